#include "colossus/amp/loss_scaler.h"

#include "colossus/core/errors.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>

namespace colossus::amp {

void LossScalerOptions::validate() const {
  auto bad = [](const std::string& what) { throw ConfigError("loss scaler: " + what); };
  if (!(min_scale > 0.0) || !std::isfinite(min_scale)) bad(fmt::format("min_scale={} must be > 0, e.g. 1", min_scale));
  if (!(max_scale >= min_scale) || !std::isfinite(max_scale)) {
    bad(fmt::format("max_scale={} must be finite and >= min_scale={}, e.g. 2^24", max_scale, min_scale));
  }
  if (!(initial_scale >= min_scale && initial_scale <= max_scale)) {
    bad(fmt::format("initial_scale={} must lie in [min_scale, max_scale] = [{}, {}], e.g. 65536", initial_scale,
                    min_scale, max_scale));
  }
  if (!(growth_factor > 1.0)) bad(fmt::format("growth_factor={} must be > 1, e.g. 2", growth_factor));
  if (!(backoff_factor > 0.0 && backoff_factor < 1.0)) {
    bad(fmt::format("backoff_factor={} must lie in (0, 1), e.g. 0.5", backoff_factor));
  }
  if (growth_interval < 1) bad(fmt::format("growth_interval={} must be >= 1, e.g. 1000", growth_interval));
  if (hysteresis < 0) bad(fmt::format("hysteresis={} must be >= 0, e.g. 2", hysteresis));
}

DynamicLossScaler::DynamicLossScaler(LossScalerOptions options)
    : options_(options), scale_(options.initial_scale) {
  options_.validate();
}

void DynamicLossScaler::update(bool overflow) {
  if (overflow) {
    ++hysteresis_step_;
    growth_step_ = 0;
    // Not reset on backoff: after `hysteresis` overflows, each further one
    // backs off again until a growth resets the count (as Colossal-AI does).
    if (hysteresis_step_ >= options_.hysteresis) scale_ = std::max(scale_ * options_.backoff_factor, options_.min_scale);
  } else if (++growth_step_ == options_.growth_interval) {
    growth_step_ = 0;
    hysteresis_step_ = 0;
    scale_ = std::min(scale_ * options_.growth_factor, options_.max_scale);
  }
}

std::string DynamicLossScaler::state_dict() const {
  return nlohmann::json{{"scale", scale_}, {"growth_step", growth_step_}, {"hysteresis_step", hysteresis_step_}}.dump();
}

void DynamicLossScaler::load_state_dict(const std::string& json) {
  try {
    const auto j = nlohmann::json::parse(json);
    const double scale = j.at("scale").get<double>();
    if (!(scale > 0.0) || !std::isfinite(scale)) {
      throw CheckpointError(fmt::format("loss scaler state has scale={}; it must be finite and > 0", scale));
    }
    const int64_t growth_step = j.at("growth_step").get<int64_t>();
    const int64_t hysteresis_step = j.at("hysteresis_step").get<int64_t>();
    if (growth_step < 0 || hysteresis_step < 0) {
      throw CheckpointError(fmt::format("loss scaler state has growth_step={} hysteresis_step={}; both count steps "
                                        "and are >= 0",
                                        growth_step, hysteresis_step));
    }
    scale_ = scale;
    growth_step_ = growth_step;
    hysteresis_step_ = hysteresis_step;
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(fmt::format("loss scaler state does not parse: {}", e.what()));
  }
}

}  // namespace colossus::amp
