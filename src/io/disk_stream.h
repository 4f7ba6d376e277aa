// Large writes into an existing file at the disk's own rate. A buffered write of many GB
// fills the page cache with dirty pages that reach the disk only when the kernel's
// thresholds or the final fsync push them, so the disk idles first and the fsync waits
// for everything at the end. DiskStream starts the writeback of each piece as soon as it
// is written (sync_file_range), keeps a bounded amount in flight, and drops the written
// pages from the cache (they are not read again, and on a host that maps the optimizer
// state from a file they would crowd it out). Durability is still the caller's fsync.
#pragma once
#include <cstddef>
#include <cstdint>
#include <deque>
#include <filesystem>

namespace tandem {

class DiskStream {
 public:
  // Opens `path` (which must exist) for writing; throws std::runtime_error naming it.
  explicit DiskStream(std::filesystem::path path);
  ~DiskStream();
  DiskStream(const DiskStream&) = delete;
  DiskStream& operator=(const DiskStream&) = delete;

  // Writes `bytes` at `offset`, in pieces; throws naming the file and the offset on a
  // failure (a full disk, an I/O error).
  void write_at(uint64_t offset, const void* data, size_t bytes);
  // Closes the file; the caller's fsync waits for the last pieces (up to 256 MiB), so a
  // small file costs one round trip to the disk, as a plain write and fsync would.
  void close();

 private:
  struct Range {
    uint64_t offset;
    size_t bytes;
  };
  void start_writeback(Range range);
  void wait_for(Range range);

  std::filesystem::path path_;
  int fd_ = -1;
  std::deque<Range> in_flight_;
  size_t in_flight_bytes_ = 0;
};

}  // namespace tandem
