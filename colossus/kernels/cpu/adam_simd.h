// The per-ISA bodies of the CPU Adam kernel (cpu/adam_simd.cpp), each over
// elements [begin, end) of one tensor. Internal to colossus/kernels.
#pragma once
#include "colossus/kernels/adam.h"

namespace colossus::kernels::detail {

void adam_range_scalar(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h);
void adam_range_avx2(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h);
void adam_range_avx512(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h);

// ConfigError unless this CPU has `isa` and num_threads >= 0 (0: every core):
// what every CPU Adam entry point checks before it touches memory.
void check_cpu_adam_call(CpuIsa isa, int num_threads);

}  // namespace colossus::kernels::detail
