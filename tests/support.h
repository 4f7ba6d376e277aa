// Helpers shared by the test programs.
#pragma once
#include <filesystem>
#include <string>
#include <vector>

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

// A shell command line started in the background, its stdout and stderr going to a file,
// to be signalled while it runs. The destructor kills it (SIGKILL) if it still runs.
class BackgroundCommand {
 public:
  BackgroundCommand(const std::string& command, const std::filesystem::path& output);
  ~BackgroundCommand();
  int pid() const { return pid_; }
  // Sends `signal` to the process (sh execs the command line's last program, e.g. mpirun).
  void signal(int signal) const;
  // The process ids whose parent is this process (mpirun's ranks).
  std::vector<int> children() const;
  // Waits for the end: the exit code, 128 + N when signal N ended it.
  int wait();
  // True when it has ended within `seconds`; then wait() returns at once.
  bool ended_within(double seconds);

 private:
  int pid_ = -1;
  int status_ = -1;
};

// Waits until `path` contains `text`; false after `seconds`.
bool wait_for_text(const std::filesystem::path& path, const std::string& text, double seconds);

// The run files (run.h5) of two run folders hold the same steps and, for the metrics that
// do not measure time, the same values bit for bit.
void expect_same_metrics(const std::filesystem::path& folder_a, const std::filesystem::path& folder_b);

// Path of the built tandem executable and of the source tree.
std::string tandem_binary();
std::filesystem::path source_dir();

// True when a CUDA device can be used by this process.
bool cuda_device_available();

}  // namespace tandem::testing
