// The [dpo] section of a training config (train.task = "dpo"), in TRL's
// DPOConfig names; no torch here, so the config headers stay light.
#pragma once
#include <string>

namespace colossus::apps {

struct DpoOptions {
  double beta = 0.1;                  // strength of the reference: rewards are beta * log-ratios
  std::string loss_type = "sigmoid";  // sigmoid | ipo | hinge | robust
  double label_smoothing = 0.0;       // robust only: the assumed share of flipped preferences, in [0, 0.5)
  // ConfigError naming the bad value and the valid ones.
  void validate() const;
};

}  // namespace colossus::apps
