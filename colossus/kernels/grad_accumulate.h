// Sums a bf16 gradient into an fp32 accumulator in host memory, threads over
// elements: Gemini's host step under gradient accumulation, where each
// micro-batch's reduced bf16 gradient lands in pinned memory and joins the
// chunk's fp32 host gradient while the GPU runs on.
#pragma once
#include <cstdint>

namespace colossus::kernels {

// acc[i] = float(grad_bf16[i]) when `first`, else acc[i] + float(grad_bf16[i])
// (one fp32 add: the bits of ATen's acc.add_(grad.to(at::kFloat))). Returns
// whether every acc value is finite afterwards. num_threads 0: every core.
bool accumulate_bf16_cpu(float* acc, const void* grad_bf16, int64_t numel, bool first, int num_threads = 0);

}  // namespace colossus::kernels
