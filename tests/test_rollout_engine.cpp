// The rollout engine on the CPU backend against the trainer's full forward
// (Transformer::forward, no cache): greedy decoding with the paged KV cache picks the
// argmax of a full forward at every step; the recorded log-probs equal the trainer's
// log softmax(logits / T) of the same tokens within 1e-5 (FP32 both sides, different
// summation orders), so the importance ratio starts at 1; continuous batching, chunked
// prefill and preemption give each request the tokens it gets when run alone; stops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numeric>

#include "rollout/request.h"
#include "tasks/char_tokenizer.h"
#include "test_rollout_support.h"

namespace tandem {
namespace {

using testing::largest_logprob_gap;
using testing::random_prompt;
using testing::reference_logprob;
using testing::RolloutRig;
using testing::small_engine_options;

struct Variant {
  const char* name;
  bool qk_norm, qkv_bias, tied;
};

class EngineVariant : public ::testing::TestWithParam<Variant> {
 protected:
  ModelConfig config() const {
    const Variant v = GetParam();
    return testing::tiny_config(v.qk_norm, v.qkv_bias, v.tied);
  }
};

INSTANTIATE_TEST_SUITE_P(Models, EngineVariant,
                         ::testing::Values(Variant{"qwen3", true, false, true}, Variant{"qwen2", false, true, true},
                                           Variant{"llama", false, false, false}),
                         [](const auto& info) { return std::string(info.param.name); });

int32_t argmax(const float* row, int vocab) { return static_cast<int32_t>(std::max_element(row, row + vocab) - row); }

TEST_P(EngineVariant, GreedyWithCacheIsTheArgmaxOfAFullForwardAtEveryStep) {
  RolloutRig rig(config());
  auto engine = rig.make_engine();
  const int V = rig.model.config.vocab;
  GenerationRequest request{0, random_prompt(7, V, 1), {}};
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = 24;
  const Completion completion = engine->generate({request}).front();
  ASSERT_EQ(completion.finish, FinishReason::Length);
  ASSERT_EQ(completion.tokens.size(), 24u);

  std::vector<int32_t> sequence = request.prompt;
  for (size_t i = 0; i < completion.tokens.size(); ++i) {
    const int32_t length = static_cast<int32_t>(sequence.size());
    const std::vector<int32_t> cu = {0, length};
    const Tensor logits = rig.model.transformer.forward(rig.model.params, rig.model.acts, sequence, cu);
    const float* last = logits.ptr<float>() + (length - 1) * V;
    EXPECT_EQ(completion.tokens[i], argmax(last, V)) << "step " << i;
    EXPECT_NEAR(completion.logprobs[i], reference_logprob(last, V, completion.tokens[i], 1.0), 1e-5) << "step " << i;
    sequence.push_back(completion.tokens[i]);
  }
}

// Samples several prompts together, then recomputes every sampled token's log-prob with
// one packed trainer forward over prompt + completion.
TEST_P(EngineVariant, LogprobsMatchTheTrainersForwardOnTheSameTokens) {
  RolloutRig rig(config());
  auto engine = rig.make_engine();
  const int V = rig.model.config.vocab;
  SamplingParams sampling;
  sampling.temperature = 0.8f;
  sampling.top_p = 0.9f;
  sampling.top_k = 20;
  sampling.max_new_tokens = 20;
  sampling.seed = 11;
  std::vector<GenerationRequest> requests;
  for (uint64_t r = 0; r < 5; ++r) requests.push_back({r, random_prompt(3 + 4 * r, V, 100 + r), sampling});
  const std::vector<Completion> completions = engine->generate(requests);

  EXPECT_LT(largest_logprob_gap(rig.model, requests, completions), 1e-5);
}

std::vector<GenerationRequest> mixed_requests(int vocab) {
  std::vector<GenerationRequest> requests;
  const int prompt_lengths[] = {1, 17, 5, 30, 2, 9, 12};
  const int max_new[] = {20, 3, 25, 7, 14, 1, 18};
  for (uint64_t r = 0; r < 7; ++r) {
    SamplingParams sampling;
    sampling.seed = 5;
    sampling.max_new_tokens = max_new[r];
    sampling.temperature = r % 3 == 0 ? 0.0f : 1.0f;
    requests.push_back({100 + r, random_prompt(prompt_lengths[r], vocab, 7 + r), sampling});
  }
  return requests;
}

void expect_same_completions(const std::vector<Completion>& actual, const std::vector<Completion>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t r = 0; r < actual.size(); ++r) {
    EXPECT_EQ(actual[r].request_id, expected[r].request_id);
    EXPECT_EQ(actual[r].finish, expected[r].finish) << "request " << r;
    EXPECT_EQ(actual[r].tokens, expected[r].tokens) << "request " << r;
    ASSERT_EQ(actual[r].logprobs.size(), expected[r].logprobs.size());
    for (size_t i = 0; i < actual[r].logprobs.size(); ++i)
      EXPECT_NEAR(actual[r].logprobs[i], expected[r].logprobs[i], 1e-5) << "request " << r << " token " << i;
  }
}

std::vector<Completion> one_at_a_time(RolloutRig& rig, const std::vector<GenerationRequest>& requests) {
  std::vector<Completion> completions;
  for (const GenerationRequest& request : requests) {
    auto engine = rig.make_engine();
    completions.push_back(engine->generate({request}).front());
  }
  return completions;
}

TEST_P(EngineVariant, ContinuousBatchingGivesEachRequestItsTokensAlone) {
  RolloutRig rig(config());
  const std::vector<GenerationRequest> requests = mixed_requests(rig.model.config.vocab);
  const std::vector<Completion> alone = one_at_a_time(rig, requests);

  // At most 3 sequences and 8 new tokens a step: prompts are prefilled in chunks, decodes
  // and prefills share steps, finished sequences leave and waiting ones join.
  EngineOptions options = small_engine_options();
  options.max_running = 3;
  options.max_step_tokens = 8;
  auto engine = rig.make_engine(options);
  expect_same_completions(engine->generate(requests), alone);
  EXPECT_EQ(engine->free_blocks(), engine->total_blocks());
  EXPECT_GT(engine->stats().steps, 25);
}

// An FP8 KV cache (rollout.kv-cache-dtype = fp8): a token's codes depend on its keys and
// values alone, not on the step that stored them, so continuous batching still gives each
// request its tokens alone. The recorded log-probs then differ from the trainer's forward
// on the same tokens by the codes' rounding (up to 1/16 of an element: 3 mantissa bits):
// more than an FP32 cache's 1e-5, and at most 0.10-0.11 on these tiny random models
// (heads of 6 dims, peaked logits), bounded at 0.25.
TEST_P(EngineVariant, Fp8CacheBatchesAsAloneAndStaysNearTheTrainersLogprobs) {
  RolloutRig rig(config());
  const int V = rig.model.config.vocab;
  EngineOptions fp8 = small_engine_options();
  fp8.fp8_kv_cache = true;
  const std::vector<GenerationRequest> requests = mixed_requests(V);
  std::vector<Completion> alone;
  for (const GenerationRequest& request : requests) alone.push_back(rig.make_engine(fp8)->generate({request}).front());
  EngineOptions batched = fp8;
  batched.max_running = 3;
  batched.max_step_tokens = 8;
  auto engine = rig.make_engine(batched);
  EXPECT_EQ(engine->cache_geometry().dtype, DType::F8_E4M3);
  expect_same_completions(engine->generate(requests), alone);

  const double worst = largest_logprob_gap(rig.model, requests, alone);
  std::printf("largest log-prob difference to the trainer's: %.3g\n", worst);
  EXPECT_GT(worst, 1e-4);
  EXPECT_LT(worst, 0.25);
}

// FP8 projections (rollout.weight-dtype = fp8): each token's codes depend on its own row
// alone, so batching still gives each request its tokens alone; the log-probs move from
// the trainer's by the weights' and activations' rounding to 3 mantissa bits (0.29 and
// 0.47 on these tiny random models of 16-wide rows; 3-12 with SwiGLU's input scales left
// out), bounded at 0.6. q|k|v with biases (qwen2) does not stack, and is refused.
TEST_P(EngineVariant, Fp8WeightsBatchAsAloneAndStayNearTheTrainersLogprobs) {
  RolloutRig rig(config());
  EngineOptions fp8 = small_engine_options();
  fp8.fp8_weights = true;
  if (GetParam().qkv_bias) {
    try {
      rig.make_engine(fp8);
      ADD_FAILURE() << "FP8 weights were taken with q|k|v biases";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("stacked, without biases"), std::string::npos) << e.what();
    }
    return;
  }
  const std::vector<GenerationRequest> requests = mixed_requests(rig.model.config.vocab);
  std::vector<Completion> alone;
  for (const GenerationRequest& request : requests) alone.push_back(rig.make_engine(fp8)->generate({request}).front());
  EngineOptions batched = fp8;
  batched.max_running = 3;
  batched.max_step_tokens = 8;
  expect_same_completions(rig.make_engine(batched)->generate(requests), alone);

