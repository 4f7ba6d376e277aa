#include "world/log.h"

#include <boost/core/null_deleter.hpp>
#include <boost/log/attributes/constant.hpp>
#include <boost/log/attributes/mutable_constant.hpp>
#include <boost/log/core.hpp>
#include <boost/log/expressions.hpp>
#include <boost/log/sinks/sync_frontend.hpp>
#include <boost/log/sinks/text_file_backend.hpp>
#include <boost/log/sinks/text_ostream_backend.hpp>
#include <boost/log/support/date_time.hpp>
#include <boost/log/attributes/clock.hpp>
#include <boost/log/sinks/basic_sink_backend.hpp>
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <stdexcept>

namespace tandem {

namespace logging = boost::log;
namespace expr = boost::log::expressions;

BOOST_LOG_ATTRIBUTE_KEYWORD(rank_attr, "Rank", int)
BOOST_LOG_ATTRIBUTE_KEYWORD(step_attr, "Step", long)
BOOST_LOG_ATTRIBUTE_KEYWORD(time_attr, "TimeStamp", boost::posix_time::ptime)
BOOST_LOG_ATTRIBUTE_KEYWORD(file_only_attr, "FileOnly", bool)

namespace {

// The log file through write(2), so a write that fails (a full disk, a file-size limit)
// is seen: the first failure is said once on stderr, where the console sink goes on
// printing the same lines. Boost's text_file_backend drops them without a word. The
// file is opened at the first line, so a rank with nothing to say leaves none.
class CheckedFileBackend
    : public logging::sinks::basic_formatted_sink_backend<char, logging::sinks::synchronized_feeding> {
 public:
  explicit CheckedFileBackend(std::filesystem::path path) : path_(std::move(path)) {}
  ~CheckedFileBackend() {
    if (fd_ >= 0) ::close(fd_);
  }
  CheckedFileBackend(const CheckedFileBackend&) = delete;
  CheckedFileBackend& operator=(const CheckedFileBackend&) = delete;

  void consume(const logging::record_view&, const std::string& line) {
    if (fd_ < 0) fd_ = ::open(path_.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return report(errno);
    const std::string text = line + "\n";
    size_t written = 0;
    while (written < text.size()) {
      const ssize_t n = ::write(fd_, text.data() + written, text.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return report(n < 0 ? errno : ENOSPC);
      written += static_cast<size_t>(n);
    }
  }

 private:
  void report(int error) {
    if (reported_) return;
    reported_ = true;
    std::cerr << "tandem: cannot write the log file " << path_.string() << " (" << std::strerror(error)
              << "): its lines from here on are on stderr only" << std::endl;
  }

  std::filesystem::path path_;
  int fd_ = -1;
  bool reported_ = false;
};

LogOptions current_options;
logging::attributes::mutable_constant<long> step_value(-1);
boost::shared_ptr<logging::sinks::synchronous_sink<logging::sinks::text_ostream_backend>> console_sink;
boost::shared_ptr<logging::sinks::synchronous_sink<CheckedFileBackend>> file_sink;

void format_record(const logging::record_view& record, logging::formatting_ostream& out) {
  const auto step = record[step_attr];
  out << boost::posix_time::to_simple_string(record[time_attr].get()).substr(12) << " [r" << record[rank_attr]
      << "] [step ";
  if (step && *step >= 0)
    out << *step;
  else
    out << "-";
  out << "] " << record[logging::trivial::severity] << ": " << record[expr::smessage];
}

// Rank 0 at the chosen level; other ranks at warning unless all ranks were asked for.
bool passes(const logging::attribute_value_set& values) {
  const auto severity = values[logging::trivial::severity];
  if (!severity) return true;
  const LogLevel floor = (current_options.rank == 0 || current_options.all_ranks)
                             ? current_options.level
                             : std::max(current_options.level, logging::trivial::warning);
  return *severity >= floor;
}

}  // namespace

boost::log::sources::severity_logger_mt<LogLevel>& logger() {
  static boost::log::sources::severity_logger_mt<LogLevel> instance;
  return instance;
}

void init_logging(const LogOptions& options) {
  current_options = options;
  auto core = logging::core::get();
  core->add_global_attribute("Rank", logging::attributes::constant<int>(options.rank));
  core->add_global_attribute("Step", step_value);
  core->add_global_attribute("TimeStamp", logging::attributes::local_clock());
  core->set_filter(&passes);
  if (!console_sink) {
    auto backend = boost::make_shared<logging::sinks::text_ostream_backend>();
    backend->add_stream(boost::shared_ptr<std::ostream>(&std::clog, boost::null_deleter()));
    backend->auto_flush(true);
    console_sink = boost::make_shared<decltype(console_sink)::element_type>(backend);
    console_sink->set_formatter(&format_record);
    console_sink->set_filter(!expr::has_attr(file_only_attr));
    core->add_sink(console_sink);
  }
}

void add_log_file(const std::filesystem::path& folder) {
  auto core = logging::core::get();
  if (file_sink) core->remove_sink(file_sink);
  const std::string name = current_options.rank == 0 ? "tandem.log" : "tandem.rank" + std::to_string(current_options.rank) + ".log";
  auto backend = boost::make_shared<CheckedFileBackend>(folder / name);
  file_sink = boost::make_shared<decltype(file_sink)::element_type>(backend);
  file_sink->set_formatter(&format_record);
  core->add_sink(file_sink);
}

void log_fatal_to_file(const std::string& message) {
  // The attribute must be the logger's: sinks filter a record before its stream runs.
  static boost::log::sources::severity_logger_mt<LogLevel> file_only = [] {
    boost::log::sources::severity_logger_mt<LogLevel> logger;
    logger.add_attribute("FileOnly", logging::attributes::constant<bool>(true));
    return logger;
  }();
  if (file_sink) BOOST_LOG_SEV(file_only, logging::trivial::fatal) << message;
}

void set_log_step(long step) { step_value.set(step); }

LogLevel parse_log_level(const std::string& name) {
  LogLevel level;
  if (!logging::trivial::from_string(name.c_str(), name.size(), level))
    throw std::invalid_argument("unknown log level '" + name + "'");
  return level;
}

}  // namespace tandem
