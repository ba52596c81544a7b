// Connects the fused SwiGLU kernels (swiglu.h) to the models layer
// (cuda_slots.h) and registers their self-test for `colossus check`: forward
// and backward, fp32 and bf16, aligned (16-byte vectors plus a tail) and
// misaligned (element by element) operands, against silu(gate) * up and its
// autograd gradient in fp64; outputs poisoned with NaN.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"
#include "colossus/kernels/swiglu.h"

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

namespace colossus::kernels {

namespace {

using namespace fused_check;

bool cuda_swiglu_forward(const SwigluArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return swiglu_forward_cuda(args, stream_of(device_index));
}

bool cuda_swiglu_packed_forward(const SwigluPackedArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return swiglu_packed_forward_cuda(args, stream_of(device_index));
}

bool cuda_swiglu_packed_backward(const SwigluPackedArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return swiglu_packed_backward_cuda(args, stream_of(device_index));
}

bool cuda_swiglu_backward(const SwigluArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return swiglu_backward_cuda(args, stream_of(device_index));
}

std::string check_swiglu_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  const int64_t n = 3 * 4096 + 5;
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    for (int64_t offset : {0, 1}) {  // 1: every pointer off 16-byte alignment
      const auto operand = [&](double scale) { return (at::randn({n + offset}) * scale).to(cuda).narrow(0, offset, n); };
      const at::Tensor gate = operand(3), up = operand(1), dout = operand(1);
      at::Tensor out = poisoned({n + offset}, cuda).narrow(0, offset, n);
      at::Tensor dgate = poisoned({n + offset}, cuda).narrow(0, offset, n);
      at::Tensor dup = poisoned({n + offset}, cuda).narrow(0, offset, n);
      const SwigluArgs args{.dtype = element_dtype(dtype),
                            .n = n,
                            .gate = gate.data_ptr(),
                            .up = up.data_ptr(),
                            .out = out.data_ptr(),
                            .dout = dout.data_ptr(),
                            .dgate = dgate.data_ptr(),
                            .dup = dup.data_ptr()};
      if (!cuda_swiglu_forward(args, 0) || !cuda_swiglu_backward(args, 0)) return "the kernels refused their arguments";
      at::Tensor g64 = gate.cpu().to(at::kDouble).requires_grad_(true), u64 = up.cpu().to(at::kDouble).requires_grad_(true);
      const at::Tensor ref = at::silu(g64) * u64;
      (ref * dout.cpu().to(at::kDouble)).sum().backward();
      const double bound = bound_for(dtype);
      for (const auto& [name, err] : {std::pair<const char*, double>{"out", rel_err(out, ref)},
                                      {"dgate", rel_err(dgate, g64.grad())},
                                      {"dup", rel_err(dup, u64.grad())}}) {
        if (!(err <= bound)) {
          return fmt::format("{} offset {}: {} rel err {:.2e} (bound {:.0e})", c10::toString(dtype), offset, name, err,
                             bound);
        }
      }
    }
  }
  // The packed forward: widths with and without 16-byte packs.
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    for (int64_t width : {int64_t{4096}, int64_t{1003}}) {
      const int64_t rows = 3;
      const at::Tensor gate_up = (at::randn({rows, 2 * width}) * 3).to(cuda), dout = at::randn({rows, width}).to(cuda);
      at::Tensor out = poisoned({rows, width}, cuda), dgate_up = poisoned({rows, 2 * width}, cuda);
      const SwigluPackedArgs args{.dtype = element_dtype(dtype),
                                  .rows = rows,
                                  .width = width,
                                  .gate_up = gate_up.data_ptr(),
                                  .out = out.data_ptr(),
                                  .dout = dout.data_ptr(),
                                  .dgate_up = dgate_up.data_ptr()};
      if (!cuda_swiglu_packed_forward(args, 0)) return "the packed kernel refused its arguments";
      if (!cuda_swiglu_packed_backward(args, 0)) return "the packed backward refused its arguments";
      at::Tensor g64 = gate_up.cpu().to(at::kDouble).requires_grad_(true);
      const at::Tensor ref = at::silu(g64.narrow(1, 0, width)) * g64.narrow(1, width, width);
      (ref * dout.cpu().to(at::kDouble)).sum().backward();
      const double bound = bound_for(dtype);
      for (const auto& [name, err] : {std::pair<const char*, double>{"out", rel_err(out, ref.detach())},
                                      {"dgate_up", rel_err(dgate_up, g64.grad())}}) {
        if (!(err <= bound)) {
          return fmt::format("packed {} width {}: {} rel err {:.2e} (bound {:.0e})", c10::toString(dtype), width, name,
                             err, bound);
        }
      }
    }
  }
  return {};
}

const bool registered = [] {
  cuda_slots().swiglu_forward = cuda_swiglu_forward;
  cuda_slots().swiglu_backward = cuda_swiglu_backward;
  cuda_slots().swiglu_packed_forward = cuda_swiglu_packed_forward;
  cuda_slots().swiglu_packed_backward = cuda_swiglu_packed_backward;
  register_kernel({"swiglu", "cuda", check_swiglu_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
