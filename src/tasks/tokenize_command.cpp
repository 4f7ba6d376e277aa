#include "tasks/tokenize_command.h"

#include <boost/program_options.hpp>

#include <charconv>
#include <sstream>
#include <string>
#include <vector>

#include "deck/command_flags.h"
#include "tasks/tokenizer.h"

namespace tandem {
namespace {

std::vector<int32_t> parse_ids(const std::string& line, std::size_t line_number) {
  std::vector<int32_t> ids;
  std::istringstream words(line);
  std::string word;
  while (words >> word) {
    int32_t id = 0;
    const auto [end, error] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (error != std::errc() || end != word.data() + word.size()) {
      throw std::invalid_argument("line " + std::to_string(line_number) + ": '" + word +
                                  "' is not a token id");
    }
    ids.push_back(id);
  }
  return ids;
}

}  // namespace

int tokenize_command(int argc, char** argv, std::istream& in, std::ostream& out,
                     std::ostream& err) {
  namespace po = boost::program_options;
  po::options_description options(
      "tandem tokenize: each line of stdin (without its newline) becomes one line of\n"
      "space-separated token ids on stdout; with --decode, each line of ids becomes its\n"
      "text and a newline (the text itself may hold newlines)");
  options.add_options()
      ("tokenizer", po::value<std::string>()->value_name("PATH")->required(),
       "tokenizer.json, or the model folder that holds it")
      ("decode", po::bool_switch(), "read ids, print text")
      ("help", "print this help");
  po::variables_map flags;
  if (const auto status = parse_command_flags("tokenize", argc, argv, options, flags, out, err)) return *status;

  try {
    const auto tokenizer = load_tokenizer(flags["tokenizer"].as<std::string>());
    const bool decode = flags["decode"].as<bool>();
    std::string line;
    for (std::size_t line_number = 1; std::getline(in, line); ++line_number) {
      if (decode) {
        out << tokenizer->decode(parse_ids(line, line_number));
      } else {
        const std::vector<int32_t> ids = tokenizer->encode(line);
        for (std::size_t i = 0; i < ids.size(); ++i) out << (i ? " " : "") << ids[i];
      }
      // Flushed per line so the command also works interactively and in pipelines.
      out << std::endl;
    }
  } catch (const std::exception& e) {
    err << "tandem tokenize: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace tandem
