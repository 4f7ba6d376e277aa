// Flag parsing shared by the user commands (tandem tokenize, tandem generate): --help
// prints the options, a bad flag prints the reason and the options, exit code 2.
#pragma once
#include <boost/program_options.hpp>

#include <optional>
#include <ostream>

namespace tandem {

// Fills `flags`; returns the exit status when the command should stop here (help: 0,
// bad flags: 2), nothing when it should run. `positional` names the options that bare
// arguments fill (tandem inspect FILE).
std::optional<int> parse_command_flags(const char* command, int argc, char** argv,
                                       const boost::program_options::options_description& options,
                                       boost::program_options::variables_map& flags, std::ostream& out,
                                       std::ostream& err,
                                       const boost::program_options::positional_options_description& positional = {});

}  // namespace tandem
