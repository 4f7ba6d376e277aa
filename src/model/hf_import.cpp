#include "model/hf_import.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "io/safetensors.h"

namespace tandem {

namespace {

float bf16_to_f32(uint16_t half) {
  const uint32_t bits = static_cast<uint32_t>(half) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint16_t f32_to_bf16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((bits + 0x7fffu + ((bits >> 16) & 1)) >> 16);                  // nearest even
}

float f16_to_f32(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000) << 16;
  const uint32_t exponent = (half >> 10) & 0x1f, mantissa = half & 0x3ff;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);  // zero or subnormal
    return sign ? -magnitude : magnitude;
  }
  const uint32_t bits = exponent == 31 ? sign | 0x7f800000u | (mantissa << 13)
                                       : sign | ((exponent + 112) << 23) | (mantissa << 13);
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

uint16_t f32_to_f16(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const float magnitude = std::fabs(value);
  if (std::isnan(value)) return sign | 0x7e00;
  if (magnitude >= 65520.0f) return sign | 0x7c00;  // rounds past the largest half, 65504
  if (magnitude < 0x1p-14f)                          // subnormal: a multiple of 2^-24
    return sign | static_cast<uint16_t>(std::nearbyint(magnitude * 0x1p24f));
  const uint32_t exponent = ((bits >> 23) & 0xff) - 127 + 15, mantissa = bits & 0x7fffff;
  uint32_t half = (exponent << 10) | (mantissa >> 13);
  const uint32_t rest = mantissa & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (half & 1))) ++half;  // a carry moves into the exponent, as it should
  return sign | static_cast<uint16_t>(half);
}

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
          target[e] = entry.dtype == DType::BF16 ? bf16_to_f32(half) : f16_to_f32(half);
        }
        break;
      default:
        throw std::runtime_error(file->path().string() + ": tensor '" + info.name + "' has dtype " +
                                 dtype_name(entry.dtype) + "; tandem loads F32, BF16 or F16 weights");
    }
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
        halves[e] = dtype == DType::BF16 ? f32_to_bf16(source[e]) : f32_to_f16(source[e]);
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
