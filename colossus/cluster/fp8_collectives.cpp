#include "colossus/cluster/fp8_collectives.h"

#include "colossus/core/errors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <atomic>

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

std::atomic<int64_t> g_fp8_bytes{0}, g_plain_bytes{0};

void count_wire_bytes(int64_t chunk_numel, int64_t ranks, int64_t plain_element_bytes) {
  g_fp8_bytes += fp8_shard_collective_wire_bytes(chunk_numel, ranks);
  g_plain_bytes += ring_shard_collective_wire_bytes(chunk_numel, ranks, plain_element_bytes);
}

void check_floating(const at::Tensor& tensor, const char* what) {
  if (!at::isFloatingType(tensor.scalar_type()) || !tensor.is_contiguous()) {
    throw ConfigError(fmt::format("{}: the tensor must be floating and contiguous, not {}", what,
                                  c10::toString(tensor.scalar_type())));
  }
}

// As reduce_scatter_fp8, its bytes counted against a plain reduce-scatter in
// plain_element_bytes an element (all_reduce_fp8 runs it on an fp32 copy).
void reduce_scatter_counted(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input, ReduceOp op,
                            int64_t plain_element_bytes) {
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
  count_wire_bytes(chunk, ranks, plain_element_bytes);
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

void all_gather_counted(ProcessGroup& group, const at::Tensor& output_flat, const at::Tensor& input,
                        int64_t plain_element_bytes) {
  check_floating(input, "all_gather_fp8");
  check_floating(output_flat, "all_gather_fp8");
  const int64_t ranks = group.size(), chunk = input.numel();
  if (output_flat.numel() != ranks * chunk) {
    throw ConfigError(fmt::format("all_gather_fp8: output has {} elements, expected {} ranks x {}",
                                  output_flat.numel(), ranks, chunk));
  }
  if (chunk == 0) return;
  count_wire_bytes(chunk, ranks, plain_element_bytes);
  auto [q, scale] = quantize(input.reshape({-1}).to(at::kFloat));
  at::Tensor gathered = at::empty({ranks * chunk}, q.options());
  group.all_gather_into(gathered, q).wait();
  at::Tensor scales = at::empty({ranks}, scale.options());
  group.all_gather_into(scales, scale).wait();
  output_flat.view({-1}).copy_(dequantize(gathered.view({ranks, chunk}), scales.view({ranks, 1})).view({-1}));
}

}  // namespace

void reduce_scatter_fp8(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input, ReduceOp op) {
  reduce_scatter_counted(group, output, input, op, static_cast<int64_t>(input.element_size()));
}

void all_gather_fp8(ProcessGroup& group, const at::Tensor& output_flat, const at::Tensor& input) {
  all_gather_counted(group, output_flat, input, static_cast<int64_t>(output_flat.element_size()));
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
  // Counted against a ring all-reduce in the tensor's dtype: a reduce-scatter
  // and an all-gather of the chunks.
  const auto element_bytes = static_cast<int64_t>(tensor.element_size());
  reduce_scatter_counted(group, reduced, padded, op, element_bytes);
  all_gather_counted(group, padded, reduced, element_bytes);
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

int64_t fp8_shard_collective_wire_bytes(int64_t chunk_numel, int64_t ranks) {
  if (ranks <= 1) return 0;
  return (ranks - 1) * (chunk_numel + 4);  // one byte an element, one fp32 scale
}

int64_t ring_shard_collective_wire_bytes(int64_t chunk_numel, int64_t ranks, int64_t element_bytes) {
  if (ranks <= 1) return 0;
  return (ranks - 1) * chunk_numel * element_bytes;
}

Fp8WireBytes fp8_wire_bytes_sent() { return {.fp8 = g_fp8_bytes.load(), .plain = g_plain_bytes.load()}; }

}  // namespace colossus::cluster
