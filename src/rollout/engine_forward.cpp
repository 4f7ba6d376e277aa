#include "rollout/engine_forward.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/activations.h"

namespace tandem {

namespace {

[[noreturn]] void bad_step(const std::string& why) { throw std::invalid_argument("EngineForward: " + why); }

}  // namespace

EngineForward::EngineForward(const ModelConfig& config, const ParameterSet& weights, Ops& ops,
                             PagedAttention& attention, MemoryPool& pool, StepCapacity capacity, DType dtype,
                             bool fp8_weights, const std::string& name)
    : config_(config),
      params_(weights),
      ops_(ops),
      attention_(attention),
      pool_(pool),
      capacity_(capacity),
      dtype_(dtype),
      fp8_weights_(fp8_weights),
      inv_freq_(config.rope_inv_freq()) {
  config_.validate();
  if (static_cast<int>(weights.layers.size()) != config_.layers)
    throw std::invalid_argument("EngineForward: the weights were laid out for another model config");
  for (const LayerParameters& p : weights.layers) {
    // A bias lies between its projection and the next one in the layout; weights laid
    // apart elsewhere could still meet, and one GEMM would then drop the biases.
    const bool biased = p.q_bias.data || p.k_bias.data || p.v_bias.data;
    stacked_.push_back({biased ? Tensor{} : stacked_weights({p.q_proj, p.k_proj, p.v_proj}),
                        stacked_weights({p.gate_proj, p.up_proj})});
  }
  if (fp8_weights) {
    for (const StackedWeights& layer : stacked_)
      if (!layer.qkv_proj.data || !layer.gate_up_proj.data)
        throw std::invalid_argument(
            "EngineForward: FP8 weights need every layer's q|k|v and gate|up projections stacked, without biases");
    // cuBLASLt's FP8 products take widths in multiples of 16.
    for (const int64_t width : {config_.hidden, config_.q_dim() + 2 * config_.kv_dim(), 2 * config_.intermediate,
                                config_.intermediate})
      if (ops.device() == Device::CUDA && width % 16 != 0)
        throw std::invalid_argument("EngineForward: FP8 weights need the projections' widths in multiples of 16, got " +
                                    std::to_string(width));
  }
  if (capacity.max_sequences < 1 || capacity.max_tokens < capacity.max_sequences || capacity.max_blocks < 1)
    throw std::invalid_argument("EngineForward: capacity needs 1 <= max_sequences <= max_tokens and max_blocks >= 1");
  size_t bytes = 0;
  bind(nullptr, pool.device(), &bytes, &inputs_bytes_);
  allocation_ = pool.allocate(tags::kv_cache, bytes, name);
  scratch_ = bind(allocation_->ptr, pool.device(), &bytes, &inputs_bytes_);
  staging_ = std::make_unique<PinnedMemory>(kStagingImages * inputs_bytes_, pool.device());
  for (int i = 0; i < kStagingImages; ++i) {
    images_[i] = bind(static_cast<char*>(staging_->data()) + i * inputs_bytes_, Device::CPU, &bytes, &inputs_bytes_);
    std::copy(inv_freq_.begin(), inv_freq_.end(), images_[i].inv_freq.ptr<float>());
  }
}

EngineForward::~EngineForward() { pool_.release(allocation_); }

EngineForward::Scratch EngineForward::bind(void* base, Device device, size_t* bytes, size_t* inputs_bytes) const {
  size_t offset = 0;
  auto take = [&](DType dtype, std::vector<int64_t> shape) {
    offset = (offset + 255) / 256 * 256;
    Tensor tensor = Tensor::view(base ? static_cast<char*>(base) + offset : nullptr, dtype, device, std::move(shape));
    offset += tensor.nbytes();
    return tensor;
  };
  const int64_t T = capacity_.max_tokens, B = capacity_.max_sequences, C = config_.hidden;
  const int64_t QD = config_.q_dim(), KD = config_.kv_dim(), I = config_.intermediate;
  const auto qkv_stacked = [](const StackedWeights& layer) { return layer.qkv_proj.data != nullptr; };
  // Each q|k|v path's own buffers, only where some layer takes that path: the stacked
  // one's GEMM output, the separate one's k and v and their normed copies (~10 KB a
  // token at the Qwen3-0.6B shape).
  const bool one_gemm = std::ranges::any_of(stacked_, qkv_stacked);
  const bool apart = !std::ranges::all_of(stacked_, qkv_stacked);
  Scratch s;
  s.token_ids = take(DType::I32, {T});
  s.from_rows = take(DType::I32, {T});
  s.positions = take(DType::I32, {T});
  s.slots = take(DType::I32, {T});
  s.cu_queries = take(DType::I32, {B + 1});
  s.context_lens = take(DType::I32, {B});
  s.block_tables = take(DType::I32, {B, capacity_.max_blocks});
  s.last_rows = take(DType::I32, {B});
  s.inv_freq = take(DType::F32, {config_.head_dim / 2});
  offset = (offset + 255) / 256 * 256;
  *inputs_bytes = offset;
  s.rstd = take(DType::F32, {T});
  s.hidden = take(dtype_, {T, C});
  s.normed = take(dtype_, {T, C});
  if (one_gemm) s.qkv = take(dtype_, {T, QD + 2 * KD});
  s.q = take(dtype_, {T, QD});
  if (apart) {
    s.k = take(dtype_, {T, KD});
    s.v = take(dtype_, {T, KD});
    if (config_.qk_norm) {
      s.q_normed = take(dtype_, {T, QD});
      s.k_normed = take(dtype_, {T, KD});
    }
  }
  s.attention = take(dtype_, {T, QD});
  s.branch = take(dtype_, {T, C});
  s.gate = take(dtype_, {T, I});
  s.up = take(dtype_, {T, I});
  // One GEMM's gate|up output overlays gate and up, which two GEMMs write instead when
  // the weights do not stack: no step uses both.
  s.gate_up = Tensor::view(s.gate.data, dtype_, device, {T, 2 * I});
  // FP8 projections take down's input as codes (below): no working-dtype copy of it.
  if (!fp8_weights_) s.mlp = take(dtype_, {T, I});
  s.last_normed = take(dtype_, {B, C});
  s.logits = take(dtype_, {B, config_.vocab});
  if (fp8_weights_) {
    for (int l = 0; l < config_.layers; ++l)
      s.fp8_layers.push_back({take(DType::F8_E4M3, {QD + 2 * KD, C}), take(DType::F8_E4M3, {2 * I, C}),
                              take(DType::F8_E4M3, {C, I}), take(DType::F32, {1}), take(DType::F32, {1}),
                              take(DType::F32, {1})});
    s.normed_codes = take(DType::F8_E4M3, {T, C});
    s.normed_scales = take(DType::F32, {T});
    s.mlp_codes = take(DType::F8_E4M3, {T, I});
    s.mlp_scales = take(DType::F32, {T});
  }
  *bytes = offset;
  return s;
}

size_t EngineForward::fp8_weight_bytes(const ModelConfig& config) {
  const int64_t per_layer = (config.q_dim() + 2 * config.kv_dim() + 3 * config.intermediate) * config.hidden;
  return static_cast<size_t>(config.layers * per_layer);
}

void EngineForward::prepare_weights() {
  if (!fp8_weights_) return;
  for (int l = 0; l < config_.layers; ++l) {
    const Fp8Layer& fp8 = scratch_.fp8_layers[l];
    ops_.quantize_fp8(fp8.qkv_proj, fp8.qkv_scale, stacked_[l].qkv_proj);
    ops_.quantize_fp8(fp8.gate_up_proj, fp8.gate_up_scale, stacked_[l].gate_up_proj);
    ops_.quantize_fp8(fp8.down_proj, fp8.down_scale, params_.layers[l].down_proj);
  }
}

void EngineForward::stage(const StepInputs& step) {
  const int64_t T = step.tokens(), B = step.sequences(), max_blocks = capacity_.max_blocks;
  if (B < 1 || T > capacity_.max_tokens || B > capacity_.max_sequences)
    bad_step("a step of " + std::to_string(T) + " tokens in " + std::to_string(B) +
             " sequences does not fit the capacity (" + std::to_string(capacity_.max_tokens) + " tokens, " +
             std::to_string(capacity_.max_sequences) + " sequences)");
  if (static_cast<int64_t>(step.from_rows.size()) != T || static_cast<int64_t>(step.positions.size()) != T ||
      static_cast<int64_t>(step.slots.size()) != T || static_cast<int64_t>(step.cu_queries.size()) != B + 1 ||
      step.cu_queries.front() != 0 || step.cu_queries.back() != T ||
      static_cast<int64_t>(step.block_tables.size()) != B * max_blocks)
    bad_step("inconsistent step inputs: " + std::to_string(T) + " tokens, " + std::to_string(step.from_rows.size()) +
             " source rows, " + std::to_string(step.positions.size()) + " positions, " +
             std::to_string(step.slots.size()) + " slots, " + std::to_string(step.cu_queries.size()) +
             " query offsets, " + std::to_string(step.block_tables.size()) + " block table entries for " +
             std::to_string(B) + " sequences");
  auto put = [](const Tensor& into, const std::vector<int32_t>& values) {
    std::copy(values.begin(), values.end(), into.ptr<int32_t>());
  };
  const Scratch& image = images_[staged_steps_ % kStagingImages];
  put(image.token_ids, step.token_ids);
  put(image.from_rows, step.from_rows);
  put(image.positions, step.positions);
  put(image.slots, step.slots);
  put(image.cu_queries, step.cu_queries);
  put(image.context_lens, step.context_lens);
  put(image.block_tables, step.block_tables);
  for (int64_t b = 0; b < B; ++b) image.last_rows.ptr<int32_t>()[b] = step.cu_queries[b + 1] - 1;
  // The whole input region, inv_freq included: the scratch may have been dropped (and
  // come back zeroed) with the cache since the last step.
  ops_.queue_copy_from_host(Tensor::view(scratch_.token_ids.data, DType::U8, pool_.device(),
                                         {static_cast<int64_t>(inputs_bytes_)}),
                            image.token_ids.data);
  ++staged_steps_;
  staged_tokens_ = T;
  staged_sequences_ = B;
}

Tensor EngineForward::token_ids() const { return first_rows(scratch_.token_ids, staged_tokens_); }
Tensor EngineForward::from_rows() const { return first_rows(scratch_.from_rows, staged_tokens_); }

Tensor EngineForward::run(const KvCache& cache) {
  const int64_t T = staged_tokens_, B = staged_sequences_;
  if (B < 1) bad_step("run() without a staged step");
  const KvCacheGeometry& geometry = cache.geometry();
  if (geometry.layers != config_.layers || geometry.kv_dim != config_.kv_dim())
    bad_step("the KV cache was laid out for another model config");

  const Scratch& s = scratch_;
  // The step's rows of a buffer; one this path's scratch does not hold stays empty.
  auto rows = [T](const Tensor& t) { return t.data ? first_rows(t, T) : t; };
  const Tensor ids = rows(s.token_ids), positions = rows(s.positions), last = first_rows(s.last_rows, B);
  const PagedBatch batch{rows(s.slots), first_rows(s.cu_queries, B + 1), first_rows(s.context_lens, B),
                         first_rows(s.block_tables, B), geometry.block_size};

  const float eps = static_cast<float>(config_.rms_eps);
  const int H = config_.heads, KV = config_.kv_heads;
  const Tensor hidden = rows(s.hidden), normed = rows(s.normed), branch = rows(s.branch), rstd = rows(s.rstd);
  const Tensor q = rows(s.q), attention = rows(s.attention);
  const Tensor gate_up = rows(s.gate_up), gate = rows(s.gate), up = rows(s.up), mlp = rows(s.mlp);
  // With FP8 weights the norms before the FP8 projections write their inputs as codes.
  const ScaledRows projected =
      fp8_weights_ ? ScaledRows(rows(s.normed_codes), rows(s.normed_scales)) : ScaledRows(normed);
  ops_.embedding_forward(hidden, params_.embed_tokens, ids);
  // Each residual add also applies the norm that reads its result next (fewer kernels:
  // at decode sizes their start-up and drain cost more than their work).
  ops_.rmsnorm_forward(projected, rstd, hidden, params_.layers[0].input_norm, eps);
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParameters& p = params_.layers[l];
    const StackedWeights& stacked = stacked_[l];
    // Without qk_norm the norm weights are empty and q, k only rotate.
    if (stacked.qkv_proj.data) {  // always so with FP8 weights
      const Tensor qkv = rows(s.qkv);
      ScaledRows projected_qkv = qkv;
      if (fp8_weights_) {
        const Fp8Layer& fp8 = s.fp8_layers[l];
        ops_.fp8_matmul_forward(qkv, projected.values, fp8.qkv_proj, fp8.qkv_scale);
        projected_qkv = ScaledRows(qkv, projected.scales);
      } else {
        ops_.matmul_forward(qkv, normed, stacked.qkv_proj, Tensor{});
      }
      attention_.attend_qkv(attention, q, cache.layer(l), projected_qkv, p.q_norm, p.k_norm, positions, s.inv_freq,
                            batch, H, KV, eps);
    } else {
      const Tensor k = rows(s.k), v = rows(s.v);
      ops_.matmul_forward(q, normed, p.q_proj, p.q_bias);
      ops_.matmul_forward(k, normed, p.k_proj, p.k_bias);
      ops_.matmul_forward(v, normed, p.v_proj, p.v_bias);
      const Tensor q_in = config_.qk_norm ? rows(s.q_normed) : q;
      const Tensor k_in = config_.qk_norm ? rows(s.k_normed) : k;
      ops_.qk_norm_rope_forward(q_in, k_in, q, k, p.q_norm, p.k_norm, positions, s.inv_freq, H, KV, eps, Tensor{},
                                Tensor{});
      attention_.store(cache.layer(l), k_in, v, batch.slots);
      attention_.attend(attention, q_in, cache.layer(l), batch, H, KV);
    }
    ops_.matmul_forward(branch, attention, p.o_proj, Tensor{});
    ops_.add_rmsnorm_forward(projected, rstd, hidden, branch, p.post_attention_norm, eps);

    // down_proj's output, with the row scales of its FP8 input.
    ScaledRows down = branch;
    if (fp8_weights_) {
      const Fp8Layer& fp8 = s.fp8_layers[l];
      const ScaledRows mlp_codes(rows(s.mlp_codes), rows(s.mlp_scales));
      ops_.fp8_matmul_forward(gate_up, projected.values, fp8.gate_up_proj, fp8.gate_up_scale);
      ops_.swiglu_forward(mlp_codes, ScaledRows(gate_up, projected.scales));
      ops_.fp8_matmul_forward(branch, mlp_codes.values, fp8.down_proj, fp8.down_scale);
      down = ScaledRows(branch, mlp_codes.scales);
    } else {
      if (stacked.gate_up_proj.data) {
        ops_.matmul_forward(gate_up, normed, stacked.gate_up_proj, Tensor{});
        ops_.swiglu_forward(mlp, gate_up);
      } else {
        ops_.matmul_forward(gate, normed, p.gate_proj, Tensor{});
        ops_.matmul_forward(up, normed, p.up_proj, Tensor{});
        ops_.swiglu_forward(mlp, gate, up);
      }
      ops_.matmul_forward(branch, mlp, p.down_proj, Tensor{});
    }
    const bool last_layer = l + 1 == config_.layers;
    // The LM head reads the final norm in the working dtype.
    ops_.add_rmsnorm_forward(last_layer ? ScaledRows(normed) : projected, rstd, hidden, down,
                             last_layer ? params_.final_norm : params_.layers[l + 1].input_norm, eps);
  }
  // The embedding lookup doubles as a row gather: each sequence's last new token, already
  // through the final norm (every row went through it: one kernel fewer than a gather of
  // the hidden rows and a norm of those alone).
  const Tensor last_normed = first_rows(s.last_normed, B);
  ops_.embedding_forward(last_normed, normed, last);
  const Tensor logits = first_rows(s.logits, B);
  ops_.matmul_forward(logits, last_normed, params_.lm_head, Tensor{});
  return logits;
}

}  // namespace tandem
