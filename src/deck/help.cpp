#include <string>

#include "deck/deck.h"

namespace tandem {

void print_deck_help(std::ostream& out, const DeckSchema& schema) {
  constexpr size_t kTypeColumn = 44;
  out << "Deck options. In the deck write `key = value` under its [section]; on the command line\n"
         "write --section.key=value, which wins over the deck. Booleans take true/false, yes/no,\n"
         "on/off, 1/0; sizes take B, KB, KiB ... TiB; durations take ms, s, min, h.\n";
  std::string section;
  for (const OptionSpec& spec : schema.options) {
    if (spec.section() != section) {
      section = spec.section();
      out << "\n[" << section << "]\n";
    }
    std::string line = "  " + spec.name() + " = " + spec.default_text;
    line.resize(std::max(kTypeColumn, line.size() + 2), ' ');
    out << line << describe_type(spec) << (spec.unit.empty() ? "" : ", in " + spec.unit) << "\n"
        << "      " << spec.help << "\n";
  }
}

}  // namespace tandem
