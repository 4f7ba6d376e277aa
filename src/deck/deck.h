// The input deck: Boost.Program_options config-file text ([section], key = value, # comments)
// plus --section.key=value overrides from the command line, checked against the option table
// (options.cpp) and the contradiction rules (rules.cpp). Every bad input is a DeckError.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "deck/deck_error.h"
#include "deck/option_spec.h"

namespace tandem {

class Deck;
// Checks that options agree with each other; throws DeckError at one of the keys involved.
using DeckRule = void (*)(const Deck&);

struct DeckSchema {
  std::vector<OptionSpec> options;
  std::vector<DeckRule> rules;
};
const DeckSchema& tandem_deck_schema();  // tandem_options() and tandem_rules()

class Deck {
 public:
  // `overrides` are "--section.key=value" tokens; they win over the text, a later one over an
  // earlier one. `origin` names the text in errors and in resolved_text().
  static Deck load_file(const std::string& path, const std::vector<std::string>& overrides,
                        const DeckSchema& schema = tandem_deck_schema());
  static Deck load_text(const std::string& text, const std::string& origin, const std::vector<std::string>& overrides,
                        const DeckSchema& schema = tandem_deck_schema());

  // T is the option's C++ type (see OptionValue); another T throws std::invalid_argument.
  template <class T>
  T get(const std::string& key) const;
  bool is_default(const std::string& key) const;  // not set by the deck or the command line
  Source source(const std::string& key) const;
  std::string text(const std::string& key) const;  // the value as resolved_text() writes it

  // Every option by section, "key = value  # SOURCE"; it parses back to the same values.
  std::string resolved_text() const;

 private:
  Deck() = default;  // a Deck exists only as the result of a load, so it is always checked
  struct Entry {
    OptionSpec spec;
    OptionValue value;
    Source source;
  };
  const Entry& entry(const std::string& key) const;
  // Parses `value` for `key` (which Boost did or did not recognise) and records its source.
  void set(const std::string& key, bool known, const std::string& value, const Source& source,
           const std::vector<OptionSpec>& options);

  std::string origin_;
  std::vector<Entry> entries_;  // in table order
};

template <class T>
T Deck::get(const std::string& key) const {
  const Entry& found = entry(key);
  if (const T* value = std::get_if<T>(&found.value)) return *value;
  throw std::invalid_argument("deck key '" + key + "' holds " + describe_type(found.spec) + ", not the type asked for");
}

// Every option by section: key, default, type with range or choices, unit, help line.
void print_deck_help(std::ostream& out, const DeckSchema& schema = tandem_deck_schema());

}  // namespace tandem
