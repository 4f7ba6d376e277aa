#include "sync/delta_format.h"

#include <xxhash.h>
#include <zstd.h>

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

// The xor delta goes through zstd a part of this size at a time, never whole.
constexpr size_t kStreamBytes = size_t{1} << 20;
// A tensor this large is compressed by several zstd workers (into one frame).
constexpr size_t kParallelFrameBytes = size_t{32} << 20;

using CompressContext = std::unique_ptr<ZSTD_CCtx, size_t (*)(ZSTD_CCtx*)>;
using DecompressContext = std::unique_ptr<ZSTD_DCtx, size_t (*)(ZSTD_DCtx*)>;

void check_zstd(size_t code) {
  if (ZSTD_isError(code)) throw std::runtime_error(std::string("zstd: ") + ZSTD_getErrorName(code));
}

// Compresses `bytes` of input, produced `kStreamBytes` at a time by fill(first, part), into
// one zstd frame that records its content size.
std::vector<std::byte> compress_stream(size_t bytes, int level, const std::function<void(size_t, std::span<std::byte>)>& fill) {
  CompressContext context(ZSTD_createCCtx(), ZSTD_freeCCtx);
  if (!context) throw std::runtime_error("zstd: cannot create a compression context");
  check_zstd(ZSTD_CCtx_setParameter(context.get(), ZSTD_c_compressionLevel, level));
  // Without libzstd's threads this fails, and the frame is compressed on this thread.
  if (bytes >= kParallelFrameBytes) ZSTD_CCtx_setParameter(context.get(), ZSTD_c_nbWorkers, 4);
  check_zstd(ZSTD_CCtx_setPledgedSrcSize(context.get(), bytes));
  std::vector<std::byte> part(std::min(bytes, kStreamBytes));
  std::vector<std::byte> frame(std::max<size_t>(ZSTD_CStreamOutSize(), 1024));
  ZSTD_outBuffer out{frame.data(), frame.size(), 0};
  for (size_t first = 0;; first += part.size()) {
    const size_t size = std::min(part.size(), bytes - first);
    fill(first, std::span(part).first(size));
    ZSTD_inBuffer in{part.data(), size, 0};
    const ZSTD_EndDirective mode = first + size == bytes ? ZSTD_e_end : ZSTD_e_continue;
    for (;;) {
      if (out.pos == out.size) {
        frame.resize(2 * frame.size());
        out.dst = frame.data();
        out.size = frame.size();
      }
      const size_t left = ZSTD_compressStream2(context.get(), &out, &in, mode);
      check_zstd(left);
      if (mode == ZSTD_e_end ? left == 0 : in.pos == in.size) break;
    }
    if (mode == ZSTD_e_end) break;
  }
  frame.resize(out.pos);
  return frame;
}

// The zstd frame of one tensor's delta, and how many of its bytes changed.
std::vector<std::byte> compress_delta(const DeltaTensor& tensor, DeltaEncoding encoding, int level, size_t& changed_bytes) {
  const std::byte* base = tensor.baseline.data();
  const std::byte* now = tensor.current.data();
  const size_t bytes = tensor.current.size();
  changed_bytes = 0;
  if (encoding == DeltaEncoding::Xor)
    return compress_stream(bytes, level, [&](size_t first, std::span<std::byte> part) {
      size_t changed = 0;
      for (size_t i = 0; i < part.size(); ++i) {
        part[i] = base[first + i] ^ now[first + i];
        changed += part[i] != std::byte{0};
      }
      changed_bytes += changed;
    });
  const size_t element = dtype_size(tensor.dtype);
  const size_t elements = bytes / element;
  if (elements > UINT32_MAX) throw std::runtime_error("too many elements for an overwrite delta");
  std::vector<uint32_t> gaps;
  std::vector<std::byte> values;
  uint32_t last = 0;
  for (size_t e = 0; e < elements; ++e) {
    const std::byte* a = base + e * element;
    const std::byte* b = now + e * element;
    if (std::memcmp(a, b, element) == 0) continue;
    for (size_t k = 0; k < element; ++k) changed_bytes += a[k] != b[k];
    gaps.push_back(static_cast<uint32_t>(e) - last);
    last = static_cast<uint32_t>(e);
    values.insert(values.end(), b, b + element);
  }
  const uint64_t count = gaps.size();
  std::vector<std::byte> delta(sizeof count + gaps.size() * sizeof(uint32_t) + values.size());
  std::memcpy(delta.data(), &count, sizeof count);
  std::memcpy(delta.data() + sizeof count, gaps.data(), gaps.size() * sizeof(uint32_t));
  std::memcpy(delta.data() + sizeof count + gaps.size() * sizeof(uint32_t), values.data(), values.size());
  return compress_stream(delta.size(), level, [&](size_t first, std::span<std::byte> part) {
    std::memcpy(part.data(), delta.data() + first, part.size());
  });
}

