// The per-ISA bodies of the CPU Adam kernel (cpu/adam_simd.cpp), each over
// elements [begin, end) of one tensor. Internal to colossus/kernels.
#pragma once
#include "colossus/kernels/adam.h"

namespace colossus::kernels::detail {

void adam_range_scalar(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h);
void adam_range_avx2(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h);
void adam_range_avx512(const AdamTensorPtrs& t, int64_t begin, int64_t end, const AdamHyper& h);

}  // namespace colossus::kernels::detail
