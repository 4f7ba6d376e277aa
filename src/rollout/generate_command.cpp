#include "rollout/generate_command.h"

#include <boost/program_options.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "deck/command_flags.h"
#include "export/checkpoint_policy.h"
#include "io/safetensors.h"
#include "model/activations.h"
#include "model/cpu_ops.h"
#include "model/hf_import.h"
#include "model/parameters.h"
#include "model/transformer.h"
#include "rollout/engine.h"
#include "tasks/tokenizer.h"
#include "tensor/memory_pool.h"

namespace tandem {
namespace {

// The Qwen3 chat template for one user turn, ready for the assistant's answer.
std::string chat_prompt(const std::string& text) {
  return "<|im_start|>user\n" + text + "<|im_end|>\n<|im_start|>assistant\n";
}

// End-of-sequence ids: the tokenizer's, config.json's eos_token_id (a number or a list)
// and, for a chat turn, the end-of-turn token.
std::vector<int32_t> stop_ids(const Tokenizer& tokenizer, const ModelConfig& config, bool chat) {
  std::vector<int32_t> ids;
  if (tokenizer.special_ids().eos) ids.push_back(*tokenizer.special_ids().eos);
  if (!config.hf_source.empty()) {
    const nlohmann::json source = nlohmann::json::parse(config.hf_source);
    const nlohmann::json eos = source.value("eos_token_id", nlohmann::json());
    if (eos.is_number_integer()) ids.push_back(eos.get<int32_t>());
    if (eos.is_array())
      for (const nlohmann::json& id : eos)
        if (id.is_number_integer()) ids.push_back(id.get<int32_t>());
  }
  if (chat)
    if (const auto end_of_turn = tokenizer.find_id("<|im_end|>")) ids.push_back(*end_of_turn);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  return ids;
}

// The logits at every prompt position by tandem's CPU forward, with the prompt's ids, in
// one safetensors file: what tools/check_export_transformers.py holds transformers to.
void write_prompt_logits(const std::filesystem::path& path, const ModelConfig& config, const ParameterSet& params,
                         const std::vector<int32_t>& ids, MemoryPool& pool) {
  CpuOps ops;
  Transformer transformer(config, ops);
  const ActivationCapacity capacity{static_cast<int64_t>(ids.size()), 1};
  Allocation* slab = pool.allocate(tags::activations, Activations::slab_bytes(config, capacity, DType::F32), "generate.logits");
  Activations acts = Activations::bind(config, capacity, slab->ptr, DType::F32);
  const std::vector<int32_t> cu_seqlens = {0, static_cast<int32_t>(ids.size())};
  const Tensor logits = transformer.forward(params, acts, ids, cu_seqlens);
  const SafetensorsTensor tensors[] = {{"logits", DType::F32, logits.shape, logits.data},
                                       {"input_ids", DType::I32, {static_cast<int64_t>(ids.size())}, ids.data()}};
  write_safetensors(path, tensors);
  pool.release(slab);
}

}  // namespace

int generate_command(int argc, char** argv, std::ostream& out, std::ostream& err) {
  namespace po = boost::program_options;
  po::options_description options(
      "tandem generate: one completion of a prompt by a Hugging Face model folder or the policy\n"
      "of a tandem checkpoint (ckpt_*.h5), on the CPU.\n"
      "Prints the completion's text (the stop token left out); with --ids, then the generated\n"
      "token ids on one line (the stop token included). A summary goes to stderr");
  options.add_options()
      ("model", po::value<std::string>()->value_name("DIR|CKPT")->required(), "folder with config.json and *.safetensors, or a checkpoint")
      ("prompt", po::value<std::string>()->value_name("TEXT")->required(), "the prompt")
      ("tokenizer", po::value<std::string>()->value_name("PATH"), "tokenizer.json or its folder (default: --model, or a checkpoint's model.path)")
      ("max-new", po::value<int>()->value_name("N")->default_value(64), "most tokens to generate")
      ("temperature", po::value<float>()->value_name("T")->default_value(1.0f), "softmax temperature; 0 = greedy")
      ("top-p", po::value<float>()->value_name("P")->default_value(1.0f), "nucleus sampling mass; 1 = off")
      ("top-k", po::value<int>()->value_name("K")->default_value(0), "sample among the K likeliest; 0 = off")
      ("seed", po::value<uint64_t>()->value_name("S")->default_value(0), "random seed")
      ("chat", po::bool_switch(), "wrap the prompt in the Qwen3 chat template (one user turn)")
      ("ids", po::bool_switch(), "also print the generated token ids")
      ("logits", po::value<std::string>()->value_name("FILE"), "also write the logits of every prompt position (and the prompt's ids) to this safetensors file")
      ("help", "print this help");
  po::variables_map flags;
  if (const auto status = parse_command_flags("generate", argc, argv, options, flags, out, err)) return *status;

  try {
    const std::filesystem::path model_dir = flags["model"].as<std::string>();
    // A checkpoint brings its weights; its tokenizer is the one of the folder the run began from.
    std::optional<CheckpointPolicy> checkpoint;
    if (std::filesystem::is_regular_file(model_dir)) checkpoint = load_checkpoint_policy(model_dir);
    if (checkpoint && checkpoint->origin.empty() && !flags.count("tokenizer"))
      throw std::runtime_error(model_dir.string() + ": a run of the tiny built-in model, whose character tokenizer "
                                                    "has no file: give --tokenizer");
    const std::filesystem::path tokenizer_path = flags.count("tokenizer")
                                                     ? std::filesystem::path(flags["tokenizer"].as<std::string>())
                                                     : (checkpoint ? checkpoint->origin : model_dir);
    const bool chat = flags["chat"].as<bool>();
    const ModelConfig config = checkpoint ? checkpoint->config : load_hf_config(model_dir);
    const std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(tokenizer_path);
    const std::string text = flags["prompt"].as<std::string>();

    GenerationRequest request;
    request.prompt = tokenizer->encode(chat ? chat_prompt(text) : text);
    request.sampling.temperature = flags["temperature"].as<float>();
    request.sampling.top_p = flags["top-p"].as<float>();
    request.sampling.top_k = flags["top-k"].as<int>();
    request.sampling.max_new_tokens = flags["max-new"].as<int>();
    request.sampling.seed = flags["seed"].as<uint64_t>();
    request.sampling.stop_token_ids = stop_ids(*tokenizer, config, chat);
    request.sampling.validate();

    const std::unique_ptr<MemoryPool> pool = MemoryPool::create(Device::CPU);
    const ParameterLayout layout(config);
    Allocation* weights = pool->allocate(tags::weights, layout.slab_bytes(DType::F32), "generate.weights");
    const ParameterSet params = ParameterSet::bind(layout, weights->ptr, DType::F32);
    if (checkpoint)
      std::copy(checkpoint->weights.begin(), checkpoint->weights.end(), static_cast<float*>(weights->ptr));
    else
      load_hf_weights(model_dir, params);

    if (flags.count("logits")) write_prompt_logits(flags["logits"].as<std::string>(), config, params, request.prompt, *pool);

    // Sized for this one sequence: the prompt in one step and a cache that just holds it.
    EngineOptions engine_options;
    engine_options.max_running = 1;
    engine_options.max_step_tokens = std::clamp<int64_t>(static_cast<int64_t>(request.prompt.size()), 1, 2048);
    engine_options.max_sequence_length = static_cast<int64_t>(request.prompt.size()) + request.sampling.max_new_tokens;
    const KvCacheGeometry one_block =
        KvCacheGeometry::for_blocks(config, 1, engine_options.block_size, DType::F32);
    const int64_t blocks = (engine_options.max_sequence_length + one_block.block_size - 1) / one_block.block_size;
    engine_options.kv_cache_bytes = blocks * one_block.block_bytes();
    engine_options.name = "generate";
    Engine engine(config, params, *pool, engine_options, tokenizer.get());

    const auto start = std::chrono::steady_clock::now();
    const Completion completion = engine.generate({request}).front();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

    std::vector<int32_t> shown = completion.tokens;
    if (completion.finish == FinishReason::Stop && completion.stop_string.empty()) shown.pop_back();
    out << tokenizer->decode(shown) << "\n";
    if (flags["ids"].as<bool>()) {
      for (size_t i = 0; i < completion.tokens.size(); ++i) out << (i ? " " : "") << completion.tokens[i];
      out << "\n";
    }
    err << "tandem generate: " << request.prompt.size() << " prompt tokens, " << completion.tokens.size()
        << " generated in " << seconds << " s, finish: " << finish_reason_name(completion.finish) << "\n";
  } catch (const std::exception& e) {
    err << "tandem generate: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

}  // namespace tandem
