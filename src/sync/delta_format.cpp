#include "sync/delta_format.h"

#include <xxhash.h>
#include <zstd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <stdexcept>

#include "io/safetensors.h"

namespace tandem {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kFormatName = "tandem-disk-delta";

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

size_t numel(const std::vector<int64_t>& shape) {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

// A tensor's delta is compressed a part of this size at a time, each part a zstd frame of
// its own: the parts of one large tensor (the embedding) go to several cores on both sides.
constexpr size_t kFrameBytes = size_t{4} << 20;

using CompressContext = std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)>;
using DecompressContext = std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)>;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A part of a tensor's bytes (its state's, or its overwrite delta's): [first, first + bytes).
struct Part {
  size_t tensor = 0, first = 0, bytes = 0;
};

// The parts of tensors of these sizes, at most kFrameBytes each (an empty tensor has one).
std::vector<Part> parts_of(const std::vector<size_t>& sizes) {
  std::vector<Part> parts;
  for (size_t t = 0; t < sizes.size(); ++t) {
    size_t first = 0;
    do {
      parts.push_back({t, first, std::min(kFrameBytes, sizes[t] - first)});
      first += kFrameBytes;
    } while (first < sizes[t]);
  }
  return parts;
}

// One zstd frame of `content` (at most kFrameBytes), recording its content size.
std::vector<std::byte> compress_frame(std::span<const std::byte> content, int level) {
  thread_local CompressContext context(ZSTD_createCCtx(), ZSTD_freeCCtx);
  thread_local std::unique_ptr<std::byte[]> out(new std::byte[ZSTD_compressBound(kFrameBytes)]);
  if (!context) throw std::runtime_error("zstd: cannot create a compression context");
  const size_t size = ZSTD_compressCCtx(context.get(), out.get(), ZSTD_compressBound(kFrameBytes), content.data(), content.size(), level);
  if (ZSTD_isError(size)) throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(size));
  return std::vector<std::byte>(out.get(), out.get() + size);
}

// out = a ^ b over n bytes; returns how many bytes of out are not zero. Eight bytes at a time.
size_t xor_bytes(const std::byte* a, const std::byte* b, std::byte* out, size_t n) {
  constexpr uint64_t kLow7 = 0x7f7f7f7f7f7f7f7full;
  size_t zero = 0, i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, a + i, 8);
    std::memcpy(&y, b + i, 8);
    x ^= y;
    std::memcpy(out + i, &x, 8);
    // The high bit of each zero byte of x.
    zero += static_cast<size_t>(__builtin_popcountll(~(((x & kLow7) + kLow7) | x | kLow7)));
  }
  size_t changed = 8 * (i / 8) - zero;
  for (; i < n; ++i) {
    out[i] = a[i] ^ b[i];
    changed += out[i] != std::byte{0};
  }
  return changed;
}

// The changed elements of a part of a tensor (element-aligned): their positions in the
// tensor, new values and changed bytes.
struct Changes {
  std::vector<uint32_t> positions;
  std::vector<std::byte> values;
  size_t changed_bytes = 0;
};

Changes changes_of(const DeltaTensor& tensor, const Part& part, size_t element) {
  Changes found;
  const std::byte* base = tensor.baseline.data();
  const std::byte* now = tensor.current.data();
  // Equal words are skipped whole: most elements do not change.
  const size_t word = std::max<size_t>(1, 8 / element) * element;
  for (size_t at = part.first, end = part.first + part.bytes; at < end;) {
    if (at + word <= end && std::memcmp(base + at, now + at, word) == 0) {
      at += word;
      continue;
    }
    if (std::memcmp(base + at, now + at, element) != 0) {
      for (size_t k = 0; k < element; ++k) found.changed_bytes += base[at + k] != now[at + k];
      found.positions.push_back(static_cast<uint32_t>(at / element));
      found.values.insert(found.values.end(), now + at, now + at + element);
    }
    at += element;
  }
  return found;
}

// The overwrite delta of one tensor from its parts' changes: a u32 count, the u32 gaps
// between the positions (the first from 0), then the new values.
std::vector<std::byte> overwrite_delta(std::span<const Changes> parts, size_t element) {
  size_t count = 0;
  for (const Changes& c : parts) count += c.positions.size();
  if (count > UINT32_MAX) throw std::runtime_error("too many changed elements for an overwrite delta");
  std::vector<std::byte> delta(sizeof(uint32_t) + count * (sizeof(uint32_t) + element));
  const auto count32 = static_cast<uint32_t>(count);
  std::memcpy(delta.data(), &count32, sizeof count32);
  std::byte* gaps = delta.data() + sizeof(uint32_t);
  std::byte* values = gaps + count * sizeof(uint32_t);
  uint32_t last = 0;
  for (const Changes& c : parts) {
    for (uint32_t position : c.positions) {
      const uint32_t gap = position - last;
      std::memcpy(gaps, &gap, sizeof gap);
      gaps += sizeof gap;
      last = position;
    }
    std::memcpy(values, c.values.data(), c.values.size());
    values += c.values.size();
  }
  return delta;
}

