#include "model/parameters.h"

#include <stdexcept>

namespace tandem {

int64_t ParameterInfo::numel() const {
  int64_t count = 1;
  for (int64_t extent : shape) count *= extent;
  return count;
}

std::string layer_parameter_name(int layer, std::string_view suffix) {
  return "model.layers." + std::to_string(layer) + "." + std::string(suffix);
}

ParameterLayout::ParameterLayout(const ModelConfig& config) : config_(config) {
  config_.validate();
  const int64_t C = config.hidden, V = config.vocab, I = config.intermediate, D = config.head_dim;
  const int64_t QD = config.q_dim(), KD = config.kv_dim();
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    ParameterInfo info{std::move(name), std::move(shape), slab_elements_};
    slab_elements_ += (info.numel() + kAlignment - 1) / kAlignment * kAlignment;
    tensors_.push_back(std::move(info));
  };
  add("model.embed_tokens.weight", {V, C});
  for (int l = 0; l < config.layers; ++l) {
    auto name = [l](std::string_view suffix) { return layer_parameter_name(l, suffix); };
    add(name("input_layernorm.weight"), {C});
    add(name("self_attn.q_proj.weight"), {QD, C});
    if (config.qkv_bias) add(name("self_attn.q_proj.bias"), {QD});
    add(name("self_attn.k_proj.weight"), {KD, C});
    if (config.qkv_bias) add(name("self_attn.k_proj.bias"), {KD});
    add(name("self_attn.v_proj.weight"), {KD, C});
    if (config.qkv_bias) add(name("self_attn.v_proj.bias"), {KD});
    if (config.qk_norm) {
      add(name("self_attn.q_norm.weight"), {D});
      add(name("self_attn.k_norm.weight"), {D});
    }
    add(name("self_attn.o_proj.weight"), {C, QD});
    add(name("post_attention_layernorm.weight"), {C});
    add(name("mlp.gate_proj.weight"), {I, C});
    add(name("mlp.up_proj.weight"), {I, C});
    add(name("mlp.down_proj.weight"), {C, I});
  }
  add("model.norm.weight", {C});
  if (!config.tie_embeddings) add("lm_head.weight", {V, C});
}

int64_t ParameterLayout::parameter_count() const {
  int64_t count = 0;
  for (const auto& info : tensors_) count += info.numel();
  return count;
}

const ParameterInfo* ParameterLayout::find(std::string_view name) const {
  for (const auto& info : tensors_)
    if (info.name == name) return &info;
  return nullptr;
}

ParameterSet ParameterSet::bind(const ParameterLayout& layout, void* base, DType dtype, Device device) {
  ParameterSet set;
  set.layout = &layout;
  for (const auto& info : layout.tensors())
    set.all.push_back(
        Tensor::view(static_cast<char*>(base) + info.offset * dtype_size(dtype), dtype, device, info.shape));

  auto optional = [&](const std::string& name) {
    const ParameterInfo* info = layout.find(name);
    return info ? set.all[info - layout.tensors().data()] : Tensor{};
  };
  auto required = [&](const std::string& name) { return set[name]; };

  const ModelConfig& config = layout.config();
  set.embed_tokens = required("model.embed_tokens.weight");
  for (int l = 0; l < config.layers; ++l) {
    auto name = [l](std::string_view suffix) { return layer_parameter_name(l, suffix); };
    LayerParameters layer;
    layer.input_norm = required(name("input_layernorm.weight"));
    layer.q_proj = required(name("self_attn.q_proj.weight"));
    layer.k_proj = required(name("self_attn.k_proj.weight"));
    layer.v_proj = required(name("self_attn.v_proj.weight"));
    layer.q_bias = optional(name("self_attn.q_proj.bias"));
    layer.k_bias = optional(name("self_attn.k_proj.bias"));
    layer.v_bias = optional(name("self_attn.v_proj.bias"));
    layer.q_norm = optional(name("self_attn.q_norm.weight"));
    layer.k_norm = optional(name("self_attn.k_norm.weight"));
    layer.o_proj = required(name("self_attn.o_proj.weight"));
    layer.post_attention_norm = required(name("post_attention_layernorm.weight"));
    layer.gate_proj = required(name("mlp.gate_proj.weight"));
    layer.up_proj = required(name("mlp.up_proj.weight"));
    layer.down_proj = required(name("mlp.down_proj.weight"));
    set.layers.push_back(std::move(layer));
  }
  set.final_norm = required("model.norm.weight");
  set.lm_head = config.tie_embeddings ? set.embed_tokens : required("lm_head.weight");
  return set;
}

const Tensor& ParameterSet::operator[](std::string_view name) const {
  const ParameterInfo* info = layout ? layout->find(name) : nullptr;
  if (!info) throw std::out_of_range("the model has no parameter tensor '" + std::string(name) + "'");
  return all[info - layout->tensors().data()];
}

Tensor stacked_weights(std::initializer_list<Tensor> weights) {
  if (weights.size() == 0) return Tensor{};
  const Tensor& first = *weights.begin();
  const char* next = first.ptr<char>();
  int64_t rows = 0;
  for (const Tensor& weight : weights) {
    if (!weight.data || weight.ptr<char>() != next || weight.rank() != 2 || !weight.is_contiguous() ||
        weight.dtype != first.dtype || weight.device != first.device || weight.shape[1] != first.shape[1])
      return Tensor{};
    rows += weight.shape[0];
    next += weight.nbytes();
  }
  return Tensor::view(first.data, first.dtype, first.device, {rows, first.shape[1]});
}

}  // namespace tandem
