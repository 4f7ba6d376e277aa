#include "deck/command_flags.h"

namespace tandem {

namespace po = boost::program_options;

std::optional<int> parse_command_flags(const char* command, int argc, char** argv,
                                       const po::options_description& options, po::variables_map& flags,
                                       std::ostream& out, std::ostream& err,
                                       const po::positional_options_description& positional) {
  try {
    po::store(po::command_line_parser(argc, argv).options(options).positional(positional).run(), flags);
    if (flags.count("help")) {
      out << options;
      return 0;
    }
    po::notify(flags);
  } catch (const po::error& e) {
    err << "tandem " << command << ": " << e.what() << "\n" << options;
    return 2;
  }
  return std::nullopt;
}

}  // namespace tandem