  const double worst = largest_logprob_gap(rig.model, requests, alone);
  std::printf("largest log-prob difference to the trainer's: %.3g\n", worst);
  EXPECT_GT(worst, 1e-3);
  EXPECT_LT(worst, 0.6);
}

// The FP8 codes are made from the weights each time the engine takes up work: after an
// update of the weights between two generates (a trainer's step), the engine samples as
// a new engine on the new weights does, not from the old codes.
TEST(EngineFp8Weights, CodesFollowTheWeightsFromOneGenerateToTheNext) {
  RolloutRig rig(testing::tiny_config(true, false, true));
  EngineOptions fp8 = small_engine_options();
  fp8.fp8_weights = true;
  const std::vector<GenerationRequest> requests = mixed_requests(rig.model.config.vocab);
  auto engine = rig.make_engine(fp8);
  const std::vector<Completion> before = engine->generate(requests);

  const testing::TinyModel updated(rig.model.config, {512, 32}, 8);
  std::copy(updated.weights.begin(), updated.weights.end(), rig.model.weights.begin());
  const std::vector<Completion> after = engine->generate(requests);
  expect_same_completions(after, rig.make_engine(fp8)->generate(requests));
  int changed = 0;
  for (size_t r = 0; r < requests.size(); ++r) changed += after[r].tokens != before[r].tokens;
  EXPECT_GT(changed, 0) << "new weights should change some completion";
}

