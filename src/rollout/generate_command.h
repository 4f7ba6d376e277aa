// `tandem generate --model HF_DIR --prompt TEXT [...]`: loads a Hugging Face model folder
// on the CPU backend, generates one completion of the prompt and prints its text (and
// with --ids the generated token ids on one line). Temperature 0 is greedy.
#pragma once
#include <iostream>

namespace tandem {

// argv[0] is the command's name; the options follow. Returns the process exit status:
// 0 on success, 1 when loading or generating fails, 2 for bad options.
int generate_command(int argc, char** argv, std::ostream& out = std::cout, std::ostream& err = std::cerr);

}  // namespace tandem
