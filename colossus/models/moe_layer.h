// Sparse mixture-of-experts FFN (Mixtral's block_sparse_moe): a linear router,
// top-k routing with renormalised weights, SwiGLU experts, and the pieces a
// parallel version reuses: the dispatch plan (assignments sorted by expert
// into contiguous segments, optional capacity dropping) and the weighted
// combine. The experts' weights live in two packed buffers (w1|w3 and w2,
// the parameters being views of them), so all experts run as grouped GEMMs
// (at::_grouped_mm, one launch per projection) over the rows sorted by
// expert; a loop over experts (never over tokens) is the fallback. On CUDA the
// sort, the permute and the combine run as kernels (kernels/moe_permute.h)
// when the build registers them; the ATen ops here are their reference.
#pragma once
#include "colossus/models/config.h"
#include "colossus/models/layers.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace colossus::models::moe {

struct Routing {
  at::Tensor logits;   // (N, E) router logits in the input dtype
  at::Tensor weights;  // (N, k) fp32: softmax (fp32) probabilities of the top-k
                       // experts, renormalised to sum 1
  at::Tensor experts;  // (N, k) int64 expert ids, in descending probability
};

// HF's MixtralTopKRouter math. router_logits: (N, E). normalize = false keeps
// the raw top-k softmax probabilities (Qwen-MoE's norm_topk_prob = false).
Routing route(const at::Tensor& router_logits, int64_t top_k, bool normalize = true);

// HF's load_balancing_loss_func over the layers' router logits (each (N, E)):
// E * sum_e (share of top-k assignments to e per token) * (mean router
// probability of e).
at::Tensor load_balancing_loss(const std::vector<at::Tensor>& router_logits, int64_t num_experts, int64_t top_k);
// ST-MoE router z-loss: mean over tokens (all layers) of logsumexp(logits)^2,
// fp32.
at::Tensor router_z_loss(const std::vector<at::Tensor>& router_logits);

// Tokens an expert keeps: ceil(capacity_factor * tokens * top_k / num_experts).
int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts);

// The (token, slot) assignments sorted by expert (stable, so token order
// inside each expert's segment). With a capacity, an expert keeps its first
// `capacity` tokens in token order; the rest are dropped (they add nothing).
struct DispatchPlan {
  at::Tensor token_index;       // (M) int64: source token of each kept row, rows
                                // grouped by expert
  at::Tensor weight;            // (M) fp32 routing weight of each kept row
  std::vector<int64_t> counts;  // (E) kept rows per expert (host), sum = M
  int64_t dropped = 0;          // assignments dropped by the capacity
  // Set by the CUDA kernels' plan only: (N*k) int64 row of each assignment
  // (-1 dropped), so permute and combine run as the kernels' gathers.
  at::Tensor row_of;
  int64_t top_k = 0;
};
// use_kernels: sort with the CUDA kernel (kernels/moe_permute.h; needs
// dispatch_kernels_available) and let permute/combine use the kernels too;
// the same plan as the reference (stable: token order inside each expert).
DispatchPlan plan_dispatch(const Routing& routing, int64_t num_experts, std::optional<int64_t> capacity = std::nullopt,
                           bool use_kernels = false);

// Whether the CUDA dispatch kernels are registered (a CUDA build) and handle
// rows like x (a CUDA tensor of fp32, fp16 or bf16).
bool dispatch_kernels_available(const at::Tensor& x);

// x: (tokens, H) -> (M, H), the rows in plan order (x.index_select(0,
// plan.token_index), or the permute kernel for a kernel plan; differentiable).
at::Tensor permute(const at::Tensor& x, const DispatchPlan& plan);

// expert_out: (M, H) rows in plan order -> (tokens, H): sum over a token's
// rows of weight * row, computed in fp32 and returned in expert_out's dtype
// (the unpermute kernel for a kernel plan; differentiable in both).
at::Tensor combine(const at::Tensor& expert_out, const DispatchPlan& plan, int64_t tokens);

}  // namespace colossus::models::moe

namespace colossus::models {

// One SwiGLU expert. HF names: Mixtral's w1 (gate, (I, H)), w3 (up, (I, H)),
// w2 (down, (H, I)); the Qwen MoE families' gate_proj, up_proj, down_proj.
struct ExpertNames {
  std::string gate = "w1", up = "w3", down = "w2";
};

class MixtralExpert : public LayerHost {
 public:
  using Names = ExpertNames;
  MixtralExpert(int64_t hidden_size, int64_t intermediate_size, const at::TensorOptions& options,
                Names names = Names());
  // x: (n, H) -> (n, H): down(silu(gate x) * up x)
  at::Tensor forward(const at::Tensor& x);
  Linear& gate() const { return layer_as<Linear>(names_.gate); }
  Linear& up() const { return layer_as<Linear>(names_.up); }
  Linear& down() const { return layer_as<Linear>(names_.down); }

