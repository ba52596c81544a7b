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

namespace {

void check_floating(const at::Tensor& tensor, const char* what) {
  if (!at::isFloatingType(tensor.scalar_type()) || !tensor.is_contiguous()) {
    throw ConfigError(fmt::format("{}: the tensor must be floating and contiguous, not {}", what,
                                  c10::toString(tensor.scalar_type())));
  }
}

}  // namespace

void reduce_scatter_fp8(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  check_floating(input, "reduce_scatter_fp8");
  check_floating(output, "reduce_scatter_fp8");
  if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
    throw ConfigError("reduce_scatter_fp8 sums or averages; other reductions have no fp8 form");
  }
  const int64_t ranks = group.size(), chunk = output.numel();
  if (input.numel() != ranks * chunk) {
    throw ConfigError(fmt::format("reduce_scatter_fp8: input has {} elements, expected {} ranks x {}", input.numel(),
                                  ranks, chunk));
  }
  if (chunk == 0) return;
  auto [q, scale] = quantize(input.reshape({-1}).to(at::kFloat));
  // Chunk r of every rank's bytes to rank r; every rank's scale to all.
  at::Tensor received = at::empty_like(q);
  group.all_to_all(received, q).wait();
  at::Tensor scales = at::empty({ranks}, scale.options());
  group.all_gather_into(scales, scale).wait();
  // Row j: rank j's contribution to this rank's chunk, with rank j's scale.
  at::Tensor reduced = dequantize(received.view({ranks, chunk}), scales.view({ranks, 1})).sum(0);
  if (op == ReduceOp::Avg) reduced.div_(static_cast<double>(ranks));
  output.view({-1}).copy_(reduced);
}

void all_gather_fp8(ProcessGroup& group, const at::Tensor& output_flat, const at::Tensor& input) {
  check_floating(input, "all_gather_fp8");
  check_floating(output_flat, "all_gather_fp8");
  const int64_t ranks = group.size(), chunk = input.numel();
  if (output_flat.numel() != ranks * chunk) {
    throw ConfigError(fmt::format("all_gather_fp8: output has {} elements, expected {} ranks x {}",
                                  output_flat.numel(), ranks, chunk));
  }
  if (chunk == 0) return;
  auto [q, scale] = quantize(input.reshape({-1}).to(at::kFloat));
  at::Tensor gathered = at::empty({ranks * chunk}, q.options());
  group.all_gather_into(gathered, q).wait();
  at::Tensor scales = at::empty({ranks}, scale.options());
  group.all_gather_into(scales, scale).wait();
  output_flat.view({-1}).copy_(dequantize(gathered.view({ranks, chunk}), scales.view({ranks, 1})).view({-1}));
}

void all_reduce_fp8(ProcessGroup& group, const at::Tensor& tensor, ReduceOp op) {
  check_floating(tensor, "all_reduce_fp8");
  if (op != ReduceOp::Sum && op != ReduceOp::Avg) {
    throw ConfigError("all_reduce_fp8 sums or averages; other reductions have no fp8 form");
  }
  const int64_t ranks = group.size(), n = tensor.numel();
  if (n == 0) return;
  at::Tensor flat = tensor.view({-1});
  // Padded to whole chunks; then each rank reduces its chunk and the reduced
  // chunks go back to everyone (requantized with their own scales). One rank
  // rounds twice too, so its numerics match many ranks'.
  const int64_t chunk = (n + ranks - 1) / ranks;
  at::Tensor padded = at::zeros({chunk * ranks}, flat.options().dtype(at::kFloat));
  padded.narrow(0, 0, n).copy_(flat);
  at::Tensor reduced = at::empty({chunk}, padded.options());
  reduce_scatter_fp8(group, reduced, padded, op);
  all_gather_fp8(group, padded, reduced);
  flat.copy_(padded.narrow(0, 0, n));
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
