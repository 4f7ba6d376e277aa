// What a caller asks the rollout engine for and what it gets back: one prompt, how to
// sample its continuation, and the completion with the log-prob of every sampled token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

struct SamplingParams {
  float temperature = 1;  // 0: greedy (argmax, ties to the lowest id)
  int top_k = 0;          // keep the k most likely tokens; 0: all
  float top_p = 1;        // then the smallest set holding this much of the kept mass; 1: all
  int max_new_tokens = 16;
  std::vector<int32_t> stop_token_ids;    // EOS ids: the token is kept and generation ends
  std::vector<std::string> stop_strings;  // ends when the decoded completion contains one
  uint64_t seed = 0;                      // with the request id, seeds the request's own random stream

  // Throws std::invalid_argument naming the first field out of range.
  void validate() const;
};

struct GenerationRequest {
  uint64_t id = 0;  // unique among the requests an engine holds at one time
  std::vector<int32_t> prompt;
  SamplingParams sampling;
};

enum class FinishReason {
  Stop,    // a stop token id or stop string
  Length,  // max_new_tokens reached
  Abort,   // cut short by an abort; the tokens so far are returned but never count as finished
};
const char* finish_reason_name(FinishReason reason);

struct Completion {
  uint64_t request_id = 0;
  std::vector<int32_t> tokens;  // generated ids, the stop token included
  // log softmax(logits / temperature)[token] over the full vocabulary, in FP32, for each
  // token: before top-k/top-p truncation, which is what the trainer recomputes (the
  // importance ratio then starts at 1). Greedy requests record log softmax(logits).
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::Abort;
  std::string stop_string;  // the stop string that ended it, if one did
};

}  // namespace tandem
