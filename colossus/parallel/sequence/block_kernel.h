// Which kernel computes ring attention's (query shard, key block) pairs: its
// own header, since both the public options (ring_attention.h) and the block
// helpers below them (ring_blocks.h) name it.
#pragma once

namespace colossus::parallel::sequence {

// How each (query shard, key block) pair is computed: Fused runs one SDPA
// kernel that returns the log-sum-exp wherever the block is unmasked or a
// rank's own causal block (on CUDA cuDNN's attention for half/bfloat16 with as
// many kv heads as query heads and head size up to 128, outside
// deterministic mode, flash's otherwise;
// the CPU flash kernel on CPU), and matmuls elsewhere (packed documents,
// padding, float32 on CUDA); Math always uses matmuls (the reference the
// fused path is tested and benchmarked against).
enum class BlockKernel { Fused, Math };

}  // namespace colossus::parallel::sequence