// Planning each decode step while the one before runs (the default) against planning it
// after the results: with stops by token id that land while the next step is queued, a
// queue of waiting requests, prompts in chunks and preemption, every request gets the
// same completion, token for token.
TEST_P(EngineVariant, PlanningAheadGivesTheCompletionsOfPlanningAfterTheResults) {
  RolloutRig rig(config());
  std::vector<GenerationRequest> requests = mixed_requests(rig.model.config.vocab);
  for (GenerationRequest& request : requests) request.sampling.stop_token_ids = {3, 11, 17};
  EngineOptions queueing = small_engine_options();
  queueing.max_running = 3;
  queueing.max_step_tokens = 8;
  EngineOptions few_blocks = small_engine_options();
  few_blocks.kv_cache_bytes = 14 * KvCacheGeometry::for_blocks(rig.model.config, 1, 4, DType::F32).block_bytes();
  int stopped = 0;
  for (EngineOptions options : {small_engine_options(), queueing, few_blocks}) {
    options.plan_ahead = false;
    auto after = rig.make_engine(options);
    const std::vector<Completion> expected = after->generate(requests);
    options.plan_ahead = true;
    auto ahead = rig.make_engine(options);
    expect_same_completions(ahead->generate(requests), expected);
    EXPECT_EQ(after->stats().steps_planned_ahead, 0);
    EXPECT_GT(ahead->stats().steps_planned_ahead, 0);
    EXPECT_EQ(ahead->stats().generated_tokens, after->stats().generated_tokens);
    EXPECT_EQ(ahead->free_blocks(), ahead->total_blocks());
    EXPECT_FALSE(ahead->has_work());
    for (const Completion& completion : expected) stopped += completion.finish == FinishReason::Stop;
  }
  EXPECT_GT(stopped, 3) << "the test needs stops; change the stop ids";
}

