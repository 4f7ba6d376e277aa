// Checkpoints: one HDF5 file per step, `ckpt_<step, 8 digits>.h5`, in the run folder.
//
//   /                      attributes format, format_version, version, git_revision,
//                          step, data_cursor, and complete = 1, written last
//   /deck                  the resolved deck, one string
//   /rng_states/rank_<r>   one uint8 tensor per rank (the state's bytes); attribute ranks
//   /tensors/<name>        every tensor, with attributes dtype, shape and xxh3_64 (the
//                          XXH3-64 of its raw bytes, 16 hex digits; rng states too)
//
// A kill at any instant leaves the previous checkpoint loadable: the file is written
// under a temporary name (`.ckpt_<step>.h5.tmp`), marked complete, flushed, closed and
// fsynced, then renamed into place and the folder fsynced. A file under the final name
// is therefore always whole; `complete` guards against copies and hand edits as well,
// and the checksums against bytes that changed on disk: read_tensor verifies them.
// The tensors' bytes bypass H5Dwrite: HDF5 allocates each dataset's contiguous storage,
// those of 64 KiB and more on 4 KiB boundaries, and the bytes go there in large writes
// past the page cache (disk_stream.h). HDF5 objects carry no modification times, so one
// state always makes the same file, whichever way its bytes went to the disk.
//
// A checkpoint may have companions, `<what>.ckpt_<step>.h5` beside it (the run file as
// of that step: run.ckpt_<step>.h5), written durably before the checkpoint is committed;
// pruning removes them with their checkpoint, and those whose checkpoint never came.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <stdexcept>
#include <stop_token>
#include <string>
#include <utility>
#include <vector>

#include "io/disk_stream.h"
#include "io/hdf5_file.h"
#include "tensor/tensor.h"

namespace tandem {

struct CheckpointContents {
  int64_t step = 0;
  int64_t data_cursor = 0;
  std::string deck_text;
  std::vector<std::string> rng_states;                  // one per rank, arbitrary bytes
  std::vector<std::pair<std::string, Tensor>> tensors;  // contiguous host tensors
};

std::string checkpoint_file_name(int64_t step);  // "ckpt_00000010.h5"
std::string checkpoint_companion_name(const std::string& what, int64_t step);  // "run.ckpt_00000010.h5"

// What write_checkpoint_temporary throws when `stop` asked it to give up.
struct CheckpointAbandoned : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Stage 1: the whole checkpoint under its temporary name, closed and fsynced. Returns
// that path. On failure the temporary file is removed and the error rethrown; a stop
// requested through `stop` ends it between two tensors (CheckpointAbandoned). `writes`:
// how the tensors' bytes reach the disk (the same file either way).
std::filesystem::path write_checkpoint_temporary(const std::filesystem::path& folder,
                                                 const CheckpointContents& contents, std::stop_token stop = {},
                                                 DiskWrites writes = DiskWrites::Direct);
// Stage 2: renames the temporary of `step` into place, fsyncs the folder, then removes
// stale temporaries and complete checkpoints beyond the newest `keep_last` (0 keeps all).
// Checkpoints of steps after `step` are removed too: they belong to the timeline that a
// restart from an older checkpoint abandoned, and `restart = auto` must not return to it.
std::filesystem::path commit_checkpoint(const std::filesystem::path& folder, int64_t step, int keep_last);
// Both stages.
std::filesystem::path write_checkpoint(const std::filesystem::path& folder, const CheckpointContents& contents,
                                       int keep_last);

// Every file named like a checkpoint, newest step first, loadable or not (restart = auto
// falls back along this list when the newest fails its checks).
std::vector<std::filesystem::path> checkpoints_newest_first(const std::filesystem::path& folder);

// A complete checkpoint opened for reading; the file stays open while the object lives.
class Checkpoint {
 public:
  // Throws when the file is not a complete checkpoint, or is named ckpt_<n>.h5 and holds
  // another step (a copy under the wrong name).
  static Checkpoint open(const std::filesystem::path& path);

  const std::filesystem::path& path() const { return path_; }
  int64_t step() const { return step_; }
  int64_t data_cursor() const { return data_cursor_; }
  const std::string& deck_text() const { return deck_text_; }
  const std::vector<std::string>& rng_states() const { return rng_states_; }
  const std::string& version() const { return version_; }
  const std::string& git_revision() const { return git_revision_; }
  const std::vector<hdf5::TensorInfo>& tensors() const { return tensors_; }

  bool has_tensor(const std::string& name) const;
  const hdf5::TensorInfo& tensor(const std::string& name) const;  // throws when missing
  // Fills `destination` after checking its dtype and shape against the stored ones, then
  // its bytes against the stored checksum (BadInputError naming the file and tensor).
  void read_tensor(const std::string& name, const Tensor& destination) const;

 private:
  Checkpoint(std::filesystem::path path, hdf5::File file);

  std::filesystem::path path_;
  hdf5::File file_;
  int64_t format_version_ = 0;
  int64_t step_ = 0;
  int64_t data_cursor_ = 0;
  std::string deck_text_;
  std::vector<std::string> rng_states_;
  std::string version_;
  std::string git_revision_;
  std::vector<hdf5::TensorInfo> tensors_;
};

}  // namespace tandem