// state = baseline with the frame's delta applied; "" when done, else why not.
std::string decompress_delta(std::span<const std::byte> frame, DeltaEncoding encoding, size_t element,
                             std::span<const std::byte> baseline, std::span<std::byte> state) {
  const unsigned long long content = ZSTD_getFrameContentSize(frame.data(), frame.size());
  // A delta is never larger than its overwrite form of every element.
  const size_t largest = encoding == DeltaEncoding::Xor ? state.size()
                                                        : sizeof(uint64_t) + state.size() / element * (sizeof(uint32_t) + element);
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN || content > largest) return "corrupt zstd frame";
  if (encoding == DeltaEncoding::Xor) {
    if (content != state.size()) return "malformed xor delta";
    // The delta a part at a time: state = baseline ^ delta.
    DecompressContext context(ZSTD_createDCtx(), ZSTD_freeDCtx);
    if (!context) return "zstd: cannot create a decompression context";
    std::vector<std::byte> part(std::min(state.size(), kStreamBytes));
    ZSTD_inBuffer in{frame.data(), frame.size(), 0};
    size_t done = 0;
    for (;;) {
      ZSTD_outBuffer out{part.data(), std::min(part.size(), state.size() - done), 0};
      const size_t left = ZSTD_decompressStream(context.get(), &out, &in);
      if (ZSTD_isError(left)) return std::string("corrupt zstd frame: ") + ZSTD_getErrorName(left);
      for (size_t i = 0; i < out.pos; ++i) state[done + i] = baseline[done + i] ^ part[i];
      done += out.pos;
      if (left == 0) break;
      if (out.pos == 0 && in.pos == in.size) return "corrupt zstd frame: short";
    }
    return done == state.size() && in.pos == in.size ? "" : "corrupt zstd frame: short";
  }
  std::vector<std::byte> delta(content);
  const size_t size = ZSTD_decompress(delta.data(), delta.size(), frame.data(), frame.size());
  if (ZSTD_isError(size) || size != content) return std::string("corrupt zstd frame: ") + (ZSTD_isError(size) ? ZSTD_getErrorName(size) : "short");
  std::memcpy(state.data(), baseline.data(), state.size());
  uint64_t count = 0;
  if (delta.size() < sizeof count) return "malformed overwrite delta";
  std::memcpy(&count, delta.data(), sizeof count);
  const size_t elements = state.size() / element;
  if (count > elements || delta.size() != sizeof count + count * (sizeof(uint32_t) + element)) return "malformed overwrite delta";
  const std::byte* gaps = delta.data() + sizeof count;
  const std::byte* values = gaps + count * sizeof(uint32_t);
  uint64_t position = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t gap = 0;
    std::memcpy(&gap, gaps + i * sizeof gap, sizeof gap);
    position += gap;
    if (position >= elements || (i > 0 && gap == 0)) return "malformed overwrite delta";
    std::memcpy(state.data() + position * element, values + i * element, element);
  }
  return "";
}

