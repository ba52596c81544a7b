// Which kernel computes ring attention's (query shard, key block) pairs: its
// own header, since both the public options (ring_attention.h) and the block
// helpers below them (ring_blocks.h) name it.
#pragma once

namespace colossus::parallel::sequence {

// How each (query shard, key block) pair is computed: Fused runs one SDPA
// kernel that returns the log-sum-exp (flash on CUDA for half/bfloat16, the
// CPU flash kernel on CPU) wherever the block is unmasked or a rank's own
// causal block, and matmuls elsewhere (packed documents, padding, float32 on
// CUDA); FusedCudnn is Fused with cuDNN's attention kernel on CUDA where it
// takes the block (half/bfloat16, as many kv heads as query heads, head size
// up to 128), flash elsewhere; Math always uses matmuls (the reference the
// fused paths are tested and benchmarked against).
enum class BlockKernel { Fused, FusedCudnn, Math };

}  // namespace colossus::parallel::sequence
