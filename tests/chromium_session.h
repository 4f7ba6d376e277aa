// Debian's headless Chromium driven over the DevTools protocol on a pipe, so a test can
// wait for what a page does after its load event (work done in idle time, a paint) and
// read it back, with no server and no port.
#pragma once
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

namespace tandem::testing {

class ChromiumSession {
 public:
  // Starts Chromium with its profile in `profile_dir` (a new folder: one Chromium a
  // profile) and a window of that size.
  explicit ChromiumSession(const std::filesystem::path& profile_dir, int width = 1400, int height = 1000);
  ~ChromiumSession();
  ChromiumSession(const ChromiumSession&) = delete;
  ChromiumSession& operator=(const ChromiumSession&) = delete;

  // Opens `url` in a new tab and waits for its load event; later calls evaluate there.
  void open(const std::string& url);
  // The value of a JavaScript expression in the page; a promise is awaited. A script
  // error, or no answer within the timeout, throws.
  nlohmann::json evaluate(const std::string& expression);

 private:
  nlohmann::json call(const std::string& method, const nlohmann::json& params, bool in_page = true);
  nlohmann::json next_message();

  int pid_ = -1;
  int to_browser_ = -1;    // Chromium reads its fd 3
  int from_browser_ = -1;  // and writes its fd 4
  std::string received_;
  std::string session_;
  bool load_fired_ = false;
  int next_id_ = 1;
};

}  // namespace tandem::testing
