// Phi-3 / Phi-3.5-mini with Hugging Face's Phi3ForCausalLM numerics, built in
// LLaMA's frame (llama.h: the same attention, MLP and RoPE modules, longrope
// in rope.h) with the two things Phi-3 changes: dropout on the attention and
// MLP outputs (resid_pdrop), and checkpoints that hold q/k/v_proj fused into
// self_attn.qkv_proj and gate/up_proj into mlp.gate_up_proj. The model keeps
// LLaMA's separate projections, so tensor parallelism, ZeRO, pipelines and the
// inference engine see LLaMA's layers; the fused names exist only in files
// (fuse_phi3_checkpoint on save, split_phi3_checkpoint on load).
#pragma once
#include "colossus/checkpoint/safetensors.h"
#include "colossus/models/llama.h"

#include <map>
#include <string>

namespace colossus::models {

class Phi3DecoderLayer : public LlamaDecoderLayer {
 public:
  Phi3DecoderLayer(const LlamaConfig& config, const at::TensorOptions& options, int64_t layer);
  // h = x + dropout(attn(input_layernorm(x))); out = h + dropout(mlp(post_attention_layernorm(h))),
  // dropout only in training with resid_pdrop > 0 (else LLaMA's block).
  at::Tensor forward(const at::Tensor& hidden, const BlockContext& context) override;

 private:
  double resid_pdrop_;
};

class Phi3ForCausalLM : public LlamaForCausalLM {
 public:
  Phi3ForCausalLM(const LlamaConfig& config, const at::TensorOptions& options);
};

// Model names -> checkpoint names: each layer's q/k/v_proj.weight become one
// qkv_proj.weight (rows [q | k | v]) at q's place, gate/up_proj.weight one
// gate_up_proj.weight (rows [gate | up]); other tensors pass through. Whole
// (unsharded) tensors; the fused ones are new tensors.
checkpoint::NamedTensors fuse_phi3_checkpoint(checkpoint::NamedTensors params);
// Checkpoint names -> model names: qkv_proj.weight (H*D + 2*K*D, C) split
// into q/k/v_proj.weight, gate_up_proj.weight (2F, C) into gate/up_proj.weight
// (row views of the file's tensors). A fused tensor of another shape is a
// CheckpointError naming it and `source`.
std::map<std::string, at::Tensor> split_phi3_checkpoint(const LlamaConfig& config,
                                                        std::map<std::string, at::Tensor> state,
                                                        const std::string& source);

}  // namespace colossus::models
