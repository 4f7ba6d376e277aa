#include "train/lr_schedule.h"

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <string>

namespace tandem {

LrSchedule::LrSchedule(double peak, double floor, int64_t warmup_steps, int64_t total_steps)
    : peak_(peak), floor_(floor), warmup_steps_(warmup_steps), total_steps_(total_steps) {
  if (!(floor >= 0 && floor <= peak))
    throw std::invalid_argument("learning-rate schedule: needs 0 <= floor <= peak, got floor " + std::to_string(floor) +
                                " and peak " + std::to_string(peak));
  if (total_steps < 1 || warmup_steps < 0 || warmup_steps > total_steps)
    throw std::invalid_argument("learning-rate schedule: needs 0 <= warm-up steps <= total steps >= 1, got " +
                                std::to_string(warmup_steps) + " and " + std::to_string(total_steps));
}

double LrSchedule::at(int64_t step) const {
  if (step < 1) throw std::invalid_argument("learning-rate schedule: steps count from 1, got " + std::to_string(step));
  if (step <= warmup_steps_) return peak_ * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  if (step >= total_steps_) return floor_;
  const double progress =
      static_cast<double>(step - warmup_steps_) / static_cast<double>(total_steps_ - warmup_steps_);
  return floor_ + (peak_ - floor_) * 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

}  // namespace tandem
