#include "model/transformer.h"

#include <stdexcept>

namespace tandem {

namespace {

Tensor flat(const Tensor& x) { return Tensor::view(x.data, x.dtype, x.device, {x.numel()}); }

}  // namespace

std::vector<int32_t> packed_positions(std::span<const int32_t> cu_seqlens, int64_t tokens) {
  if (cu_seqlens.size() < 2 || cu_seqlens.front() != 0 || cu_seqlens.back() != tokens)
    throw std::invalid_argument("cu_seqlens must start at 0 and end at the token count " + std::to_string(tokens) +
                                " (got " + std::to_string(cu_seqlens.size()) + " offsets)");
  std::vector<int32_t> positions(tokens);
  for (size_t s = 0; s + 1 < cu_seqlens.size(); ++s) {
    if (cu_seqlens[s + 1] <= cu_seqlens[s])
      throw std::invalid_argument("cu_seqlens must increase strictly: sequence " + std::to_string(s) + " spans [" +
                                  std::to_string(cu_seqlens[s]) + ", " + std::to_string(cu_seqlens[s + 1]) + ")");
    for (int32_t t = cu_seqlens[s]; t < cu_seqlens[s + 1]; ++t) positions[t] = t - cu_seqlens[s];
  }
  return positions;
}

Transformer::Transformer(const ModelConfig& config, Ops& ops)
    : config_(config), ops_(ops), inv_freq_(config.rope_inv_freq()) {
  config_.validate();
}

void Transformer::attention_inputs(const LayerParameters& p, const LayerActivations& layer, const Activations& acts) {
  const int64_t T = acts.tokens;
  auto rows = [T](const Tensor& t) { return first_rows(t, T); };
  // With q/k norm the stored projections stay as they are (rmsnorm_backward reads them),
  // beside each head's rstd, which the norm writes on the way; without it q_rope and
  // k_rope are the projections, rotated in place.
  const Tensor q_rstd = config_.qk_norm ? flat(rows(layer.q_rstd)) : Tensor{};
  const Tensor k_rstd = config_.qk_norm ? flat(rows(layer.k_rstd)) : Tensor{};
  ops_.qk_norm_rope_forward(rows(layer.q_rope), rows(layer.k_rope), rows(layer.q), rows(layer.k), p.q_norm, p.k_norm,
                            rows(acts.positions), acts.inv_freq, config_.heads, config_.kv_heads,
                            static_cast<float>(config_.rms_eps), q_rstd, k_rstd);
}

Tensor Transformer::forward(const ParameterSet& params, Activations& acts, std::span<const int32_t> token_ids,
                            std::span<const int32_t> cu_seqlens) {
  const int64_t T = static_cast<int64_t>(token_ids.size());
  const int64_t sequences = static_cast<int64_t>(cu_seqlens.size()) - 1;
  if (T > acts.capacity.max_tokens || sequences > acts.capacity.max_sequences)
    throw std::invalid_argument("a batch of " + std::to_string(T) + " tokens in " + std::to_string(sequences) +
                                " sequences exceeds the activation capacity (" +
                                std::to_string(acts.capacity.max_tokens) + " tokens, " +
                                std::to_string(acts.capacity.max_sequences) + " sequences)");
  const std::vector<int32_t> positions = packed_positions(cu_seqlens, T);
  // Checked here, on the host, for every backend: a GPU kernel cannot report a bad id
  // without a synchronisation.
  for (int64_t t = 0; t < T; ++t)
    if (token_ids[t] < 0 || token_ids[t] >= config_.vocab)
      throw std::invalid_argument("token id " + std::to_string(token_ids[t]) + " at position " + std::to_string(t) +
                                  " is outside the vocabulary of " + std::to_string(config_.vocab));
  if (static_cast<int>(params.layers.size()) != config_.layers || static_cast<int>(acts.layers.size()) != config_.layers)
    throw std::invalid_argument("parameters or activations were laid out for another model config");

  acts.tokens = T;
  acts.sequences = sequences;
  auto rows = [T](const Tensor& t) { return first_rows(t, T); };
  const Tensor ids = rows(acts.token_ids), cu = first_rows(acts.cu_seqlens, sequences + 1);
  ops_.copy_from_host(ids, token_ids.data());
  ops_.copy_from_host(rows(acts.positions), positions.data());
  ops_.copy_from_host(cu, cu_seqlens.data());
  ops_.copy_from_host(acts.inv_freq, inv_freq_.data());

  const float eps = static_cast<float>(config_.rms_eps);
  const Tensor normed = rows(acts.normed);
  ops_.embedding_forward(rows(acts.layers[0].input), params.embed_tokens, ids);
  ops_.rmsnorm_forward(normed, rows(acts.layers[0].input_rstd), rows(acts.layers[0].input),
                       params.layers[0].input_norm, eps);
  // Each residual add also applies the norm that reads its result next: one pass over
  // the residual stream instead of two.
  for (int l = 0; l < config_.layers; ++l) {
    const LayerParameters& p = params.layers[l];
    const LayerActivations& a = acts.layers[l];
    const Tensor input = rows(a.input), mid = rows(a.mid);

    ops_.matmul_forward(rows(a.q), normed, p.q_proj, p.q_bias);
    ops_.matmul_forward(rows(a.k), normed, p.k_proj, p.k_bias);
    ops_.matmul_forward(rows(a.v), normed, p.v_proj, p.v_bias);
    attention_inputs(p, a, acts);
    ops_.attention_forward(rows(a.attention), rows(a.lse), rows(a.q_rope), rows(a.k_rope), rows(a.v), cu,
                           config_.heads, config_.kv_heads);
    ops_.matmul_forward(mid, rows(a.attention), p.o_proj, Tensor{});
    ops_.add_rmsnorm_forward(normed, rows(a.mid_rstd), mid, input, p.post_attention_norm, eps);

    ops_.matmul_forward(rows(a.gate), normed, p.gate_proj, Tensor{});
    ops_.matmul_forward(rows(a.up), normed, p.up_proj, Tensor{});
    ops_.swiglu_forward(rows(a.mlp_hidden), rows(a.gate), rows(a.up));
    const bool last = l + 1 == config_.layers;
    const Tensor next = rows(last ? acts.output : acts.layers[l + 1].input);
    ops_.matmul_forward(next, rows(a.mlp_hidden), p.down_proj, Tensor{});
    ops_.add_rmsnorm_forward(normed, rows(last ? acts.output_rstd : acts.layers[l + 1].input_rstd), next, mid,
                             last ? params.final_norm : params.layers[l + 1].input_norm, eps);
  }
  const Tensor logits = rows(acts.logits);
  ops_.matmul_forward(logits, normed, params.lm_head, Tensor{});
  return logits;
}

void Transformer::backward(const ParameterSet& params, const ParameterSet& grads, Activations& acts,
                           const Tensor& dlogits) {
  const int64_t T = acts.tokens;
  if (T <= 0) throw std::logic_error("Transformer::backward called before forward on these activations");
  if (dlogits.rank() != 2 || dlogits.shape[0] != T || dlogits.shape[1] != config_.vocab)
    throw std::invalid_argument("Transformer::backward: dlogits must be [" + std::to_string(T) + "," +
                                std::to_string(config_.vocab) + "], got " + dlogits.describe());
  auto rows = [T](const Tensor& t) { return first_rows(t, T); };
  const float eps = static_cast<float>(config_.rms_eps);
  const int H = config_.heads, KV = config_.kv_heads;
  const Tensor normed = rows(acts.normed), d_normed = rows(acts.d_normed), d_residual = rows(acts.d_residual);
  const Tensor cu = first_rows(acts.cu_seqlens, acts.sequences + 1);
  const Tensor positions = rows(acts.positions);
  // Whole logits buffer: dead from the LM head's backward on.
  const AttentionScratch attention_scratch{
      rows(acts.attention_row_dots),
      Tensor::view(acts.logits.data, DType::BF16, acts.logits.device, {static_cast<int64_t>(acts.logits.nbytes() / 2)})};

  // LM head and final norm; d_residual then carries dLoss/dh down the residual stream,
  // each sublayer adding its branch's share through rmsnorm_backward.
  // The first writer of each input gradient overwrites it, the others add (no memsets).
  constexpr GradWrite overwrite = GradWrite::overwrite, accumulate = GradWrite::accumulate;
  ops_.rmsnorm_forward(normed, rows(acts.output_rstd), rows(acts.output), params.final_norm, eps);
  ops_.matmul_backward(d_normed, grads.lm_head, Tensor{}, dlogits, normed, params.lm_head, overwrite);
  ops_.rmsnorm_backward(d_residual, grads.final_norm, d_normed, rows(acts.output), params.final_norm,
                        rows(acts.output_rstd), overwrite);

  for (int l = config_.layers - 1; l >= 0; --l) {
    const LayerParameters& p = params.layers[l];
    const LayerParameters& g = grads.layers[l];
    const LayerActivations& a = acts.layers[l];
    const Tensor input = rows(a.input), mid = rows(a.mid);

    // MLP branch.
    ops_.rmsnorm_forward(normed, rows(a.mid_rstd), mid, p.post_attention_norm, eps);
    ops_.matmul_backward(rows(acts.d_mlp_hidden), g.down_proj, Tensor{}, d_residual, rows(a.mlp_hidden),
                         p.down_proj, overwrite);
    ops_.swiglu_backward(rows(acts.d_gate), rows(acts.d_up), rows(acts.d_mlp_hidden), rows(a.gate), rows(a.up));
    ops_.matmul_backward(d_normed, g.gate_proj, Tensor{}, rows(acts.d_gate), normed, p.gate_proj, overwrite);
    ops_.matmul_backward(d_normed, g.up_proj, Tensor{}, rows(acts.d_up), normed, p.up_proj, accumulate);
    ops_.rmsnorm_backward(d_residual, g.post_attention_norm, d_normed, mid, p.post_attention_norm, rows(a.mid_rstd),
                          accumulate);

    // Attention branch.
    ops_.matmul_backward(rows(acts.d_attention), g.o_proj, Tensor{}, d_residual, rows(a.attention), p.o_proj,
                         overwrite);
    const Tensor d_q_rope = rows(acts.d_q_rope), d_k_rope = rows(acts.d_k_rope), d_v = rows(acts.d_v);
    ops_.attention_backward(d_q_rope, d_k_rope, d_v, rows(acts.d_attention), rows(a.attention), rows(a.lse),
                            rows(a.q_rope), rows(a.k_rope), rows(a.v), cu, H, KV, attention_scratch);
    Tensor d_q = d_q_rope, d_k = d_k_rope;
    if (config_.qk_norm) {
      d_q = rows(acts.d_q);
      d_k = rows(acts.d_k);
      ops_.rmsnorm_rope_backward(d_q, g.q_norm, d_q_rope, rows(a.q), p.q_norm, flat(rows(a.q_rstd)), positions,
                                 acts.inv_freq, H);
      ops_.rmsnorm_rope_backward(d_k, g.k_norm, d_k_rope, rows(a.k), p.k_norm, flat(rows(a.k_rstd)), positions,
                                 acts.inv_freq, KV);
    } else {
      ops_.rope_backward(d_q_rope, positions, acts.inv_freq, H);
      ops_.rope_backward(d_k_rope, positions, acts.inv_freq, KV);
    }
    ops_.rmsnorm_forward(normed, rows(a.input_rstd), input, p.input_norm, eps);
    ops_.matmul_backward(d_normed, g.q_proj, g.q_bias, d_q, normed, p.q_proj, overwrite);
    ops_.matmul_backward(d_normed, g.k_proj, g.k_bias, d_k, normed, p.k_proj, accumulate);
    ops_.matmul_backward(d_normed, g.v_proj, g.v_bias, d_v, normed, p.v_proj, accumulate);
    ops_.rmsnorm_backward(d_residual, g.input_norm, d_normed, input, p.input_norm, rows(a.input_rstd), accumulate);
  }
  ops_.embedding_backward(grads.embed_tokens, d_residual, rows(acts.token_ids));
}

}  // namespace tandem
