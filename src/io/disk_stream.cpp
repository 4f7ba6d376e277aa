#include "io/disk_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tandem {

namespace {

// 64 MiB pieces, and up to 256 MiB between the buffered writes and the disk: big enough
// for the disk's queue to stay full (the kernel splits a direct piece into many requests
// in flight at once), small against the host's memory.
constexpr size_t kPieceBytes = size_t{64} << 20;
constexpr size_t kMaxInFlightBytes = size_t{256} << 20;
static_assert(kPieceBytes % DiskStream::kBlockBytes == 0, "direct pieces end on block boundaries");

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, int error) {
  throw std::runtime_error(path.string() + ": " + what + ": " + std::strerror(error));
}

// Writes all `bytes` at `offset`; returns 0, or the errno of the write that failed.
int write_fully(int fd, const char* data, size_t bytes, uint64_t offset) {
  size_t done = 0;
  while (done < bytes) {
    const ssize_t written = ::pwrite(fd, data + done, bytes - done, static_cast<off_t>(offset + done));
    if (written < 0 && errno == EINTR) continue;
    if (written < 0) return errno;
    if (written == 0) return EIO;  // no progress and no reason: not a write to retry
    done += static_cast<size_t>(written);
  }
  return 0;
}

// The memory alignment direct writes into `fd` need, or 0 when the file takes none that
// DiskStream can give (offsets on kBlockBytes boundaries, memory on at most one block):
// statx's STATX_DIOALIGN where the filesystem reports it (Linux 6.1 on; an offset
// alignment of 0 there means no direct I/O at all), else a page, the most that the older
// kernels' rule (the device's logical block) asks of common disks. A filesystem that
// still refuses says EINVAL, at open or at the first write.
size_t direct_memory_alignment(int fd) {
#ifdef STATX_DIOALIGN
  struct statx status {};
  if (::statx(fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &status) == 0 && (status.stx_mask & STATX_DIOALIGN)) {
    const size_t offset = status.stx_dio_offset_align, memory = status.stx_dio_mem_align;
    if (offset == 0 || DiskStream::kBlockBytes % offset != 0 || memory == 0 || DiskStream::kBlockBytes % memory != 0)
      return 0;
    return memory;
  }
#else
  (void)fd;
#endif
  return DiskStream::kBlockBytes;
}

}  // namespace

DiskStream::DiskStream(std::filesystem::path path, DiskWrites writes) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) fail(path_, "cannot open for writing", errno);
  if (writes == DiskWrites::Buffered) return;
  memory_alignment_ = direct_memory_alignment(fd_);
  if (memory_alignment_ == 0) return;
  direct_fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC | O_DIRECT);
  if (direct_fd_ < 0 && errno != EINVAL) {  // EINVAL: the filesystem takes no O_DIRECT
    const int error = errno;
    ::close(fd_);
    fd_ = -1;
    fail(path_, "cannot open for direct writes", error);
  }
}

DiskStream::~DiskStream() {
  if (direct_fd_ >= 0) ::close(direct_fd_);
  if (fd_ >= 0) ::close(fd_);
}

void DiskStream::write_at(uint64_t offset, const void* data, size_t bytes) {
  const char* from = static_cast<const char*>(data);
  const uint64_t end = offset + bytes;
  const uint64_t blocks_begin = (offset + kBlockBytes - 1) / kBlockBytes * kBlockBytes;
  const uint64_t blocks_end = end / kBlockBytes * kBlockBytes;
  if (!direct() || blocks_end <= blocks_begin) {
    write_paced(offset, from, bytes);
    return;
  }
  // The partial blocks share their pages with neighbouring objects, which the page cache
  // merges; the whole blocks between them are this range's alone.
  write_cached(offset, from, blocks_begin - offset);
  write_direct(blocks_begin, from + (blocks_begin - offset), blocks_end - blocks_begin);
  write_cached(blocks_end, from + (blocks_end - offset), end - blocks_end);
}

void DiskStream::write_direct(uint64_t offset, const char* data, size_t bytes) {
  while (bytes > 0) {
    if (!direct()) {
      write_paced(offset, data, bytes);
      return;
    }
    const size_t piece = std::min(bytes, kPieceBytes);
    const char* source = data;
    if (reinterpret_cast<uintptr_t>(data) % memory_alignment_ != 0) {
      if (!staging_) staging_.reset(static_cast<char*>(std::aligned_alloc(kBlockBytes, kPieceBytes)));
      if (!staging_)
        throw std::runtime_error(path_.string() + ": cannot allocate the " + std::to_string(kPieceBytes >> 20) +
                                 " MiB staging buffer of its direct writes");
      std::memcpy(staging_.get(), data, piece);
      source = staging_.get();
    }
    const int error = write_fully(direct_fd_, source, piece, offset);
    if (error == EINVAL) {  // refused after all: this piece and the rest through the page cache
      stop_direct_writes();
      continue;
    }
    if (error != 0)
      fail(path_, "cannot write " + std::to_string(piece) + " bytes at offset " + std::to_string(offset) + " (O_DIRECT)",
           error);
    direct_bytes_ += piece;
    data += piece;
    offset += piece;
    bytes -= piece;
  }
}

void DiskStream::stop_direct_writes() {
  ::close(direct_fd_);
  direct_fd_ = -1;
  staging_.reset();
}

void DiskStream::write_cached(uint64_t offset, const char* data, size_t bytes) {
  if (const int error = write_fully(fd_, data, bytes, offset); error != 0)
    fail(path_, "cannot write " + std::to_string(bytes) + " bytes at offset " + std::to_string(offset), error);
}

void DiskStream::write_paced(uint64_t offset, const char* data, size_t bytes) {
  while (bytes > 0) {
    const size_t piece = std::min(bytes, kPieceBytes);
    write_cached(offset, data, piece);
    start_writeback({offset, piece});
    data += piece;
    offset += piece;
    bytes -= piece;
  }
}

void DiskStream::start_writeback(Range range) {
  if (::sync_file_range(fd_, static_cast<off_t>(range.offset), static_cast<off_t>(range.bytes), SYNC_FILE_RANGE_WRITE) != 0)
    fail(path_, "cannot start the writeback at offset " + std::to_string(range.offset), errno);
  in_flight_.push_back(range);
  in_flight_bytes_ += range.bytes;
  while (in_flight_bytes_ > kMaxInFlightBytes) {
    wait_for(in_flight_.front());
    in_flight_bytes_ -= in_flight_.front().bytes;
    in_flight_.pop_front();
  }
}

void DiskStream::wait_for(Range range) {
  const unsigned all = SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER;
  if (::sync_file_range(fd_, static_cast<off_t>(range.offset), static_cast<off_t>(range.bytes), all) != 0)
    fail(path_, "writeback failed at offset " + std::to_string(range.offset), errno);
  // Clean pages now: dropping them frees the cache without a write.
  ::posix_fadvise(fd_, static_cast<off_t>(range.offset), static_cast<off_t>(range.bytes), POSIX_FADV_DONTNEED);
}

void DiskStream::close() {
  const int direct_closed = direct_fd_ >= 0 ? ::close(direct_fd_) : 0;
  const int direct_error = errno;
  direct_fd_ = -1;
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail(path_, "close failed", errno);
  if (direct_closed != 0) fail(path_, "close failed (O_DIRECT)", direct_error);
}

}  // namespace tandem
