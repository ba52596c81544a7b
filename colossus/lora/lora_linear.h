// LoraLinear: a models::Layer that wraps a frozen Linear (weight (out, in)) or
// GPT-2 Conv1D (weight (in, out)) and adds PEFT's low-rank update,
// y = base(x) + B(A(dropout(x))) * scaling, with the adapters in their own
// dtype (fp32 over a bf16 base) exactly as peft/tuners/lora/layer.py casts.
#pragma once
#include "colossus/cluster/process_group.h"
#include "colossus/lora/lora_config.h"
#include "colossus/models/layers.h"

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>

namespace colossus::lora {

// How the base layer is split over tensor-parallel ranks (lora/tensor_parallel.h).
enum class TpSplit {
  None,    // a whole Linear / Conv1D / NF4 Linear
  Column,  // ColumnParallelLinear: lora_B holds this rank's output rows, lora_A is whole
  Row,     // RowParallelLinear: lora_A holds this rank's input columns, lora_B is whole
};

// The adapters' side of a tensor-parallel split (LoraLinear::adopt_parallel_base).
struct TpAdapterSplit {
  TpSplit split = TpSplit::None;
  cluster::ProcessGroupPtr group;
  // Column with replicated key/value heads (fewer kv heads than ranks): this
  // rank's replica set of lora_B's rows and the number of sets; 0: none.
  int64_t replica_slot = 0, replica_slots = 0;
  // split_gather / ring: the layer's activations are sharded along the
  // sequence (dim 1) over the group, as its base's are.
  bool sequence_sharded = false;
};

class LoraLinear : public models::Layer {
 public:
  // base: a models::Linear or models::Conv1D (else ConfigError). Its
  // parameters are registered here under their own names ("weight", "bias"),
  // so the wrapped layer keeps its Hugging Face parameter names, and frozen
  // (requires_grad false). lora_A.weight (r, in) and lora_B.weight (out, r)
  // are new parameters of `adapter_dtype` on the base weight's device,
  // initialised per `init` from `generator_seed`.
  LoraLinear(std::shared_ptr<models::Layer> base, int64_t r, double scaling, double dropout, LoraInit init,
             uint64_t generator_seed, c10::ScalarType adapter_dtype = c10::kFloat);

  // x: (..., in) -> (..., out), in the base output's dtype. The adapter path
  // runs in the adapter dtype (x cast to it), the sum in the promoted dtype,
  // then one cast back: PEFT's Linear.forward.
  at::Tensor forward(const at::Tensor& x) override;

  // scaling * B @ A in the base weight's layout: (out, in) for Linear, its
  // transpose (in, out) for Conv1D (PEFT's fan_in_fan_out); adapter dtype.
  at::Tensor delta_weight() const;
  // A new plain layer (Linear or Conv1D, like the base) holding
  // W + delta_weight() in W's dtype (added in the promoted dtype, as PEFT's
  // merge) and a copy of the base bias, frozen like the base (PEFT's
  // merge_and_unload leaves them so too).
  std::shared_ptr<models::Layer> merged() const;

  bool fan_in_fan_out() const { return conv1d_; }  // the base is a Conv1D
  const std::shared_ptr<models::Layer>& base() const { return base_; }
  int64_t rank() const { return lora_A.size(0); }
  double scaling() const { return scaling_; }
  double dropout() const { return dropout_; }

  // Copies the adapter as it is now; while use_snapshot is set, forward uses
  // that copy (on the input's device) instead of lora_A / lora_B: DPO's
  // reference, the policy as it started, without a second model (TRL keeps a
  // "ref" copy of a PEFT adapter for the same). The copy is no parameter.
  void snapshot();
  bool use_snapshot = false;
  const at::Tensor& snapshot_A() const { return snapshot_A_; }  // undefined before snapshot()
  const at::Tensor& snapshot_B() const { return snapshot_B_; }

  // Tensor parallelism: `parallel_base` (a ColumnParallelLinear or
  // RowParallelLinear over the base's own, already sliced, weight) becomes the
  // base, and `lora_A` / `lora_B` (and a snapshot) become this rank's slices
  // `sliced_A` / `sliced_B` (set_data: optimizer handles stay valid). The
  // forward then runs the adapter as Megatron runs a linear pair:
  //   Column: h = A x on every rank (x replicated), its gradient summed over
  //           the group (copy_to_region), y_local += s B_local h.
  //   Row:    h = reduce_from_region(A_local x_local), y += s B h.
  // With the sequence sharded over the group (split_gather / ring), as the
  // base gathers its input and reduce-scatters its output along the sequence:
  //   Column: h = gather_sequence(A x_local), y_local += s B_local h.
  //   Row:    h = reduce_scatter_sequence(A_local x_local), y_local += s B h.
  // The whole A (column) and B (row) then see this rank's tokens only; the
  // plugin sums their gradients over tp, as every tp-replicated weight's.
  // Only the r-wide h crosses ranks.
  void adopt_parallel_base(std::shared_ptr<models::Layer> parallel_base, TpAdapterSplit split,
                           const at::Tensor& sliced_A, const at::Tensor& sliced_B, const at::Tensor& sliced_snapshot_A,
                           const at::Tensor& sliced_snapshot_B);
  const TpAdapterSplit& tp_split() const { return tp_; }
  at::Tensor lora_A;  // (r, in), registered as lora_A.weight
  at::Tensor lora_B;  // (out, r), registered as lora_B.weight

 private:
  std::shared_ptr<models::Layer> base_;
  at::Tensor base_weight_, base_bias_;
  at::Tensor snapshot_A_, snapshot_B_;
  bool conv1d_ = false;
  bool nf4_base_ = false;  // the base is an Nf4Linear (QLoRA)
  double scaling_;
  double dropout_;
  TpAdapterSplit tp_;
};

}  // namespace colossus::lora
