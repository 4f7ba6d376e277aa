#include "io/disk_stream.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tandem {

namespace {

// 64 MiB pieces with up to 256 MiB between the writes and the disk: big enough for the
// disk's queue to stay full, small against the host's memory.
constexpr size_t kPieceBytes = size_t{64} << 20;
constexpr size_t kMaxInFlightBytes = size_t{256} << 20;

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, int error) {
  throw std::runtime_error(path.string() + ": " + what + ": " + std::strerror(error));
}

}  // namespace

DiskStream::DiskStream(std::filesystem::path path) : path_(std::move(path)) {
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd_ < 0) fail(path_, "cannot open for writing", errno);
}

DiskStream::~DiskStream() {
  if (fd_ >= 0) ::close(fd_);
}

void DiskStream::write_at(uint64_t offset, const void* data, size_t bytes) {
  const char* from = static_cast<const char*>(data);
  while (bytes > 0) {
    const size_t piece = std::min(bytes, kPieceBytes);
    size_t done = 0;
    while (done < piece) {
      const ssize_t written = ::pwrite(fd_, from + done, piece - done, static_cast<off_t>(offset + done));
      if (written < 0 && errno == EINTR) continue;
      if (written < 0) fail(path_, "cannot write " + std::to_string(piece) + " bytes at offset " + std::to_string(offset + done), errno);
      if (written == 0) throw std::runtime_error(path_.string() + ": wrote nothing at offset " + std::to_string(offset + done));
      done += static_cast<size_t>(written);
    }
    start_writeback({offset, piece});
    from += piece;
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
  const int closed = ::close(fd_);
  fd_ = -1;
  if (closed != 0) fail(path_, "close failed", errno);
}

}  // namespace tandem