TEST_P(EngineVariant, PreemptionRecomputesAndKeepsTheTokens) {
  RolloutRig rig(config());
  const std::vector<GenerationRequest> requests = mixed_requests(rig.model.config.vocab);
  const std::vector<Completion> alone = one_at_a_time(rig, requests);

  // 14 blocks of 4 tokens: the longest request (37 tokens) fits alone, but not beside others.
  EngineOptions options = small_engine_options();
  options.kv_cache_bytes = 14 * KvCacheGeometry::for_blocks(rig.model.config, 1, 4, DType::F32).block_bytes();
  auto engine = rig.make_engine(options);
  ASSERT_EQ(engine->total_blocks(), 14);
  expect_same_completions(engine->generate(requests), alone);
  EXPECT_GT(engine->stats().preemptions, 0);
  EXPECT_GT(engine->stats().forward_tokens, engine->stats().generated_tokens);
  EXPECT_EQ(engine->free_blocks(), engine->total_blocks());
}

// GRPO's groups: three samples each of two prompts (9 and 14 tokens, blocks of 4). With
// shared prompt blocks a group's later samples compute only what follows its first 2 and
// 3 whole blocks, and every sample gets the tokens and log-probs it gets alone, also when
// the prompts are prefilled in chunks over several steps.
TEST_P(EngineVariant, SamplesOfOnePromptShareItsBlocksAndGetTheirTokensAlone) {
  RolloutRig rig(config());
  std::vector<GenerationRequest> requests;
  const int prompt_lengths[] = {9, 14};
  for (uint64_t p = 0; p < 2; ++p) {
    const std::vector<int32_t> prompt = random_prompt(prompt_lengths[p], rig.model.config.vocab, 11 + p);
    for (uint64_t g = 0; g < 3; ++g) {
      SamplingParams sampling;
      sampling.seed = 5;
      sampling.max_new_tokens = static_cast<int>(6 + 3 * g);
      sampling.temperature = g == 0 ? 0.0f : 1.0f;
      requests.push_back({10 * p + g, prompt, sampling});
    }
  }
  const std::vector<Completion> alone = one_at_a_time(rig, requests);
  for (const int64_t step_tokens : {64, 8}) {
    EngineOptions options = small_engine_options();
    options.max_step_tokens = step_tokens;
    options.share_prompts = false;
    auto apart = rig.make_engine(options);
    expect_same_completions(apart->generate(requests), alone);
    options.share_prompts = true;
    auto shared = rig.make_engine(options);
    expect_same_completions(shared->generate(requests), alone);
    EXPECT_EQ(apart->stats().shared_prompt_tokens, 0);
    EXPECT_EQ(shared->stats().shared_prompt_tokens, 2 * (2 + 3) * 4) << step_tokens << " tokens a step";
    EXPECT_EQ(apart->stats().forward_tokens - shared->stats().forward_tokens, 2 * (2 + 3) * 4);
    EXPECT_EQ(shared->free_blocks(), shared->total_blocks());
  }
}

// Copies of the q/k/v and gate/up weights of `weights`, each one element apart from the
// next in `memory`, so that none stack: the engine takes the separate GEMMs for them.
ParameterSet laid_apart(const ParameterSet& weights, std::vector<float>& memory) {
  ParameterSet apart = weights;
  std::vector<Tensor*> moved;
  for (LayerParameters& layer : apart.layers)
    moved.insert(moved.end(), {&layer.q_proj, &layer.k_proj, &layer.v_proj, &layer.gate_proj, &layer.up_proj});
  int64_t elements = 0;
  for (const Tensor* weight : moved) elements += weight->numel() + 1;
  memory.assign(elements, 0.0f);
  float* next = memory.data();
  for (Tensor* weight : moved) {
    std::copy_n(weight->ptr<float>(), weight->numel(), next);
    weight->data = next;
    next += weight->numel() + 1;
  }
  for (const LayerParameters& layer : apart.layers) {
    EXPECT_EQ(stacked_weights({layer.q_proj, layer.k_proj}).data, nullptr);
    EXPECT_EQ(stacked_weights({layer.gate_proj, layer.up_proj}).data, nullptr);
  }
  return apart;
}

