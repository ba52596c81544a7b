// Connects the FP8 quantise kernel (fp8_quantize.h) to the models layer
// (cuda_slots.h) and registers its self-test for `colossus check`: bf16 and
// fp32 inputs, e4m3 and e5m2, per tensor and per row (one row all zeros,
// sub-normal magnitudes, odd sizes), against the ATen formula of
// models/fp8_linear.cpp's reference path, which it must equal to the bit.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/fp8_quantize.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

using namespace fused_check;

bool cuda_fp8_quantize(const Fp8QuantizeArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return fp8_quantize_cuda(args, stream_of(device_index));
}

std::string check_fp8_quantize_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  const int64_t rows = 67, cols = 1000;
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    // Magnitudes over 12 decades, so fp8's sub-normals and rounding ties occur.
    at::Tensor x = (at::randn({rows, cols}) * at::exp(at::randn({rows, 1}) * 6)).to(cuda);
    x[3].zero_();
    for (const auto format : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (bool rowwise : {false, true}) {
        // The reference: fp8_linear.cpp's quantize, op for op.
        const at::Tensor x32 = x.to(at::kFloat);
        const at::Tensor amax = rowwise ? x32.abs().amax({-1}, /*keepdim=*/true) : x32.abs().max();
        const double top = format == at::kFloat8_e5m2 ? 57344.0 : 448.0;
        const at::Tensor ref_scale = at::where(amax > 0, amax / top, at::ones_like(amax));
        const at::Tensor ref_q = (x32 / ref_scale).clamp(-top, top).to(format);

        at::Tensor q = at::full({rows, cols}, 0x55, cuda.dtype(at::kByte));
        at::Tensor scale = poisoned({rowwise ? rows : 1}, cuda.dtype(at::kFloat));
        at::Tensor scratch = poisoned({1}, cuda.dtype(at::kFloat));
        const Fp8QuantizeArgs args{.dtype = element_dtype(dtype),
                                   .format = format == at::kFloat8_e5m2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3,
                                   .rowwise = rowwise,
                                   .rows = rows,
                                   .cols = cols,
                                   .x = x.data_ptr(),
                                   .q = q.data_ptr(),
                                   .scale = scale.data_ptr<float>(),
                                   .amax_scratch = scratch.data_ptr<float>()};
        if (!cuda_fp8_quantize(args, 0)) return "the kernel refused its arguments";
        const std::string what =
            fmt::format("{} -> {}, {}", c10::toString(dtype), c10::toString(format), rowwise ? "rowwise" : "tensorwise");
        const int64_t bytes_differ = q.ne(ref_q.view(at::kByte)).sum().item<int64_t>();
        if (bytes_differ != 0) return fmt::format("{}: {} of {} bytes differ from ATen's", what, bytes_differ, q.numel());
        if (!at::equal(scale, ref_scale.reshape({-1}))) return fmt::format("{}: the scales differ from ATen's", what);
      }
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().fp8_quantize = cuda_fp8_quantize;
  register_kernel({"fp8_quantize", "cuda", check_fp8_quantize_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
