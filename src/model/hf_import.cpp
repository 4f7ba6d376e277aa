#include "model/hf_import.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "io/safetensors.h"
#include "tensor/bf16.h"
#include "tensor/f16.h"
#include "tensor/finite.h"
#include "world/errors.h"

namespace tandem {

namespace {

void expect_host_f32(const ParameterSet& params, const char* what) {
  if (!params.layout) throw std::invalid_argument(std::string(what) + ": the parameter set is not bound to a layout");
  for (const Tensor& tensor : params.all)
    if (tensor.dtype != DType::F32 || tensor.device != Device::CPU)
      throw std::invalid_argument(std::string(what) + " works on FP32 host parameters, got " + tensor.describe());
}

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

ModelConfig load_hf_config(const std::filesystem::path& folder) { return ModelConfig::from_hf_json(folder / "config.json"); }

void load_hf_weights(const std::filesystem::path& folder, const ParameterSet& params) {
  expect_host_f32(params, "load_hf_weights");
  const ParameterLayout& layout = *params.layout;
  const ModelConfig& config = layout.config();
  const SafetensorsCheckpoint checkpoint(folder);

  for (const std::string& name : checkpoint.names()) {
    if (layout.find(name) || ends_with(name, ".rotary_emb.inv_freq")) continue;
    if (config.tie_embeddings && name == "lm_head.weight") continue;
    throw std::runtime_error(checkpoint.file_of(name)->path().string() + ": tensor '" + name + "' is not part of a " +
                             architecture_hf_name(config.arch) + " with this config (qk_norm " +
                             (config.qk_norm ? "on" : "off") + ", qkv_bias " + (config.qkv_bias ? "on" : "off") +
                             ", tied embeddings " + (config.tie_embeddings ? "on" : "off") + ")");
  }

  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    const ParameterInfo& info = layout.tensors()[i];
    const SafetensorsFile* file = checkpoint.file_of(info.name);
    if (!file)
      throw std::runtime_error(checkpoint.origin().string() + ": tensor '" + info.name + "' " +
                               shape_string(info.shape) + " is missing (config.json describes a " +
                               architecture_hf_name(config.arch) + " that needs it)");
    const SafetensorsEntry& entry = file->entry(info.name);
    if (entry.shape != info.shape)
      throw std::runtime_error(file->path().string() + ": tensor '" + info.name + "' has shape " +
                               shape_string(entry.shape) + " but config.json implies " + shape_string(info.shape));
    const std::byte* source = file->bytes(info.name).data();
    float* target = params.all[i].ptr<float>();
    const int64_t count = info.numel();
    switch (entry.dtype) {
      case DType::F32:
        std::memcpy(target, source, count * sizeof(float));
        break;
      case DType::BF16:
      case DType::F16:
        for (int64_t e = 0; e < count; ++e) {
          uint16_t half;
          std::memcpy(&half, source + 2 * e, sizeof half);  // offsets may be unaligned
          target[e] = entry.dtype == DType::BF16 ? bf16_to_float(half) : f16_to_float(half);
        }
        break;
      default:
        throw std::runtime_error(file->path().string() + ": tensor '" + info.name + "' has dtype " +
                                 dtype_name(entry.dtype) + "; tandem loads F32, BF16 or F16 weights");
    }
    // A NaN in the weights would surface steps later in the sampler, naming nothing.
    const std::string bad = describe_non_finite(params.all[i]);
    if (!bad.empty()) throw BadInputError(file->path().string() + ": tensor '" + info.name + "': " + bad);
  }
}

void export_hf(const std::filesystem::path& folder, const ParameterSet& params, DType dtype, size_t max_shard_bytes) {
  expect_host_f32(params, "export_hf");
  if (dtype != DType::F32 && dtype != DType::BF16 && dtype != DType::F16)
    throw std::invalid_argument(std::string("export_hf: cannot write weights as ") + dtype_name(dtype) +
                                " (F32, BF16, F16)");
  const ParameterLayout& layout = *params.layout;
  const std::string config_json = layout.config().to_hf_json(dtype_info(dtype).safetensors_code);
  std::filesystem::create_directories(folder);

  std::vector<std::vector<uint16_t>> converted;
  std::vector<SafetensorsTensor> tensors;
  for (size_t i = 0; i < layout.tensors().size(); ++i) {
    const ParameterInfo& info = layout.tensors()[i];
    const float* source = params.all[i].ptr<float>();
    const void* data = source;
    if (dtype != DType::F32) {
      auto& halves = converted.emplace_back(info.numel());
      for (int64_t e = 0; e < info.numel(); ++e)
        halves[e] = dtype == DType::BF16 ? float_to_bf16(source[e]) : float_to_f16(source[e]);
      data = halves.data();
    }
    tensors.push_back({info.name, dtype, info.shape, data});
  }
  // transformers refuses safetensors files without a framework tag.
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (max_shard_bytes == 0) {
    write_safetensors(folder / kSafetensorsSingleName, tensors, metadata);
    std::filesystem::remove(folder / kSafetensorsIndexName);
  } else {
    std::filesystem::remove(folder / kSafetensorsSingleName);
    write_safetensors_sharded(folder, tensors, max_shard_bytes, metadata);
  }
  write_file_atomically(folder / "config.json", config_json);
}

}  // namespace tandem
