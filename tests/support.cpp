#include "support.h"

#include <array>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>
#include <stdexcept>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "io/run_file.h"

#ifdef TANDEM_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tandem::testing {

TempDir::TempDir(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
  if (!mkdtemp(pattern.data())) throw std::runtime_error("mkdtemp failed for " + pattern);
  path_ = pattern;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

void write_text(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

CommandResult run_command(const std::string& command) {
  CommandResult result;
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (!pipe) throw std::runtime_error("popen failed for " + command);
  std::array<char, 4096> chunk;
  size_t n;
  while ((n = fread(chunk.data(), 1, chunk.size(), pipe)) > 0) result.output.append(chunk.data(), n);
  const int status = pclose(pipe);
  result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

BackgroundCommand::BackgroundCommand(const std::string& command, const std::filesystem::path& output) {
  const std::string line = "exec " + command + " > '" + output.string() + "' 2>&1";
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed for " + command);
  if (pid_ == 0) {
    execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
}

BackgroundCommand::~BackgroundCommand() {
  if (status_ >= 0) return;
  kill(pid_, SIGKILL);
  for (int child : children()) kill(child, SIGKILL);
  waitpid(pid_, nullptr, 0);
}

void BackgroundCommand::signal(int signal) const { kill(pid_, signal); }

std::vector<int> BackgroundCommand::children() const {
  std::vector<int> found;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    // /proc/PID/stat: "PID (COMM) STATE PPID ..."; COMM may hold spaces, so after the last ')'.
    const std::string stat = read_text(entry.path() / "stat");
    const size_t close = stat.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(stat.substr(close + 1));
    std::string state;
    int parent = 0;
    rest >> state >> parent;
    if (parent == pid_) found.push_back(std::stoi(name));
  }
  return found;
}

int BackgroundCommand::wait() {
  if (status_ < 0) waitpid(pid_, &status_, 0);
  return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_);
}

bool BackgroundCommand::ended_within(double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (status_ < 0) {
    if (waitpid(pid_, &status_, WNOHANG) == pid_) break;
    status_ = -1;
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

bool wait_for_text(const std::filesystem::path& path, const std::string& text, double seconds) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (read_text(path).find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void expect_same_metrics(const std::filesystem::path& folder_a, const std::filesystem::path& folder_b) {
  const RunFile a = RunFile::open(folder_a / kRunFileName), b = RunFile::open(folder_b / kRunFileName);
  EXPECT_EQ(b.steps(), a.steps());
  for (const char* metric : {"data_cursor", "reward_mean", "accuracy", "response_length", "loss", "grad_norm", "entropy"})
    EXPECT_EQ(b.metric(metric), a.metric(metric)) << metric;
}

// The build's binary; where the tests run from a pack on another machine (the GPU one),
// the tandem found on PATH.
std::string tandem_binary() {
  if (std::filesystem::exists(TANDEM_BINARY)) return TANDEM_BINARY;
  return "tandem";
}
std::filesystem::path source_dir() { return TANDEM_SOURCE_DIR; }

bool cuda_device_available() {
#ifdef TANDEM_HAVE_CUDA
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
#else
  return false;
#endif
}

}  // namespace tandem::testing
