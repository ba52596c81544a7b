// Connects the CUDA MoE dispatch kernels (moe_permute.h) to the models layer
// (cuda_slots.h) and registers their self-test for `colossus check`: random
// routing (some experts empty), dropless and with a capacity, fp32 and bf16,
// aligned and unaligned widths, against the ATen reference on the host (stable
// sort by expert, index_select, weighted index_add in fp64, row dots);
// outputs are poisoned first, so a kernel that writes nothing cannot pass.
#include "colossus/kernels/cuda_slots.h"
#include "colossus/kernels/moe_permute.h"
#include "colossus/kernels/registry.h"

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <fmt/format.h>

#include <algorithm>

namespace colossus::kernels {

namespace {

void* stream_of(int device_index) { return at::cuda::getCurrentCUDAStream(device_index).stream(); }

bool cuda_moe_sort(const MoeSortArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return moe_sort_cuda(args, stream_of(device_index));
}
bool cuda_moe_permute(const MoePermuteArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return moe_permute_cuda(args, stream_of(device_index));
}
bool cuda_moe_unpermute(const MoeUnpermuteArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return moe_unpermute_cuda(args, stream_of(device_index));
}
bool cuda_moe_row_dot(const MoeRowDotArgs& args, int device_index) {
  c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device_index));
  return moe_row_dot_cuda(args, stream_of(device_index));
}

double rel_err(const at::Tensor& out, const at::Tensor& ref) {
  return (out.to(at::kDouble).cpu() - ref).norm().item<double>() / std::max(ref.norm().item<double>(), 1e-30);
}

MoeRowsDtype rows_dtype(at::ScalarType t) {
  return t == at::kFloat ? MoeRowsDtype::kFloat32 : t == at::kHalf ? MoeRowsDtype::kFloat16 : MoeRowsDtype::kBFloat16;
}

