#include "colossus/models/attention.h"

#include <ATen/ops/arange.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/softmax.h>
#include <ATen/ops/tanh.h>
#include <c10/core/TensorOptions.h>

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

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const AttentionSpec& spec,
                            double dropout, const at::Tensor& document_mask) {
  const int64_t seq = q.size(2);
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
