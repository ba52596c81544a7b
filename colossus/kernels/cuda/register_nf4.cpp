// Connects the NF4 kernels (nf4.h) to the layers built without CUDA
// (cuda_slots.h): the LoRA layer's Nf4Linear reaches them through these
// slots. Their `colossus check` self-test compares them with the ATen
// reference in colossus/lora, so it lives there (lora/nf4_cuda_check.cpp):
// nothing under kernels/ includes a layer above it.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/nf4.h"

#include <c10/cuda/CUDAGuard.h>

namespace colossus::kernels {

namespace {

bool cuda_nf4_dequantize(const Nf4DequantizeArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return nf4_dequantize_cuda(args, fused_check::stream_of(device_index));
}

bool cuda_nf4_gemv(const Nf4GemvArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return nf4_gemv_cuda(args, fused_check::stream_of(device_index));
}

const bool registered = [] {
  cuda_slots().nf4_dequantize = cuda_nf4_dequantize;
  cuda_slots().nf4_gemv = cuda_nf4_gemv;
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
