#include "train/optimizer_state_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tandem {

namespace {

[[noreturn]] void fail(const std::filesystem::path& path, size_t bytes, const std::string& what, int error) {
  throw std::runtime_error("optimizer state file " + path.string() + " (" + std::to_string(bytes) +
                           " bytes): " + what + ": " + std::strerror(error));
}

}  // namespace

OptimizerStateFile::OptimizerStateFile(std::filesystem::path path, size_t bytes) : path_(std::move(path)), bytes_(bytes) {
  descriptor_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (descriptor_ < 0) fail(path_, bytes_, "cannot create it", errno);
  // Beyond RLIMIT_FSIZE the kernel sends SIGXFSZ, which would kill the job without a
  // word; ignored, the call fails with EFBIG and the job says why.
  struct sigaction ignore {}, previous {};
  ignore.sa_handler = SIG_IGN;
  sigaction(SIGXFSZ, &ignore, &previous);
  const int status = ::posix_fallocate(descriptor_, 0, static_cast<off_t>(bytes_));
  sigaction(SIGXFSZ, &previous, nullptr);
  if (status != 0) {
    ::close(descriptor_);
    ::unlink(path_.c_str());
    fail(path_, bytes_, "cannot reserve the space (posix_fallocate)", status);
  }
  data_ = ::mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor_, 0);
  if (data_ == MAP_FAILED) {
    const int error = errno;
    data_ = nullptr;
    ::close(descriptor_);
    ::unlink(path_.c_str());
    fail(path_, bytes_, "cannot map it", error);
  }
}

OptimizerStateFile::~OptimizerStateFile() {
  if (data_) ::munmap(data_, bytes_);
  if (descriptor_ >= 0) ::close(descriptor_);
  ::unlink(path_.c_str());
}

double OptimizerStateFile::sync() {
  const auto start = std::chrono::steady_clock::now();
  if (::msync(data_, bytes_, MS_SYNC) != 0) fail(path_, bytes_, "msync failed", errno);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace tandem
