// Connects the FP8 quantise kernel (fp8_quantize.h) to the models layer
// (cuda_slots.h) and registers its self-test for `colossus check`: bf16 and
// fp32 inputs, e4m3 and e5m2, per tensor and per row (one row all zeros,
// sub-normal magnitudes, odd sizes), against the ATen formula of
// models/fp8_linear.cpp's reference path, which it must equal to the bit;
// the transposed bytes (q_t) equal to the transpose.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/fp8_quantize.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

#include <tuple>

namespace colossus::kernels {

namespace {

using namespace fused_check;

bool cuda_fp8_quantize(const Fp8QuantizeArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return fp8_quantize_cuda(args, stream_of(device_index));
}

// One shape: every dtype, format and scaling against the ATen formula; with
// `transposed`, per tensor also the transposed bytes (q_t == q^T).
std::string check_shape(int64_t rows, int64_t cols, bool transposed) {
  for (at::ScalarType dtype : {at::kBFloat16, at::kFloat}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    // Magnitudes over 12 decades, so fp8's sub-normals and rounding ties occur.
    at::Tensor x = (at::randn({rows, cols}) * at::exp(at::randn({rows, 1}) * 6)).to(cuda);
    x[3].zero_();
    for (const auto format : {at::kFloat8_e4m3fn, at::kFloat8_e5m2}) {
      for (bool rowwise : {false, true}) {
        if (transposed && rowwise) continue;
        // The reference: fp8_linear.cpp's quantize, op for op.
        const at::Tensor x32 = x.to(at::kFloat);
        const at::Tensor amax = rowwise ? x32.abs().amax({-1}, /*keepdim=*/true) : x32.abs().max();
        const double top = format == at::kFloat8_e5m2 ? 57344.0 : 448.0;
        const at::Tensor ref_scale = at::where(amax > 0, amax / top, at::ones_like(amax));
        const at::Tensor ref_q = (x32 / ref_scale).clamp(-top, top).to(format);

        at::Tensor q = at::full({rows, cols}, 0x55, cuda.dtype(at::kByte));
        at::Tensor q_t = at::full({cols, rows}, 0x55, cuda.dtype(at::kByte));
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
                                   .amax_scratch = scratch.data_ptr<float>(),
                                   .q_t = transposed ? q_t.data_ptr() : nullptr};
        const std::string what = fmt::format("{}x{} {} -> {}, {}{}", rows, cols, c10::toString(dtype),
                                             c10::toString(format), rowwise ? "rowwise" : "tensorwise",
                                             transposed ? " with q_t" : "");
        if (!cuda_fp8_quantize(args, 0)) return what + ": the kernel refused its arguments";
        const at::Tensor ref_bytes = ref_q.view(at::kByte);
        const int64_t bytes_differ = q.ne(ref_bytes).sum().item<int64_t>();
        if (bytes_differ != 0) return fmt::format("{}: {} of {} bytes differ from ATen's", what, bytes_differ, q.numel());
        if (!at::equal(scale, ref_scale.reshape({-1}))) return fmt::format("{}: the scales differ from ATen's", what);
        if (transposed) {
          const int64_t t_differ = q_t.ne(ref_bytes.t()).sum().item<int64_t>();
          if (t_differ != 0) return fmt::format("{}: {} of {} transposed bytes differ", what, t_differ, q_t.numel());
        }
      }
    }
  }
  return {};
}

std::string check_fp8_quantize_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  // Odd sizes (the vector paths' scalar tails, no q_t), then tiles cut at
  // both edges with q_t, then a row count that is not a multiple of 8, which
  // must be refused with q_t.
  for (const auto& [rows, cols, transposed] :
       {std::tuple<int64_t, int64_t, bool>{67, 1001, false}, {136, 1000, false}, {136, 1000, true}}) {
    if (auto failure = check_shape(rows, cols, transposed); !failure.empty()) return failure;
  }
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  at::Tensor x = at::randn({67, 1000}, cuda.dtype(at::kBFloat16));
  at::Tensor q = at::empty({67, 1000}, cuda.dtype(at::kByte)), q_t = at::empty({1000, 67}, cuda.dtype(at::kByte));
  at::Tensor scale = at::empty({1}, cuda.dtype(at::kFloat)), scratch = at::empty({1}, cuda.dtype(at::kFloat));
  const Fp8QuantizeArgs odd{.rows = 67, .cols = 1000, .x = x.data_ptr(), .q = q.data_ptr(),
                            .scale = scale.data_ptr<float>(), .amax_scratch = scratch.data_ptr<float>(),
                            .q_t = q_t.data_ptr()};
  if (cuda_fp8_quantize(odd, 0)) return "q_t with 67 rows (not a multiple of 8) was not refused";
  return {};
}

const bool registered = [] {
  cuda_slots().fp8_quantize = cuda_fp8_quantize;
  register_kernel({"fp8_quantize", "cuda", check_fp8_quantize_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
