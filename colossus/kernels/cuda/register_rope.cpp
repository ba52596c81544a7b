// Connects the fused RoPE kernel (rope.h) to the models layer (cuda_slots.h)
// and registers its self-test for `colossus check`: q and k with different
// head counts in one launch, forward and backward, fp32 and bf16, with random
// cos/sin (so a kernel that mixes up the halves' angles cannot pass), against
// the rotation and its autograd gradient in fp64; outputs poisoned with NaN.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"
#include "colossus/kernels/rope.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

using namespace fused_check;

bool cuda_rope(const RopeArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return rope_cuda(args, stream_of(device_index));
}

// x: (B, T, H, D), cos/sin: (T, D) fp64: HF's x * cos + rotate_half(x) * sin.
at::Tensor rope_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t half = x.size(-1) / 2;
  const at::Tensor rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos.unsqueeze(1) + rotated * sin.unsqueeze(1);
}

std::string check_rope_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  const int64_t batch = 2, seq = 37, q_heads = 6, k_heads = 2, head_dim = 64;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    const at::Tensor q = at::randn({batch, seq, q_heads, head_dim}).to(cuda);
    const at::Tensor k = at::randn({batch, seq, k_heads, head_dim}).to(cuda);
    const at::Tensor cos = at::randn({seq, head_dim}).to(cuda), sin = at::randn({seq, head_dim}).to(cuda);
    const at::Tensor dq = at::randn(q.sizes()).to(cuda), dk = at::randn(k.sizes()).to(cuda);
    at::Tensor q_out = poisoned(q.sizes(), cuda), k_out = poisoned(k.sizes(), cuda);
    at::Tensor dq_in = poisoned(q.sizes(), cuda), dk_in = poisoned(k.sizes(), cuda);
    RopeArgs args{.dtype = element_dtype(dtype),
                  .batch = batch,
                  .seq = seq,
                  .head_dim = head_dim,
                  .q = q.data_ptr(),
                  .q_out = q_out.data_ptr(),
                  .q_heads = q_heads,
                  .k = k.data_ptr(),
                  .k_out = k_out.data_ptr(),
                  .k_heads = k_heads,
                  .cos = cos.data_ptr(),
                  .sin = sin.data_ptr(),
                  .backward = false};
    if (!cuda_rope(args, 0)) return "the forward refused aligned arguments";
    args.q = dq.data_ptr();
    args.q_out = dq_in.data_ptr();
    args.k = dk.data_ptr();
    args.k_out = dk_in.data_ptr();
    args.backward = true;
    if (!cuda_rope(args, 0)) return "the backward refused aligned arguments";

    // The forward reading q and k in place from a merged q/k/v projection
    // (strided rows) writes the same values as from contiguous copies.
    const at::Tensor qkv = at::cat({q.flatten(2), k.flatten(2), k.flatten(2)}, -1);  // (batch, seq, (q + 2k) heads * D)
    at::Tensor q_strided = poisoned(q.sizes(), cuda), k_strided = poisoned(k.sizes(), cuda);
    RopeArgs strided{.dtype = element_dtype(dtype),
                     .batch = batch,
                     .seq = seq,
                     .head_dim = head_dim,
                     .q = qkv.data_ptr(),
                     .q_out = q_strided.data_ptr(),
                     .q_heads = q_heads,
                     .k = qkv.narrow(-1, q_heads * head_dim, k_heads * head_dim).data_ptr(),
                     .k_out = k_strided.data_ptr(),
                     .k_heads = k_heads,
                     .q_row_stride = qkv.size(-1),
                     .k_row_stride = qkv.size(-1),
                     .cos = cos.data_ptr(),
                     .sin = sin.data_ptr(),
                     .backward = false};
    if (!cuda_rope(strided, 0)) return "the forward refused strided rows";
    if (!at::equal(q_strided, q_out) || !at::equal(k_strided, k_out)) {
      return fmt::format("{}: the forward over strided rows differs from the contiguous one", c10::toString(dtype));
    }

    const auto f64 = [](const at::Tensor& t) { return t.cpu().to(at::kDouble); };
    at::Tensor q64 = f64(q).requires_grad_(true), k64 = f64(k).requires_grad_(true);
    const at::Tensor q_ref = rope_reference(q64, f64(cos), f64(sin)), k_ref = rope_reference(k64, f64(cos), f64(sin));
    ((q_ref * f64(dq)).sum() + (k_ref * f64(dk)).sum()).backward();
    const double bound = bound_for(dtype);
    for (const auto& [name, err] : {std::pair<const char*, double>{"q", rel_err(q_out, q_ref)},
                                    {"k", rel_err(k_out, k_ref)},
                                    {"dq", rel_err(dq_in, q64.grad())},
                                    {"dk", rel_err(dk_in, k64.grad())}}) {
      if (!(err <= bound)) {
        return fmt::format("{}: {} rel err {:.2e} (bound {:.0e})", c10::toString(dtype), name, err, bound);
      }
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().rope = cuda_rope;
  register_kernel({"rope", "cuda", check_rope_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
