// Fused Adam/AdamW update over many fp32 tensors in one pass: each element
// reads param, grad, exp_avg, exp_avg_sq once and writes param, exp_avg,
// exp_avg_sq once (28 bytes per element). Raw pointers only; the optimizer
// layer (colossus/optim/hybrid_adam.h) computes the hyper-parameters.
#pragma once
#include <cstdint>
#include <string>

namespace colossus::kernels {

// Per-call constants, already folded on the host in double and rounded to
// float once, so every implementation (scalar, AVX2, AVX-512, CUDA) sees the
// same float values and can agree bit for bit.
struct AdamHyper {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;       // L2 coefficient added to the grad (decoupled == false)
  float decay_factor = 1.0f;       // 1 - lr * weight_decay, multiplies the param (decoupled == true)
  float step_size = 1e-3f;         // lr / (1 - beta1^step), or lr without bias correction
  float bias_correction2_sqrt = 1; // sqrt(1 - beta2^step), or 1 without bias correction
  bool decoupled = true;           // AdamW (true) or Adam with L2 (false)
};

// Builds the constants for optimizer step `step` (1-based), in torch's order of
// double operations (torch.optim.Adam's single-tensor path).
AdamHyper make_adam_hyper(double lr, double beta1, double beta2, double eps, double weight_decay, bool decoupled,
                          bool bias_correction, int64_t step);

// The constants of a group that do not change from step to step; with lr and
// the step count they give make_adam_hyper's result. The graph-capturable
// step (adam_step_mixed_device_cuda) folds them on the device, in the same
// double operations, because there lr and the step count live in device memory.
struct AdamGroupConstants {
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool decoupled = true;
  bool bias_correction = true;
};

// One tensor's buffers, each `numel` fp32 values, contiguous.
struct AdamTensorPtrs {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  int64_t numel;
};

// The reference: one element at a time, in this order (all float):
//   g = grad (+ weight_decay * p when !decoupled);   p = p * decay_factor when decoupled
//   m = beta1 * m + one_minus_beta1 * g;             v = beta2 * v + one_minus_beta2 * (g * g)
//   p = p - step_size * (m / (sqrt(v) / bias_correction2_sqrt + eps))
void adam_step_reference(const AdamTensorPtrs& t, const AdamHyper& h);

enum class CpuIsa { kScalar, kAvx2, kAvx512 };
// The widest ISA this CPU and OS support (cpuid + xgetbv), and its name.
CpuIsa best_cpu_isa();
bool cpu_supports(CpuIsa isa);
std::string isa_name(CpuIsa isa);

// All tensors in one call, split over `num_threads` threads by element count
// (0: std::thread::hardware_concurrency()). The SIMD paths perform exactly the
// reference's float operations, so results equal the reference bit for bit.
// Throws ConfigError when `isa` is not supported by this CPU.
void adam_step_cpu(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, int num_threads = 0);
void adam_step_cpu(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, int num_threads, CpuIsa isa);

// Mixed precision in one pass: the same update of the fp32 master `param`,
// with the gradient read from the model's bf16 gradient `grad_bf16` (numel
// values) and the updated master also written, rounded to nearest-even bf16,
// into the model's parameter `param_bf16`. Saves the fp32 master-gradient
// copy and the copy back (14 + 14 bytes per element instead of 16 + 12 plus
// 2 + 8 + 4 + 2 for the copies).
struct AdamMixedPtrs {
  float* param;
  const void* grad_bf16;
  float* exp_avg;
  float* exp_avg_sq;
  void* param_bf16;
  int64_t numel;
};

// AdamMixedPtrs on host memory, for ZeRO's CPU offload: the gradient is
// float(grad_bf16) * grad_scale (the clip coefficient, 1 for none), then
// adam_step_reference's operations, then param_bf16 = bf16(param), rounded to
// nearest even (NaN -> 0x7FC0, as c10::BFloat16). grad_bf16 and param_bf16
// may be the same buffer: each element is read before it is written, so one
// pinned bf16 buffer carries the gradient down and the new parameter back up.
// Split over threads as adam_step_cpu; every ISA gives the same bits.
void adam_step_mixed_cpu(const AdamMixedPtrs* tensors, int64_t count, const AdamHyper& h, float grad_scale,
                         int num_threads, CpuIsa isa);
// One element of it (tests and the check compare the threaded kernel with it).
void adam_step_mixed_reference(const AdamMixedPtrs& t, const AdamHyper& h, float grad_scale);

// The same step from an fp32 gradient (Gemini's host accumulator under
// gradient accumulation): float(grad) is grad itself; nothing aliases.
struct AdamMixedFp32GradPtrs {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  void* param_bf16;
  int64_t numel;
};
void adam_step_mixed_cpu(const AdamMixedFp32GradPtrs* tensors, int64_t count, const AdamHyper& h, float grad_scale,
                         int num_threads, CpuIsa isa);
void adam_step_mixed_reference(const AdamMixedFp32GradPtrs& t, const AdamHyper& h, float grad_scale);

#ifdef COLOSSUS_WITH_CUDA
// Same update on device memory, one launch per table of up to 32 tensors and
// 320 chunks of 64K elements (usually one launch for a whole model's group).
// Uses round-to-nearest intrinsics (no FMA contraction), so it matches the
// reference bit for bit. Runs on `stream` (a cudaStream_t).
void adam_step_cuda(const AdamTensorPtrs* tensors, int64_t count, const AdamHyper& h, void* stream);
// AdamMixedPtrs on device memory: bit for bit adam_step_reference on
// float(grad_bf16), then param_bf16 = bf16(param).
void adam_step_mixed_cuda(const AdamMixedPtrs* tensors, int64_t count, const AdamHyper& h, void* stream);
// The same update with nothing read from the host at launch time, so it can
// be captured once in a CUDA graph and replayed every step: `lr` (device
// double) is this group's learning rate, written before each step; `counters`
// (device int64 [3]: steps taken, steps skipped, last step skipped) and `skip` (device int32,
// set by bf16_nonfinite_check_cuda for this step) say which step this is and
// whether to leave everything untouched. The step count advances in
// adam_device_step_finish_cuda, after every group has been updated.
void adam_step_mixed_device_cuda(const AdamMixedPtrs* tensors, int64_t count, const AdamGroupConstants& c,
                                 const double* lr, const int64_t* counters, const int32_t* skip, void* stream);
// Ends a device-counted step: counters[0] += 1 when *skip is 0, else
// counters[1] += 1; counters[2] = *skip != 0; then clears *skip for the next
// step. One thread.
void adam_device_step_finish_cuda(int64_t* counters, int32_t* skip, void* stream);
// Sets *found_nonfinite (device int32, left alone otherwise) to 1 when any of
// the `count` bf16 buffers holds an inf or NaN: the mixed-precision step's
// overflow check, one launch per 32 tensors, on `stream`.
void bf16_nonfinite_check_cuda(const void* const* data, const int64_t* numel, int64_t count, int32_t* found_nonfinite,
                               void* stream);
#endif

}  // namespace colossus::kernels
