#include "model/activations.h"

#include <stdexcept>

namespace tandem {

namespace {

// Hands out aligned, consecutive pieces of a slab; with a null base it only measures.
class Carver {
 public:
  static constexpr size_t kAlignment = 256;
  Carver(void* base, Device device) : base_(static_cast<char*>(base)), device_(device) {}

  Tensor take(DType dtype, std::vector<int64_t> shape) {
    offset_ = (offset_ + kAlignment - 1) / kAlignment * kAlignment;
    Tensor tensor = Tensor::view(base_ ? base_ + offset_ : nullptr, dtype, device_, std::move(shape));
    offset_ += tensor.nbytes();
    return tensor;
  }
  size_t used() const { return offset_; }

 private:
  char* base_;
  Device device_;
  size_t offset_ = 0;
};

}  // namespace

size_t Activations::slab_bytes(const ModelConfig& config, ActivationCapacity capacity, DType dtype) {
  return bind(config, capacity, nullptr, dtype).bytes;
}

Activations Activations::bind(const ModelConfig& config, ActivationCapacity capacity, void* base, DType dtype,
                              Device device) {
  config.validate();
  if (capacity.max_tokens <= 0 || capacity.max_sequences <= 0 || capacity.max_sequences > capacity.max_tokens)
    throw std::invalid_argument("activation capacity needs 0 < max_sequences <= max_tokens, got " +
                                std::to_string(capacity.max_sequences) + " sequences, " +
                                std::to_string(capacity.max_tokens) + " tokens");
  if (reinterpret_cast<uintptr_t>(base) % Carver::kAlignment != 0)
    throw std::invalid_argument("the activation slab must be " + std::to_string(Carver::kAlignment) + "-byte aligned");
  const int64_t T = capacity.max_tokens, C = config.hidden, I = config.intermediate;
  const int64_t QD = config.q_dim(), KD = config.kv_dim();
  Carver carve(base, device);
  Activations acts;
  acts.capacity = capacity;
  acts.token_ids = carve.take(DType::I32, {T});
  acts.positions = carve.take(DType::I32, {T});
  acts.cu_seqlens = carve.take(DType::I32, {capacity.max_sequences + 1});
  acts.inv_freq = carve.take(DType::F32, {config.head_dim / 2});
  for (int l = 0; l < config.layers; ++l) {
    LayerActivations layer;
    layer.input = carve.take(dtype, {T, C});
    layer.input_rstd = carve.take(DType::F32, {T});
    layer.q = carve.take(dtype, {T, QD});
    layer.k = carve.take(dtype, {T, KD});
    layer.v = carve.take(dtype, {T, KD});
    if (config.qk_norm) {
      layer.q_rstd = carve.take(DType::F32, {T, config.heads});
      layer.k_rstd = carve.take(DType::F32, {T, config.kv_heads});
      layer.q_rope = carve.take(dtype, {T, QD});
      layer.k_rope = carve.take(dtype, {T, KD});
    } else {
      layer.q_rope = layer.q;
      layer.k_rope = layer.k;
    }
    layer.attention = carve.take(dtype, {T, QD});
    layer.lse = carve.take(DType::F32, {T, config.heads});
    layer.mid = carve.take(dtype, {T, C});
    layer.mid_rstd = carve.take(DType::F32, {T});
    layer.gate = carve.take(dtype, {T, I});
    layer.up = carve.take(dtype, {T, I});
    layer.mlp_hidden = carve.take(dtype, {T, I});
    acts.layers.push_back(std::move(layer));
  }
  acts.output = carve.take(dtype, {T, C});
  acts.output_rstd = carve.take(DType::F32, {T});
  acts.logits = carve.take(dtype, {T, config.vocab});

  acts.normed = carve.take(dtype, {T, C});
  acts.d_residual = carve.take(dtype, {T, C});
  acts.d_normed = carve.take(dtype, {T, C});
  acts.d_q_rope = carve.take(dtype, {T, QD});
  acts.d_q = carve.take(dtype, {T, QD});
  acts.d_k_rope = carve.take(dtype, {T, KD});
  acts.d_k = carve.take(dtype, {T, KD});
  acts.d_v = carve.take(dtype, {T, KD});
  acts.d_attention = carve.take(dtype, {T, QD});
  acts.attention_row_dots = carve.take(DType::F32, {T, config.heads});
  acts.d_mlp_hidden = carve.take(dtype, {T, I});
  acts.d_gate = carve.take(dtype, {T, I});
  acts.d_up = carve.take(dtype, {T, I});
  acts.bytes = carve.used();
  return acts;
}

Tensor first_rows(const Tensor& buffer, int64_t rows) {
  if (buffer.rank() < 1 || rows < 0 || rows > buffer.shape[0])
    throw std::out_of_range("cannot take " + std::to_string(rows) + " rows of " + buffer.describe());
  Tensor view = buffer;
  view.shape[0] = rows;
  return view;
}

Tensor per_head_rows(const Tensor& x, int heads) {
  if (x.rank() != 2 || heads <= 0 || x.shape[1] % heads != 0)
    throw std::invalid_argument("cannot split the rows of " + x.describe() + " into " + std::to_string(heads) + " heads");
  return Tensor::view(x.data, x.dtype, x.device, {x.shape[0] * heads, x.shape[1] / heads});
}

}  // namespace tandem