// Applies an overwrite delta onto `held`; "" when done, else why not.
std::string apply_overwrite(std::span<const std::byte> delta, size_t element, std::span<std::byte> held) {
  uint32_t count = 0;
  if (delta.size() < sizeof count) return "malformed overwrite delta";
  std::memcpy(&count, delta.data(), sizeof count);
  const size_t elements = held.size() / element;
  if (count > elements || delta.size() != sizeof count + size_t{count} * (sizeof(uint32_t) + element)) return "malformed overwrite delta";
  const std::byte* gaps = delta.data() + sizeof count;
  const std::byte* values = gaps + size_t{count} * sizeof(uint32_t);
  uint64_t position = 0;
  for (uint32_t i = 0; i < count; ++i) {
    uint32_t gap = 0;
    std::memcpy(&gap, gaps + size_t{i} * sizeof gap, sizeof gap);
    position += gap;
    if (position >= elements || (i > 0 && gap == 0)) return "malformed overwrite delta";
    std::memcpy(held.data() + position * element, values + size_t{i} * element, element);
  }
  return "";
}

// Indices, the largest first: the longest work starts first on the cores.
template <class Size>
std::vector<size_t> largest_first(size_t count, Size size) {
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size(a) > size(b); });
  return order;
}

// Runs work(i) for every i of `order` on every core; an exception must not leave an
// OpenMP region, so each keeps its message in errors[key(i)] (the first one).
template <class Work, class Key>
void on_every_core(const std::vector<size_t>& order, std::vector<std::string>& errors, Key key, Work work) {
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < order.size(); ++k) {
    try {
      work(order[k]);
    } catch (const std::exception& e) {
#pragma omp critical(delta_errors)
      if (errors[key(order[k])].empty()) errors[key(order[k])] = e.what();
    }
  }
}

std::vector<size_t> in_order(size_t count) { return largest_first(count, [](size_t) { return 0; }); }

}  // namespace

DeltaEncoding delta_encoding_from_name(const std::string& name) {
  if (name == "xor") return DeltaEncoding::Xor;
  if (name == "overwrite") return DeltaEncoding::Overwrite;
  throw std::invalid_argument("unknown delta encoding '" + name + "' (xor or overwrite)");
}

const char* delta_encoding_name(DeltaEncoding encoding) { return encoding == DeltaEncoding::Xor ? "xor" : "overwrite"; }

std::string xxh3_128_hex(std::span<const std::byte> bytes) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size()));
  static const char* digits = "0123456789abcdef";
  std::string hex;
  for (unsigned char byte : canonical.digest) {
    hex += digits[byte >> 4];
    hex += digits[byte & 15];
  }
  return hex;
}

fs::path delta_version_folder(const fs::path& root, int64_t version) {
  char name[32];
  std::snprintf(name, sizeof name, "weight_v%06lld", static_cast<long long>(version));
  return root / name;
}

std::string delta_file_name(int source_rank, int source_ranks) {
  char name[64];
  std::snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", source_rank + 1, source_ranks);
  return name;
}