// Tensor indices, the largest first: the longest work starts first on the cores.
template <class Size>
std::vector<size_t> largest_first(size_t count, Size size) {
  std::vector<size_t> order(count);
  for (size_t i = 0; i < count; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return size(a) > size(b); });
  return order;
}

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
  DeltaWriteStats stats;
  std::vector<std::vector<std::byte>> frames(tensors.size());
  std::vector<SafetensorsTensor> stored;
  std::map<std::string, std::string> metadata = {{"format", kFormatName},
                                                 {"delta_encoding", delta_encoding_name(encoding)},
                                                 {"compression_format", kDeltaCompressionFormat},
                                                 {"checksum_format", kDeltaChecksumFormat},
                                                 {"source_rank", std::to_string(source_rank)}};
  // Tensors are independent: encode, compress and checksum them on every core, the
  // largest first (an exception must not leave an OpenMP region: each keeps its error).
  std::vector<size_t> changed(tensors.size(), 0);
  std::vector<std::string> errors(tensors.size()), checksums(tensors.size());
  const std::vector<size_t> order = largest_first(tensors.size(), [&](size_t i) { return tensors[i].current.size(); });
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < order.size(); ++k) {
    const size_t i = order[k];
    try {
      frames[i] = compress_delta(tensors[i], encoding, compression_level, changed[i]);
      checksums[i] = xxh3_128_hex(tensors[i].current);
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  }
  for (size_t i = 0; i < tensors.size(); ++i) {
    const DeltaTensor& tensor = tensors[i];
    if (!errors[i].empty()) throw std::runtime_error(path.string() + ": tensor " + tensor.name + ": " + errors[i]);
    stored.push_back({tensor.name, DType::U8, {static_cast<int64_t>(frames[i].size())}, frames[i].data()});
    metadata[tensor.name] = json{{"dtype", dtype_info(tensor.dtype).safetensors_code},
                                 {"shape", tensor.shape},
                                 {"changed_bytes", changed[i]},
                                 {"xxh3_128", checksums[i]}}
                                .dump();
    stats.changed_bytes += changed[i];
    stats.total_bytes += tensor.current.size();
  }
  write_safetensors(path, stored, metadata);
  stats.file_bytes = fs::file_size(path);
  return stats;
}

std::vector<std::string> apply_delta_file(const fs::path& path, DeltaEncoding encoding, const DeltaApplyTarget& target) {
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
  // Read the headers in order, then decode and verify every tensor on every core, the
  // largest first, each into its state buffer.
  struct Pending {
    const SafetensorsEntry* entry;
    DType dtype = DType::U8;
    std::string checksum;
    std::span<const std::byte> baseline;
    std::span<std::byte> state;
    std::string error;
  };
  const std::string source = meta("source_rank");
  const auto failure = [&](const std::string& name, const std::string& why) {
    return std::runtime_error("tensor " + name + " in " + path.string() + " (source rank " + source + "): " + why);
  };
  std::vector<Pending> pending;
  for (const SafetensorsEntry& entry : file.entries()) {
    Pending& p = pending.emplace_back();
    p.entry = &entry;
    std::vector<int64_t> shape;
    try {
      const json info = json::parse(meta(entry.name));
      p.dtype = dtype_from_safetensors(info.at("dtype").get<std::string>());
      shape = info.at("shape").get<std::vector<int64_t>>();
      p.checksum = info.at("xxh3_128").get<std::string>();
    } catch (const std::exception& e) {
      throw failure(entry.name, std::string("unreadable metadata: ") + e.what());
    }
    if (entry.dtype != DType::U8 || entry.shape.size() != 1) throw failure(entry.name, "is not a U8 vector of compressed bytes");
    p.baseline = target.baseline(entry.name, p.dtype, shape);
    p.state = target.state(entry.name);
    if (p.state.size() != p.baseline.size()) throw failure(entry.name, "the state buffer is not the baseline's size");
  }
  const std::vector<size_t> order = largest_first(pending.size(), [&](size_t i) { return pending[i].state.size(); });
#pragma omp parallel for schedule(dynamic, 1)
  for (size_t k = 0; k < order.size(); ++k) {
    Pending& p = pending[order[k]];
    p.error = decompress_delta(file.bytes(p.entry->name), encoding, dtype_size(p.dtype), p.baseline, p.state);
    if (!p.error.empty()) {
      p.error += " (checksum " + p.checksum + " not verified)";
      continue;
    }
    const std::string decoded = xxh3_128_hex(p.state);
    if (decoded != p.checksum) p.error = "checksum mismatch: xxh3-128 " + decoded + " decoded, " + p.checksum + " written";
  }
  std::vector<std::string> decoded;
  for (const Pending& p : pending) {
    if (!p.error.empty()) throw failure(p.entry->name, p.error);
    decoded.push_back(p.entry->name);
  }
  return decoded;
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
