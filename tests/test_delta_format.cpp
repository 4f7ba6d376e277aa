// The disk-delta format: deltas decode back bit for bit, overwrite is idempotent, a
// corrupted file is caught by its checksums with the tensor, file and rank named, the
// baseline check names each error class, and a full disk leaves no file behind.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <omp.h>
#include <unistd.h>
#include <zstd.h>

#include <csignal>
#include <cstring>
#include <fstream>
#include <random>

#include "io/safetensors.h"
#include "support.h"
#include "sync/delta_format.h"

using namespace tandem;
using tandem::testing::TempDir;
namespace fs = std::filesystem;

namespace {

struct Weights {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<std::vector<std::byte>> baseline, current;
};

// Random tensors and a new state with about `changed` of their elements changed, the way
// a small update leaves most BF16 weights bit-identical.
Weights random_weights(DType dtype, double changed, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Weights w;
  for (const auto& [name, shape] : {std::pair<std::string, std::vector<int64_t>>{"model.embed_tokens.weight", {64, 16}},
                                    {"model.layers.0.mlp.up_proj.weight", {32, 16}},
                                    {"model.norm.weight", {16}}}) {
    const size_t bytes = static_cast<size_t>(shape[0] * (shape.size() > 1 ? shape[1] : 1)) * dtype_size(dtype);
    std::vector<std::byte> base(bytes);
    for (auto& b : base) b = static_cast<std::byte>(rng());
    std::vector<std::byte> now = base;
    std::bernoulli_distribution flip(changed);
    for (size_t e = 0; e < bytes / dtype_size(dtype); ++e)
      if (flip(rng)) now[e * dtype_size(dtype)] ^= std::byte{1};
    w.names.push_back(name);
    w.shapes.push_back(shape);
    w.baseline.push_back(std::move(base));
    w.current.push_back(std::move(now));
  }
  return w;
}

std::vector<DeltaTensor> deltas(const Weights& w, DType dtype) {
  std::vector<DeltaTensor> tensors;
  for (size_t i = 0; i < w.names.size(); ++i) tensors.push_back({w.names[i], dtype, w.shapes[i], w.baseline[i], w.current[i]});
  return tensors;
}

// Applies the file onto `from` (the baseline, or any state); returns the states by tensor.
std::map<std::string, std::vector<std::byte>> apply(const fs::path& path, DeltaEncoding encoding, const Weights& w,
                                                    const std::vector<std::vector<std::byte>>& from) {
  std::map<std::string, std::vector<std::byte>> states;
  for (size_t i = 0; i < w.names.size(); ++i) states[w.names[i]] = from[i];
  apply_delta_file(path, encoding, [&](const std::string& name, DType, const std::vector<int64_t>&) -> std::span<std::byte> {
    const auto found = states.find(name);
    if (found == states.end()) throw std::runtime_error("no " + name);
    return found->second;
  });
  return states;
}

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_bytes(const fs::path& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

}  // namespace

TEST(DeltaFormat, BothEncodingsDecodeBitForBitAndCountTheChangedBytes) {
  TempDir dir;
  for (DType dtype : {DType::F32, DType::BF16}) {
    for (DeltaEncoding encoding : {DeltaEncoding::Xor, DeltaEncoding::Overwrite}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + delta_encoding_name(encoding));
      const Weights w = random_weights(dtype, 0.01, 7);
      const fs::path path = dir / (std::string(dtype_name(dtype)) + delta_encoding_name(encoding) + ".safetensors");
      const DeltaWriteStats stats = write_delta_file(path, deltas(w, dtype), encoding, 1, 2);
      size_t changed = 0, total = 0;
      for (size_t i = 0; i < w.names.size(); ++i) {
        total += w.current[i].size();
        for (size_t k = 0; k < w.current[i].size(); ++k) changed += w.current[i][k] != w.baseline[i][k];
      }
      EXPECT_EQ(stats.changed_bytes, changed);
      EXPECT_EQ(stats.total_bytes, total);
      EXPECT_GT(changed, 0u);
      EXPECT_LT(stats.file_bytes, total / 2);  // a sparse delta compresses
      // A valid safetensors file: U8 frames, the tensor's dtype, shape and checksum in the metadata.
      const SafetensorsFile file(path);
      EXPECT_EQ(file.metadata().at("source_rank"), "2");
      EXPECT_EQ(file.metadata().at("delta_encoding"), delta_encoding_name(encoding));
      EXPECT_NE(file.metadata().at(w.names[1]).find(xxh3_128_hex(w.current[1])), std::string::npos);
      const auto states = apply(path, encoding, w, w.baseline);
      for (size_t i = 0; i < w.names.size(); ++i) EXPECT_TRUE(states.at(w.names[i]) == w.current[i]) << w.names[i];
      if (encoding == DeltaEncoding::Overwrite) {
        // Idempotent: applied onto the state it produced, it gives that state again.
        const auto again = apply(path, encoding, w, w.current);
        for (size_t i = 0; i < w.names.size(); ++i) EXPECT_TRUE(again.at(w.names[i]) == w.current[i]) << w.names[i];
      }
    }
  }
}

