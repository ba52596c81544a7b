// FP8 linear layers for training (Colossal-AI's use_fp8; Transformer Engine's
// and torchao's float8 training): the matmuls of a Linear run on FP8 operands
// through at::_scaled_mm (Hopper's FP8 tensor cores; a oneDNN kernel on the
// CPU), each operand scaled dynamically from its current absolute maximum so
// that it fills the format's range:
//   forward   y = x W^T: x and W in e4m3, one scale per tensor or one per row
//             of x and per row of W (`rowwise`);
//   backward  dx = dy W and dW = dy^T x: dy in e5m2 (range for gradients) or
//             e4m3, every operand scaled per tensor.
// Sums are fp32; y and the gradients come out in x's dtype. The parameters
// stay what they were (fp32 masters or bf16): FP8 is the matmuls' input
// format only, so checkpoints, optimizers, ZeRO and Gemini see no change.
// Where _scaled_mm does not take the operands (rowwise scales on the CPU, a
// CUDA size not a multiple of 16), the same FP8 values are multiplied after
// dequantising them to fp32: slower, same numbers up to summation order.
// Delayed scaling (Transformer Engine's amax history; `amax_history_len`):
// per tensor, each operand's scale comes from the largest of its last N
// absolute maxima instead of its current one (the first use, with no
// history yet, takes its current one), values beyond it saturate, and each
// training use records its own maximum (evaluation under no-grad does not);
// not inside activation checkpointing's rerun. The history lives in the
// layer, not in checkpoints: a resumed run starts it afresh.
#pragma once
#include "colossus/models/layers.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>

namespace colossus::models {

struct Fp8Recipe {
  bool rowwise = false;              // forward scales per row of x and of W, else per tensor
  std::string grad_format = "e5m2";  // dy's format in the backward: "e5m2" or "e4m3"
  // On CUDA, each operand quantised by one fused kernel (kernels/fp8_quantize.h:
  // two passes, the same bytes and scales, `colossus check`'s fp8_quantize)
  // instead of six ATen passes in fp32: the FP8 step 1.74x faster on an H100
  // (bench/RESULTS.md). false: the ATen formula, the reference
  // bench_train_gpt2 --fp8 times beside it.
  bool fused_quantize = true;
  // > 0: delayed scaling over this many past maxima (per tensor only; the
  // ATen path, not the fused quantise); 0: each operand scaled by its
  // current maximum.
  int64_t amax_history_len = 0;
  // Per tensor: the forward's FP8 W^T kept for the backward (a byte a
  // parameter until then), else W quantised again there; Gemini's trainer
  // path sets false, since it releases gathered weights between the two.
  bool keep_weight_for_backward = true;
  void validate() const;             // ConfigError naming a bad value
};

// Delayed scaling's state of one FP8 layer: the last maxima of x, W and dy,
// newest first, (amax_history_len) fp32 each, made at the first use.
struct Fp8AmaxHistory {
  at::Tensor x, w, dy;
};

// y = x W^T + bias with FP8 matmuls (above); x (..., in), weight (out, in),
// bias (out) or undefined; differentiable in x, weight and bias. `history`:
// the layer's state, required when recipe.amax_history_len > 0; it must
// outlive the backward.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias, const Fp8Recipe& recipe,
                      Fp8AmaxHistory* history = nullptr);

// A Linear whose matmuls run in FP8; the same parameters under the same
// names (weight, bias), so it replaces a Linear in place.
class Fp8Linear : public Linear {
 public:
  Fp8Linear(const Linear& base, Fp8Recipe recipe);
  at::Tensor forward(const at::Tensor& x) override;
  const Fp8Recipe& recipe() const { return recipe_; }
  const Fp8AmaxHistory& amax_history() const { return *history_; }

 private:
  Fp8Recipe recipe_;
  std::shared_ptr<Fp8AmaxHistory> history_ = std::make_shared<Fp8AmaxHistory>();
};

// GPT-2's Conv1D (weight stored (in, out)) with its matmuls in FP8.
class Fp8Conv1D : public Conv1D {
 public:
  Fp8Conv1D(const Conv1D& base, Fp8Recipe recipe);
  at::Tensor forward(const at::Tensor& x) override;
  const Fp8Recipe& recipe() const { return recipe_; }

 private:
  Fp8Recipe recipe_;
  std::shared_ptr<Fp8AmaxHistory> history_ = std::make_shared<Fp8AmaxHistory>();
};

class CausalLM;

// Replaces the plain Linear (and GPT-2 Conv1D) layers of the decoder blocks
// with their FP8 forms,
// leaving the embeddings and the head in their dtype and, with
// keep_first_last (the default, as the recipes that train in FP8 do), the
// first and the last block too. Returns how many layers were replaced.
// MoE experts and routers (run from packed buffers), LoRA and tensor-parallel
// layers are not plain leaves and stay as they are; tensor parallelism's
// sharder carries an FP8 leaf's recipe into the parallel layer it makes
// (parallel/tensor/layers.h), so enable_fp8 runs before sharding.
int64_t enable_fp8(CausalLM& model, const Fp8Recipe& recipe, bool keep_first_last = true);

}  // namespace colossus::models
