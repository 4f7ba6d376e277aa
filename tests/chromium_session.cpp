#include "chromium_session.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <stdexcept>
#include <thread>

namespace tandem::testing {

using nlohmann::json;

namespace {

// No answer within this is a hung browser: the test fails instead of waiting for ever.
constexpr int kAnswerTimeoutMs = 60000;

}  // namespace

ChromiumSession::ChromiumSession(const std::filesystem::path& profile_dir, int width, int height) {
  // A Chromium that died would end the test by SIGPIPE on our next write: an error instead.
  signal(SIGPIPE, SIG_IGN);
  int commands[2], answers[2];
  if (pipe(commands) != 0 || pipe(answers) != 0) throw std::runtime_error("pipe failed for Chromium");
  const std::string user_data = "--user-data-dir=" + profile_dir.string();
  const std::string window = "--window-size=" + std::to_string(width) + "," + std::to_string(height);
  pid_ = fork();
  if (pid_ < 0) throw std::runtime_error("fork failed for Chromium");
  if (pid_ == 0) {
    // Above 4 first, so the dup2 below cannot close an end it still needs.
    const int in = fcntl(commands[0], F_DUPFD, 10), out = fcntl(answers[1], F_DUPFD, 10);
    dup2(in, 3);
    dup2(out, 4);
    const int null = ::open("/dev/null", O_RDWR);
    dup2(null, 0);
    dup2(null, 1);
    dup2(null, 2);  // D-Bus complaints in a container
    for (int fd = 5; fd < 64; ++fd) close(fd);
    // As root Chromium needs --no-sandbox.
    execlp("chromium", "chromium", "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync", user_data.c_str(),
           window.c_str(), "--remote-debugging-pipe", "about:blank", static_cast<char*>(nullptr));
    _exit(127);
  }
  close(commands[0]);
  close(answers[1]);
  to_browser_ = commands[1];
  from_browser_ = answers[0];
}

ChromiumSession::~ChromiumSession() {
  try {
    call("Browser.close", json::object(), false);
  } catch (const std::exception&) {
  }
  close(to_browser_);
  close(from_browser_);
  int status = 0;
  for (int waited_ms = 0; waitpid(pid_, &status, WNOHANG) == 0; waited_ms += 50) {
    if (waited_ms >= 10000) {
      kill(pid_, SIGKILL);
      waitpid(pid_, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void ChromiumSession::open(const std::string& url) {
  const json target = call("Target.createTarget", {{"url", "about:blank"}}, false);
  session_ = call("Target.attachToTarget", {{"targetId", target["targetId"]}, {"flatten", true}}, false)["sessionId"];
  call("Page.enable", json::object());
  load_fired_ = false;
  const json navigated = call("Page.navigate", {{"url", url}});
  if (navigated.contains("errorText")) throw std::runtime_error("Chromium cannot open " + url + ": " + navigated["errorText"].get<std::string>());
  while (!load_fired_) {
    const json message = next_message();
    if (message.value("method", "") == "Page.loadEventFired" && message.value("sessionId", "") == session_) load_fired_ = true;
  }
}

json ChromiumSession::evaluate(const std::string& expression) {
  const json answer = call("Runtime.evaluate", {{"expression", expression}, {"awaitPromise", true}, {"returnByValue", true}});
  if (answer.contains("exceptionDetails")) throw std::runtime_error("the page's script failed on " + expression + ": " + answer["exceptionDetails"].dump());
  return answer["result"].value("value", json());
}

json ChromiumSession::call(const std::string& method, const json& params, bool in_page) {
  const int id = next_id_++;
  json command = {{"id", id}, {"method", method}, {"params", params}};
  if (in_page) command["sessionId"] = session_;
  const std::string text = command.dump() + '\0';
  for (size_t sent = 0; sent < text.size();) {
    const ssize_t n = write(to_browser_, text.data() + sent, text.size() - sent);
    if (n <= 0) throw std::runtime_error("Chromium closed its DevTools pipe before " + method);
    sent += static_cast<size_t>(n);
  }
  for (;;) {
    const json message = next_message();
    if (message.value("method", "") == "Page.loadEventFired" && message.value("sessionId", "") == session_) load_fired_ = true;
    if (message.value("id", 0) != id) continue;
    if (message.contains("error")) throw std::runtime_error("Chromium: " + method + ": " + message["error"].dump());
    return message["result"];
  }
}

json ChromiumSession::next_message() {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAnswerTimeoutMs);
  while (received_.find('\0') == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd readable{from_browser_, POLLIN, 0};
    const int ready = left.count() > 0 ? poll(&readable, 1, static_cast<int>(left.count())) : 0;
    if (ready == 0) throw std::runtime_error("Chromium sent nothing for " + std::to_string(kAnswerTimeoutMs / 1000) + " s");
    if (ready < 0) continue;  // a signal
    char chunk[65536];
    const ssize_t n = read(from_browser_, chunk, sizeof chunk);
    if (n <= 0) throw std::runtime_error("Chromium closed its DevTools pipe");
    received_.append(chunk, static_cast<size_t>(n));
  }
  const size_t end = received_.find('\0');
  json message = json::parse(received_.substr(0, end));
  received_.erase(0, end + 1);
  return message;
}

}  // namespace tandem::testing
