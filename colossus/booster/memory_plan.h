// What fits before a run starts: for a model shape, a batch and a machine,
// the bytes each plugin and offload setting keeps per GPU and on the host
// (model states by the ZeRO paper's accounting for bf16 with fp32 masters
// and AdamW: 2 + 2 + 12 bytes per parameter), plus the activations of one
// micro-batch with and without full activation checkpointing (34 s b h bytes
// per layer with fused attention, Korthikanti et al. 2022; 2 s b h per layer
// plus one layer's rerun when checkpointed). An estimate: allocator slack,
// communication buckets and temporary buffers come on top (`colossus plan
// --memory` keeps a margin for them).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace colossus::booster {

struct MemoryPlanInput {
  int64_t parameters = 0;  // trained parameters (tied embeddings counted once)
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t seq_len = 0;
  int64_t micro_batch = 1;
  int64_t gpus = 1;               // data-parallel ranks (one per GPU)
  double gpu_bytes = 0;           // memory of one GPU
  double host_bytes = 0;          // host memory of the machine (all its GPUs' ranks share it)
  double margin = 0.05;           // share of GPU and host memory kept free for what the estimate leaves out
  int64_t grad_accum = 1;         // micro-batches a step (Gemini's host step then keeps an fp32 gradient sum)
};

struct MemoryPlanRow {
  std::string setting;       // as the [plugin] keys spell it
  double model_states = 0;   // per GPU: weights, gradients, fp32 masters, moments held there
  double activations = 0;    // per GPU, one micro-batch, no checkpointing
  double activations_checkpointed = 0;  // with model.gradient_checkpointing_ratio = 1
  double host = 0;           // the machine's host memory for offloaded states (all ranks)
  bool fits = false;         // without checkpointing
  bool fits_checkpointed = false;
};

// One row per setting: ddp; low_level_zero stage 1, stage 2, stage 2 with
// cpu_offload; gemini with its chunks on the GPU, with the optimizer
// offloaded (offload_optim_frac = 1), and its auto placement.
std::vector<MemoryPlanRow> plan_memory(const MemoryPlanInput& input);

// The rows as a Markdown table in GiB, with the inputs and assumptions.
std::string format_memory_plan(const MemoryPlanInput& input, const std::vector<MemoryPlanRow>& rows,
                               const std::string& model_name);

}  // namespace colossus::booster