// One configuration; empty when the kernels match the reference.
std::string check_case(int64_t tokens, int64_t k, int64_t experts, int64_t width, int64_t capacity,
                       at::ScalarType dtype) {
  const auto cuda = at::TensorOptions().device(at::kCUDA, 0);
  const auto label = fmt::format("N={} k={} E={} H={} cap={} {}", tokens, k, experts, width, capacity,
                                 c10::toString(dtype));
  // Expert ids that skip the last expert (an empty segment); distinct per token.
  at::Tensor ids = std::get<1>(at::topk(at::rand({tokens, experts - 1}), k, -1)).contiguous();
  at::Tensor flat = ids.reshape(-1);
  // Host reference: stable sort by expert, then the capacity in token order.
  at::Tensor order = std::get<1>(at::sort(flat, /*stable=*/true, 0, false));
  at::Tensor total = at::bincount(flat, {}, experts);
  std::vector<int64_t> kept_rows;
  std::vector<int64_t> counts(static_cast<size_t>(experts), 0), position(static_cast<size_t>(experts), 0);
  for (int64_t i = 0; i < order.size(0); ++i) {
    const int64_t a = order[i].item<int64_t>(), e = flat[a].item<int64_t>();
    if (capacity < 0 || position[e] < capacity) {
      kept_rows.push_back(a);
      ++counts[e];
    }
    ++position[e];
  }
  const int64_t rows = static_cast<int64_t>(kept_rows.size());
  at::Tensor ref_assignment = at::tensor(kept_rows, at::kLong);
  at::Tensor ref_token = at::div(ref_assignment, k, "floor");

  const auto long_cuda = cuda.dtype(at::kLong);
  at::Tensor d_experts = flat.to(cuda);
  at::Tensor d_total = at::full({experts}, -7, long_cuda), d_counts = at::full({experts}, -7, long_cuda);
  at::Tensor d_token = at::full({tokens * k}, -7, long_cuda), d_assignment = at::full({tokens * k}, -7, long_cuda);
  at::Tensor d_row_of = at::full({tokens * k}, -1, long_cuda);
  const MoeSortArgs sort{.experts = d_experts.data_ptr<int64_t>(),
                         .tokens = tokens,
                         .top_k = k,
                         .num_experts = experts,
                         .capacity = capacity,
                         .total_counts = d_total.data_ptr<int64_t>(),
                         .counts = d_counts.data_ptr<int64_t>(),
                         .token_index = d_token.data_ptr<int64_t>(),
                         .row_assignment = d_assignment.data_ptr<int64_t>(),
                         .row_of = d_row_of.data_ptr<int64_t>()};
  if (!cuda_moe_sort(sort, 0)) return label + ": the sort kernel refused its arguments";
  if (!at::equal(d_total.cpu(), total)) return label + ": total counts differ";
  if (!at::equal(d_counts.cpu(), at::tensor(counts, at::kLong))) return label + ": kept counts differ";
  if (!at::equal(d_token.narrow(0, 0, rows).cpu(), ref_token)) return label + ": token order differs";
  if (!at::equal(d_assignment.narrow(0, 0, rows).cpu(), ref_assignment)) return label + ": assignments differ";
  at::Tensor row_of = d_row_of.cpu();
  for (int64_t r = 0; r < rows; ++r) {
    if (row_of[kept_rows[static_cast<size_t>(r)]].item<int64_t>() != r) return label + ": row_of differs";
  }

  // Permute, unpermute (combine) and the row dots against fp64 on the same rounded inputs.
  at::Tensor x = at::randn({tokens, width}).to(dtype).to(cuda);
  at::Tensor weight = at::rand({rows}).to(cuda);
  at::Tensor permuted = at::full({rows, width}, NAN, x.options());
  const MoePermuteArgs gather{.in = x.data_ptr(),
                              .out = permuted.data_ptr(),
                              .dtype = rows_dtype(dtype),
                              .rows = rows,
                              .width = width,
                              .source = d_token.data_ptr<int64_t>(),
                              .scale = weight.data_ptr<float>()};
  if (!cuda_moe_permute(gather, 0)) return label + ": the permute kernel refused its arguments";
  const at::Tensor x64 = x.cpu().to(at::kDouble), w64 = weight.cpu().to(at::kDouble);
  const at::Tensor ref_permuted = x64.index_select(0, ref_token) * w64.unsqueeze(1);
  // One rounding of a product in fp32 (then to bf16: 2^-9 relative).
  const double bound = dtype == at::kFloat ? 1e-6 : 4e-3;
  if (const double err = rel_err(permuted, ref_permuted); !(err <= bound)) {
    return fmt::format("{}: permute rel err {:.2e} (bound {:.0e})", label, err, bound);
  }
  at::Tensor y = at::randn({rows, width}).to(dtype).to(cuda);
  at::Tensor combined = at::full({tokens, width}, NAN, y.options());
  const MoeUnpermuteArgs scatter{.in = y.data_ptr(),
                                 .out = combined.data_ptr(),
                                 .dtype = rows_dtype(dtype),
                                 .tokens = tokens,
                                 .top_k = k,
                                 .width = width,
                                 .row_of = d_row_of.data_ptr<int64_t>(),
                                 .row_weight = weight.data_ptr<float>()};
  if (!cuda_moe_unpermute(scatter, 0)) return label + ": the unpermute kernel refused its arguments";
  const at::Tensor y64 = y.cpu().to(at::kDouble);
  const at::Tensor ref_combined =
      at::zeros({tokens, width}, y64.options()).index_add(0, ref_token, y64 * w64.unsqueeze(1));
  if (const double err = rel_err(combined, ref_combined); !(err <= bound)) {
    return fmt::format("{}: unpermute rel err {:.2e} (bound {:.0e})", label, err, bound);
  }
  at::Tensor dots = at::full({rows}, NAN, cuda.dtype(at::kFloat));
  const MoeRowDotArgs dot{.grad_out = combined.data_ptr(),
                          .rows_in = y.data_ptr(),
                          .dtype = rows_dtype(dtype),
                          .rows = rows,
                          .width = width,
                          .token_index = d_token.data_ptr<int64_t>(),
                          .grad_weight = dots.data_ptr<float>()};
  if (!cuda_moe_row_dot(dot, 0)) return label + ": the row-dot kernel refused its arguments";
  const at::Tensor ref_dots = (combined.cpu().to(at::kDouble).index_select(0, ref_token) * y64).sum(1);
  if (const double err = rel_err(dots, ref_dots); !(err <= 1e-5)) {
    return fmt::format("{}: row dot rel err {:.2e} (bound 1e-5)", label, err);
  }
  return {};
}

std::string check_moe_permute_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    // Widths: 16-byte vectors (64) and the scalar path (70); capacity: none, tight.
    for (const auto& [width, capacity] : std::vector<std::pair<int64_t, int64_t>>{{64, -1}, {70, -1}, {64, 40}}) {
      if (std::string error = check_case(333, 2, 8, width, capacity, dtype); !error.empty()) return error;
    }
  }
  return check_case(1000, 1, 5, 128, -1, at::kFloat);
}

const bool registered = [] {
  cuda_slots().moe_sort = cuda_moe_sort;
  cuda_slots().moe_permute = cuda_moe_permute;
  cuda_slots().moe_unpermute = cuda_moe_unpermute;
  cuda_slots().moe_row_dot = cuda_moe_row_dot;
  register_kernel({"moe_permute", "cuda", check_moe_permute_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::kernels
