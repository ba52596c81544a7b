#include "colossus/models/attention.h"

#include "colossus/core/errors.h"

#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <c10/core/TensorOptions.h>

#include <atomic>
#include <limits>

namespace colossus::models {

at::Tensor causal_window_mask(int64_t q_len, int64_t k_len, int64_t first_query_position, int64_t window,
                              const at::Device& device) {
  const auto longs = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor query_pos = at::arange(first_query_position, first_query_position + q_len, longs).unsqueeze(1);
  const at::Tensor key_pos = at::arange(k_len, longs).unsqueeze(0);
  at::Tensor mask = key_pos.le(query_pos);
  if (window > 0) mask = mask.logical_and(key_pos.gt(query_pos - window));
  return mask;
}

VarlenSegments varlen_segments(const at::Tensor& document_ids) {
  if (document_ids.dim() != 2 || document_ids.size(1) < 1) {
    throw ConfigError("varlen_segments: document_ids must be (B, T) with T >= 1");
  }
  const int64_t rows = document_ids.size(0), seq = document_ids.size(1);
  // A segment starts at every row's first token and wherever the document changes.
  at::Tensor starts = at::ones({rows, seq}, document_ids.options().dtype(at::kBool));
  if (seq > 1) starts.narrow(1, 1, seq - 1).copy_(document_ids.narrow(1, 1, seq - 1).ne(document_ids.narrow(1, 0, seq - 1)));
  const at::Tensor begin = starts.reshape({-1}).nonzero().reshape({-1});
  VarlenSegments segments;
  segments.cu_seqlens =
      at::cat({begin, at::tensor({rows * seq}, begin.options())}).to(at::kInt);
  const at::Tensor lengths = segments.cu_seqlens.narrow(0, 1, begin.size(0)) - segments.cu_seqlens.narrow(0, 0, begin.size(0));
  segments.max_seqlen = lengths.max().item<int64_t>();
  return segments;
}

bool varlen_flash_applies(const at::Tensor& q, const AttentionSpec& spec) {
  const int64_t head_dim = q.size(-1);
  return q.is_cuda() && (q.scalar_type() == at::kHalf || q.scalar_type() == at::kBFloat16) && head_dim % 8 == 0 &&
         head_dim <= 256 && spec.softcap == 0.0;
}

at::Tensor varlen_flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const AttentionSpec& spec, double dropout, const VarlenSegments& segments) {
  const int64_t batch = q.size(0), heads = q.size(1), seq = q.size(2), head_dim = q.size(3);
  // (B, H, T, D) -> (B*T, H, D): the flattened tokens the segments index.
  const auto tokens = [&](const at::Tensor& x) { return x.transpose(1, 2).reshape({batch * seq, x.size(1), head_dim}); };
  std::optional<int64_t> window_left;
  if (spec.window > 0) window_left = spec.window - 1;  // keys (p - window, p]
  auto out = std::get<0>(at::_flash_attention_forward(tokens(q), tokens(k), tokens(v), segments.cu_seqlens,
                                                      segments.cu_seqlens, segments.max_seqlen, segments.max_seqlen,
                                                      dropout, /*is_causal=*/true, /*return_debug_mask=*/false,
                                                      spec.scale, window_left, /*window_size_right=*/std::nullopt));
  return out.reshape({batch, seq, heads, head_dim}).transpose(1, 2);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionSpec& spec,
                            double dropout, const at::Tensor& document_mask, const VarlenSegments& segments) {
  const int64_t seq = q.size(2);
  // A GPU or build without the flash kernel fails the first call: the dense
  // mask serves from then on.
  static std::atomic<bool> varlen_unavailable{false};
  if (segments.defined() && varlen_flash_applies(q, spec) && !varlen_unavailable.load()) {
    try {
      return varlen_flash_attention(q, k, v, spec, dropout, segments);
    } catch (const c10::Error&) {
      if (!document_mask.defined()) throw;
      varlen_unavailable.store(true);
    }
  }
  if (document_mask.defined()) {
    const at::Tensor mask = spec.window > 0 && seq > spec.window
                                ? document_mask.logical_and(causal_window_mask(seq, k.size(2), 0, spec.window, q.device()))
                                : document_mask;
    return masked_attention(q, k, v, mask, spec, dropout);
  }
  if (spec.plain_causal_for(seq)) {
    return at::scaled_dot_product_attention(q, k, v, {}, dropout, /*is_causal=*/true, spec.scale,
                                            /*enable_gqa=*/q.size(1) != k.size(1));
  }
  return masked_attention(q, k, v, causal_window_mask(seq, k.size(2), 0, spec.window, q.device()), spec, dropout);
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& mask,
                            const AttentionSpec& spec, double dropout) {
  const int64_t heads = q.size(1), kv_heads = k.size(1);
  // The fused kernels that take a mask do not all take grouped heads: repeat them.
  const at::Tensor keys = heads != kv_heads ? k.repeat_interleave(heads / kv_heads, 1) : k;
  const at::Tensor values = heads != kv_heads ? v.repeat_interleave(heads / kv_heads, 1) : v;
  if (spec.softcap == 0.0) {
    return at::scaled_dot_product_attention(q, keys, values, mask, dropout, /*is_causal=*/false, spec.scale);
  }
  at::Tensor scores = at::matmul(q, keys.transpose(-2, -1)).to(at::kFloat) * spec.scale;
  scores = at::tanh(scores / spec.softcap) * spec.softcap;
  scores = scores.masked_fill(mask.logical_not(), -std::numeric_limits<float>::infinity());
  at::Tensor probs = at::softmax(scores, -1).to(q.scalar_type());
  if (dropout > 0.0) probs = at::dropout(probs, dropout, /*train=*/true);
  return at::matmul(probs, values);
}

}  // namespace colossus::models