// The qwen3 and llama variants' q/k/v and gate/up weights lie end to end, so the engine
// runs each group as ONE GEMM; copies of the same weights laid apart in memory take the
// separate GEMMs (as qwen2's biased q/k/v always do), and must give the same completions.
TEST_P(EngineVariant, StackedAndSeparateProjectionsGiveTheSameCompletions) {
  RolloutRig rig(config());
  const std::vector<GenerationRequest> requests = mixed_requests(rig.model.config.vocab);
  const ParameterSet& stacked = rig.model.params;
  const LayerParameters& first = stacked.layers[0];
  EXPECT_EQ(stacked_weights({first.q_proj, first.k_proj, first.v_proj}).data != nullptr, !GetParam().qkv_bias);
  EXPECT_NE(stacked_weights({first.gate_proj, first.up_proj}).data, nullptr);
  std::vector<float> memory;
  const ParameterSet apart = laid_apart(stacked, memory);

  EngineOptions options = small_engine_options();
  options.max_running = 3;
  options.max_step_tokens = 8;
  const std::vector<Completion> separate = Engine(rig.model.config, apart, *rig.pool, options).generate(requests);
  expect_same_completions(rig.make_engine(options)->generate(requests), separate);
}

TEST(EngineStops, StopTokenIdsEndGenerationAndKeepTheToken) {
  RolloutRig rig(testing::tiny_config(true, false, true));
  auto engine = rig.make_engine();
  GenerationRequest request{1, random_prompt(6, 32, 3), {}};
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = 30;
  const Completion free_run = engine->generate({request}).front();
  ASSERT_EQ(free_run.finish, FinishReason::Length);

  request.sampling.stop_token_ids = {free_run.tokens[5], 31};
  const auto first = std::find_first_of(free_run.tokens.begin(), free_run.tokens.end(),
                                        request.sampling.stop_token_ids.begin(), request.sampling.stop_token_ids.end());
  const size_t expected_length = first - free_run.tokens.begin() + 1;
  const Completion stopped = engine->generate({request}).front();
  EXPECT_EQ(stopped.finish, FinishReason::Stop);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + expected_length));
  EXPECT_EQ(stopped.logprobs.size(), expected_length);
  EXPECT_TRUE(stopped.stop_string.empty());
}

TEST(EngineStops, StopStringsMatchTheDecodedText) {
  // 3 special tokens + 29 characters = the tiny model's 32 ids.
  const CharTokenizer tokenizer("abcdefghijklmnopqrstuvwxyz .,");
  ASSERT_EQ(tokenizer.vocab_size(), 32);
  RolloutRig rig(testing::tiny_config(true, false, true));
  auto engine = rig.make_engine(small_engine_options(), &tokenizer);
  GenerationRequest request{1, tokenizer.encode("hello there"), {}};
  request.sampling.temperature = 0;
  request.sampling.max_new_tokens = 30;
  const Completion free_run = engine->generate({request}).front();
  const std::string text = tokenizer.decode(free_run.tokens);

  // The text of tokens 6..7 as a stop string: generation ends at its first occurrence.
  const std::string stop = tokenizer.decode(std::span<const int32_t>(free_run.tokens).subspan(6, 2));
  request.sampling.stop_strings = {"never-there", stop};
  size_t expected_length = 0;
  while (tokenizer.decode(std::span<const int32_t>(free_run.tokens).first(expected_length)).find(stop) ==
         std::string::npos)
    ++expected_length;
  const Completion stopped = engine->generate({request}).front();
  EXPECT_EQ(stopped.finish, FinishReason::Stop) << text;
  EXPECT_EQ(stopped.stop_string, stop);
  EXPECT_EQ(stopped.tokens, std::vector<int32_t>(free_run.tokens.begin(), free_run.tokens.begin() + expected_length));
}

