#include "colossus/cluster/fp8_collectives.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace colossus::cluster {

namespace {

constexpr double kE4m3Max = 448.0;

// x / scale in e4m3 as bytes, and the scale (a 1-element fp32 tensor): the
// absolute maximum maps to 448; an all-zero x keeps scale 1.
std::pair<at::Tensor, at::Tensor> quantize(const at::Tensor& x) {
  at::Tensor amax = x.abs().max().reshape({1});
  at::Tensor scale = at::where(amax > 0, amax / kE4m3Max, at::ones_like(amax));
  at::Tensor q = (x / scale).to(at::kFloat8_e4m3fn).view(at::kByte);
  return {q, scale};
}

at::Tensor dequantize(const at::Tensor& bytes, const at::Tensor& scale) {
  return bytes.view(at::kFloat8_e4m3fn).to(at::kFloat) * scale;
}


}  // namespace

void all_reduce_fp8(ProcessGroup& group, const at::Tensor& tensor, ReduceOp op) {
  if (!at::isFloatingType(tensor.scalar_type()) || !tensor.is_contiguous()) {
    throw ConfigError(fmt::format("all_reduce_fp8: the tensor must be floating and contiguous, not {}",
                                  c10::toString(tensor.scalar_type())));
  }
  if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
    throw ConfigError("all_reduce_fp8 sums or averages; other reductions have no fp8 form");
  }
  const int64_t ranks = group.size(), n = tensor.numel();
  if (n == 0) return;
  at::Tensor flat = tensor.view({-1});
  if (ranks == 1) {
    // The same rounding a peer's contribution gets, so one rank's numerics match many.
    auto [q, scale] = quantize(flat.to(at::kFloat));
    flat.copy_(dequantize(q, scale));
    return;
  }
  const int64_t chunk = (n + ranks - 1) / ranks;
  at::Tensor padded = at::zeros({chunk * ranks}, flat.options().dtype(at::kFloat));
  padded.narrow(0, 0, n).copy_(flat);
  auto [q, scale] = quantize(padded);
  // Chunk r of every rank's bytes to rank r; every rank's scale to all.
  at::Tensor received = at::empty_like(q);
  group.all_to_all(received, q).wait();
  at::Tensor scales = at::empty({ranks}, scale.options());
  group.all_gather_into(scales, scale).wait();
  // Row j: rank j's contribution to this rank's chunk, with rank j's scale.
  at::Tensor parts = dequantize(received.view({ranks, chunk}), scales.view({ranks, 1}));
  at::Tensor reduced = parts.sum(0);
  if (op == ReduceOp::Avg) reduced.div_(static_cast<double>(ranks));
  // The reduced chunks back to everyone, requantized with their own scales.
  auto [q2, scale2] = quantize(reduced);
  at::Tensor gathered = at::empty({chunk * ranks}, q2.options());
  group.all_gather_into(gathered, q2).wait();
  at::Tensor scales2 = at::empty({ranks}, scale2.options());
  group.all_gather_into(scales2, scale2).wait();
  at::Tensor result = dequantize(gathered.view({ranks, chunk}), scales2.view({ranks, 1}));
  flat.copy_(result.view({-1}).narrow(0, 0, n));
}

int64_t fp8_all_reduce_wire_bytes(int64_t numel, int64_t ranks) {
  if (ranks <= 1) return 0;
  const int64_t chunk = (numel + ranks - 1) / ranks;
  // all-to-all and all-gather: (ranks - 1) chunks of bytes each; 2 x (ranks - 1) fp32 scales.
  return 2 * chunk * (ranks - 1) + 2 * 4 * (ranks - 1);
}

int64_t ring_all_reduce_wire_bytes(int64_t numel, int64_t ranks, int64_t element_bytes) {
  if (ranks <= 1) return 0;
  return 2 * ((numel + ranks - 1) / ranks) * (ranks - 1) * element_bytes;
}

}  // namespace colossus::cluster
