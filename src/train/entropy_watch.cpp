#include "train/entropy_watch.h"

#include <cmath>

namespace tandem {

namespace {
// Within 0.1% of log V: the logits carry no preference left (a random initialisation
// starts further off, about half the logits' variance). Below 0.01 nats: one token holds
// nearly all the mass at every position.
constexpr double kUniformGap = 1e-3;
constexpr double kZeroEntropy = 0.01;
}  // namespace

EntropyWatch::EntropyWatch(int64_t vocab) : uniform_(std::log(static_cast<double>(vocab))) {}

std::optional<std::string> EntropyWatch::observe(double entropy) {
  if (!std::isfinite(entropy)) return std::nullopt;  // the non-finite check reports those
  // A band is left only well clear of its edge (ten times the margin), so an entropy that
  // hovers at the edge, as a policy that has solved its task does near zero, warns once.
  const double uniform_gap = (band_ == Band::Uniform ? 10 : 1) * kUniformGap * uniform_;
  const double zero_entropy = (band_ == Band::Zero ? 10 : 1) * kZeroEntropy;
  const Band band = uniform_ - entropy < uniform_gap ? Band::Uniform
                    : entropy < zero_entropy         ? Band::Zero
                                                     : Band::Normal;
  const Band before = band_;
  band_ = band;
  if (before == Band::Unknown || band == before || band == Band::Normal) return std::nullopt;
  if (band == Band::Uniform)
    return "the policy's entropy rose to " + std::to_string(entropy) + " nats, near log(vocab) = " +
           std::to_string(uniform_) + ": it samples almost uniformly (is the learning rate too large?)";
  return "the policy's entropy fell to " + std::to_string(entropy) +
         " nats: it samples one token whatever the reward (collapsed; is the learning rate too large?)";
}

}  // namespace tandem
