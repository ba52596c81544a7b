#!/usr/bin/env python3
"""Device-side helper for scripts/device_families.sh (transformers as the oracle).

  family_oracle.py make FAMILY DIR [--shape tiny|qwen2.5-7b] [--device cuda]
      A randomly initialised transformers model of FAMILY (qwen2, mistral,
      gemma2, gemma3) saved to DIR (safetensors, bf16 for the 7B shape), with a
      byte-level BPE tokenizer.json covering the whole vocabulary (256 byte
      tokens, then two- and three-byte tokens built by merges), so any id the
      model emits decodes. No download.

  family_oracle.py greedy DIR --prompt TEXT --new N --dtype fp32|bf16 [--device cuda] [--candidates K]
      transformers' greedy generate: one JSON line {"prompt", "ids": generated
      ids, "margins": top-1 minus top-2 logit at each step}. With K > 1, of the
      prompt and K - 1 word rotations of it, the one whose smallest margin is
      largest (a comparison that bf16 rounding cannot flip at a near-tie).

  family_oracle.py greedy ... --candidates K --all
      One JSON line per candidate prompt (the prompt and its K - 1 rotations).

  family_oracle.py agreement REFERENCE_JSONL OTHER_JSONL...
      For each prompt of the reference (transformers fp32's --all lines), how
      many tokens each other run (JSONL, one line per prompt: transformers
      bf16's --all, or colossus generate --ids_out) keeps before it parts from
      the reference; prints a table with the lengths and their mean. Telling a
      tie apart from a precision fault takes many prompts, not one.

  family_oracle.py compare HF_JSON OURS_JSONL
      Prints one line: tokens equal before the first difference, and the HF
      margin at that step (a near-tie there is rounding, not a defect).
"""
import argparse
import json
import pathlib
import sys

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SHAPES = {
    # Small enough to build in seconds; head_dim 64 is a CUDA paged-kernel size;
    # windows of 48 < prompt + new tokens, so the paged kernels mask.
    "tiny": dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=64, max_position_embeddings=512),
    # Qwen2.5-7B's shape (config.json of Qwen/Qwen2.5-7B).
    "qwen2.5-7b": dict(vocab_size=152064, hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, max_position_embeddings=32768,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False),
}


def config_for(family, shape):
    s = dict(SHAPES[shape])
    if family == "qwen2":
        return transformers.Qwen2Config(**s)
    if family == "mistral":
        return transformers.MistralConfig(sliding_window=48, **s)
    if family == "gemma2":
        return transformers.Gemma2Config(sliding_window=48, query_pre_attn_scalar=64, **s)
    if family == "gemma3":
        return transformers.Gemma3TextConfig(sliding_window=48, query_pre_attn_scalar=64,
                                             layer_types=["sliding_attention", "full_attention"] * 2, **s)
    raise SystemExit(f"unknown family {family}")


def byte_level_tokenizer(vocab_size):
    """Byte-level BPE whose vocabulary is exactly vocab_size tokens."""
    alphabet = list(pre_tokenizers.ByteLevel.alphabet())
    alphabet.sort()
    vocab = {c: i for i, c in enumerate(alphabet)}
    merges = []
    singles = alphabet
    pairs = (a + b for a in singles for b in singles)
    for token in pairs:
        if len(vocab) >= vocab_size:
            break
        vocab[token] = len(vocab)
        merges.append((token[0], token[1]))
    triples = ((a + b, c) for a in singles for b in singles for c in singles)
    for left, right in triples:
        if len(vocab) >= vocab_size:
            break
        if left not in vocab:
            continue
        vocab[left + right] = len(vocab)
        merges.append((left, right))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    return tok


def make(args):
    config = config_for(args.family, args.shape)
    torch.manual_seed(1234)
    dtype = torch.bfloat16 if args.shape != "tiny" else torch.float32
    with torch.device(args.device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype)
    out = pathlib.Path(args.dir)
    model.save_pretrained(out, safe_serialization=True)
    byte_level_tokenizer(config.vocab_size).save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    print(json.dumps({"family": args.family, "shape": args.shape, "parameters": model.num_parameters()}))


def greedy_run(model, tok, prompt, new, device):
    ids = torch.tensor([tok.encode(prompt)], device=device)
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0, eos_token_id=None)
    margins = []
    for scores in out.scores:
        top2 = torch.topk(scores[0].float(), 2).values
        margins.append((top2[0] - top2[1]).item())
    return {"prompt": prompt, "prompt_ids": ids[0].tolist(), "ids": out.sequences[0, ids.size(1):].tolist(),
            "margins": margins}


