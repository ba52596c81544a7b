// Collectives with FP8 on the wire (Colossal-AI's fp8_communication): a
// tensor is scaled by its absolute maximum into float8 e4m3 (448 at most,
// 3 mantissa bits) and sent as bytes; each rank dequantizes what it receives
// and reduces in fp32. An all-reduce is an all-to-all of the quantized
// chunks (every rank reduces its chunk, each sender's scale applied), then an
// all-gather of the reduced chunks, requantized with their own scales: about
// 2 bytes per element on the wire against 4 for a bf16 ring all-reduce.
// Every rank ends with the same values. Blocking. Each call adds what this
// rank sent to a process-wide tally (fp8_wire_bytes_sent), beside what the
// plain collective of the same tensors would have sent.
#pragma once
#include "colossus/cluster/process_group.h"

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace colossus::cluster {

// tensor (floating, any shape, contiguous) reduced in place: Sum, or Avg.
void all_reduce_fp8(ProcessGroup& group, const at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);

// As ProcessGroup::reduce_scatter with the input in FP8 on the wire: input
// (size() * N elements), output (N) = this rank's chunk reduced (Sum or Avg)
// in fp32, written in output's dtype.
void reduce_scatter_fp8(ProcessGroup& group, const at::Tensor& output, const at::Tensor& input,
                        ReduceOp op = ReduceOp::Sum);

// As ProcessGroup::all_gather_into with each rank's input in FP8 on the wire
// (its own scale): every rank, this one included, gets the dequantized chunks.
void all_gather_fp8(ProcessGroup& group, const at::Tensor& output_flat, const at::Tensor& input);

// Bytes one rank sends for all_reduce_fp8 of `numel` elements over `ranks`
// ranks (the fp8 chunks and the scales), and for a ring all-reduce of the
// same tensor in `element_bytes` per element: 2 (n/r)(r-1) x element_bytes.
int64_t fp8_all_reduce_wire_bytes(int64_t numel, int64_t ranks);
int64_t ring_all_reduce_wire_bytes(int64_t numel, int64_t ranks, int64_t element_bytes);

// Bytes one rank sends for reduce_scatter_fp8 / all_gather_fp8 with
// `chunk_numel` elements a rank (its fp8 chunks to the other ranks and its
// scale), and for the plain ring collective in `element_bytes` per element:
// (ranks - 1) x chunk_numel x element_bytes.
int64_t fp8_shard_collective_wire_bytes(int64_t chunk_numel, int64_t ranks);
int64_t ring_shard_collective_wire_bytes(int64_t chunk_numel, int64_t ranks, int64_t element_bytes);

// What this process's fp8 collectives sent since it started: `fp8` the bytes
// on the wire, `plain` what the same collectives in the tensors' own dtype
// (reduce-scatter: the input's; all-gather: the output's; all-reduce: the
// tensor's) would have sent. A running tally, like a metrics counter: take
// the difference over a step for bytes a step.
struct Fp8WireBytes {
  int64_t fp8 = 0;
  int64_t plain = 0;
};
Fp8WireBytes fp8_wire_bytes_sent();

}  // namespace colossus::cluster
