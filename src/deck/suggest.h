// Reasons for keys and sections the deck does not know, with the nearest valid one suggested.
#pragma once
#include <string>
#include <vector>

#include "deck/option_spec.h"

namespace tandem {

// "unknown key (did you mean 'run.steps'?)", or "unknown section [rnu] (did you mean [run]?)"
// when the key's section is the unknown part.
std::string unknown_key_reason(const std::string& key, const std::vector<OptionSpec>& options);
std::string unknown_section_reason(const std::string& section, const std::vector<OptionSpec>& options);

bool is_known_section(const std::string& section, const std::vector<OptionSpec>& options);

}  // namespace tandem
