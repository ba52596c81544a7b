// Static and auto chunk placement (see placement.h).
#include "colossus/zero/gemini/placement.h"

#include <algorithm>
#include <cmath>

namespace colossus::zero::gemini {

namespace {

// ceil(frac * n), robust to fractions like 0.3 * 10 = 3.0000000000000004.
size_t count_of(double frac, size_t n) {
  const double x = frac * static_cast<double>(n);
  return std::min(n, static_cast<size_t>(std::ceil(x - 1e-9)));
}

}  // namespace

std::vector<ChunkPlacement> static_placement(size_t chunks, double shard_param_frac, double offload_optim_frac,
                                             double offload_param_frac) {
  std::vector<ChunkPlacement> placement(chunks);
  const size_t sharded = count_of(shard_param_frac, chunks);
  for (size_t c = sharded; c < chunks; ++c) placement[c].keep_gathered = true;
  // Gathered chunks keep their optimizer side on the device (as Colossal-AI).
  const size_t offload_optim = count_of(offload_optim_frac, sharded);
  const size_t offload_param = count_of(offload_param_frac, sharded);
  for (size_t c = 0; c < offload_optim; ++c) placement[c].optim_on_host = true;
  for (size_t c = 0; c < offload_param; ++c) placement[c].param_on_host = true;
  return placement;
}

std::vector<ChunkPlacement> auto_placement(size_t chunks, const AutoPlacementInput& input) {
  std::vector<ChunkPlacement> placement(chunks);
  // In chunk order: once one does not fit, the rest go to the host too.
  const auto non_model = static_cast<int64_t>(
      std::ceil(static_cast<double>(input.non_model_peak_bytes) * (1.0 + kNonModelHeadroom)));
  int64_t left = input.device_budget_bytes - non_model - input.working_bytes;
  bool full = false;
  for (auto& chunk : placement) {
    full = full || left < input.param_shard_bytes;
    if (full) {
      chunk.param_on_host = true;
    } else {
      left -= input.param_shard_bytes;
    }
  }
  int64_t margin =
      static_cast<int64_t>(std::floor(static_cast<double>(std::max<int64_t>(left, 0)) * input.gpu_margin_mem_ratio));
  full = false;
  int64_t on_device = 0;
  for (auto& chunk : placement) {
    full = full || margin < input.optim_shard_bytes;
    if (full) {
      chunk.optim_on_host = true;
    } else {
      margin -= input.optim_shard_bytes;
      ++on_device;
    }
  }
  if (input.host_budget_bytes <= 0) return placement;
  int64_t host_need = (static_cast<int64_t>(chunks) - on_device) * input.host_optim_shard_bytes;
  int64_t spare = std::max<int64_t>(left, 0) - on_device * input.optim_shard_bytes;
  for (auto& chunk : placement) {
    if (host_need <= input.host_budget_bytes || spare < input.optim_shard_bytes) break;
    if (!chunk.optim_on_host) continue;
    chunk.optim_on_host = false;
    spare -= input.optim_shard_bytes;
    host_need -= input.host_optim_shard_bytes;
  }
  return placement;
}

}  // namespace colossus::zero::gemini