// A tensor over 4 MiB is compressed as several zstd frames, concatenated: the engine
// decodes them in parallel, and a plain zstd decoder decodes them whole into the delta
// (xor: baseline ^ new; overwrite: a u32 count, u32 gaps, new values).
TEST(DeltaFormat, ALargeTensorIsSeveralFramesThatAPlainDecoderReads) {
  TempDir dir;
  std::mt19937_64 rng(11);
  const std::vector<int64_t> shape = {2200, 1024};  // 8.6 MiB of BF16: 3 frames
  std::vector<std::byte> base(static_cast<size_t>(shape[0] * shape[1]) * 2);
  for (auto& b : base) b = static_cast<std::byte>(rng());
  std::vector<std::byte> now = base;
  std::vector<uint32_t> positions;
  for (uint32_t e = 5; e < base.size() / 2; e += 3) {  // an overwrite delta of 9 MiB
    now[2 * e] ^= std::byte{3};
    positions.push_back(e);
  }
  const Weights w{{"model.embed_tokens.weight"}, {shape}, {base}, {now}};
  for (DeltaEncoding encoding : {DeltaEncoding::Xor, DeltaEncoding::Overwrite}) {
    SCOPED_TRACE(delta_encoding_name(encoding));
    const fs::path path = dir / (std::string(delta_encoding_name(encoding)) + ".safetensors");
    const DeltaWriteStats stats = write_delta_file(path, deltas(w, DType::BF16), encoding, 1, 0);
    EXPECT_EQ(stats.changed_bytes, positions.size());
    const SafetensorsFile file(path);
    const std::span<const std::byte> frames = file.bytes(w.names[0]);
    EXPECT_LT(ZSTD_findFrameCompressedSize(frames.data(), frames.size()), frames.size()) << "one frame";
    std::vector<std::byte> expected;
    if (encoding == DeltaEncoding::Xor) {
      for (size_t k = 0; k < base.size(); ++k) expected.push_back(base[k] ^ now[k]);
    } else {
      const auto append = [&](const void* bytes, size_t n) {
        expected.insert(expected.end(), static_cast<const std::byte*>(bytes), static_cast<const std::byte*>(bytes) + n);
      };
      const auto count = static_cast<uint32_t>(positions.size());
      append(&count, 4);
      for (size_t i = 0; i < positions.size(); ++i) {
        const uint32_t gap = positions[i] - (i ? positions[i - 1] : 0);
        append(&gap, 4);
      }
      for (uint32_t e : positions) append(&now[2 * e], 2);
    }
    std::vector<std::byte> delta(expected.size() + 1);
    EXPECT_EQ(ZSTD_decompress(delta.data(), delta.size(), frames.data(), frames.size()), expected.size());
    delta.pop_back();
    EXPECT_TRUE(delta == expected);
    EXPECT_TRUE(apply(path, encoding, w, w.baseline).at(w.names[0]) == now);
  }
}

TEST(DeltaFormat, Xxh3128IsTheCanonicalHexOfTheReferenceValue) {
  // XXH3_128bits("") = 99aa06d3014798d86001c324468d497f (xxHash's test vectors).
  EXPECT_EQ(xxh3_128_hex({}), "99aa06d3014798d86001c324468d497f");
  const std::byte one[] = {std::byte{'a'}};
  EXPECT_NE(xxh3_128_hex(one), xxh3_128_hex({}));
  EXPECT_EQ(xxh3_128_hex(one).size(), 32u);
}

TEST(DeltaFormat, CorruptedFileIsCaughtNamingTensorFileAndRank) {
  TempDir dir;
  const Weights w = random_weights(DType::F32, 0.05, 3);
  const fs::path path = dir / delta_file_name(2, 3);
  write_delta_file(path, deltas(w, DType::F32), DeltaEncoding::Xor, 1, 2);
  const std::string original = read_bytes(path);
  const SafetensorsFile file(path);
  const std::string tensor = w.names[1];
  const std::string checksum = xxh3_128_hex(w.current[1]);

  // A checksum that does not match the decoded state (the same length: the header stays valid).
  std::string tampered = original;
  const size_t at = tampered.find(checksum);
  ASSERT_NE(at, std::string::npos);
  tampered[at] = tampered[at] == '0' ? '1' : '0';
  write_bytes(path, tampered);
  try {
    apply(path, DeltaEncoding::Xor, w, w.baseline);
    FAIL() << "no error";
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("tensor " + tensor), std::string::npos) << message;
    EXPECT_NE(message.find(path.string()), std::string::npos) << message;
    EXPECT_NE(message.find("source rank 2"), std::string::npos) << message;
    EXPECT_NE(message.find("checksum mismatch"), std::string::npos) << message;
  }

  // Flipped bits in every tensor's compressed bytes: each is a corrupt frame or a mismatch.
  const size_t header = 8 + *reinterpret_cast<const uint64_t*>(original.data());
  for (const SafetensorsEntry& entry : file.entries()) {
    SCOPED_TRACE(entry.name);
    std::string flipped = original;
    for (size_t k = entry.offset + entry.bytes / 2; k < entry.offset + entry.bytes; ++k) flipped[header + k] ^= 0x5a;
    write_bytes(path, flipped);
    try {
      apply(path, DeltaEncoding::Xor, w, w.baseline);
      FAIL() << "no error";
    } catch (const std::runtime_error& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find("tensor " + entry.name + " in " + path.string() + " (source rank 2)"), std::string::npos) << message;
    }
  }
}

