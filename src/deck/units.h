// Quantities with units in the deck: sizes in bytes and durations in seconds. Each parses
// the spellings a user writes (4KiB, 1.5GiB, 250ms, 5min) and formats back to a spelling
// that parses to the same value, so a resolved deck reads like a hand-written one.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace boost {
class any;
}

namespace tandem {

struct Bytes {
  uint64_t value = 0;
  friend bool operator==(const Bytes&, const Bytes&) = default;
};

struct Seconds {
  double value = 0;
  friend bool operator==(const Seconds&, const Seconds&) = default;
};

// Both throw std::invalid_argument with a reason that names the accepted units.
Bytes parse_bytes(const std::string& text);      // 123, 4KB, 4KiB, 1.5GiB ... TiB; unit case-insensitive
Seconds parse_seconds(const std::string& text);  // 30, 30s, 250ms, 5min, 2h

// The shortest text that reads back to the same double (1e-06, 10000, 0.25).
std::string format_number(double value);

std::string format_bytes(Bytes bytes);        // largest unit that is exact: 1536MiB, 1500KB, 1234
std::string format_seconds(Seconds seconds);  // shortest exact form in seconds: 0.25s

// Boost.Program_options finds these by argument-dependent lookup for po::value<Bytes>() and
// po::value<Seconds>(); the std::invalid_argument from the parsers passes through unchanged.
void validate(boost::any& value, const std::vector<std::string>& tokens, Bytes*, int);
void validate(boost::any& value, const std::vector<std::string>& tokens, Seconds*, int);

}  // namespace tandem
