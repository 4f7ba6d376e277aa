// The fused ops of CpuOps (add_rmsnorm_forward, qk_norm_rope_forward) against the unfused
// sequences they replace in the engine's and the trainer's forward passes: equal bit for
// bit (the per-head rstd the trainer keeps included), so either pass gives the same
// results on the CPU either way; aliasing outputs and inputs (as the engine does) changes
// nothing; bad arguments are refused by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/activations.h"
#include "model/cpu_ops.h"

using namespace tandem;

namespace {

class CpuFusedOps : public ::testing::Test {
 protected:
  std::vector<float> normal(int64_t n, float mean = 0, float stddev = 1) {
    std::normal_distribution<float> distribution(mean, stddev);
    std::vector<float> values(n);
    for (float& v : values) v = distribution(rng_);
    return values;
  }
  std::vector<int32_t> positions(int64_t n) {
    std::uniform_int_distribution<int32_t> distribution(0, 4095);
    std::vector<int32_t> values(n);
    for (int32_t& v : values) v = distribution(rng_);
    return values;
  }

  CpuOps ops_;

 private:
  std::mt19937 rng_{20240611};
};

Tensor view(std::vector<float>& values, std::vector<int64_t> shape) {
  return Tensor::view(values.data(), DType::F32, Device::CPU, std::move(shape));
}
Tensor view(std::vector<int32_t>& values) {
  return Tensor::view(values.data(), DType::I32, Device::CPU, {static_cast<int64_t>(values.size())});
}

void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0) << what;
}

std::vector<float> inv_freq(int head_dim) {
  std::vector<float> freq(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i)
    freq[i] = 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / static_cast<float>(head_dim));
  return freq;
}

