// Where every parameter tensor of a model lives: one contiguous slab, llm.c style, with
// tensors named as in Hugging Face checkpoints. The layout is a pure function of the
// config, so the same offsets serve the weights, their gradients and any optimizer state
// kept per element; the slab memory belongs to the caller (the memory pool, or a vector).
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace tandem {

struct ParameterInfo {
  std::string name;  // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;
  int64_t offset = 0;  // in elements from the start of the slab
  int64_t numel() const;
};

class ParameterLayout {
 public:
  // Offsets are multiples of this many elements, so every tensor starts 128-byte aligned
  // in BF16 (and 256 in FP32), as vectorised GPU loads and cuBLASLt want.
  static constexpr int64_t kAlignment = 64;

  explicit ParameterLayout(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<ParameterInfo>& tensors() const { return tensors_; }
  int64_t slab_elements() const { return slab_elements_; }  // including alignment gaps
  int64_t parameter_count() const;                          // without them
  size_t slab_bytes(DType dtype) const { return static_cast<size_t>(slab_elements_) * dtype_size(dtype); }
  const ParameterInfo* find(std::string_view name) const;

 private:
  ModelConfig config_;
  std::vector<ParameterInfo> tensors_;
  int64_t slab_elements_ = 0;
};

std::string layer_parameter_name(int layer, std::string_view suffix);

// Views of one layer's tensors. Absent ones (no bias, no q/k norm) have data == nullptr.
struct LayerParameters {
  Tensor input_norm;           // [hidden]
  Tensor q_proj, k_proj, v_proj;  // [heads*head_dim | kv_heads*head_dim, hidden]
  Tensor q_bias, k_bias, v_bias;
  Tensor q_norm, k_norm;       // [head_dim]
  Tensor o_proj;               // [hidden, heads*head_dim]
  Tensor post_attention_norm;  // [hidden]
  Tensor gate_proj, up_proj;   // [intermediate, hidden]
  Tensor down_proj;            // [hidden, intermediate]
};

// Typed views of a slab laid out by a ParameterLayout. Cheap to copy; owns nothing.
struct ParameterSet {
  Tensor embed_tokens;  // [vocab, hidden]
  std::vector<LayerParameters> layers;
  Tensor final_norm;  // [hidden]
  Tensor lm_head;     // [vocab, hidden]; the same memory as embed_tokens when tied
  std::vector<Tensor> all;  // one view per layout tensor, in layout order
  const ParameterLayout* layout = nullptr;

  static ParameterSet bind(const ParameterLayout& layout, void* base, DType dtype, Device device = Device::CPU);
  // Throws std::out_of_range naming the tensor when the layout has no such name.
  const Tensor& operator[](std::string_view name) const;
};

// Linear weights [O_i, I] that lie end to end in memory (same dtype, device and width, no
// gap) seen as ONE [Σ O_i, I] matrix: one GEMM against it writes all their outputs side
// by side. The layout puts q/k/v and gate/up in this order, so without biases between
// them and alignment gaps they stack with no copy. Empty (data == nullptr) otherwise.
Tensor stacked_weights(std::initializer_list<Tensor> weights);

}  // namespace tandem
