// `tandem export CKPT --hf OUT`: the trained policy of a checkpoint as a Hugging Face
// folder (config.json, safetensors, and the tokenizer and generation config files of the
// folder the run started from), which transformers and `tandem generate` load unchanged.
#pragma once
#include <iostream>

namespace tandem {

int export_command(int argc, char** argv, std::ostream& out = std::cout, std::ostream& err = std::cerr);

}  // namespace tandem
