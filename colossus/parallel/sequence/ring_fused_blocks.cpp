// Ring attention's fused block kernels: one SDPA kernel per block that also
// returns the log-sum-exp, so blocks merge online exactly as the matmul path
// does, at the kernel's speed and without materialising the (Lq, Lk) scores.
// The backward of a block is the kernel's own backward given the row's final
// output and log-sum-exp: it recomputes P = exp(S - lse) with the global lse
// and takes rowsum(dO * O) from the global O, which is exactly this block's
// share of the softmax gradient. On CUDA the kernel is cuDNN's where it takes
// the block, else flash attention: one SDPA call over a whole sequence takes
// cuDNN's kernel on Hopper, and with flash's blocks the ring ran at 1.94-2.64x
// that call at 32K-64K tokens on an H100 (forward + backward) against
// 1.19-1.78x with cuDNN's (equal heads; GQA blocks expand k and v to take it).
#include "colossus/parallel/sequence/ring_blocks.h"

#include <ATen/Context.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention.h>
#include <ATen/ops/_scaled_dot_product_cudnn_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_backward.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/empty.h>

namespace colossus::parallel::sequence::blocks {

bool fused_block_supported(const at::Tensor &q) {
  if (q.is_cpu()) return true;
  // The CUDA flash kernel: half/bfloat16, head sizes up to 256 in steps of 8.
  const auto t = q.scalar_type();
  return q.is_cuda() && (t == at::kHalf || t == at::kBFloat16) && q.size(3) % 8 == 0 && q.size(3) <= 256;
}

bool cudnn_block_supported(const at::Tensor &q, const at::Tensor &k) {
  // What SDPA itself checks before it takes cuDNN's kernel, as far as it
  // matters here: not in deterministic mode (its backward is not), not
  // switched off, more than one key, batch and heads within its grid. (It
  // needs sm80+, as flash's kernel does.)
  const auto t = q.scalar_type();
  const auto &context = at::globalContext();
  return q.is_cuda() && (t == at::kHalf || t == at::kBFloat16) && q.size(1) % k.size(1) == 0 && q.size(3) % 8 == 0 &&
         q.size(3) <= 128 && k.size(2) > 1 && q.size(0) <= 65535 && q.size(1) <= 65535 &&
         !context.deterministicAlgorithms() && context.userEnabledCuDNNSDP();
}

namespace {

// GQA on cuDNN's kernel, which wants as many kv heads as query heads: the
// block's k and v repeated to q's heads (a copy of Lk rows, small beside the
// Lq x Lk attention), their gradients summed back over each group in fp32.
int64_t kv_groups(const at::Tensor &q, const at::Tensor &k) { return q.size(1) / k.size(1); }

at::Tensor sum_groups_fp32(const at::Tensor &x, int64_t groups) {
  if (groups == 1) return x;
  const auto b = x.size(0), h = x.size(1), l = x.size(2), d = x.size(3);
  return x.view({b, h / groups, groups, l, d}).sum(2, /*keepdim=*/false, at::kFloat);
}

}  // namespace

std::pair<at::Tensor, at::Tensor> fused_block_forward(const at::Tensor &q, const at::Tensor &k, const at::Tensor &v,
                                                      bool causal, double scale) {
  if (cudnn_block_supported(q, k)) {
    const int64_t groups = kv_groups(q, k);
    // Its log-sum-exp is (B, H, Lq, 1) in fp32 (natural log, like flash's).
    auto result = at::_scaled_dot_product_cudnn_attention(q, expand_kv(k, groups), expand_kv(v, groups), std::nullopt,
                                                          /*compute_log_sumexp=*/true, 0.0, causal, false, scale);
    at::Tensor lse = std::get<1>(result);
    if (lse.dim() == 4) lse = lse.squeeze(-1);
    TORCH_CHECK(lse.dim() == 3 && lse.size(0) == q.size(0) && lse.size(1) == q.size(1) && lse.size(2) == q.size(2),
                "ring attention: cuDNN's log-sum-exp has shape ", lse.sizes(), ", expected (B, H, Lq) = (", q.size(0),
                ", ", q.size(1), ", ", q.size(2), ")");
    return {std::get<0>(result), lse};
  }
  if (q.is_cpu()) {
    auto [out, lse] = at::_scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal, {}, scale);
    return {out, lse};
  }
  // Both kernels here take GQA (fewer kv heads) natively.
  auto result = at::_scaled_dot_product_flash_attention(q, k, v, 0.0, causal, false, scale);
  return {std::get<0>(result), std::get<1>(result).narrow(2, 0, q.size(2))};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fused_block_backward(const at::Tensor &dout, const at::Tensor &q,
                                                                    const at::Tensor &k, const at::Tensor &v,
                                                                    const at::Tensor &out, const at::Tensor &lse,
                                                                    bool causal, double scale) {
  if (cudnn_block_supported(q, k)) {
    // The kernel takes dO in O's layout and the log-sum-exp as its forward
    // returned it, (B, H, Lq, 1).
    const at::Tensor placeholder = at::zeros({}, q.options().dtype(at::kLong));  // unused without dropout, but on q's device
    const at::Tensor o = out.contiguous();
    const int64_t groups = kv_groups(q, k);
    auto [dq, dk, dv] = at::_scaled_dot_product_cudnn_attention_backward(
        dout.contiguous(), q, expand_kv(k, groups), expand_kv(v, groups), o,
        lse.to(at::kFloat).contiguous().unsqueeze(-1), placeholder, placeholder, at::Tensor(), at::Tensor(),
        at::Tensor(), q.size(2), k.size(2), 0.0, causal, scale);
    return {dq, sum_groups_fp32(dk, groups), sum_groups_fp32(dv, groups)};
  }
  if (q.is_cpu()) {
    return at::_scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse.contiguous(), 0.0, causal, {}, scale);
  }
  // Without dropout the kernel reads no random state; the forward's would be
  // these placeholders too.
  const at::Tensor philox_seed = at::empty({}, at::kLong), philox_offset = at::empty({}, at::kLong);
  return at::_scaled_dot_product_flash_attention_backward(dout, q, k, v, out, lse.to(at::kFloat).contiguous(),
                                                          at::Tensor(), at::Tensor(), q.size(2), k.size(2), 0.0,
                                                          causal, philox_seed, philox_offset, scale);
}

}  // namespace colossus::parallel::sequence::blocks
