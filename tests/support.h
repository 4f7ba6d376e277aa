// Helpers shared by the test programs.
#pragma once
#include <filesystem>
#include <string>

namespace tandem::testing {

// A fresh, empty folder under the system temp dir, removed when the object dies.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "tandem-test");
  ~TempDir();
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_text(const std::filesystem::path& path, const std::string& text);
std::string read_text(const std::filesystem::path& path);

struct CommandResult {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};
// Runs a shell command line and captures its output.
CommandResult run_command(const std::string& command);

// Path of the built tandem executable and of the source tree.
std::string tandem_binary();
std::filesystem::path source_dir();

// True when a CUDA device can be used by this process.
bool cuda_device_available();

}  // namespace tandem::testing