def candidate_prompts(prompt, n):
    """The prompt, then n - 1 variants: its words rotated by 1, 2, ... places."""
    words = prompt.split()
    return [" ".join(words[k:] + words[:k]) for k in range(min(n, len(words)))]


def greedy(args):
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(args.dir, dtype=dtype).to(args.device).eval()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(pathlib.Path(args.dir) / "tokenizer.json"))
    runs = [greedy_run(model, tok, p, args.new, args.device) for p in candidate_prompts(args.prompt, args.candidates)]
    # Random weights give near-uniform logits, so some steps are near-ties that
    # any rounding difference flips; with --candidates the prompt whose greedy
    # run has the largest smallest margin is the one compared (stated in the row).
    if args.all:
        for k, run in enumerate(runs):
            print(json.dumps(dict(run, candidate=k, candidates=len(runs))))
        return
    best = max(range(len(runs)), key=lambda k: min(runs[k]["margins"]))
    result = dict(runs[best], candidate=best, candidates=len(runs))
    print(json.dumps(result))


def agreement(args):
    def lines(path):
        return [json.loads(l) for l in pathlib.Path(path).read_text().splitlines() if l.strip()]
    reference = lines(args.reference)
    print("| run | " + " | ".join(f"prompt {k}" for k in range(len(reference))) + " | mean |")
    print("|---|" + "---|" * (len(reference) + 1))
    for path, label in zip(args.others, args.labels or args.others):
        by_prompt = {tuple(r["prompt_ids"]): r["ids"] for r in lines(path)}
        lengths = []
        for ref in reference:
            ids = by_prompt.get(tuple(ref["prompt_ids"]))
            if ids is None:
                print(f"{label}: no run for prompt {ref['prompt'][:40]!r}")
                return 1
            same = 0
            while same < min(len(ids), len(ref["ids"])) and ids[same] == ref["ids"][same]:
                same += 1
            lengths.append(same)
        print(f"| {label} | " + " | ".join(str(n) for n in lengths) + f" | {sum(lengths) / len(lengths):.1f} |")
    return 0


def compare(args):
    hf = json.loads(pathlib.Path(args.hf_json).read_text().strip().splitlines()[-1])
    ours = json.loads(pathlib.Path(args.ours_jsonl).read_text().strip().splitlines()[0])
    if ours["prompt_ids"] != hf["prompt_ids"]:
        print(f"prompt ids differ: ours {ours['prompt_ids'][:8]}... HF {hf['prompt_ids'][:8]}...")
        return 1
    a, b = ours["ids"], hf["ids"]
    same = 0
    while same < min(len(a), len(b)) and a[same] == b[same]:
        same += 1
    if same == len(b) == len(a):
        chosen = f", prompt {hf['candidate']} of {hf['candidates']} candidates" if hf.get("candidates", 1) > 1 else ""
        print(f"equal: {same}/{len(b)} tokens (smallest HF margin {min(hf['margins']):.4f}{chosen})")
        return 0
    margin = hf["margins"][same] if same < len(hf["margins"]) else float("nan")
    print(f"differ at token {same}/{len(b)}: ours {a[same] if same < len(a) else None}, HF {b[same]}; "
          f"HF margin there {margin:.4f}")
    return 1


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("family")
    m.add_argument("dir")
    m.add_argument("--shape", default="tiny", choices=sorted(SHAPES))
    m.add_argument("--device", default="cuda")
    g = sub.add_parser("greedy")
    g.add_argument("dir")
    g.add_argument("--prompt", required=True)
    g.add_argument("--new", type=int, default=32)
    g.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    g.add_argument("--device", default="cuda")
    g.add_argument("--candidates", type=int, default=1,
                   help="try the prompt and N - 1 word rotations of it; keep the best-conditioned")
    g.add_argument("--all", action="store_true", help="print every candidate's run, not the best")
    a = sub.add_parser("agreement")
    a.add_argument("reference")
    a.add_argument("others", nargs="+")
    a.add_argument("--labels", nargs="*")
    c = sub.add_parser("compare")
    c.add_argument("hf_json")
    c.add_argument("ours_jsonl")
    args = p.parse_args()
    return {"make": make, "greedy": greedy, "compare": compare, "agreement": agreement}[args.cmd](args) or 0


if __name__ == "__main__":
    sys.exit(main())
