// Shared by the ZeRO tests: a training run through the Booster with the
// low_level_zero (or DDP) plugin over any group, each optimizer we have, and
// the single-process reference on the full global batch (the data, models
// and scratch directories come from tests/booster/booster_testing.h).
#pragma once
#include "colossus/booster/booster.h"
#include "colossus/booster/gemini_plugin.h"
#include "colossus/booster/low_level_zero_plugin.h"
#include "tests/booster/booster_testing.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace colossus::zero::testing {

struct RunSpec {
  std::string model = "gpt2";   // "gpt2", "llama" or "phi3"
  std::string plugin = "zero";  // "zero", "gemini" or "ddp"
  int stage = 2;
  int micro_batches = 1;
  double max_norm = 0.0;
  std::string optimizer = "adamw";  // adamw, adam, sgd, lamb, hybrid_adam
  std::string precision = "fp32";
  double bucket_size_in_m = 0.002;  // ~2K elements: several buckets even for tiny models
  bool overlap_allgather = false;
  int extra_dp_size = 1;
  double initial_scale = 4294967296.0;  // fp16 loss scale
  std::string communication_dtype;
  bool cpu_offload = false;
  bool master_weights = true;
  bool fp8_communication = false;  // zero and gemini
  // gemini (micro_batches > 1 turns on enable_gradient_accumulation): small
  // chunks (min_chunk_size_m: ~1K elements) so even tiny models have several.
  std::string placement_policy = "static";
  double shard_param_frac = 1.0;
  double offload_optim_frac = 0.0;
  double offload_param_frac = 0.0;
  std::optional<double> gpu_margin_mem_ratio = std::nullopt;  // gemini auto; unset: the measured margin
  int max_prefetch = 0;
  double min_chunk_size_m = 0.001;
  double search_range_m = 0.004;
  std::function<std::optional<metrics::DeviceMemory>()> memory_probe = {};
  std::function<void()> memory_peak_reset = {};     // gemini auto: the probe's peak reset
  std::function<int64_t()> host_budget_probe = {};  // gemini auto
  // The model is built on the meta device and each rank materialises what its
  // plugin keeps from the seeded init (models::seeded_source).
  bool lazy_init = false;
  double nvme_offload_fraction = 0.0;  // gemini NVMe offload of optimizer state
  std::string nvme_offload_dir;
  bool nvme_direct_io = true;
};

std::vector<double> reference_losses(const RunSpec& spec, int64_t steps);

class ZeroRun {
 public:
  // group: the ranks of this run (null: the world).
  explicit ZeroRun(const RunSpec& spec, cluster::ProcessGroupPtr group = nullptr);
  double train_step(int64_t step);  // the group's mean loss of `step`
  std::vector<double> train(int64_t first_step, int64_t end_step);
  // shard: each rank writes its own files (SaveOptions::shard).
  void save(const std::string& dir, bool shard = false);
  void load(const std::string& dir);
  booster::Booster& booster() { return *booster_; }
  booster::Boosted& boosted() { return boosted_; }

 private:
  RunSpec spec_;
  cluster::ProcessGroupPtr group_;
  std::unique_ptr<booster::Booster> booster_;
  booster::Boosted boosted_;
};

double worst_rel_diff(const std::vector<double>& got, const std::vector<double>& reference);

}  // namespace colossus::zero::testing
