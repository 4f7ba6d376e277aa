// Learning rate per step: linear warm-up from 0 to the peak, then a cosine decay to a
// floor, which it keeps after the last step (Megatron's warmup + cosine).
#pragma once
#include <cstdint>

namespace tandem {

class LrSchedule {
 public:
  // Throws std::invalid_argument unless 0 <= floor <= peak, 0 <= warmup_steps <= total_steps
  // and total_steps >= 1.
  LrSchedule(double peak, double floor, int64_t warmup_steps, int64_t total_steps);

  // step counts from 1, as AdamW's: step w of the warm-up gets peak * w / warmup_steps;
  // the decay reaches the floor at total_steps.
  double at(int64_t step) const;

 private:
  double peak_, floor_;
  int64_t warmup_steps_, total_steps_;
};

}  // namespace tandem
