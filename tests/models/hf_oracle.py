#!/usr/bin/env python3
"""Hugging Face transformers as the test oracle for colossus/models (tests only).

  hf_oracle.py make OUT_DIR
      For each case below: a randomly initialised tiny HF model, saved with
      save_pretrained(safe_serialization=True) into OUT_DIR/<case>/, plus
      OUT_DIR/<case>/reference.safetensors with input_ids, labels, logits,
      loss and the gradient of the loss for every parameter ("grad.<name>").
      padded.safetensors: the same for a batch with an attention_mask (row 0
      padded on the right, row 1 on the left). packed.safetensors: three
      documents (lengths in doc_lengths) run as a right-padded batch, one row
      each: what packing them into rows with restarting positions must give.

  hf_oracle.py check DIR...
      Each DIR was written by Colossus' save_pretrained and holds
      cpp_logits.safetensors (input_ids, logits). Loads DIR with
      from_pretrained, requires a clean load (no missing, unexpected or
      mismatched tensors) and logits within TOLERANCE of Colossus'. Exit 1 if not.
"""
import argparse
import pathlib
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file

TOLERANCE = 1e-4
BATCH, SEQ = 2, 16


def gpt2():
    return transformers.GPT2Config(vocab_size=96, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                                   resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2)


def llama(**overrides):
    settings = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                    initializer_range=0.2, rms_norm_eps=1e-5)
    settings.update(overrides)
    return transformers.LlamaConfig(**settings)


def family(config_class, **overrides):
    settings = dict(vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=64,
                    initializer_range=0.2, rms_norm_eps=1e-5)
    settings.update(overrides)
    return config_class(**settings)


# longrope's per-frequency divisors for head_dim 16 (8 frequencies).
PHI3_SHORT = [1.0, 1.05, 1.1, 1.3, 1.6, 2.0, 2.5, 3.0]
PHI3_LONG = [1.0, 1.5, 2.2, 3.0, 4.5, 6.0, 9.0, 12.0]