DeltaWriteStats write_delta_file(const fs::path& path, std::span<const DeltaTensor> tensors, DeltaEncoding encoding,
                                 int compression_level, int source_rank) {
  const auto start = std::chrono::steady_clock::now();
  const size_t n = tensors.size();
  std::vector<size_t> sizes(n);
  for (size_t i = 0; i < n; ++i) {
    if (tensors[i].baseline.size() != tensors[i].current.size())
      throw std::runtime_error(path.string() + ": tensor " + tensors[i].name + ": the baseline is not the new state's size");
    sizes[i] = tensors[i].current.size();
  }
  // Tensors and their parts are independent: encode, compress and checksum them on every
  // core. An error is kept by tensor and thrown, the first tensor's, after each stage.
  std::vector<std::string> errors(n);
  const auto by_tensor = [](size_t i) { return i; };
  const auto throw_first_error = [&] {
    for (size_t i = 0; i < n; ++i)
      if (!errors[i].empty()) throw std::runtime_error(path.string() + ": tensor " + tensors[i].name + ": " + errors[i]);
  };
  std::vector<size_t> changed(n, 0);
  std::vector<Part> parts = parts_of(sizes);
  std::vector<std::vector<std::byte>> frames(parts.size());
  const auto tensor_of_part = [&](size_t p) { return parts[p].tensor; };
  if (encoding == DeltaEncoding::Xor) {
    std::vector<size_t> part_changed(parts.size());
    on_every_core(in_order(parts.size()), errors, tensor_of_part, [&](size_t p) {
      thread_local std::unique_ptr<std::byte[]> delta(new std::byte[kFrameBytes]);
      const Part& part = parts[p];
      const DeltaTensor& tensor = tensors[part.tensor];
      part_changed[p] = xor_bytes(tensor.baseline.data() + part.first, tensor.current.data() + part.first, delta.get(), part.bytes);
      frames[p] = compress_frame({delta.get(), part.bytes}, compression_level);
    });
    for (size_t p = 0; p < parts.size(); ++p) changed[parts[p].tensor] += part_changed[p];
  } else {
    // The changed elements part by part, each tensor's overwrite delta from its parts,
    // then that delta's parts compressed.
    std::vector<Changes> found(parts.size());
    on_every_core(in_order(parts.size()), errors, tensor_of_part,
                  [&](size_t p) { found[p] = changes_of(tensors[parts[p].tensor], parts[p], dtype_size(tensors[parts[p].tensor].dtype)); });
    throw_first_error();
    std::vector<size_t> first_part(n + 1, parts.size());
    for (size_t p = parts.size(); p-- > 0;) first_part[parts[p].tensor] = p;
    std::vector<std::vector<std::byte>> deltas(n);
    on_every_core(largest_first(n, [&](size_t i) { return sizes[i]; }), errors, by_tensor, [&](size_t i) {
      const std::span<const Changes> own(found.data() + first_part[i], first_part[i + 1] - first_part[i]);
      for (const Changes& c : own) changed[i] += c.changed_bytes;
      deltas[i] = overwrite_delta(own, dtype_size(tensors[i].dtype));
    });
    throw_first_error();
    found.clear();
    std::vector<size_t> delta_sizes(n);
    for (size_t i = 0; i < n; ++i) delta_sizes[i] = deltas[i].size();
    parts = parts_of(delta_sizes);
    frames.assign(parts.size(), {});
    on_every_core(in_order(parts.size()), errors, tensor_of_part, [&](size_t p) {
      frames[p] = compress_frame(std::span(deltas[parts[p].tensor]).subspan(parts[p].first, parts[p].bytes), compression_level);
    });
  }
  std::vector<std::string> checksums(n);
  on_every_core(largest_first(n, [&](size_t i) { return sizes[i]; }), errors, by_tensor,
                [&](size_t i) { checksums[i] = xxh3_128_hex(tensors[i].current); });
  throw_first_error();

  // A tensor's frames, concatenated: what a plain zstd decoder decodes whole.
  std::vector<std::vector<std::byte>> compressed(n);
  for (size_t p = 0; p < parts.size(); ++p)
    compressed[parts[p].tensor].insert(compressed[parts[p].tensor].end(), frames[p].begin(), frames[p].end());
  DeltaWriteStats stats;
  std::vector<SafetensorsTensor> stored;
  std::map<std::string, std::string> metadata = {{"format", kFormatName},
                                                 {"delta_encoding", delta_encoding_name(encoding)},
                                                 {"compression_format", kDeltaCompressionFormat},
                                                 {"checksum_format", kDeltaChecksumFormat},
                                                 {"source_rank", std::to_string(source_rank)}};
  for (size_t i = 0; i < n; ++i) {
    const DeltaTensor& tensor = tensors[i];
    stored.push_back({tensor.name, DType::U8, {static_cast<int64_t>(compressed[i].size())}, compressed[i].data()});
    metadata[tensor.name] = json{{"dtype", dtype_info(tensor.dtype).safetensors_code},
                                 {"shape", tensor.shape},
                                 {"changed_bytes", changed[i]},
                                 {"xxh3_128", checksums[i]}}
                                .dump();
    stats.changed_bytes += changed[i];
    stats.total_bytes += sizes[i];
  }
  stats.encode_seconds = seconds_since(start);
  const auto written = std::chrono::steady_clock::now();
  write_safetensors(path, stored, metadata);
  stats.file_bytes = fs::file_size(path);
  stats.write_seconds = seconds_since(written);
  return stats;
}

