// CUDA builds only (in the colossus_cuda bundle): the `colossus check`
// self-test `nf4/cuda` of the NF4 kernels (kernels/nf4.h) against this
// layer's ATen reference, which is why it sits here and not under kernels/.
//  - dequantisation: bit-identical to dequantize_nf4 (run on the CPU) in
//    fp32 / fp16 / bf16, with and without double quantisation, blocksizes
//    16 / 64 / 256, shapes of whole blocks, a partial last block and an odd
//    count, and misaligned packed codes and output (the element-by-element
//    path); outputs poisoned with NaN;
//  - the fused gemv for 1, 3 and 8 rows against at::linear in fp64 on the
//    dequantised weight, with and without bias, on the vector path
//    (in a multiple of 16) and the element path (odd in, misaligned x);
//  - nf4_linear (Nf4Linear's CUDA path) forward and grad_x against
//    at::linear's autograd on the reference weight, for 3 rows (the gemv)
//    and 40 (dequantise, then the GEMM), counting that the kernels ran.
#include "colossus/kernels/cuda/fused_check.h"
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/registry.h"
#include "colossus/lora/nf4.h"
#include "colossus/lora/nf4_matmul.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

namespace colossus::lora {

namespace {

using namespace kernels::fused_check;

struct Shape {
  int64_t out_features, in_features, blocksize;
};

// A copy of `t` starting one byte / element past an aligned address, so the
// kernels must take their element-by-element path.
at::Tensor misaligned_copy(const at::Tensor& t) {
  at::Tensor buffer = at::empty({t.numel() + 1}, t.options());
  at::Tensor view = buffer.narrow(0, 1, t.numel()).view(t.sizes());
  view.copy_(t);
  return view;
}

// fp32 ~1e-5 (fp32 sums of up to 1024 products); fp16 / bf16 outputs rounded
// to 11 / 8 bits.
double gemv_bound(at::ScalarType t) { return t == at::kFloat ? 1e-5 : t == at::kHalf ? 2e-3 : 1e-2; }

std::string check_dequantize(const at::Tensor& weight, const Shape& s, bool double_quant) {
  const Nf4Tensor cpu = quantize_nf4(weight, s.blocksize, double_quant);
  const at::Tensor tables = nf4_lookup_tables(at::Device(at::kCUDA, 0));
  for (bool misaligned : {false, true}) {
    Nf4Tensor q = cpu.to(at::Device(at::kCUDA, 0));
    if (misaligned) q.packed = misaligned_copy(q.packed);
    for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
      const at::Tensor expected = dequantize_nf4(cpu, dtype);
      const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
      at::Tensor out = poisoned({cpu.numel()}, cuda);
      if (misaligned) out = misaligned_copy(out);
      const kernels::Nf4DequantizeArgs args{
          .weight = nf4_weight_ptrs(q, tables), .dtype = element_dtype(dtype), .out = out.data_ptr()};
      if (!kernels::cuda_slots().nf4_dequantize(args, 0)) return "the dequantisation kernel refused its arguments";
      if (!at::equal(out.cpu().view(expected.sizes()), expected)) {
        const double err = rel_err(out.view(expected.sizes()), expected);
        return fmt::format("dequantize {}x{} blocksize {} double_quant {} {}{}: not bit-identical (rel err {:.2e})",
                           s.out_features, s.in_features, s.blocksize, double_quant, c10::toString(dtype),
                           misaligned ? " misaligned" : "", err);
      }
    }
  }
  return {};
}

std::string check_gemv(const at::Tensor& weight, const Shape& s, bool double_quant) {
  const Nf4Tensor cpu = quantize_nf4(weight, s.blocksize, double_quant);
  const Nf4Tensor q = cpu.to(at::Device(at::kCUDA, 0));
  const at::Tensor tables = nf4_lookup_tables(at::Device(at::kCUDA, 0));
  for (at::ScalarType dtype : {at::kFloat, at::kHalf, at::kBFloat16}) {
    const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
    const at::Tensor w64 = dequantize_nf4(cpu, dtype).to(at::kDouble);
    for (int64_t rows : {1, 3, 8}) {
      for (bool with_bias : {false, true}) {
        const at::Tensor x = at::randn({rows, s.in_features}).to(cuda);
        const at::Tensor bias = with_bias ? at::randn({s.out_features}).to(cuda) : at::Tensor();
        at::Tensor y = poisoned({rows, s.out_features}, cuda);
        const kernels::Nf4GemvArgs args{.weight = nf4_weight_ptrs(q, tables),
                                        .dtype = element_dtype(dtype),
                                        .rows = rows,
                                        .x = x.data_ptr(),
                                        .bias = with_bias ? bias.data_ptr() : nullptr,
                                        .y = y.data_ptr()};
        if (!kernels::cuda_slots().nf4_gemv(args, 0)) return "the gemv kernel refused its arguments";
        const at::Tensor expected =
            at::linear(x.cpu().to(at::kDouble), w64, with_bias ? bias.cpu().to(at::kDouble) : at::Tensor());
        const double err = rel_err(y, expected), bound = gemv_bound(dtype);
        if (!(err <= bound)) {
          return fmt::format("gemv {}x{} blocksize {} double_quant {} {} rows {} bias {}: rel err {:.2e} (bound {:.0e})",
                             s.out_features, s.in_features, s.blocksize, double_quant, c10::toString(dtype), rows,
                             with_bias, err, bound);
        }
      }
    }
  }
  return {};
}

int dequantize_launches = 0, gemv_launches = 0;
kernels::CudaNf4DequantizeFn real_dequantize = nullptr;
kernels::CudaNf4GemvFn real_gemv = nullptr;
bool counting_dequantize(const kernels::Nf4DequantizeArgs& args, int device_index) {
  ++dequantize_launches;
  return real_dequantize(args, device_index);
}
bool counting_gemv(const kernels::Nf4GemvArgs& args, int device_index) {
  ++gemv_launches;
  return real_gemv(args, device_index);
}

// Counts the NF4 slots' launches while alive; the real slots come back even
// when a check throws.
struct CountingSlots {
  CountingSlots() {
    auto& slots = kernels::cuda_slots();
    real_dequantize = std::exchange(slots.nf4_dequantize, counting_dequantize);
    real_gemv = std::exchange(slots.nf4_gemv, counting_gemv);
    dequantize_launches = gemv_launches = 0;
  }
  ~CountingSlots() {
    kernels::cuda_slots().nf4_dequantize = real_dequantize;
    kernels::cuda_slots().nf4_gemv = real_gemv;
  }
  CountingSlots(const CountingSlots&) = delete;
  CountingSlots& operator=(const CountingSlots&) = delete;
};

// nf4_linear forward and backward, counting which kernels each ran.
std::string check_autograd(int64_t rows, at::ScalarType dtype) {
  const Shape s{.out_features = 96, .in_features = 256, .blocksize = 64};
  const Nf4Tensor cpu = quantize_nf4(at::randn({s.out_features, s.in_features}), s.blocksize);
  const Nf4Tensor q = cpu.to(at::Device(at::kCUDA, 0));
  const auto cuda = at::TensorOptions().dtype(dtype).device(at::kCUDA, 0);
  at::Tensor x = at::randn({1, rows, s.in_features}).to(cuda).requires_grad_(true);
  const at::Tensor bias = at::randn({s.out_features}).to(cuda);
  const at::Tensor grad_y = at::randn({1, rows, s.out_features}).to(cuda);

  at::Tensor y;
  int forward_gemv = 0, forward_dequantize = 0, backward_dequantize = 0;
  {
    const CountingSlots counting;
    y = nf4_linear(x, q, nf4_lookup_tables(x.device()), bias);
    forward_gemv = gemv_launches;
    forward_dequantize = dequantize_launches;
    y.backward(grad_y);
    backward_dequantize = dequantize_launches - forward_dequantize;
  }

  const bool small = rows <= kernels::kNf4GemvMaxRows;
  if (forward_gemv != (small ? 1 : 0) || forward_dequantize != (small ? 0 : 1) || backward_dequantize != 1) {
    return fmt::format("nf4_linear rows {}: launches forward gemv {} dequantize {}, backward dequantize {}", rows,
                       forward_gemv, forward_dequantize, backward_dequantize);
  }
  at::Tensor x64 = x.detach().cpu().to(at::kDouble).requires_grad_(true);
  const at::Tensor expected = at::linear(x64, dequantize_nf4(cpu, dtype).to(at::kDouble), bias.cpu().to(at::kDouble));
  expected.backward(grad_y.cpu().to(at::kDouble));
  const double bound = gemv_bound(dtype);
  for (const auto& [name, err] :
       {std::pair<const char*, double>{"y", rel_err(y, expected)}, {"grad_x", rel_err(x.grad(), x64.grad())}}) {
    if (!(err <= bound)) {
      return fmt::format("nf4_linear rows {} {}: {} rel err {:.2e} (bound {:.0e})", rows, c10::toString(dtype), name,
                         err, bound);
    }
  }
  return {};
}

std::string check_nf4_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  at::manual_seed(11);
  const std::vector<Shape> shapes = {{.out_features = 128, .in_features = 64, .blocksize = 64},
                                     {.out_features = 37, .in_features = 23, .blocksize = 64},  // odd count, partial block
                                     {.out_features = 300, .in_features = 256, .blocksize = 64},  // 5 absmax groups
                                     {.out_features = 48, .in_features = 1024, .blocksize = 16},
                                     {.out_features = 33, .in_features = 96, .blocksize = 256}};  // blocks across rows
  for (const Shape& s : shapes) {
    const at::Tensor weight = at::randn({s.out_features, s.in_features}) * 0.05;
    for (bool double_quant : {false, true}) {
      if (std::string e = check_dequantize(weight, s, double_quant); !e.empty()) return e;
      if (std::string e = check_gemv(weight, s, double_quant); !e.empty()) return e;
    }
  }
  // The gemv's element path on a vector-friendly shape: x one element off.
  {
    const Shape s{.out_features = 40, .in_features = 128, .blocksize = 64};
    const Nf4Tensor q = quantize_nf4(at::randn({s.out_features, s.in_features}), s.blocksize).to(at::Device(at::kCUDA, 0));
    const auto cuda = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
    const at::Tensor x = misaligned_copy(at::randn({3, s.in_features}).to(cuda));
    at::Tensor y = poisoned({3, s.out_features}, cuda);
    const kernels::Nf4GemvArgs args{.weight = nf4_weight_ptrs(q, nf4_lookup_tables(x.device())),
                                    .dtype = kernels::ElementDtype::kBFloat16,
                                    .rows = 3,
                                    .x = x.data_ptr(),
                                    .y = y.data_ptr()};
    if (!kernels::cuda_slots().nf4_gemv(args, 0)) return "the gemv kernel refused a misaligned x";
    const at::Tensor expected =
        at::linear(x.cpu().to(at::kDouble), dequantize_nf4(q.to(at::kCPU), at::kBFloat16).to(at::kDouble));
    if (const double err = rel_err(y, expected); !(err <= gemv_bound(at::kBFloat16))) {
      return fmt::format("gemv misaligned x: rel err {:.2e}", err);
    }
  }
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    for (int64_t rows : {3, 40}) {
      if (std::string e = check_autograd(rows, dtype); !e.empty()) return e;
    }
  }
  return {};
}

const bool registered = [] {
  kernels::register_kernel({"nf4", "cuda", check_nf4_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::lora