CASES = {
    "gpt2": gpt2,
    # Grouped-query attention (2 kv heads for 4 query heads), attention bias,
    # and a padding token whose embedding row gets no gradient.
    "llama_gqa": lambda: llama(num_key_value_heads=2, attention_bias=True, pad_token_id=0),
    # llama3 scaling with head_dim 16: the 8 frequencies span all three bands
    # (kept, interpolated, divided by factor) for original length 1024.
    "llama_rope_llama3": lambda: llama(rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                        "original_max_position_embeddings": 1024}),
    # Linear scaling with multi-query attention (1 kv head).
    "llama_rope_linear": lambda: llama(num_key_value_heads=1,
                                       rope_parameters={"rope_type": "linear", "rope_theta": 50000.0, "factor": 2.0}),
    # Dynamic NTK only changes anything past max_position_embeddings (8 < SEQ).
    "llama_rope_dynamic": lambda: llama(max_position_embeddings=8,
                                        rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0}),
    # Qwen2: q/k/v biases (o_proj none), a tied head, its own RoPE base.
    "qwen2": lambda: family(transformers.Qwen2Config, tie_word_embeddings=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}),
    # Qwen3: per-head q/k RMSNorm, head_dim not hidden/heads, attention biases on.
    "qwen3": lambda: family(transformers.Qwen3Config, head_dim=8, attention_bias=True),
    # Mistral: a sliding window of 6 over 16 tokens, on every layer.
    "mistral": lambda: family(transformers.MistralConfig, sliding_window=6),
    # Qwen2 with use_sliding_window: layer 0 full, layer 1 a window of 5 (max_window_layers 1).
    "qwen2_window": lambda: family(transformers.Qwen2Config, use_sliding_window=True, sliding_window=5,
                                   max_window_layers=1),
    # Gemma 2: (1 + w) norms, sandwich norms, GeGLU, the scaled embedding, a
    # tied head, query_pre_attn_scalar, scores and logits soft-capped with caps
    # small enough to bend them, layer 0 windowed (5 of 16 tokens), layer 1 full.
    "gemma2": lambda: family(transformers.Gemma2Config, sliding_window=5, query_pre_attn_scalar=12,
                             attn_logit_softcapping=2.0, final_logit_softcapping=3.0, pad_token_id=0),
    # Gemma 3 (text): Gemma 2's blocks without caps, (1 + w) q/k norms, layer 0
    # sliding (window 5, its own RoPE base 10^4), layer 1 full (base 10^6, linear x2).
    "gemma3": lambda: family(transformers.Gemma3TextConfig, sliding_window=5, query_pre_attn_scalar=12,
                             layer_types=["sliding_attention", "full_attention"], pad_token_id=0,
                             rope_parameters={"full_attention": {"rope_type": "linear", "factor": 2.0,
                                                                 "rope_theta": 1000000.0},
                                              "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}),
    # Phi-3: fused qkv_proj / gate_up_proj, longrope over 8 original positions
    # (the 16 tokens take long_factor; no factor given, so max/original = 8
    # sets the cos/sin scale), v5's rope_parameters.
    "phi3_longrope_long": lambda: family(transformers.Phi3Config, pad_token_id=0, original_max_position_embeddings=8,
                                         rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                          "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG}),
    # Phi-3 under 32 original positions (the 16 tokens take short_factor), v4's
    # rope_scaling with the old type name "su", a window of 6 on every layer.
    "phi3_longrope_short": lambda: family(transformers.Phi3Config, pad_token_id=None, sliding_window=6,
                                          original_max_position_embeddings=32, rope_theta=5000.0,
                                          rope_scaling={"type": "su", "short_factor": PHI3_SHORT,
                                                        "long_factor": PHI3_LONG}),
    # Phi-3 with partial RoPE: the first 8 of 16 dims of each head rotate.
    "phi3_partial": lambda: family(transformers.Phi3Config, pad_token_id=0, partial_rotary_factor=0.5),
    # The same under longrope (4 frequencies, so 4 factors each; 16 tokens take long_factor).
    "phi3_partial_longrope": lambda: family(transformers.Phi3Config, pad_token_id=0, original_max_position_embeddings=8,
                                            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                                                             "partial_rotary_factor": 0.5,
                                                             "short_factor": PHI3_SHORT[:4],
                                                             "long_factor": PHI3_LONG[:4]}),
}


def make(out_dir: pathlib.Path) -> None:
    for case, build_config in CASES.items():
        torch.manual_seed(20240601)
        config = build_config()
        model = transformers.AutoModelForCausalLM.from_config(config)
        # HF's init leaves biases at 0 and norm weights at 1; perturb every
        # tensor so that loading biases and norm weights is tested too.
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.1 * torch.randn_like(p))
        model.eval()
        case_dir = out_dir / case
        model.save_pretrained(case_dir, safe_serialization=True)

        input_ids = torch.randint(0, config.vocab_size, (BATCH, SEQ))
        input_ids[1, 3] = 0  # the padding id of llama_gqa appears in the batch
        labels = input_ids.clone()
        labels[0, :3] = -100
        labels[1, -2:] = -100
        out = model(input_ids=input_ids, labels=labels)
        out.loss.backward()
        tensors = {"input_ids": input_ids, "labels": labels, "logits": out.logits.detach().contiguous(),
                   "loss": out.loss.detach().reshape(1)}
        for name, p in model.named_parameters():
            tensors["grad." + name] = p.grad.contiguous()
        save_file(tensors, str(case_dir / "reference.safetensors"))

        # Right padding (row 0, 5 pads) and left padding (row 1, 4 pads);
        # positions 0..T-1 as transformers' forward takes them.
        attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
        attention_mask[0, -5:] = 0
        attention_mask[1, :4] = 0
        save_file(reference(case_dir, input_ids.masked_fill(attention_mask == 0, 0), attention_mask),
                  str(case_dir / "padded.safetensors"))
        # Documents of 7, 9 and 11 tokens, one row each, right-padded.
        doc_lengths = torch.tensor([7, 9, 11])
        doc_ids = torch.randint(1, config.vocab_size, (len(doc_lengths), int(doc_lengths.max())))
        doc_mask = (torch.arange(doc_ids.size(1)) < doc_lengths.unsqueeze(1)).long()
        packed = reference(case_dir, doc_ids.masked_fill(doc_mask == 0, 0), doc_mask)
        packed["doc_lengths"] = doc_lengths
        save_file(packed, str(case_dir / "packed.safetensors"))


def reference(case_dir, input_ids, attention_mask):
    """Logits, loss and gradients for a padded batch; padding is no target.
    A fresh model each time: dynamic NTK RoPE keeps the frequencies of the
    longest sequence a model instance has seen."""
    model = transformers.AutoModelForCausalLM.from_pretrained(case_dir, dtype=torch.float32)
    model.eval()
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    # Nor is a token that follows padding (left padding): a padding query predicts it.
    labels[:, 1:].masked_fill_(attention_mask[:, :-1] == 0, -100)
    out = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels)
    out.loss.backward()
    tensors = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels,
               "logits": out.logits.detach().contiguous(), "loss": out.loss.detach().reshape(1)}
    for name, p in model.named_parameters():
        assert torch.isfinite(p.grad).all(), f"transformers gave a non-finite gradient for {name}"
        tensors["grad." + name] = p.grad.contiguous()
    return tensors


def check(dirs) -> int:
    failures = 0
    for d in map(pathlib.Path, dirs):
        model, info = transformers.AutoModelForCausalLM.from_pretrained(d, output_loading_info=True,
                                                                        dtype=torch.float32)
        problems = {k: v for k, v in info.items() if v}
        ref = load_file(str(d / "cpp_logits.safetensors"))
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=ref["input_ids"]).logits
        diff = (logits - ref["logits"]).abs().max().item() if logits.shape == ref["logits"].shape else float("inf")
        ok = not problems and diff <= TOLERANCE
        print(f"{d.name}: {type(model).__name__} max|logits diff| = {diff:.3g}"
              f"{'' if not problems else f' loading problems: {problems}'} -> {'ok' if ok else 'FAIL'}")
        failures += not ok
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("make").add_argument("out_dir", type=pathlib.Path)
    sub.add_parser("check").add_argument("dirs", nargs="+")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    if args.command == "make":
        make(args.out_dir)
        return 0
    return check(args.dirs)


if __name__ == "__main__":
    sys.exit(main())
