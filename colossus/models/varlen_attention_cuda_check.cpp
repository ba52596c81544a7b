// CUDA builds only (in the colossus_cuda bundle): the `colossus check`
// self-test of the varlen flash path that packed and padded rows take in
// training (models/attention.h). On random packed rows (documents of mixed
// lengths, a padding tail, a padded row), bf16 and fp16, grouped kv heads,
// head sizes 64 and 128, with and without a sliding window, the varlen
// kernel's output and its q/k/v gradients at real tokens are compared with the
// dense-mask attention computed in fp32 from the same inputs.
#include "colossus/kernels/registry.h"
#include "colossus/models/attention.h"
#include "colossus/models/token_layout.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <string>
#include <vector>

namespace colossus::models {

namespace {

struct Case {
  int64_t heads, kv_heads, head_dim, window;
  at::ScalarType dtype;
};

std::string check_case(const Case& c) {
  at::manual_seed(17);
  // Row 0 packs documents of 37, 1, 60 and 20 tokens then 10 of padding; row 1
  // is one 90-token document padded at the end (as pad_batch makes).
  const int64_t seq = 128;
  const TokenLayout packed = TokenLayout::packed({{37, 1, 60, 20}, {90}}, seq);
  const TokenLayout layout = packed.to(at::kCUDA);
  const auto options = at::TensorOptions().dtype(c.dtype).device(at::kCUDA);
  at::Tensor q = at::randn({2, c.heads, seq, c.head_dim}, options).requires_grad_(true);
  at::Tensor k = at::randn({2, c.kv_heads, seq, c.head_dim}, options).requires_grad_(true);
  at::Tensor v = at::randn({2, c.kv_heads, seq, c.head_dim}, options).requires_grad_(true);
  const AttentionSpec spec{.scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim)), .window = c.window};
  const VarlenSegments segments = varlen_segments(layout.document_ids);
  const at::Tensor real = layout.document_ids.ge(0).view({2, 1, seq, 1});  // padding outputs are never read
  const at::Tensor weight = at::randn({2, c.heads, seq, c.head_dim}, options.dtype(at::kFloat)) * real;

  const at::Tensor out = varlen_flash_attention(q, k, v, spec, 0.0, segments);
  (out.to(at::kFloat) * weight).sum().backward();
  const at::Tensor gq = q.grad().clone(), gk = k.grad().clone(), gv = v.grad().clone();

  // The reference: the dense mask (documents, causality, window) in fp32.
  at::Tensor q32 = q.detach().to(at::kFloat).requires_grad_(true);
  at::Tensor k32 = k.detach().to(at::kFloat).requires_grad_(true);
  at::Tensor v32 = v.detach().to(at::kFloat).requires_grad_(true);
  at::Tensor mask = layout.attention_mask();
  if (c.window > 0) mask = mask.logical_and(causal_window_mask(seq, seq, 0, c.window, q.device()));
  const at::Tensor expected = masked_attention(q32, k32, v32, mask, spec, 0.0);
  (expected * weight).sum().backward();

  const double tol = c.dtype == at::kBFloat16 ? 3e-2 : 6e-3;
  const auto worst = [&](const at::Tensor& got, const at::Tensor& want, const at::Tensor& keep) {
    const at::Tensor err = (got.to(at::kFloat) - want).abs() * keep;
    return (err / (want.abs().max() + 1e-6)).max().item<double>();
  };
  const at::Tensor real_rows = real.expand({2, 1, seq, 1});
  const double errors[] = {worst(out, expected, real), worst(gq, q32.grad(), real),
                           worst(gk, k32.grad(), real_rows), worst(gv, v32.grad(), real_rows)};
  const char* names[] = {"output", "dq", "dk", "dv"};
  for (int i = 0; i < 4; ++i) {
    if (!(errors[i] <= tol)) {
      return fmt::format("{} {}q/{}kv head_dim {} window {}: {} off by {:.3g} of its largest value (tolerance {})",
                         c.dtype == at::kBFloat16 ? "bf16" : "fp16", c.heads, c.kv_heads, c.head_dim, c.window,
                         names[i], errors[i], tol);
    }
  }
  return {};
}

std::string check_varlen_attention_cuda() {
  if (!at::hasCUDA()) return "no CUDA device";
  std::vector<std::string> failures;
  for (const Case& c : {Case{8, 2, 64, 0, at::kBFloat16}, Case{8, 2, 128, 0, at::kBFloat16},
                        Case{4, 4, 64, 24, at::kBFloat16}, Case{8, 2, 64, 0, at::kHalf}}) {
    try {
      if (auto error = check_case(c); !error.empty()) failures.push_back(error);
    } catch (const std::exception& e) {
      failures.push_back(e.what());
    }
  }
  if (failures.empty()) return {};
  std::string report = fmt::format("{} of 4 cases failed:", failures.size());
  for (const auto& f : failures) report += "\n      " + f;
  return report;
}

[[maybe_unused]] const bool registered = [] {
  kernels::register_kernel({"varlen_flash_attention", "cuda", check_varlen_attention_cuda});
  return true;
}();

}  // namespace

}  // namespace colossus::models
