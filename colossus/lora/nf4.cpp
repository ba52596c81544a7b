#include "colossus/lora/nf4.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace colossus::lora {

namespace {

// Rounds each value of `scaled` (in [-1, 1]) to the index of the nearest
// code (sorted): bucketize over the midpoints, a tie going to the lower code.
at::Tensor nearest_code(const at::Tensor& scaled, const at::Tensor& code) {
  const at::Tensor bounds = (code.slice(0, 0, -1) + code.slice(0, 1)) / 2;
  return at::bucketize(scaled, bounds, /*out_int32=*/true);
}

// Blockwise absmax scaling of flat fp32 values: ({blocks} absmax, values / absmax clamped to [-1, 1]).
std::pair<at::Tensor, at::Tensor> scale_blocks(const at::Tensor& flat, int64_t blocksize) {
  const int64_t n = flat.numel(), rem = n % blocksize, full = n - rem, blocks = full / blocksize;
  const at::Tensor whole = flat.slice(0, 0, full).view({blocks, blocksize});
  at::Tensor absmax = whole.abs().amax(-1);
  at::Tensor scaled = at::clamp(whole * absmax.clamp_min(1e-38).reciprocal().view({-1, 1}), -1, 1).reshape(-1);
  if (rem) {
    const at::Tensor tail = flat.slice(0, full);
    const at::Tensor tail_max = tail.abs().max().clamp_min(1e-38);
    absmax = at::cat({absmax, tail_max.unsqueeze(0)});
    scaled = at::cat({scaled, at::clamp(tail / tail_max, -1, 1)});
  }
  return {absmax, scaled};
}

// flat codes' values times their block's absmax: (n) fp32.
at::Tensor unscale_blocks(const at::Tensor& values, const at::Tensor& absmax, int64_t blocksize) {
  const int64_t n = values.numel(), rem = n % blocksize, full = n - rem, blocks = full / blocksize;
  const at::Tensor whole = (values.slice(0, 0, full).view({blocks, blocksize}) * absmax.slice(0, 0, blocks).view({-1, 1}))
                               .reshape(-1);
  if (!rem) return whole;
  return at::cat({whole, values.slice(0, full) * absmax[blocks]});
}

at::Tensor code_tensor(const c10::Device& device) {
  const auto& code = nf4_code();
  return at::tensor(std::vector<float>(code.begin(), code.end()), at::TensorOptions().dtype(at::kFloat)).to(device);
}

}  // namespace

const std::array<float, 16>& nf4_code() {
  static const std::array<float, 16> code = {
      -1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f, -0.28444138169288635f,
      -0.18477343022823334f, -0.09105003625154495f, 0.0f, 0.07958029955625534f, 0.16093020141124725f,
      0.24611230194568634f, 0.33791524171829224f, 0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f,
      1.0f};
  return code;
}

at::Tensor dynamic_map() {
  // Signed, 7 exponent bits of 8: for exponent i, 2^i fraction steps between
  // 0.1 and 1 (their midpoints) times 10^(i - 6), both signs; then 0 and 1.
  static const at::Tensor map = [] {
    std::vector<float> data;
    const auto add = [&](int64_t fraction_items, int i) {
      const at::Tensor bounds = at::linspace(0.1, 1, fraction_items, at::TensorOptions().dtype(at::kFloat));
      const at::Tensor means = (bounds.slice(0, 0, -1) + bounds.slice(0, 1)) / 2.0;
      const double scale = std::pow(10.0, -6 + i);
      for (const at::Tensor& t : {means * scale, means * -scale}) {
        const at::Tensor c = t.contiguous();
        data.insert(data.end(), c.data_ptr<float>(), c.data_ptr<float>() + c.numel());
      }
    };
    for (int i = 0; i < 7; ++i) add((int64_t{1} << i) + 1, i);
    data.push_back(0.0f);
    data.push_back(1.0f);
    data.resize(256, 0.0f);
    std::sort(data.begin(), data.end());
    return at::tensor(data, at::TensorOptions().dtype(at::kFloat));
  }();
  return map;
}

at::Tensor nf4_lookup_tables(const c10::Device& device) {
  return at::cat({code_tensor(at::kCPU), dynamic_map()}).to(device);
}

int64_t Nf4Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t Nf4Tensor::bytes() const {
  int64_t total = packed.nbytes() + absmax.nbytes();
  if (absmax_scale.defined()) total += absmax_scale.nbytes();
  return total;
}

Nf4Tensor Nf4Tensor::to(const c10::Device& device) const {
  Nf4Tensor moved = *this;
  moved.packed = packed.to(device);
  moved.absmax = absmax.to(device);
  if (absmax_scale.defined()) moved.absmax_scale = absmax_scale.to(device);
  return moved;
}

Nf4Tensor quantize_nf4(const at::Tensor& weight, int64_t blocksize, bool double_quant) {
  if (blocksize < 16 || blocksize > 4096 || (blocksize & (blocksize - 1)))
    throw ConfigError(fmt::format("NF4 blocksize {} must be a power of two in [16, 4096] (bitsandbytes uses 64)", blocksize));
  if (!at::isFloatingType(weight.scalar_type()) || weight.numel() == 0)
    throw ConfigError(fmt::format("NF4 quantises non-empty floating-point tensors, not {} of {} elements",
                                  c10::toString(weight.scalar_type()), weight.numel()));
  Nf4Tensor q;
  q.shape = weight.sizes().vec();
  q.blocksize = blocksize;
  q.double_quant = double_quant;
  const at::Tensor flat = weight.detach().reshape(-1).to(at::kFloat);
  auto [absmax, scaled] = scale_blocks(flat, blocksize);
  if (scaled.numel() % 2) scaled = at::constant_pad_nd(scaled, {0, 1});
  const at::Tensor codes = nearest_code(scaled, code_tensor(flat.device())).to(at::kByte);
  q.packed = at::bitwise_or(at::bitwise_left_shift(codes.slice(0, 0, c10::nullopt, 2), 4), codes.slice(0, 1, c10::nullopt, 2));
  if (!double_quant) {
    q.absmax = absmax;
    return q;
  }
  q.offset = absmax.mean().item<double>();
  const at::Tensor centred = absmax - absmax.mean();
  auto [scale, centred_scaled] = scale_blocks(centred, 256);
  q.absmax = nearest_code(centred_scaled, dynamic_map().to(flat.device())).to(at::kByte);
  q.absmax_scale = scale;
  return q;
}

at::Tensor dequantize_nf4(const Nf4Tensor& q, c10::ScalarType dtype) {
  const auto device = q.packed.device();
  const at::Tensor codes = at::stack({at::bitwise_right_shift(q.packed, 4), at::bitwise_and(q.packed, 0xF)}, 1)
                               .reshape(-1)
                               .slice(0, 0, q.numel())
                               .to(at::kLong);
  at::Tensor absmax = q.absmax;
  if (q.double_quant) {
    absmax = unscale_blocks(dynamic_map().to(device).index_select(0, q.absmax.to(at::kLong)), q.absmax_scale, 256);
    absmax = absmax + static_cast<float>(q.offset);
  }
  const at::Tensor values = code_tensor(device).index_select(0, codes);
  return unscale_blocks(values, absmax, q.blocksize).view(q.shape).to(dtype);
}

}  // namespace colossus::lora