void expect_refused(const std::function<void()>& call, const std::string& fragment) {
  try {
    call();
    ADD_FAILURE() << "accepted a call that should name " << fragment;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST_F(CpuFusedOps, AddRmsnormIsAddThenRmsnormBitForBit) {
  const int64_t N = 37, D = 96;  // enough work for the parallel loops
  std::vector<float> hidden = normal(N * D, 0.0f, 2.0f), branch = normal(N * D), weight = normal(D, 1.0f, 0.1f);
  std::vector<float> unfused_hidden = hidden, unfused_out(N * D), unfused_rstd(N);
  for (int64_t i = 0; i < N * D; ++i) unfused_hidden[i] += branch[i];
  ops_.rmsnorm_forward(view(unfused_out, {N, D}), view(unfused_rstd, {N}), view(unfused_hidden, {N, D}),
                       view(weight, {D}), 1e-6f);

  std::vector<float> out(N * D), rstd(N);
  ops_.add_rmsnorm_forward(view(out, {N, D}), view(rstd, {N}), view(hidden, {N, D}), view(branch, {N, D}),
                           view(weight, {D}), 1e-6f);
  expect_same_bits(hidden, unfused_hidden, "hidden");
  expect_same_bits(out, unfused_out, "out");
  expect_same_bits(rstd, unfused_rstd, "rstd");
}

struct QkShape {
  int64_t tokens;
  int heads, kv_heads, head_dim;
};

// The unfused sequence: both per-head norms (their rstd into q_rstd, k_rstd), then both
// rotations.
void unfused_qk(CpuOps& ops, std::vector<float>& q_out, std::vector<float>& k_out, std::vector<float>& q_rstd,
                std::vector<float>& k_rstd, std::vector<float>& q, std::vector<float>& k, std::vector<float>* q_norm,
                std::vector<float>* k_norm, std::vector<int32_t>& positions, std::vector<float>& freq,
                QkShape shape) {
  const auto [T, H, KV, D] = shape;
  if (q_norm) {
    ops.rmsnorm_forward(per_head_rows(view(q_out, {T, H * D}), H), view(q_rstd, {T * H}),
                        per_head_rows(view(q, {T, H * D}), H), view(*q_norm, {D}), 1e-6f);
    ops.rmsnorm_forward(per_head_rows(view(k_out, {T, KV * D}), KV), view(k_rstd, {T * KV}),
                        per_head_rows(view(k, {T, KV * D}), KV), view(*k_norm, {D}), 1e-6f);
  } else {
    q_out = q;
    k_out = k;
  }
  ops.rope_forward(view(q_out, {T, H * D}), view(positions), view(freq, {D / 2}), H);
  ops.rope_forward(view(k_out, {T, KV * D}), view(positions), view(freq, {D / 2}), KV);
}

TEST_F(CpuFusedOps, QkNormRopeIsPerHeadNormsThenRotationsBitForBit) {
  for (const QkShape shape : {QkShape{5, 4, 2, 6}, QkShape{33, 16, 8, 128}}) {
    const auto [T, H, KV, D] = shape;
    for (const bool norm : {true, false}) {
      SCOPED_TRACE(std::string(norm ? "qk_norm" : "rope alone") + ", head_dim " + std::to_string(D));
      std::vector<float> q = normal(T * H * D, 0.0f, 2.0f), k = normal(T * KV * D, 0.0f, 2.0f);
      std::vector<float> q_norm = normal(D, 1.0f, 0.2f), k_norm = normal(D, 1.0f, 0.2f), freq = inv_freq(D);
      std::vector<int32_t> pos = positions(T);
      std::vector<float> want_q(q.size()), want_k(k.size()), want_q_rstd(T * H), want_k_rstd(T * KV);
      unfused_qk(ops_, want_q, want_k, want_q_rstd, want_k_rstd, q, k, norm ? &q_norm : nullptr,
                 norm ? &k_norm : nullptr, pos, freq, shape);

      // Out of place keeping each head's rstd (the trainer), then in place without (the engine).
      const Tensor q_weight = norm ? view(q_norm, {D}) : Tensor{}, k_weight = norm ? view(k_norm, {D}) : Tensor{};
      std::vector<float> q_out(q.size()), k_out(k.size()), q_rstd(T * H, NAN), k_rstd(T * KV, NAN);
      ops_.qk_norm_rope_forward(view(q_out, {T, H * D}), view(k_out, {T, KV * D}), view(q, {T, H * D}),
                                view(k, {T, KV * D}), q_weight, k_weight, view(pos), view(freq, {D / 2}), H, KV,
                                1e-6f, norm ? view(q_rstd, {T * H}) : Tensor{},
                                norm ? view(k_rstd, {T * KV}) : Tensor{});
      expect_same_bits(q_out, want_q, "q_out");
      expect_same_bits(k_out, want_k, "k_out");
      if (norm) {
        expect_same_bits(q_rstd, want_q_rstd, "q_rstd");
        expect_same_bits(k_rstd, want_k_rstd, "k_rstd");
      }
      ops_.qk_norm_rope_forward(view(q, {T, H * D}), view(k, {T, KV * D}), view(q, {T, H * D}),
                                view(k, {T, KV * D}), q_weight, k_weight, view(pos), view(freq, {D / 2}), H, KV,
                                1e-6f, Tensor{}, Tensor{});
      expect_same_bits(q, want_q, "q in place");
      expect_same_bits(k, want_k, "k in place");
    }
  }
}

TEST_F(CpuFusedOps, FusedOpsRefuseBadArguments) {
  const int64_t T = 3, H = 4, KV = 2, D = 8;
  std::vector<float> q(T * H * D), k(T * KV * D), weight(D), freq(D / 2), wrong(T * H * D);
  std::vector<int32_t> pos(T);
  auto qk = [&](const Tensor& k_tensor, const Tensor& q_norm, const Tensor& k_norm, int kv_heads) {
    ops_.qk_norm_rope_forward(view(q, {T, H * D}), k_tensor, view(q, {T, H * D}), k_tensor, q_norm, k_norm, view(pos),
                              view(freq, {D / 2}), H, kv_heads, 1e-6f, Tensor{}, Tensor{});
  };
  std::vector<float> q_rstd(T * H), k_rstd(T * KV);
  auto keeping = [&](const Tensor& weights, const Tensor& q_kept, const Tensor& k_kept) {
    ops_.qk_norm_rope_forward(view(q, {T, H * D}), view(k, {T, KV * D}), view(q, {T, H * D}), view(k, {T, KV * D}),
                              weights, weights, view(pos), view(freq, {D / 2}), H, KV, 1e-6f, q_kept, k_kept);
  };
  expect_refused([&] { keeping(Tensor{}, view(q_rstd, {T * H}), view(k_rstd, {T * KV})); },
                 "without q/k norm weights");
  expect_refused([&] { keeping(view(weight, {D}), view(q_rstd, {T * H}), Tensor{}); }, "'k_rstd'");
  expect_refused([&] { keeping(view(weight, {D}), view(k_rstd, {T * KV}), view(k_rstd, {T * KV})); }, "'q_rstd'");
  expect_refused([&] { qk(view(k, {T, KV * D}), view(weight, {D}), Tensor{}, KV); }, "'k_norm'");
  expect_refused([&] { qk(view(k, {T, KV * D}), Tensor{}, view(weight, {D}), KV); }, "'q_norm'");
  expect_refused([&] { qk(view(wrong, {T, H * D}), Tensor{}, Tensor{}, KV); }, "'k'");
  expect_refused([&] { qk(view(k, {T, KV * D}), Tensor{}, Tensor{}, 0); }, "0 key heads");
  std::vector<float> out(T * D), rstd(T), hidden(T * D), branch(T * D + 1);
  expect_refused([&] {
    ops_.add_rmsnorm_forward(view(out, {T, D}), view(rstd, {T}), view(hidden, {T, D}), view(branch, {T, D + 1}),
                             view(weight, {D}), 1e-6f);
  },
                 "'branch'");
}

}  // namespace
