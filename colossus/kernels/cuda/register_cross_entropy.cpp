// Connects the CUDA cross-entropy row kernel to the models layer
// (cuda_slots.h) and registers its self-test for `colossus check`: random
// logits with an odd vocab inside a padded row, ignored rows, fp32 and bf16,
// against log_softmax in fp64 on the same (rounded) inputs; outputs are
// poisoned with NaN first, so a kernel that writes nothing cannot pass.
#include "colossus/kernels/cross_entropy.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

bool cuda_cross_entropy_rows(const CrossEntropyRowsArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return cross_entropy_rows_cuda(args, at::cuda::getCurrentCUDAStream(device_index).stream());
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  return (out.to(at::kDouble) - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-30);
}

std::string check_cross_entropy_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  const int64_t rows = 67, vocab = 1001, ld = 1024, ignore = -100;
  const float scale = 0.25f;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::Tensor logits = (at::randn({rows, ld}) * 3).to(dtype).cuda();
    at::Tensor targets = at::randint(vocab, {rows}, at::TensorOptions().dtype(at::kLong)).cuda();
    targets.index_put_({at::arange(0, rows, 5, targets.options())}, ignore);
    // The reference, in fp64 on the inputs as the kernel sees them.
    const at::Tensor x = logits.narrow(1, 0, vocab).to(at::kDouble).cpu();
    const at::Tensor t = targets.cpu();
    const at::Tensor counted = t.ne(ignore);
    const at::Tensor index = at::where(counted, t, at::zeros_like(t)).unsqueeze(1);
    const at::Tensor logp = at::log_softmax(x, 1);
    const at::Tensor ref_loss = at::where(counted, -logp.gather(1, index).squeeze(1), at::zeros({rows}, x.options()));
    at::Tensor ref_grad = at::zeros({rows, ld}, x.options());
    at::Tensor g = logp.exp();
    g.scatter_add_(1, index, -at::ones_like(index, g.options()));
    ref_grad.narrow(1, 0, vocab).copy_(g * counted.unsqueeze(1).to(at::kDouble) * scale);

    at::Tensor row_loss = at::full({rows}, NAN, logits.options().dtype(at::kFloat));
    const CrossEntropyRowsArgs args{.logits = logits.data_ptr(),
                                    .dtype = dtype == at::kFloat ? LogitsDtype::kFloat32 : LogitsDtype::kBFloat16,
                                    .rows = rows,
                                    .vocab = vocab,
                                    .ld = ld,
                                    .targets = targets.data_ptr<int64_t>(),
                                    .ignore_index = ignore,
                                    .grad_scale = scale,
                                    .write_grad = true,
                                    .row_loss = row_loss.data_ptr<float>()};
    if (!cuda_cross_entropy_rows(args, 0)) return "the kernel refused aligned arguments";
    const double loss_err = rel_err(row_loss.cpu(), ref_loss);
    const double grad_err = rel_err(logits.cpu(), ref_grad);
    // fp32 sums of __expf terms; the bf16 gradient is rounded once (2^-9 relative).
    const double grad_bound = dtype == at::kFloat ? 1e-5 : 4e-3;
    if (!(loss_err <= 1e-5) || !(grad_err <= grad_bound)) {
      return fmt::format("{}: loss rel err {:.2e} (bound 1e-5), grad rel err {:.2e} (bound {:.0e})",
                         c10::toString(dtype), loss_err, grad_err, grad_bound);
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().cross_entropy_rows = cuda_cross_entropy_rows;
  register_kernel({"cross_entropy_rows", "cuda", check_cross_entropy_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
