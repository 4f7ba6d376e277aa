// What one deck option is: its key, type, default, unit, help line and the range or choices
// its values must fall in. options.cpp lists tandem's options as one line each.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "deck/units.h"

namespace boost::program_options {
class value_semantic;
}

namespace tandem {

enum class OptionType {
  Bool,     // true/false, yes/no, on/off, 1/0
  Int,      // int64_t
  Double,   // finite double
  String,   // any text (no '#': it starts a comment)
  Path,     // a string that, when not empty, must name an existing file or folder
  Choice,   // one of `choices`
  List,     // comma-separated items, each one of `choices`
  Bytes,    // tandem::Bytes
  Seconds,  // tandem::Seconds
};

// The C++ type each option type resolves to: String, Path and Choice give std::string,
// List gives std::vector<std::string>.
using OptionValue = std::variant<bool, int64_t, double, std::string, tandem::Bytes, tandem::Seconds, std::vector<std::string>>;

// Allowed numeric interval; a missing bound is unbounded. Bytes and Seconds compare in bytes
// and seconds.
struct Range {
  std::optional<double> min, max;
  bool min_exclusive = false;
};
inline Range at_least(double min) { return {min, std::nullopt, false}; }
inline Range above(double min) { return {min, std::nullopt, true}; }
inline Range between(double min, double max) { return {min, max, false}; }

struct OptionSpec {
  std::string key;  // "section.name"
  OptionType type;
  std::string default_text;  // parsed like a value from the deck, so it is checked too
  std::string unit;          // shown in help; empty when the value has none
  std::string help;
  Range range = {};
  std::vector<std::string> choices = {};

  std::string section() const { return key.substr(0, key.find('.')); }
  std::string name() const { return key.substr(key.find('.') + 1); }
};

// "int >= 0", "auto|cpu|cuda", "list of kv_cache|weight": what help shows as the type.
std::string describe_type(const OptionSpec& spec);

// The Boost.Program_options semantic that converts one token to this option's C++ type.
// The caller owns it (options_description takes ownership when given it).
const boost::program_options::value_semantic* make_value_semantic(const OptionSpec& spec);

// Converts `text` through the option's Boost semantic, then checks range, choices and path
// existence. Throws std::invalid_argument whose message is the reason, without the key.
OptionValue parse_option_value(const OptionSpec& spec, const std::string& text);

// The text that parse_option_value reads back to the same value.
std::string format_option_value(const OptionSpec& spec, const OptionValue& value);

}  // namespace tandem