TEST(DeltaFormat, BaselineCheckNamesEachErrorClass) {
  const std::vector<int64_t> shape = {256, 128};
  const std::string name = "model.layers.3.mlp.up_proj.weight";
  const size_t bytes = 256 * 128 * 2;
  EXPECT_EQ(baseline_mismatch(name, {DType::BF16, shape, bytes, true}, DType::BF16, shape), "");
  EXPECT_EQ(baseline_mismatch(name, {DType::BF16, {512, 128}, bytes * 2, true}, DType::BF16, shape),
            "tensor " + name + ": shape [512, 128] in the baseline, [256, 128] in the trainer");
  EXPECT_EQ(baseline_mismatch(name, {DType::F16, shape, bytes, true}, DType::BF16, shape),
            "tensor " + name + ": dtype F16 in the baseline, BF16 in the trainer");
  EXPECT_EQ(baseline_mismatch(name, {DType::BF16, shape, bytes + 2, true}, DType::BF16, shape),
            "tensor " + name + ": layout: 65538 bytes in the baseline, 65536 for a row-major BF16 [256, 128]");
  EXPECT_NE(baseline_mismatch(name, {DType::BF16, shape, bytes, false}, DType::BF16, shape).find("layout: not contiguous"), std::string::npos);
}

TEST(DeltaFormat, IndexRoundTripsAndItsAbsenceMeansUnpublished) {
  TempDir dir;
  const fs::path folder = delta_version_folder(dir.path(), 7);
  EXPECT_EQ(folder.filename(), "weight_v000007");
  fs::create_directories(folder);
  EXPECT_THROW(read_delta_index(folder), std::runtime_error);
  write_delta_index(folder, {7, 6, DeltaEncoding::Overwrite, {{"a", delta_file_name(0, 2)}, {"b", delta_file_name(1, 2)}}});
  const DeltaIndex index = read_delta_index(folder);
  EXPECT_EQ(index.version, 7);
  EXPECT_EQ(index.base_version, 6);
  EXPECT_EQ(index.encoding, DeltaEncoding::Overwrite);
  ASSERT_EQ(index.weight_map.size(), 2u);
  EXPECT_EQ(index.weight_map[1].second, "model-00002-of-00002.safetensors");
}

// A file size limit (RLIMIT_FSIZE, SIGXFSZ ignored) in a child stands for a full disk:
// the write fails with the file and the cause named, and leaves neither file nor temporary.
TEST(DeltaFormat, FullDiskFailsClearlyAndLeavesNothing) {
  TempDir dir;
  Weights w = random_weights(DType::F32, 0.0, 5);
  std::mt19937_64 rng(6);
  for (auto& tensor : w.current)
    for (auto& b : tensor) b = static_cast<std::byte>(rng());  // a random new state: incompressible
  const fs::path path = dir / delta_file_name(0, 1);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(pipe_fds[0]);
    omp_set_num_threads(1);  // the parent's OpenMP threads did not survive the fork
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{2048, 2048};
    setrlimit(RLIMIT_FSIZE, &limit);
    std::string message = "no error";
    try {
      write_delta_file(path, deltas(w, DType::F32), DeltaEncoding::Xor, 1, 0);
    } catch (const std::exception& e) {
      message = e.what();
    }
    (void)!write(pipe_fds[1], message.data(), message.size());
    _exit(0);
  }
  close(pipe_fds[1]);
  std::string message;
  char buffer[512];
  for (ssize_t n; (n = read(pipe_fds[0], buffer, sizeof buffer)) > 0;) message.append(buffer, static_cast<size_t>(n));
  close(pipe_fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_NE(message.find(path.filename().string()), std::string::npos) << message;
  EXPECT_NE(message.find("write failed (File too large)"), std::string::npos) << message;
  EXPECT_TRUE(fs::is_empty(dir.path())) << "a partial file was left";
}
