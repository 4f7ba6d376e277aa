#include "io/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace tandem {

namespace {

[[noreturn]] void fail(const std::filesystem::path& path, const std::string& what, int error) {
  throw std::runtime_error(path.string() + ": " + what + ": " + std::strerror(error));
}

// Closes the descriptor on every path out.
struct Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
  }
};

void copy_bytes(const std::filesystem::path& from, const std::filesystem::path& to) {
  Descriptor source{::open(from.c_str(), O_RDONLY | O_CLOEXEC)};
  if (source.fd < 0) fail(from, "cannot open", errno);
  struct stat status {};
  if (::fstat(source.fd, &status) != 0) fail(from, "cannot stat", errno);
  Descriptor target{::open(to.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (target.fd < 0) fail(to, "cannot create", errno);
  off_t left = status.st_size;
  bool in_kernel = true;
  std::vector<char> buffer;
  while (left > 0) {
    ssize_t copied = -1;
    if (in_kernel) {
      copied = ::copy_file_range(source.fd, nullptr, target.fd, nullptr, static_cast<size_t>(left), 0);
      // Older kernels and some file systems cannot: copy through a buffer instead.
      if (copied < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS || errno == EOPNOTSUPP)) {
        in_kernel = false;
        buffer.resize(1 << 20);
        continue;
      }
    } else {
      copied = ::read(source.fd, buffer.data(), buffer.size());
      if (copied > 0 && ::write(target.fd, buffer.data(), static_cast<size_t>(copied)) != copied) copied = -1;
    }
    if (copied < 0) fail(to, "cannot copy " + from.string() + " there", errno);
    if (copied == 0) throw std::runtime_error(from.string() + ": shrank while being copied to " + to.string());
    left -= copied;
  }
  if (::fsync(target.fd) != 0) fail(to, "fsync failed", errno);
  const int closed = ::close(target.fd);
  target.fd = -1;
  if (closed != 0) fail(to, "close failed", errno);
}

}  // namespace

void fsync_path(const std::filesystem::path& path, bool is_folder) {
  Descriptor descriptor{::open(path.c_str(), O_RDONLY | O_CLOEXEC | (is_folder ? O_DIRECTORY : 0))};
  if (descriptor.fd < 0) fail(path, "cannot open for fsync", errno);
  if (::fsync(descriptor.fd) != 0) fail(path, "fsync failed", errno);
}

void durable_copy(const std::filesystem::path& from, const std::filesystem::path& to) {
  const std::filesystem::path temporary = to.parent_path() / ("." + to.filename().string() + ".tmp");
  try {
    copy_bytes(from, temporary);
    std::filesystem::rename(temporary, to);
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(temporary, ignored);
    throw;
  }
  fsync_path(to.parent_path().empty() ? "." : to.parent_path(), true);
}

}  // namespace tandem
