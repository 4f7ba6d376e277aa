// Logging through Boost.Log, one format everywhere: time, rank, step, level, message.
// Rank 0 logs info and above; other ranks only warnings and errors unless asked,
// so an N-rank job prints one readable stream.
#pragma once
#include <boost/log/sources/record_ostream.hpp>
#include <boost/log/sources/severity_logger.hpp>
#include <boost/log/trivial.hpp>
#include <filesystem>
#include <string>

namespace tandem {

using LogLevel = boost::log::trivial::severity_level;

struct LogOptions {
  int rank = 0;
  LogLevel level = boost::log::trivial::info;
  bool all_ranks = false;  // ranks other than 0 log at `level` too
};

// Console sink (stderr). Safe to call again to change the options.
void init_logging(const LogOptions& options);
// Adds a file sink: rank 0 writes FOLDER/tandem.log, rank r writes FOLDER/tandem.rank<r>.log
// (created only when that rank has something to say). A failed write is reported once on
// stderr.
void add_log_file(const std::filesystem::path& folder);
// A fatal error, to the log file only: main() prints it on stderr as the job ends.
void log_fatal_to_file(const std::string& message);
// The step shown in every line from now on (-1 shows "-").
void set_log_step(long step);
LogLevel parse_log_level(const std::string& name);

boost::log::sources::severity_logger_mt<LogLevel>& logger();

}  // namespace tandem

#define TLOG(level) BOOST_LOG_SEV(::tandem::logger(), ::boost::log::trivial::level)
