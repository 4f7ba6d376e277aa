// The on-disk format of a disk-delta weight sync, shared by the ranks that write it and
// the engines that read it. A version is a folder weight_v000001/ ... holding one
// model-0000r-of-0000N.safetensors per source rank and, written last, the
// model.safetensors.index.json that publishes it:
//   {"version", "base_version", "delta_encoding", "compression_format",
//    "checksum_format", "weight_map": {tensor: file}}
// Version v is a delta against version base_version (v - 1; version 0 is the baseline the
// engines start from): a reader rebuilds version v from the bytes of base_version by
// applying v's files, so the newest weights take the baseline and every version since.
// Each tensor of a delta file is a U8 vector: its delta against the base version,
// compressed as zstd frames of at most 4 MiB of the delta each, concatenated (a plain zstd
// decoder decodes them all into the delta; the engines decode the frames on every core).
// The file's __metadata__ has, under the tensor's name, a JSON string with the tensor's
// dtype, shape, the bytes that changed and the xxh3-128 of its new full state.
//
//   xor:       delta = base ^ new, byte for byte (zeros compress to nothing).
//   overwrite: the changed elements: a u32 count, the u32 gaps between their positions
//              (the first from 0), then their new values. Applying it twice gives the
//              same state.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace tandem {

enum class DeltaEncoding { Xor, Overwrite };
DeltaEncoding delta_encoding_from_name(const std::string& name);  // "xor" | "overwrite"
const char* delta_encoding_name(DeltaEncoding encoding);

inline constexpr const char* kDeltaCompressionFormat = "zstd";
inline constexpr const char* kDeltaChecksumFormat = "xxh3-128";

// The canonical big-endian hex of the xxh3-128 of the bytes (32 characters).
std::string xxh3_128_hex(std::span<const std::byte> bytes);

std::filesystem::path delta_version_folder(const std::filesystem::path& root, int64_t version);  // weight_v000001
std::string delta_file_name(int source_rank, int source_ranks);  // model-00001-of-00003.safetensors

// One tensor of a source rank: its baseline and its new state, both in the working dtype.
struct DeltaTensor {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::span<const std::byte> baseline;
  std::span<const std::byte> current;
};

struct DeltaWriteStats {
  size_t file_bytes = 0;     // what the file takes on disk
  size_t changed_bytes = 0;  // bytes of the new state that differ from the baseline
  size_t total_bytes = 0;    // bytes of the new state
  double encode_seconds = 0;  // encode, compress and checksum, on every core
  double write_seconds = 0;   // write, fsync and rename
};

// Encodes, compresses and writes one source rank's file atomically (temporary, fsync,
// rename, fsync of the folder). Throws std::runtime_error naming the file on failure.
DeltaWriteStats write_delta_file(const std::filesystem::path& path, std::span<const DeltaTensor> tensors,
                                 DeltaEncoding encoding, int compression_level, int source_rank);

// The bytes a reader holds of a tensor of a file (after checking its dtype and shape
// against its own): the delta is applied onto them in place.
using HeldBytes = std::function<std::span<std::byte>(const std::string& name, DType dtype, const std::vector<int64_t>& shape)>;

struct DeltaApplyStats {
  std::vector<std::string> tensors;  // the tensors decoded
  size_t file_bytes = 0;             // what the file takes on disk
  double decode_seconds = 0;         // read and decode, on every core
  double verify_seconds = 0;         // xxh3-128 of every new state, on every core
};

// Reads one file and applies every tensor's delta onto its held bytes, on every core,
// verifying each checksum; the held bytes are the new state only when it returns. Errors
// (a corrupt frame, a checksum mismatch) throw std::runtime_error naming the tensor, the
// file and its source rank.
DeltaApplyStats apply_delta_file(const std::filesystem::path& path, DeltaEncoding encoding, const HeldBytes& held_bytes);

// The index of a version, written last: its presence publishes the version.
struct DeltaIndex {
  int64_t version = 0;
  int64_t base_version = 0;
  DeltaEncoding encoding = DeltaEncoding::Xor;
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> file
};
void write_delta_index(const std::filesystem::path& folder, const DeltaIndex& index);
// Throws std::runtime_error naming the index when it is absent, malformed or of another format.
DeltaIndex read_delta_index(const std::filesystem::path& folder);

// A baseline tensor as found (in the engine's slab or an HF folder), and the check a
// source rank makes before writing: dtype, shape, canonical layout (contiguous,
// row-major, the byte count dtype and shape imply). "" when it matches.
struct BaselineTensorInfo {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  size_t bytes = 0;
  bool contiguous = true;
};
std::string baseline_mismatch(const std::string& name, const BaselineTensorInfo& baseline, DType dtype,
                              const std::vector<int64_t>& shape);

}  // namespace tandem
