// GeminiOptimizer: steps each rank's master shards of GeminiDDP's chunks with
// any optimizer (its parameters are replaced by per-parameter views of the
// masters, possibly empty, so elementwise optimizers are exact and Lamb gets
// whole-parameter norms through a reducer). Offloaded chunks are stepped
// where they live (HybridAdam: CPU SIMD kernel there). It unscales and checks
// (bf16/fp16), clips over the dp shards, steps, and lets the parameter shards
// follow the masters. state_dict() is the unsharded format the Booster writes
// for DDP, so it loads with any dp size and into DDP/ZeRO-1/2.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "colossus/amp/clip_grad.h"
#include "colossus/amp/loss_scaler.h"
#include "colossus/optim/optimizer.h"
#include "colossus/zero/gemini/gemini_ddp.h"
#include "colossus/zero/gemini/nvme_store.h"

namespace colossus::zero {
struct ShardedStateLayout;  // optimizer_state.h
}  // namespace colossus::zero

namespace colossus::zero::gemini {

class GeminiOptimizer : public optim::Optimizer {
 public:
  // `inner` must hold exactly the trainable parameters of ddp's model and not
  // have stepped.
  GeminiOptimizer(std::unique_ptr<optim::Optimizer> inner, GeminiDDP& ddp);
  ~GeminiOptimizer() override;

  void step() override;
  std::string name() const override { return "Gemini[" + inner_->name() + "]"; }
  // Collective over dp.
  optim::OptimizerState state_dict() const override;
  // Collective over dp: the same format, but only the parameters this rank
  // writes in a per-rank sharded save (zero::writer_rank).
  std::optional<optim::OptimizerState> rank_state_dict() const override;
  // Each rank takes its parts of an unsharded state (not collective).
  void load_state_dict(const optim::OptimizerState& state) override;

  at::Tensor scale_loss(const at::Tensor& loss) const override;
  double loss_scale() const override { return scaler_ ? scaler_->scale() : 1.0; }
  bool last_step_skipped() const { return last_step_skipped_; }
  double last_grad_norm() const override { return last_grad_norm_; }
  // The chunks' bytes plus the optimizer state by place (host / device).
  GeminiMemory memory_bytes() const;
  optim::Optimizer& inner() { return *inner_; }
  GeminiDDP& ddp() { return ddp_; }
  // Points the inner optimizer at the DDP's master views again (after a
  // placement change).
  void rebind_masters();
  // Chunks whose optimizer state lives in NVMe offload files between steps,
  // and the file of chunk c (exists after its first step).
  const std::vector<size_t>& nvme_chunks() const { return nvme_chunks_; }
  std::string nvme_file(size_t chunk) const { return nvme_ ? nvme_->path(chunk) : std::string(); }
  const NvmeStore* nvme_store() const { return nvme_.get(); }  // null without NVMe offload

 private:
  // NVMe offload (gemini_nvme.cpp).
  void setup_nvme();
  void step_inner();  // inner step; NVMe chunks one by one with their state read in
  // The step under GeminiDDP's host step: statistics from the device,
  // chunks on the device through the inner step, then each host chunk's
  // fused bf16 CPU Adam queued on the host worker (it runs once the chunk's
  // gradient landed, and the next forward waits for a chunk when it gathers
  // it).
  void step_host();
  // Sums (max for inf) a rank's norm term over dp; empty with one rank.
  amp::NormReducer norm_reducer() const;
  std::vector<at::Tensor> chunk_state(size_t chunk) const;  // live inner state tensors of its parameters
  void nvme_fetch_all() const;  // every offloaded state in memory (checkpoints)
  void nvme_evict_all() const;  // and back to the files

  ShardedStateLayout state_layout() const;
  optim::OptimizerState state_for(const std::function<bool(size_t)>& keep) const;

  std::unique_ptr<optim::Optimizer> inner_;
  GeminiDDP& ddp_;
  std::vector<size_t> inner_order_;  // inner flat index -> parameter index
  std::vector<int64_t> inner_index_;  // parameter index -> inner flat index
  std::optional<amp::DynamicLossScaler> scaler_;
  bool last_step_skipped_ = false;
  int64_t skipped_steps_ = 0;
  double last_grad_norm_;
  std::vector<size_t> nvme_chunks_;
  std::unique_ptr<NvmeStore> nvme_;
};

}  // namespace colossus::zero::gemini
