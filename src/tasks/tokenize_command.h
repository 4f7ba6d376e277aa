// `tandem tokenize --tokenizer PATH [--decode]`: text lines on stdin to lines of token ids
// on stdout, or back with --decode.
#pragma once
#include <iostream>

namespace tandem {

// argv[0] is the command's name; the options follow. Returns the process exit status:
// 0 on success, 1 when tokenizing fails, 2 for bad options (the message goes to `err`).
int tokenize_command(int argc, char** argv, std::istream& in = std::cin,
                     std::ostream& out = std::cout, std::ostream& err = std::cerr);

}  // namespace tandem
