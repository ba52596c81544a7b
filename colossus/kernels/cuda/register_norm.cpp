// Connects the fused RMSNorm / LayerNorm kernels (norm.h) to the models layer
// (cuda_slots.h) and registers their self-tests for `colossus check`: random
// rows (several per backward block, a width that leaves threads idle), with
// and without the residual, fp32 and bf16, against autograd in fp64 on the
// same (rounded) inputs; every output is poisoned with NaN first, so a
// kernel that writes nothing cannot pass.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/norm.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

using namespace fused_check;

bool cuda_norm_forward(const NormForwardArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return norm_forward_cuda(args, stream_of(device_index));
}

bool cuda_norm_backward(const NormBackwardArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  if (!norm_cols_supported(args.kind, args.dtype, args.cols)) return false;
  // Freed into the caching allocator after the launch: stream-ordered, so the
  // kernels on this stream finish with it before anyone else gets it.
  const at::Tensor partial = at::empty({norm_backward_workspace_floats(args.kind, args.rows, args.cols)},
                                       at::TensorOptions().dtype(at::kFloat).device(at::kCUDA, device_index));
  NormBackwardArgs with_workspace = args;
  with_workspace.partial = partial.data_ptr<float>();
  return norm_backward_cuda(with_workspace, stream_of(device_index));
}

std::string check_case(NormKind kind, at::ScalarType dtype, bool with_residual, int64_t rows, int64_t cols) {
  const bool layer = kind == NormKind::kLayer;
  const float eps = 1e-5f;
  const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
  const auto f32 = cuda.dtype(at::kFloat);
  const at::Tensor x = (at::randn({rows, cols}) * 2 + 0.5).to(cuda);
  const at::Tensor residual = with_residual ? at::randn({rows, cols}).to(cuda) : at::Tensor();
  const at::Tensor weight = (at::rand({cols}) + 0.5).to(cuda);
  const at::Tensor bias = layer ? at::randn({cols}).to(cuda) : at::Tensor();
  const at::Tensor dy = at::randn({rows, cols}).to(cuda);
  const at::Tensor dsum = with_residual ? at::randn({rows, cols}).to(cuda) : at::Tensor();

  at::Tensor y = poisoned({rows, cols}, cuda), sum = with_residual ? poisoned({rows, cols}, cuda) : at::Tensor();
  at::Tensor mean = poisoned({rows}, f32), rstd = poisoned({rows}, f32);
  const NormForwardArgs fwd{.kind = kind,
                            .dtype = element_dtype(dtype),
                            .rows = rows,
                            .cols = cols,
                            .x = x.data_ptr(),
                            .residual = with_residual ? residual.data_ptr() : nullptr,
                            .weight = weight.data_ptr(),
                            .bias = layer ? bias.data_ptr() : nullptr,
                            .eps = eps,
                            .y = y.data_ptr(),
                            .residual_out = with_residual ? sum.data_ptr() : nullptr,
                            .mean = mean.data_ptr<float>(),
                            .rstd = rstd.data_ptr<float>()};
  if (!cuda_norm_forward(fwd, 0)) return "the forward refused aligned arguments";
  at::Tensor dx = poisoned({rows, cols}, cuda), dweight = poisoned({cols}, cuda);
  at::Tensor dbias = layer ? poisoned({cols}, cuda) : at::Tensor();
  const NormBackwardArgs bwd{.kind = kind,
                             .dtype = element_dtype(dtype),
                             .rows = rows,
                             .cols = cols,
                             .dy = dy.data_ptr(),
                             .dresidual_out = with_residual ? dsum.data_ptr() : nullptr,
                             .s = with_residual ? sum.data_ptr() : x.data_ptr(),
                             .weight = weight.data_ptr(),
                             .mean = mean.data_ptr<float>(),
                             .rstd = rstd.data_ptr<float>(),
                             .dx = dx.data_ptr(),
                             .dweight = dweight.data_ptr(),
                             .dbias = layer ? dbias.data_ptr() : nullptr};
  if (!cuda_norm_backward(bwd, 0)) return "the backward refused aligned arguments";

  // The reference: autograd in fp64 on the CPU. The sum is rounded to the
  // dtype as the kernel's is, with the rounding outside the gradient.
  const auto leaf = [](const at::Tensor& t) { return t.cpu().to(at::kDouble).requires_grad_(true); };
  at::Tensor x64 = leaf(x), w64 = leaf(weight);
  at::Tensor r64 = with_residual ? leaf(residual) : at::Tensor(), b64 = layer ? leaf(bias) : at::Tensor();
  at::Tensor s64 = x64;
  if (with_residual) {
    const at::Tensor exact = x64 + r64;
    s64 = exact + (exact.detach().to(dtype).to(at::kDouble) - exact.detach());
  }
  at::Tensor y64;
  if (layer) {
    const at::Tensor centred = s64 - s64.mean(-1, true);
    y64 = centred * at::rsqrt(centred.pow(2).mean(-1, true) + eps) * w64 + b64;
  } else {
    y64 = s64 * at::rsqrt(s64.pow(2).mean(-1, true) + eps) * w64;
  }
  at::Tensor loss = (y64 * dy.cpu().to(at::kDouble)).sum();
  if (with_residual) loss = loss + (s64 * dsum.cpu().to(at::kDouble)).sum();
  loss.backward();

  const double bound = bound_for(dtype);
  std::vector<std::pair<std::string, double>> errs = {
      {"y", rel_err(y, y64)}, {"dx", rel_err(dx, x64.grad())}, {"dweight", rel_err(dweight, w64.grad())}};
  if (layer) errs.emplace_back("dbias", rel_err(dbias, b64.grad()));
  if (with_residual) {
    errs.emplace_back("residual_out", rel_err(sum, s64));
    errs.emplace_back("dresidual", rel_err(dx, r64.grad()));
  }
  const at::Tensor sd = s64.detach();
  const at::Tensor centred = layer ? sd - sd.mean(-1, true) : sd;
  errs.emplace_back("rstd", rel_err(rstd, at::rsqrt(centred.pow(2).mean(-1) + eps)));
  if (layer) errs.emplace_back("mean", rel_err(mean, sd.mean(-1)));
  for (const auto& [name, err] : errs) {
    if (!(err <= bound)) {
      return fmt::format("{} {} rows={} cols={}{}: {} rel err {:.2e} (bound {:.0e})", layer ? "layer_norm" : "rms_norm",
                         c10::toString(dtype), rows, cols, with_residual ? " +residual" : "", name, err, bound);
    }
  }
  return {};
}

std::string check_norm_cuda(NormKind kind) {
  if (!at::hasCUDA()) return "no CUDA device";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (bool with_residual : {false, true}) {
      // 300 rows: 19 backward blocks, the last one short; 2056 columns: a partly idle
      // second (bf16) or fourth (fp32) vector per thread; 64: mostly idle.
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{300, 2056}, {5, 64}}) {
        std::string error = check_case(kind, dtype, with_residual, rows, cols);
        if (!error.empty()) return error;
      }
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().norm_forward = cuda_norm_forward;
  cuda_slots().norm_backward = cuda_norm_backward;
  register_kernel({"rms_norm", "cuda", [] { return check_norm_cuda(NormKind::kRms); }});
  register_kernel({"layer_norm", "cuda", [] { return check_norm_cuda(NormKind::kLayer); }});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