 private:
  Names names_;
};

// HF's block_sparse_moe: gate (E, H) and experts.M.{w1,w2,w3}; for the Qwen
// MoE families experts.M.{gate,up,down}_proj, and Qwen2-MoE's shared expert
// shared_expert.{gate,up,down}_proj (every token, not routed) scaled by
// sigmoid(shared_expert_gate x) (gate (1, H)). A subclass may hold only some
// routed experts (expert parallelism): they keep their global index M in their
// names, and it overrides run_experts; the shared expert stays whole.
class SparseMoeBlock : public LayerHost {
 public:
  // Holds experts [first_expert, first_expert + local_experts); local_experts <
  // 0 means all.
  SparseMoeBlock(const MixtralConfig& config, const at::TensorOptions& options, int64_t first_expert = 0,
                 int64_t local_experts = -1);

  // hidden: (B, T, H) -> (B, T, H). Records the router logits (B*T, E) and
  // the dropped-assignment count of this call.
  at::Tensor forward(const at::Tensor& hidden);

  // Every expert's segment through that expert. x_sorted: (M, H) rows grouped
  // by expert, counts: (E) rows per expert -> (M, H) in the same row order.
  virtual at::Tensor run_experts(const at::Tensor& x_sorted, const std::vector<int64_t>& counts);

  // Lays this block's experts' weights out as two buffers, w1|w3 as (local, 2I, H) and w2 as (local, H, I),
  // and makes the parameters views of them: the same tensors (set_data), so an optimizer or a reducer built
  // earlier keeps them. The constructor does this; call it again after experts were adopted from another
  // block. Anything that later re-points a parameter (a ZeRO bucket, a dtype cast) only turns the grouped
  // path off (the next forward frees the stale buffers), it never makes it wrong.
  void pack_experts();
  // Whether the experts run as grouped GEMMs: packed layout intact, float/bf16/fp16 rows of 16-byte
  // multiples, and not switched off by set_grouped_gemm(false) (benchmarks and tests compare both paths).
  bool grouped_gemm_ready() const;
  void set_grouped_gemm(bool enabled) { grouped_gemm_enabled_ = enabled; }
  // Whether the last forward ran the experts as grouped GEMMs (tests, benchmarks).
  bool last_ran_grouped() const { return last_ran_grouped_; }
  // Whether CUDA rows are sorted, permuted and combined by the dispatch
  // kernels when registered (default); false: the ATen reference ops.
  void set_dispatch_kernels(bool enabled) { dispatch_kernels_enabled_ = enabled; }

  MixtralExpert& expert(int64_t global_index) const;
  bool has_shared_expert() const { return has_layer("shared_expert_gate"); }
  int64_t num_experts() const { return num_experts_; }
  int64_t top_k() const { return top_k_; }
  int64_t first_expert() const { return first_expert_; }
  int64_t local_experts() const { return local_experts_; }
  const at::Tensor& last_router_logits() const { return last_router_logits_; }
  int64_t last_dropped() const { return last_dropped_; }

 protected:
  // This block's experts over their segments: x (M, H) rows grouped by local expert, rows[l] of them for
  // local expert l -> (M, H) in the same order. Every expert runs, even on zero rows, so its parameters
  // always get a (zero) gradient and data-parallel reducers see the same ready set on every rank.
  at::Tensor run_local_experts(const at::Tensor& x, const std::vector<int64_t>& rows);

 private:
  // The parameters in packed order: per local expert w1, w3 (gate_up_) and w2 (down_).
  std::vector<at::Tensor> gate_up_parts() const;
  std::vector<at::Tensor> down_parts() const;
  bool packed_layout_intact() const;

  int64_t num_experts_, top_k_, first_expert_, local_experts_;
  bool norm_topk_prob_;
  double jitter_noise_;
  std::optional<double> capacity_factor_;
  std::shared_ptr<torch::nn::Module> experts_;
  at::Tensor last_router_logits_;
  int64_t last_dropped_ = 0;
  at::Tensor gate_up_, down_;  // packed buffers (local, 2I, H) and (local, H, I)
  bool grouped_gemm_enabled_ = true;
  bool last_ran_grouped_ = false;
  bool dispatch_kernels_enabled_ = true;
};

}  // namespace colossus::models
