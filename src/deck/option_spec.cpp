#include "deck/option_spec.h"

#include <algorithm>
#include <boost/any.hpp>
#include <boost/program_options/errors.hpp>
#include <boost/program_options/value_semantic.hpp>
#include <cmath>
#include <filesystem>
#include <memory>
#include <stdexcept>

#include "deck/trim.h"

namespace tandem {
namespace po = boost::program_options;
namespace {

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string joined;
  for (const std::string& item : items) joined += (joined.empty() ? "" : separator) + item;
  return joined;
}

std::string format_bound(const OptionSpec& spec, double bound) {
  if (spec.type == OptionType::Bytes) return format_bytes(Bytes{static_cast<uint64_t>(bound)});
  if (spec.type == OptionType::Seconds) return format_seconds(Seconds{bound});
  return format_number(bound);
}

// "value >= 0", "0 < value <= 1024"; empty when the option has no range.
std::string describe_range(const OptionSpec& spec) {
  const Range& range = spec.range;
  if (!range.min && !range.max) return "";
  if (!range.max) return std::string("value ") + (range.min_exclusive ? "> " : ">= ") + format_bound(spec, *range.min);
  if (!range.min) return "value <= " + format_bound(spec, *range.max);
  return format_bound(spec, *range.min) + (range.min_exclusive ? " < " : " <= ") + "value <= " + format_bound(spec, *range.max);
}

void check_range(const OptionSpec& spec, double value, const std::string& text) {
  const Range& range = spec.range;
  const bool above_min = !range.min || (range.min_exclusive ? value > *range.min : value >= *range.min);
  const bool below_max = !range.max || value <= *range.max;
  if (!above_min || !below_max) throw std::invalid_argument("out of range: need " + describe_range(spec) + ", got " + text);
}

void check_choice(const OptionSpec& spec, const std::string& item, const std::string& text) {
  if (std::find(spec.choices.begin(), spec.choices.end(), item) != spec.choices.end()) return;
  const std::string got = item == text ? "'" + text + "'" : "'" + item + "' in '" + text + "'";
  throw std::invalid_argument("expected one of " + join(spec.choices, ", ") + ", got " + got);
}

std::vector<std::string> split_list(const OptionSpec& spec, const std::string& text) {
  std::vector<std::string> items;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = trim_whitespace(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (item.empty()) throw std::invalid_argument("empty item in list '" + text + "': expected items of " + join(spec.choices, ", ") + " separated by commas");
    check_choice(spec, item, text);
    if (std::find(items.begin(), items.end(), item) != items.end()) throw std::invalid_argument("'" + item + "' is listed twice in '" + text + "'");
    items.push_back(item);
    if (comma == std::string::npos) return items;
    start = comma + 1;
  }
}

// What a token must look like, for types whose Boost parser throws its own terse error.
std::string expected_phrase(OptionType type) {
  switch (type) {
    case OptionType::Bool: return "a boolean (true/false, yes/no, on/off, 1/0)";
    case OptionType::Int: return "an integer";
    case OptionType::Double: return "a number";
    default: return "a value";
  }
}

}  // namespace

std::string describe_type(const OptionSpec& spec) {
  std::string type;
  switch (spec.type) {
    case OptionType::Bool: type = "bool"; break;
    case OptionType::Int: type = "int"; break;
    case OptionType::Double: type = "number"; break;
    case OptionType::String: type = "string"; break;
    case OptionType::Path: type = "path"; break;
    case OptionType::Choice: type = join(spec.choices, "|"); break;
    case OptionType::List: type = "list of " + join(spec.choices, "|"); break;
    case OptionType::Bytes: type = "size"; break;
    case OptionType::Seconds: type = "duration"; break;
  }
  const std::string range = describe_range(spec);
  return range.empty() ? type : type + ", " + range;
}

const po::value_semantic* make_value_semantic(const OptionSpec& spec) {
  switch (spec.type) {
    case OptionType::Bool: return po::value<bool>();
    case OptionType::Int: return po::value<int64_t>();
    case OptionType::Double: return po::value<double>();
    case OptionType::Bytes: return po::value<Bytes>();
    case OptionType::Seconds: return po::value<Seconds>();
    case OptionType::String:
    case OptionType::Path:
    case OptionType::Choice:
    case OptionType::List: return po::value<std::string>();
  }
  throw std::logic_error("deck option '" + spec.key + "' has no value semantic");
}

OptionValue parse_option_value(const OptionSpec& spec, const std::string& text) {
  // A deck cannot hold these; refusing them keeps the resolved deck re-parseable.
  if (text.find_first_of("#\n\r") != std::string::npos) throw std::invalid_argument("value '" + text + "' contains '#' or a line break");
  const bool may_be_empty = spec.type == OptionType::String || spec.type == OptionType::Path;
  if (text.empty() && !may_be_empty) throw std::invalid_argument("empty value: expected " + describe_type(spec));

  boost::any parsed;
  try {
    std::unique_ptr<const po::value_semantic> semantic(make_value_semantic(spec));
    semantic->parse(parsed, {text}, true);
  } catch (const po::error&) {
    throw std::invalid_argument("expected " + expected_phrase(spec.type) + ", got '" + text + "'");
  }

  switch (spec.type) {
    case OptionType::Bool: return boost::any_cast<bool>(parsed);
    case OptionType::Int: {
      const auto value = boost::any_cast<int64_t>(parsed);
      check_range(spec, static_cast<double>(value), text);
      return value;
    }
    case OptionType::Double: {
      const auto value = boost::any_cast<double>(parsed);
      if (!std::isfinite(value)) throw std::invalid_argument("expected a finite number, got '" + text + "'");
      check_range(spec, value, text);
      return value;
    }
    case OptionType::String: return text;
    case OptionType::Path:
      if (!text.empty() && !std::filesystem::exists(text)) throw std::invalid_argument("missing file: '" + text + "' does not exist");
      return text;
    case OptionType::Choice: check_choice(spec, text, text); return text;
    case OptionType::List: return split_list(spec, text);
    case OptionType::Bytes: {
      const auto value = boost::any_cast<Bytes>(parsed);
      check_range(spec, static_cast<double>(value.value), text);
      return value;
    }
    case OptionType::Seconds: {
      const auto value = boost::any_cast<Seconds>(parsed);
      check_range(spec, value.value, text);
      return value;
    }
  }
  throw std::logic_error("deck option '" + spec.key + "' has an unknown type");
}

std::string format_option_value(const OptionSpec& spec, const OptionValue& value) {
  switch (spec.type) {
    case OptionType::Bool: return std::get<bool>(value) ? "true" : "false";
    case OptionType::Int: return std::to_string(std::get<int64_t>(value));
    case OptionType::Double: return format_number(std::get<double>(value));
    case OptionType::String:
    case OptionType::Path:
    case OptionType::Choice: return std::get<std::string>(value);
    case OptionType::List: return join(std::get<std::vector<std::string>>(value), ",");
    case OptionType::Bytes: return format_bytes(std::get<Bytes>(value));
    case OptionType::Seconds: return format_seconds(std::get<Seconds>(value));
  }
  throw std::logic_error("deck option '" + spec.key + "' has an unknown type");
}

}  // namespace tandem