TEST(EngineStops, IdsBeyondTheTokenizerDoNotBreakStopStrings) {
  const CharTokenizer tokenizer("abcdefghijklmnopqrstuvwxyz");  // ids 0..28 of the model's 32
  RolloutRig rig(testing::tiny_config(true, false, true));
  auto engine = rig.make_engine(small_engine_options(), &tokenizer);
  GenerationRequest request{1, tokenizer.encode("abc"), {}};
  request.sampling.max_new_tokens = 50;
  request.sampling.temperature = 5;  // flat enough to draw the ids past the tokenizer
  request.sampling.stop_strings = {"never there"};
  const Completion completion = engine->generate({request}).front();
  EXPECT_EQ(completion.finish, FinishReason::Length);
  EXPECT_GT(std::count_if(completion.tokens.begin(), completion.tokens.end(), [](int32_t id) { return id >= 29; }), 0)
      << "the test needs a sampled id the tokenizer lacks; change the seed";
}

TEST(EngineStops, MaxNewTokensEndsWithLength) {
  RolloutRig rig(testing::tiny_config(false, false, false));
  auto engine = rig.make_engine();
  for (int max_new : {1, 2, 13}) {
    GenerationRequest request{static_cast<uint64_t>(max_new), random_prompt(4, 32, 9), {}};
    request.sampling.max_new_tokens = max_new;
    const Completion completion = engine->generate({request}).front();
    EXPECT_EQ(completion.finish, FinishReason::Length);
    EXPECT_EQ(completion.tokens.size(), static_cast<size_t>(max_new));
  }
}

TEST(EngineAbort, AbortEndsEveryRequestAndFreesEveryBlock) {
  RolloutRig rig(testing::tiny_config(true, false, true));
  EngineOptions options = small_engine_options();
  options.max_running = 2;
  auto engine = rig.make_engine(options);
  for (uint64_t r = 0; r < 5; ++r) {
    GenerationRequest request{r, random_prompt(5, 32, r), {}};
    request.sampling.max_new_tokens = 40;
    engine->submit(request);
  }
  for (int s = 0; s < 6; ++s) EXPECT_TRUE(engine->step().empty());
  EXPECT_GT(engine->stats().steps_planned_ahead, 0);  // a step is queued: its tokens are dropped
  EXPECT_EQ(engine->running(), 2u);
  EXPECT_EQ(engine->waiting(), 3u);
  EXPECT_LT(engine->free_blocks(), engine->total_blocks());

  const std::vector<Completion> aborted = engine->abort();
  ASSERT_EQ(aborted.size(), 5u);
  size_t with_tokens = 0;
  for (const Completion& completion : aborted) {
    EXPECT_EQ(completion.finish, FinishReason::Abort);
    EXPECT_EQ(completion.tokens.size(), completion.logprobs.size());
    for (int32_t token : completion.tokens) EXPECT_GE(token, 0);
    with_tokens += !completion.tokens.empty();
  }
  EXPECT_EQ(with_tokens, 2u);  // the two that were running
  EXPECT_FALSE(engine->has_work());
  EXPECT_EQ(engine->free_blocks(), engine->total_blocks());
  EXPECT_TRUE(engine->step().empty());
  // The ids are free again.
  GenerationRequest again{0, random_prompt(5, 32, 0), {}};
  again.sampling.max_new_tokens = 3;
  EXPECT_EQ(engine->generate({again}).front().finish, FinishReason::Length);
}

