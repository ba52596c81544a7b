// QLoRA's 4-bit NormalFloat (NF4) weights, stored as bitsandbytes stores
// them: blocks of 64 values scaled by their absmax and rounded to the nearest
// of 16 normal-quantile codes, two codes a byte (the first in the high
// nibble); with double quantisation the blocks' absmaxes are themselves
// stored as 8-bit codes of bitsandbytes' dynamic map (minus their mean, in
// blocks of 256 with an fp32 scale each). About 0.52 bytes a weight. ATen ops
// only, so the same code runs on CPU and CUDA.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <array>
#include <cstdint>
#include <vector>

namespace colossus::lora {

// The NF4 code book as published with QLoRA (Dettmers et al. 2023, appendix E).
const std::array<float, 16>& nf4_code();
// bitsandbytes' signed 8-bit dynamic map (create_dynamic_map), 256 sorted values.
at::Tensor dynamic_map();
// The two tables a kernel looks codes up in, one fp32 tensor on `device`:
// (272) = nf4_code() (16) then dynamic_map() (256). Callers keep it per device:
// making it is a host-to-device copy.
at::Tensor nf4_lookup_tables(const c10::Device& device);

struct Nf4Tensor {
  at::Tensor packed;        // (ceil(numel / 2)) uint8
  at::Tensor absmax;        // (blocks): fp32, or uint8 codes of absmax - offset with double_quant
  at::Tensor absmax_scale;  // double_quant: (ceil(blocks / 256)) fp32 absmax of each group of 256 absmaxes
  double offset = 0.0;      // double_quant: the mean of the block absmaxes
  std::vector<int64_t> shape;
  int64_t blocksize = 64;
  bool double_quant = true;
  int64_t numel() const;
  int64_t bytes() const;  // of the stored tensors
  Nf4Tensor to(const c10::Device& device) const;
};

// weight: any shape, any floating dtype (quantised from its fp32 values).
Nf4Tensor quantize_nf4(const at::Tensor& weight, int64_t blocksize = 64, bool double_quant = true);
// -> `shape` in `dtype` (the products in fp32, then cast: bitsandbytes' order).
at::Tensor dequantize_nf4(const Nf4Tensor& q, c10::ScalarType dtype);

}  // namespace colossus::lora
