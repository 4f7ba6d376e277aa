// The optimizer's state on a local disk (optimizer.state = disk): one file per rank,
// sized with posix_fallocate before it is mapped, so a full disk or a file-size limit is
// an error at start-up naming the path and the bytes, never a SIGBUS on first touch;
// mapped MAP_SHARED, so its pages are file pages the kernel writes back and reclaims
// under memory pressure (RssFile, not RssAnon). The file is scratch: it is created anew
// (truncated) at every start and filled from the checkpoint or zeros, so a file left by
// a killed run is never read; it is removed when the job ends.
#pragma once
#include <cstddef>
#include <filesystem>

namespace tandem {

class OptimizerStateFile {
 public:
  // Throws std::runtime_error naming the path and the bytes when the file cannot be
  // created, sized or mapped.
  OptimizerStateFile(std::filesystem::path path, size_t bytes);
  ~OptimizerStateFile();
  OptimizerStateFile(const OptimizerStateFile&) = delete;
  OptimizerStateFile& operator=(const OptimizerStateFile&) = delete;

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  const std::filesystem::path& path() const { return path_; }
  // msync(MS_SYNC) of the whole mapping: the dirty pages reach the disk now (after each
  // checkpoint, on the writer's thread) rather than whenever the kernel chooses; writes
  // into the mapping may go on meanwhile. Returns the seconds it took.
  double sync();

 private:
  std::filesystem::path path_;
  size_t bytes_ = 0;
  int descriptor_ = -1;
  void* data_ = nullptr;
};

}  // namespace tandem