DeltaApplyStats apply_delta_file(const fs::path& path, DeltaEncoding encoding, const HeldBytes& held_bytes) {
  auto start = std::chrono::steady_clock::now();
  const SafetensorsFile file(path);
  const auto& metadata = file.metadata();
  const auto meta = [&](const std::string& key) {
    const auto found = metadata.find(key);
    if (found == metadata.end()) throw std::runtime_error(path.string() + ": no '" + key + "' in the metadata");
    return found->second;
  };
  if (meta("format") != kFormatName || meta("delta_encoding") != delta_encoding_name(encoding) ||
      meta("compression_format") != kDeltaCompressionFormat || meta("checksum_format") != kDeltaChecksumFormat)
    throw std::runtime_error(path.string() + ": not a " + std::string(kFormatName) + " file of encoding " +
                             delta_encoding_name(encoding) + ", zstd, xxh3-128");
  // Read the headers and find every tensor's frames in order, then decode the frames on
  // every core onto the held bytes, then verify every tensor on every core.
  struct Pending {
    const SafetensorsEntry* entry;
    size_t element = 1;
    std::string checksum;
    std::span<std::byte> held;
    std::vector<std::byte> delta;  // overwrite: the frames' content, concatenated
  };
  struct Frame {
    size_t tensor = 0;
    std::span<const std::byte> compressed;
    size_t first = 0, bytes = 0;  // where its content goes in the tensor's delta
  };
  const std::string source = meta("source_rank");
  const auto failure = [&](const std::string& name, const std::string& why) {
    return std::runtime_error("tensor " + name + " in " + path.string() + " (source rank " + source + "): " + why);
  };
  std::vector<Pending> pending;
  std::vector<Frame> frames;
  for (const SafetensorsEntry& entry : file.entries()) {
    Pending& p = pending.emplace_back();
    p.entry = &entry;
    std::vector<int64_t> shape;
    DType dtype = DType::U8;
    try {
      const json info = json::parse(meta(entry.name));
      dtype = dtype_from_safetensors(info.at("dtype").get<std::string>());
      shape = info.at("shape").get<std::vector<int64_t>>();
      p.checksum = info.at("xxh3_128").get<std::string>();
    } catch (const std::exception& e) {
      throw failure(entry.name, std::string("unreadable metadata: ") + e.what());
    }
    if (entry.dtype != DType::U8 || entry.shape.size() != 1) throw failure(entry.name, "is not a U8 vector of compressed bytes");
    p.element = dtype_size(dtype);
    p.held = held_bytes(entry.name, dtype, shape);
    // A delta is never larger than its overwrite form of every element.
    const size_t largest = encoding == DeltaEncoding::Xor ? p.held.size()
                                                          : sizeof(uint32_t) + p.held.size() / p.element * (sizeof(uint32_t) + p.element);
    const std::string unverified = " (checksum " + p.checksum + " not verified)";
    size_t content = 0;
    for (std::span<const std::byte> rest = file.bytes(entry.name); !rest.empty();) {
      const size_t size = ZSTD_findFrameCompressedSize(rest.data(), rest.size());
      const unsigned long long bytes = ZSTD_isError(size) ? ZSTD_CONTENTSIZE_ERROR : ZSTD_getFrameContentSize(rest.data(), size);
      if (bytes == ZSTD_CONTENTSIZE_ERROR || bytes == ZSTD_CONTENTSIZE_UNKNOWN || bytes > largest - content)
        throw failure(entry.name, "corrupt zstd frame" + unverified);
      frames.push_back({pending.size() - 1, rest.first(size), content, bytes});
      content += bytes;
      rest = rest.subspan(size);
    }
    if (encoding == DeltaEncoding::Xor ? content != p.held.size() : content < sizeof(uint32_t))
      throw failure(entry.name, std::string("malformed ") + delta_encoding_name(encoding) + " delta" + unverified);
    if (encoding == DeltaEncoding::Overwrite) p.delta.resize(content);
  }
  std::vector<std::string> errors(pending.size());
  const auto by_tensor = [](size_t i) { return i; };
  const auto throw_first_error = [&](const std::string& suffix) {
    for (size_t i = 0; i < pending.size(); ++i)
      if (!errors[i].empty()) throw failure(pending[i].entry->name, errors[i] + (suffix.empty() ? "" : " (checksum " + pending[i].checksum + " " + suffix + ")"));
  };
  on_every_core(in_order(frames.size()), errors, [&](size_t f) { return frames[f].tensor; }, [&](size_t f) {
    thread_local DecompressContext context(ZSTD_createDCtx(), ZSTD_freeDCtx);
    thread_local std::vector<std::byte> scratch;
    const Frame& frame = frames[f];
    Pending& p = pending[frame.tensor];
    std::byte* out = p.delta.data() + frame.first;
    if (encoding == DeltaEncoding::Xor) {
      if (scratch.size() < frame.bytes) scratch.resize(frame.bytes);
      out = scratch.data();
    }
    const size_t size = ZSTD_decompressDCtx(context.get(), out, frame.bytes, frame.compressed.data(), frame.compressed.size());
    if (ZSTD_isError(size) || size != frame.bytes)
      throw std::runtime_error(std::string("corrupt zstd frame: ") + (ZSTD_isError(size) ? ZSTD_getErrorName(size) : "short"));
    if (encoding == DeltaEncoding::Xor) {
      std::byte* held = p.held.data() + frame.first;
      xor_bytes(held, out, held, frame.bytes);
    }
  });
  throw_first_error("not verified");
  if (encoding == DeltaEncoding::Overwrite) {
    on_every_core(largest_first(pending.size(), [&](size_t i) { return pending[i].held.size(); }), errors, by_tensor, [&](size_t i) {
      if (const std::string why = apply_overwrite(pending[i].delta, pending[i].element, pending[i].held); !why.empty())
        throw std::runtime_error(why);
    });
    throw_first_error("not verified");
  }
  DeltaApplyStats stats;
  stats.decode_seconds = seconds_since(start);
  start = std::chrono::steady_clock::now();
  on_every_core(largest_first(pending.size(), [&](size_t i) { return pending[i].held.size(); }), errors, by_tensor, [&](size_t i) {
    const std::string decoded = xxh3_128_hex(pending[i].held);
    if (decoded != pending[i].checksum)
      throw std::runtime_error("checksum mismatch: xxh3-128 " + decoded + " decoded, " + pending[i].checksum + " written");
  });
  throw_first_error("");
  stats.verify_seconds = seconds_since(start);
  for (const Pending& p : pending) stats.tensors.push_back(p.entry->name);
  stats.file_bytes = fs::file_size(path);
  return stats;
}

