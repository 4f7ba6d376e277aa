// Large writes into an existing file at the disk's own rate, the same rate every time.
// A buffered write of many GB fills the page cache with dirty pages that reach the disk
// when the kernel's thresholds or the final fsync push them, and a second checkpoint
// written while the first one's pages are still going out shares the disk with them (on
// the H200's NVMe two writes in a row ran at 1.39 and 0.93 GB/s). So the whole 4 KiB
// blocks of each range go to the disk with O_DIRECT, past the page cache, and the call
// returns when they are on the device; the partial blocks at a range's two ends (a
// tensor whose size is no multiple of 4 KiB, a small tensor) go through the page cache
// and the caller's fsync. Direct writes need the file offsets on 4 KiB boundaries (the
// caller lays its file out so: checkpoint.cpp aligns HDF5's large datasets) and the
// memory on the boundary the filesystem asks for (statx's STATX_DIOALIGN; 4 KiB where
// the kernel does not say): a range from memory off that boundary goes through an
// aligned staging buffer, one 64 MiB piece at a time.
//
// Where the filesystem refuses O_DIRECT (EINVAL at open, or at a write), every byte goes
// through the page cache instead, paced: the writeback of each piece starts as soon as
// it is written (sync_file_range), at most 256 MiB are in flight, and the written pages
// are dropped from the cache (they are not read again, and on a host that maps the
// optimizer state from a file they would crowd it out). Both ways put the same bytes at
// the same offsets. Durability is the caller's fsync either way.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <memory>

namespace tandem {

enum class DiskWrites {
  Direct,    // O_DIRECT for the whole blocks where the filesystem takes it, else Buffered
  Buffered,  // every byte through the page cache, paced
};

class DiskStream {
 public:
  // The file offsets direct writes start and end on.
  static constexpr size_t kBlockBytes = 4096;

  // Opens `path` (which must exist) for writing; throws std::runtime_error naming it.
  explicit DiskStream(std::filesystem::path path, DiskWrites writes = DiskWrites::Direct);
  ~DiskStream();
  DiskStream(const DiskStream&) = delete;
  DiskStream& operator=(const DiskStream&) = delete;

  // Writes `bytes` at `offset`; throws naming the file and the offset on a failure (a
  // full disk, an I/O error).
  void write_at(uint64_t offset, const void* data, size_t bytes);
  // Closes the file; the caller's fsync waits for what went through the page cache (up to
  // 256 MiB paced, plus the partial blocks), so a small file costs one round trip to the
  // disk, as a plain write and fsync would.
  void close();

  // Whether the whole blocks still go past the page cache (false from the start, or
  // since the filesystem refused a direct write).
  bool direct() const { return direct_fd_ >= 0; }
  uint64_t direct_bytes() const { return direct_bytes_; }  // written with O_DIRECT so far

 private:
  struct Range {
    uint64_t offset;
    size_t bytes;
  };
  void write_direct(uint64_t offset, const char* data, size_t bytes);
  void write_paced(uint64_t offset, const char* data, size_t bytes);
  void write_cached(uint64_t offset, const char* data, size_t bytes);
  void stop_direct_writes();
  void start_writeback(Range range);
  void wait_for(Range range);

  std::filesystem::path path_;
  int fd_ = -1;
  int direct_fd_ = -1;             // the same file opened with O_DIRECT, -1 when refused
  size_t memory_alignment_ = 0;    // what direct writes need of the memory they read
  std::unique_ptr<char, decltype(&std::free)> staging_{nullptr, &std::free};  // for memory off it
  uint64_t direct_bytes_ = 0;
  std::deque<Range> in_flight_;
  size_t in_flight_bytes_ = 0;
};

}  // namespace tandem
