// Dynamic loss scaling for fp16 training, with Colossal-AI's semantics
// (DynamicGradScaler): every step with inf/NaN grads is skipped, but the scale
// backs off only once `hysteresis` overflows have accumulated since the last
// growth; `growth_interval` clean steps in a row grow it (and reset the
// overflow count). The scale stays within [min_scale, max_scale].
#pragma once
#include <cstdint>
#include <string>

namespace colossus::amp {

struct LossScalerOptions {
  double initial_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 1000;
  int64_t hysteresis = 2;
  double min_scale = 1.0;
  double max_scale = 16777216.0;  // 2^24
  // Throws ConfigError naming the bad value.
  void validate() const;
};

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(LossScalerOptions options = {});

  // Multiply the loss by this before backward; divide grads by it after.
  double scale() const { return scale_; }
  // Call once per optimizer step with whether any grad was inf/NaN.
  void update(bool overflow);

  int64_t growth_step() const { return growth_step_; }
  int64_t hysteresis_step() const { return hysteresis_step_; }
  const LossScalerOptions& options() const { return options_; }

  // JSON with the scale and both counters (so a resumed run continues the
  // same sequence); loading throws CheckpointError on bad input.
  std::string state_dict() const;
  void load_state_dict(const std::string& json);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t growth_step_ = 0;
  int64_t hysteresis_step_ = 0;
};

}  // namespace colossus::amp
