// A warning when the policy's mean token entropy collapses: up to log(vocab), where every
// token is as likely as any other (the sampler draws noise), or down to zero, where it
// samples one token whatever the reward (a too-large learning rate gives either).
// Entering a band warns once; leaving it (well clear of its edge) and coming back warns
// again. The first step only sets where the policy starts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace tandem {

class EntropyWatch {
 public:
  explicit EntropyWatch(int64_t vocab);
  // The warning for this step's entropy (nats), if it just entered a band.
  std::optional<std::string> observe(double entropy);

 private:
  enum class Band { Unknown, Zero, Normal, Uniform };
  double uniform_;  // log(vocab)
  Band band_ = Band::Unknown;
};

}  // namespace tandem