void write_delta_index(const fs::path& folder, const DeltaIndex& index) {
  json weight_map = json::object();
  for (const auto& [tensor, file] : index.weight_map) weight_map[tensor] = file;
  const json text = {{"version", index.version},
                     {"base_version", index.base_version},
                     {"delta_encoding", delta_encoding_name(index.encoding)},
                     {"compression_format", kDeltaCompressionFormat},
                     {"checksum_format", kDeltaChecksumFormat},
                     {"weight_map", weight_map}};
  write_file_atomically(folder / kSafetensorsIndexName, text.dump(2) + "\n");
}

DeltaIndex read_delta_index(const fs::path& folder) {
  const fs::path path = folder / kSafetensorsIndexName;
  DeltaIndex index;
  try {
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open (not published)");
    const json text = json::parse(in);
    if (text.at("compression_format") != kDeltaCompressionFormat || text.at("checksum_format") != kDeltaChecksumFormat)
      throw std::runtime_error("compression or checksum format other than zstd, xxh3-128");
    index.version = text.at("version").get<int64_t>();
    index.base_version = text.at("base_version").get<int64_t>();
    index.encoding = delta_encoding_from_name(text.at("delta_encoding").get<std::string>());
    for (const auto& [tensor, file] : text.at("weight_map").items()) index.weight_map.emplace_back(tensor, file.get<std::string>());
  } catch (const std::exception& e) {
    throw std::runtime_error(path.string() + ": " + e.what());
  }
  return index;
}

std::string baseline_mismatch(const std::string& name, const BaselineTensorInfo& baseline, DType dtype,
                              const std::vector<int64_t>& shape) {
  const std::string prefix = "tensor " + name + ": ";
  if (baseline.dtype != dtype)
    return prefix + "dtype " + dtype_info(baseline.dtype).safetensors_code + " in the baseline, " +
           dtype_info(dtype).safetensors_code + " in the trainer";
  if (baseline.shape != shape) return prefix + "shape " + shape_text(baseline.shape) + " in the baseline, " + shape_text(shape) + " in the trainer";
  const size_t expected = numel(shape) * dtype_size(dtype);
  if (!baseline.contiguous || baseline.bytes != expected)
    return prefix + "layout: " + (baseline.contiguous ? "" : "not contiguous, ") + std::to_string(baseline.bytes) +
           " bytes in the baseline, " + std::to_string(expected) + " for a row-major " + dtype_name(dtype) + " " + shape_text(shape);
  return "";
}

}  // namespace tandem
