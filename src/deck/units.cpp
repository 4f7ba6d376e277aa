#include "deck/units.h"

#include <boost/any.hpp>
#include <boost/program_options/value_semantic.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <utility>

#include "deck/trim.h"

namespace tandem {
namespace {

struct Unit {
  const char* name;
  double factor;
};

// Binary units first so that formatting prefers them; parsing matches any.
constexpr Unit kByteUnits[] = {
    {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0},
    {"TB", 1e12},             {"GB", 1e9},           {"MB", 1e6},        {"KB", 1e3},
    {"B", 1},
};
constexpr const char* kByteUnitList = "B, KB, KiB, MB, MiB, GB, GiB, TB, TiB (or none for bytes)";

constexpr Unit kTimeUnits[] = {{"ms", 1e-3}, {"s", 1}, {"min", 60}, {"h", 3600}};
constexpr const char* kTimeUnitList = "ms, s, min, h (or none for seconds)";

std::string lowercase(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// "1.5 GiB" -> {"1.5", "GiB"}: the unit starts at the first letter.
std::pair<std::string, std::string> split_number_and_unit(const std::string& text) {
  size_t unit_start = 0;
  while (unit_start < text.size() && !std::isalpha(static_cast<unsigned char>(text[unit_start]))) ++unit_start;
  return {trim_whitespace(text.substr(0, unit_start)), trim_whitespace(text.substr(unit_start))};
}

// True when all of `text` is one number of the given type.
template <class Number>
bool parse_entire(const std::string& text, Number& number) {
  const char* end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, number);
  return error == std::errc() && stop == end && !text.empty();
}

const Unit* find_unit(const Unit* first, const Unit* last, const std::string& name) {
  for (const Unit* unit = first; unit != last; ++unit)
    if (lowercase(unit->name) == lowercase(name)) return unit;
  return nullptr;
}

}  // namespace

Bytes parse_bytes(const std::string& text) {
  const auto [number, unit_name] = split_number_and_unit(text);
  double fractional = 0;
  if (!parse_entire(number, fractional)) throw std::invalid_argument("expected a size such as 4096, 64KiB or 1.5GiB, got '" + text + "'");
  if (fractional < 0) throw std::invalid_argument("size '" + text + "' is negative");
  double factor = 1;
  if (!unit_name.empty()) {
    const Unit* unit = find_unit(std::begin(kByteUnits), std::end(kByteUnits), unit_name);
    if (!unit) throw std::invalid_argument("unknown unit '" + unit_name + "' in '" + text + "': accepted units are " + kByteUnitList);
    factor = unit->factor;
  }
  const std::string too_large = "size '" + text + "' is too large (2^64 bytes or more)";
  // Whole numbers stay in integers so that sizes near 2^64 are exact.
  uint64_t whole = 0;
  if (parse_entire(number, whole)) {
    const auto multiplier = static_cast<uint64_t>(factor);
    if (whole > std::numeric_limits<uint64_t>::max() / multiplier) throw std::invalid_argument(too_large);
    return Bytes{whole * multiplier};
  }
  const double bytes = std::round(fractional * factor);
  if (bytes >= 18446744073709551616.0) throw std::invalid_argument(too_large);
  return Bytes{static_cast<uint64_t>(bytes)};
}

Seconds parse_seconds(const std::string& text) {
  const auto [number, unit_name] = split_number_and_unit(text);
  double value = 0;
  if (!parse_entire(number, value)) throw std::invalid_argument("expected a duration such as 30, 250ms, 5min or 2h, got '" + text + "'");
  if (value < 0) throw std::invalid_argument("duration '" + text + "' is negative");
  double factor = 1;
  if (!unit_name.empty()) {
    const Unit* unit = find_unit(std::begin(kTimeUnits), std::end(kTimeUnits), unit_name);
    if (!unit) throw std::invalid_argument("unknown unit '" + unit_name + "' in '" + text + "': accepted units are " + kTimeUnitList);
    factor = unit->factor;
  }
  return Seconds{value * factor};
}

std::string format_number(double value) {
  // Plain decimals where people write them (500000, 0.25), exponents for the very small or large (1e-06).
  const double magnitude = std::fabs(value);
  const bool plain = magnitude == 0 || (magnitude >= 1e-4 && magnitude < 1e15);
  char buffer[64];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value, plain ? std::chars_format::fixed : std::chars_format::scientific);
  return std::string(buffer, result.ptr);
}

std::string format_bytes(Bytes bytes) {
  if (bytes.value == 0) return "0";
  for (const Unit& unit : kByteUnits) {
    const auto factor = static_cast<uint64_t>(unit.factor);
    if (factor > 1 && bytes.value % factor == 0) return std::to_string(bytes.value / factor) + unit.name;
  }
  return std::to_string(bytes.value);
}

std::string format_seconds(Seconds seconds) { return format_number(seconds.value) + "s"; }

void validate(boost::any& value, const std::vector<std::string>& tokens, Bytes*, int) {
  boost::program_options::validators::check_first_occurrence(value);
  value = parse_bytes(boost::program_options::validators::get_single_string(tokens));
}

void validate(boost::any& value, const std::vector<std::string>& tokens, Seconds*, int) {
  boost::program_options::validators::check_first_occurrence(value);
  value = parse_seconds(boost::program_options::validators::get_single_string(tokens));
}

}  // namespace tandem