TEST(EngineRequests, RefusesWhatCanNeverRun) {
  RolloutRig rig(testing::tiny_config(true, false, true));
  EngineOptions options = small_engine_options();
  options.max_sequence_length = 40;
  auto engine = rig.make_engine(options);
  EXPECT_EQ(engine->max_sequence_length(), 40);
  auto refused = [&](GenerationRequest request, const std::string& words) {
    try {
      engine->submit(request);
      ADD_FAILURE() << "accepted a request that should be refused for: " << words;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  GenerationRequest ok{1, {1, 2, 3}, {}};
  refused({1, {}, {}}, "empty");
  refused({1, {1, 32}, {}}, "outside the vocabulary");
  GenerationRequest long_one = ok;
  long_one.sampling.max_new_tokens = 38;
  refused(long_one, "exceeds");
  GenerationRequest stop_text = ok;
  stop_text.sampling.stop_strings = {"x"};
  refused(stop_text, "tokenizer");
  GenerationRequest bad = ok;
  bad.sampling.top_p = 0;
  refused(bad, "top_p");
  engine->submit(ok);
  refused(ok, "already queued");
  EXPECT_EQ(engine->waiting(), 1u);
}

TEST(EngineMemory, CacheAndScratchComeFromThePoolUnderTheKvCacheTag) {
  RolloutRig rig(testing::tiny_config(true, false, true));
  {
    auto engine = rig.make_engine();
    const KvCacheGeometry& geometry = engine->cache_geometry();
    EXPECT_EQ(geometry.block_size, 4);
    EXPECT_EQ(static_cast<size_t>(engine->total_blocks()), (size_t{1} << 20) / geometry.block_bytes());
    const MemoryStats stats = rig.pool->stats();
    ASSERT_TRUE(stats.per_tag.count("kv_cache"));
    EXPECT_GE(stats.per_tag.at("kv_cache").device_bytes, geometry.bytes());
    size_t allocations = 0;
    for (const Allocation* allocation : rig.pool->allocations())
      if (allocation->tag == tags::kv_cache) ++allocations;
    EXPECT_EQ(allocations, 2u);  // the cache and the step scratch
  }
  EXPECT_EQ(rig.pool->stats().per_tag.at("kv_cache").device_bytes, 0u);
}

// The step scratch holds the buffers of the q|k|v path the weights take alone: the one
// GEMM's output [T, QD + 2 KD] for stacked weights; k, v and both normed copies [T, QD +
// 3 KD] for weights apart. (64 tokens of these F32 rows are whole 256-byte alignments.)
TEST(EngineMemory, StepScratchHoldsTheBuffersOfTheQkvPathTheWeightsTake) {
  RolloutRig rig(testing::tiny_config(true, false, true));
  const ModelConfig& config = rig.model.config;
  const auto scratch_bytes = [&](const ParameterSet& weights, EngineOptions options = small_engine_options()) {
    const Engine engine(config, weights, *rig.pool, options);
    for (const Allocation* allocation : rig.pool->allocations())
      if (allocation->name == "engine.step_scratch") return allocation->bytes;
    ADD_FAILURE() << "no step scratch in the pool";
    return size_t{0};
  };
  std::vector<float> memory;
  const size_t stacked = scratch_bytes(rig.model.params), apart = scratch_bytes(laid_apart(rig.model.params, memory));
  const int64_t T = small_engine_options().max_step_tokens, QD = config.q_dim(), KD = config.kv_dim();
  ASSERT_EQ(T, 64);
  EXPECT_EQ(apart - stacked, static_cast<size_t>(T * ((QD + 3 * KD) - (QD + 2 * KD))) * sizeof(float));

  // FP8 projections: the codes of the weights and of the projections' inputs, each buffer
  // on 256 bytes; the working-dtype SwiGLU output they replace gone.
  EngineOptions fp8 = small_engine_options();
  fp8.fp8_weights = true;
  const auto laid = [](int64_t bytes) { return (bytes + 255) / 256 * 256; };
  const int64_t C = config.hidden, I = config.intermediate;
  const int64_t added = config.layers * (laid((QD + 2 * KD) * C) + laid(2 * I * C) + laid(C * I) + 3 * laid(4)) +
                        laid(T * C) + laid(4 * T) + laid(T * I) + laid(4 * T);
  const int64_t dropped = laid(4 * T * I);
  EXPECT_EQ(static_cast<int64_t>(scratch_bytes(rig.model.params, fp8)) - static_cast<int64_t>(stacked),
            added - dropped);
}

}  // namespace
}  // namespace tandem
