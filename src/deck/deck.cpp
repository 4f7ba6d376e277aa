#include "deck/deck.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "deck/options.h"
#include "deck/rules.h"
#include "deck/scan.h"
#include "deck/suggest.h"
#include "deck/trim.h"

namespace tandem {
namespace po = boost::program_options;
namespace {

const std::string kCommandLine = "command line";

po::options_description describe_options(const std::vector<OptionSpec>& options) {
  po::options_description description;
  for (const OptionSpec& spec : options) description.add_options()(spec.key.c_str(), make_value_semantic(spec), spec.help.c_str());
  return description;
}

// One "--section.key=value" token through Boost's command-line parser. Tokens go one at a
// time so that an error names the token that caused it.
po::option parse_override(const std::string& token, const po::options_description& description) {
  const size_t equals = token.find('=');
  if (token.rfind("--", 0) != 0 || equals == std::string::npos || equals == 2)
    throw DeckError(kCommandLine, 0, "", "malformed override '" + token + "': expected --section.key=value");
  const std::string key = token.substr(2, equals - 2);
  const std::string value = trim_whitespace(token.substr(equals + 1));
  if (value.empty()) throw DeckError(kCommandLine, 0, key, "empty value after '=' in '" + token + "'");
  try {
    const auto parsed = po::command_line_parser(std::vector<std::string>{"--" + key + "=" + value})
                            .options(description)
                            .style(po::command_line_style::allow_long | po::command_line_style::long_allow_adjacent)
                            .allow_unregistered()
                            .run();
    return parsed.options.at(0);
  } catch (const po::error& error) {
    throw DeckError(kCommandLine, 0, key, error.what());
  }
}

std::string read_deck_file(const std::string& path) {
  if (!std::filesystem::exists(path)) throw DeckError(path, 0, "", "missing file: the deck does not exist");
  if (std::filesystem::is_directory(path)) throw DeckError(path, 0, "", "is a folder, not a deck file");
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) throw DeckError(path, 0, "", "cannot read the deck file");
  return text.str();
}

}  // namespace

const DeckSchema& tandem_deck_schema() {
  static const DeckSchema schema{tandem_options(), tandem_rules()};
  return schema;
}

Deck Deck::load_file(const std::string& path, const std::vector<std::string>& overrides, const DeckSchema& schema) {
  return load_text(read_deck_file(path), path, overrides, schema);
}

Deck Deck::load_text(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides,
                     const DeckSchema& schema) {
  const po::options_description description = describe_options(schema.options);
  Deck deck;
  deck.origin_ = origin;
  for (const OptionSpec& spec : schema.options) {
    try {
      deck.entries_.push_back({spec, parse_option_value(spec, spec.default_text), Source{}});
    } catch (const std::invalid_argument& error) {
      throw std::logic_error("deck option '" + spec.key + "' has a bad default '" + spec.default_text + "': " + error.what());
    }
  }

  const std::vector<DeckLine> lines = scan_deck_text(text, origin, schema.options);
  const po::parsed_options parsed = [&] {
    std::istringstream stream(text);
    try {
      return po::parse_config_file(stream, description, /*allow_unregistered=*/true);
    } catch (const po::error& error) {
      throw DeckError(origin, 0, "", error.what());
    }
  }();
  for (const po::option& option : parsed.options) {
    const auto line = std::find_if(lines.begin(), lines.end(), [&](const DeckLine& l) { return l.key == option.string_key; });
    if (line == lines.end()) throw std::logic_error("deck scan found no line for key '" + option.string_key + "' that Boost read from " + origin);
    deck.set(option.string_key, !option.unregistered, option.value.at(0), Source::in_file(origin, line->line), schema.options);
  }

  for (const std::string& token : overrides) {
    const po::option option = parse_override(token, description);
    deck.set(option.string_key, !option.unregistered, option.value.at(0), Source::command_line(), schema.options);
  }

  for (const DeckRule rule : schema.rules) rule(deck);
  return deck;
}

void Deck::set(const std::string& key, bool known, const std::string& value, const Source& source,
               const std::vector<OptionSpec>& options) {
  if (!known) throw DeckError(source, key, unknown_key_reason(key, options));
  auto found = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.spec.key == key; });
  try {
    found->value = parse_option_value(found->spec, value);
  } catch (const std::invalid_argument& error) {
    throw DeckError(source, key, error.what());
  }
  found->source = source;
}

const Deck::Entry& Deck::entry(const std::string& key) const {
  const auto found = std::find_if(entries_.begin(), entries_.end(), [&](const Entry& e) { return e.spec.key == key; });
  if (found == entries_.end()) throw std::invalid_argument("deck has no key '" + key + "'");
  return *found;
}

bool Deck::is_default(const std::string& key) const { return entry(key).source.kind == Source::Kind::Default; }

Source Deck::source(const std::string& key) const { return entry(key).source; }

std::string Deck::text(const std::string& key) const {
  const Entry& found = entry(key);
  return format_option_value(found.spec, found.value);
}

std::string Deck::resolved_text() const {
  constexpr size_t kCommentColumn = 40;
  std::string text = "# tandem deck resolved from " + origin_ + "; each comment says where the value came from\n";
  std::string section;
  for (const Entry& entry : entries_) {
    if (entry.spec.section() != section) {
      section = entry.spec.section();
      text += "\n[" + section + "]\n";
    }
    std::string line = entry.spec.name() + " = " + format_option_value(entry.spec, entry.value);
    line.resize(std::max(kCommentColumn, line.size() + 1), ' ');
    text += line + "# " + entry.source.describe() + "\n";
  }
  return text;
}

}  // namespace tandem
