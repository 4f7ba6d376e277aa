#include "export/export_command.h"

#include <boost/program_options.hpp>

#include <filesystem>
#include <string>

#include "deck/command_flags.h"
#include "deck/deck_error.h"
#include "export/checkpoint_policy.h"
#include "model/hf_import.h"
#include "model/parameters.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

// What a Hugging Face folder holds besides config.json and the weights, copied unchanged
// from the folder the run started from when it has them.
const char* const kCompanionFiles[] = {"tokenizer.json",     "tokenizer_config.json", "special_tokens_map.json",
                                       "added_tokens.json",  "vocab.json",            "merges.txt",
                                       "chat_template.jinja", "generation_config.json"};

}  // namespace

int export_command(int argc, char** argv, std::ostream& out, std::ostream& err) {
  namespace po = boost::program_options;
  po::options_description flags_spec(
      "tandem export CKPT --hf OUT: the policy of checkpoint CKPT as a Hugging Face model folder.\n"
      "OUT gets config.json, model.safetensors and the tokenizer and generation-config files of\n"
      "the folder the run started from (model.path). A run of the tiny built-in model has no\n"
      "such folder: its character tokenizer has no Hugging Face form, so OUT holds the model only");
  flags_spec.add_options()
      ("checkpoint", po::value<std::string>()->value_name("CKPT")->required(), "ckpt_*.h5 (also the first positional)")
      ("hf", po::value<std::string>()->value_name("OUT")->required(), "the folder to write (created; files in it replaced)")
      ("dtype", po::value<std::string>()->value_name("bf16|f32")->default_value("bf16"), "dtype of the weights written")
      ("help", "print this help");
  po::positional_options_description positional;
  positional.add("checkpoint", 1);
  po::variables_map flags;
  if (const auto status = parse_command_flags("export", argc, argv, flags_spec, flags, out, err, positional)) return *status;
  const std::string dtype_flag = flags["dtype"].as<std::string>();
  if (dtype_flag != "bf16" && dtype_flag != "f32") {
    err << "tandem export: --dtype " << dtype_flag << ": expected bf16 or f32\n";
    return 2;
  }
  const fs::path checkpoint = flags["checkpoint"].as<std::string>();
  const fs::path folder = flags["hf"].as<std::string>();
  if (!fs::is_regular_file(checkpoint)) {
    err << "tandem export: " << checkpoint.string() << ": no such file\n";
    return 2;
  }
  try {
    CheckpointPolicy policy = load_checkpoint_policy(checkpoint);
    const ParameterLayout layout(policy.config);
    export_hf(folder, ParameterSet::bind(layout, policy.weights.data(), DType::F32),
              dtype_flag == "bf16" ? DType::BF16 : DType::F32);
    int copied = 0;
    if (!policy.origin.empty())
      for (const char* name : kCompanionFiles)
        if (fs::is_regular_file(policy.origin / name)) {
          fs::copy_file(policy.origin / name, folder / name, fs::copy_options::overwrite_existing);
          ++copied;
        }
    out << folder.string() << ": config.json, model.safetensors (" << dtype_flag << ")";
    if (policy.origin.empty())
      out << "; no tokenizer (the tiny built-in model's character tokenizer has no Hugging Face form)\n";
    else
      out << " and " << copied << " files of " << policy.origin.string() << "\n";
  } catch (const DeckError& e) {
    err << "tandem export: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    err << "tandem export: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace tandem
