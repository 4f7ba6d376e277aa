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
#include <iostream>
#include <stdexcept>

namespace tandem {

namespace logging = boost::log;
namespace expr = boost::log::expressions;

BOOST_LOG_ATTRIBUTE_KEYWORD(rank_attr, "Rank", int)
BOOST_LOG_ATTRIBUTE_KEYWORD(step_attr, "Step", long)
BOOST_LOG_ATTRIBUTE_KEYWORD(time_attr, "TimeStamp", boost::posix_time::ptime)

namespace {

LogOptions current_options;
logging::attributes::mutable_constant<long> step_value(-1);
boost::shared_ptr<logging::sinks::synchronous_sink<logging::sinks::text_ostream_backend>> console_sink;
boost::shared_ptr<logging::sinks::synchronous_sink<logging::sinks::text_file_backend>> file_sink;

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
    core->add_sink(console_sink);
  }
}

void add_log_file(const std::filesystem::path& folder) {
  auto core = logging::core::get();
  if (file_sink) core->remove_sink(file_sink);
  const std::string name = current_options.rank == 0 ? "tandem.log" : "tandem.rank" + std::to_string(current_options.rank) + ".log";
  auto backend = boost::make_shared<logging::sinks::text_file_backend>(
      logging::keywords::file_name = (folder / name).string(),
      logging::keywords::open_mode = std::ios_base::out | std::ios_base::app);
  backend->auto_flush(true);
  file_sink = boost::make_shared<decltype(file_sink)::element_type>(backend);
  file_sink->set_formatter(&format_record);
  core->add_sink(file_sink);
}

void set_log_step(long step) { step_value.set(step); }

LogLevel parse_log_level(const std::string& name) {
  LogLevel level;
  if (!logging::trivial::from_string(name.c_str(), name.size(), level))
    throw std::invalid_argument("unknown log level '" + name + "'");
  return level;
}

}  // namespace tandem
