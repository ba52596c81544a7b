// Connects the decode GEMV (gemv.h) to the models layer (cuda_slots.h) and
// registers its self-test for `colossus check`: every row count 1..8, bf16
// and fp16, in_features with and without a full unrolled group, each
// epilogue (bias, residual in place, gated SwiGLU), each K split (1, 2, 4
// warps a group, and the shape's own choice), against at::linear and the
// epilogue in fp64; outputs poisoned with NaN.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/gemv.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

using namespace fused_check;

bool cuda_gemv(const GemvArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return gemv_cuda(args, stream_of(device_index));
}

std::string check_gemv_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  at::manual_seed(3);
  for (at::ScalarType dtype : {at::kBFloat16, at::kHalf}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    // 4360: the unrolled loop and a partial tail at every split; 1024: the
    // unrolled loop at split 1, the tail only at 2 and 4; 264: the tail only.
    for (int64_t in : {int64_t{4360}, int64_t{1024}, int64_t{264}}) {
      for (int64_t rows = 1; rows <= kGemvMaxRows; ++rows) {
        for (GemvEpilogue epilogue : {GemvEpilogue::kNone, GemvEpilogue::kResidual, GemvEpilogue::kGated}) {
          for (int32_t k_split : {0, 1, 2, 4}) {
            // 75 rows: the last group's second row is past the end (bias and
            // residual forms); the gated form pairs 74 of them.
            const int64_t out = epilogue == GemvEpilogue::kGated ? 74 : 75;
            const at::Tensor x = at::randn({rows, in}, cuda), w = (at::randn({out, in}) * 0.05).to(cuda);
            const at::Tensor bias = at::randn({out}, cuda);
            const int64_t features = epilogue == GemvEpilogue::kGated ? out / 2 : out;
            at::Tensor residual = at::randn({rows, features}, cuda);
            at::Tensor y = epilogue == GemvEpilogue::kResidual ? residual.clone() : poisoned({rows, features}, cuda);
            GemvArgs args{.dtype = element_dtype(dtype), .epilogue = epilogue, .rows = rows, .in_features = in,
                          .out_features = out, .x = x.data_ptr(), .weight = w.data_ptr(),
                          .bias = epilogue == GemvEpilogue::kNone ? bias.data_ptr() : nullptr,
                          .residual = epilogue == GemvEpilogue::kResidual ? y.data_ptr() : nullptr,  // in place
                          .y = y.data_ptr(), .k_split = k_split};
            if (!cuda_gemv(args, 0)) return fmt::format("rows {} in {}: the kernel refused its arguments", rows, in);
            const at::Tensor h = at::linear(x.cpu().to(at::kDouble), w.cpu().to(at::kDouble));
            at::Tensor ref;
            switch (epilogue) {
              case GemvEpilogue::kNone: ref = h + bias.cpu().to(at::kDouble); break;
              case GemvEpilogue::kResidual: ref = h + residual.cpu().to(at::kDouble); break;
              case GemvEpilogue::kGated: ref = at::silu(h.narrow(1, 0, features)) * h.narrow(1, features, features); break;
            }
            const double err = rel_err(y, ref), bound = bound_for(dtype);
            if (!(err <= bound)) {
              return fmt::format("{} rows {} in {} epilogue {} k_split {}: rel err {:.2e} (bound {:.0e})",
                                 c10::toString(dtype), rows, in, static_cast<int>(epilogue), k_split, err, bound);
            }
          }
        }
      }
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().gemv = cuda_gemv;
  register_kernel({"gemv", "cuda", check_gemv_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
