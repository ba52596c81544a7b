#!/usr/bin/env python3
"""transformers' generate() as the test oracle for colossus/inference (tests only).

  hf_generate.py generate MODEL_DIR --prompt 1,2,3 --new 20 [--sample --seed S
                 --temperature T --top_k K --top_p P] [--repetition_penalty R]
      Loads MODEL_DIR (written by Colossus' save_pretrained) with
      from_pretrained in fp32 and prints one JSON object: "ids", the prompt
      followed by exactly --new generated tokens (no eos: the model's eos ids
      are cleared), and "margin", the smallest gap between the two largest
      logits over the greedy steps (how safe a token-for-token comparison is).
      With --sample, torch.manual_seed(S) precedes generate(do_sample=True).

  hf_generate.py beam MODEL_DIR --prompts 1,2,3;4,5 --new 12 --num_beams 4
                 [--eos E] [--length_penalty L] [--early_stopping]
      Beam search on each prompt alone (no padding); prints {"outputs":
      [generated ids per prompt]}: the best beam's new tokens, ending at eos
      when it ended there. Without --eos the model has no eos.

  hf_generate.py batch JOBS.json
      JOBS.json is a list of argument lists, each one of the commands above;
      runs them all in this one process (transformers is imported once) and
      prints {"outputs": [each command's printed line], "exit_codes": [...]}.

  hf_generate.py logprobs MODEL_DIR --ids 1,2,3 --top 3
      One forward over the ids in fp32; prints {"logprobs": [...], "top":
      [[[id, logprob], ...], ...]}: for each position i >= 1, log_softmax of
      the logits at i - 1 at ids[i], and the --top most likely tokens there.
"""
import argparse
import contextlib
import io
import json
import sys

import torch
import transformers


def generate(args) -> int:
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()
    # Exactly --new tokens: no eos may end generation early.
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    prompt = torch.tensor([[int(i) for i in args.prompt.split(",")]])
    kwargs = dict(max_new_tokens=args.new, repetition_penalty=args.repetition_penalty,
                  output_scores=True, return_dict_in_generate=True)
    if args.sample:
        torch.manual_seed(args.seed)
        kwargs.update(do_sample=True, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    else:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    with torch.no_grad():
        out = model.generate(prompt, **kwargs)
    ids = out.sequences[0].tolist()
    if len(ids) != prompt.shape[1] + args.new:
        print(f"generate returned {len(ids) - prompt.shape[1]} new tokens, expected {args.new}", file=sys.stderr)
        return 1
    margins = []
    for scores in out.scores:
        top2 = torch.topk(scores[0].float(), 2).values
        margins.append((top2[0] - top2[1]).item())
    print(json.dumps({"ids": ids, "margin": min(margins) if margins else 0.0}))
    return 0


def beam(args) -> int:
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()
    model.generation_config.eos_token_id = args.eos
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    outputs = []
    for text in args.prompts.split(";"):
        prompt = torch.tensor([[int(i) for i in text.split(",")]])
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=args.new, num_beams=args.num_beams, do_sample=False,
                                 temperature=None, top_k=None, top_p=None, length_penalty=args.length_penalty,
                                 early_stopping=args.early_stopping)
        outputs.append(out[0, prompt.shape[1]:].tolist())
    print(json.dumps({"outputs": outputs}))
    return 0


def logprobs(args) -> int:
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    model.eval()
    ids = torch.tensor([[int(i) for i in args.ids.split(",")]])
    with torch.no_grad():
        logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
    chosen = logp[:-1].gather(1, ids[0, 1:].unsqueeze(1)).squeeze(1)
    values, top_ids = logp[:-1].topk(args.top, dim=-1)
    top = [[[int(t), float(v)] for t, v in zip(row_ids, row_values)] for row_ids, row_values in
           zip(top_ids.tolist(), values.tolist())]
    print(json.dumps({"logprobs": chosen.tolist(), "top": top}))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("model_dir")
    g.add_argument("--prompt", required=True)
    g.add_argument("--new", type=int, default=20)
    g.add_argument("--sample", action="store_true")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top_k", type=int, default=0)
    g.add_argument("--top_p", type=float, default=1.0)
    g.add_argument("--repetition_penalty", type=float, default=1.0)
    b = sub.add_parser("beam")
    b.add_argument("model_dir")
    b.add_argument("--prompts", required=True)
    b.add_argument("--new", type=int, default=12)
    b.add_argument("--num_beams", type=int, default=4)
    b.add_argument("--eos", type=int, default=None)
    b.add_argument("--length_penalty", type=float, default=1.0)
    b.add_argument("--early_stopping", action="store_true")
    lp = sub.add_parser("logprobs")
    lp.add_argument("model_dir")
    lp.add_argument("--ids", required=True)
    lp.add_argument("--top", type=int, default=1)
    bt = sub.add_parser("batch")
    bt.add_argument("jobs")
    args = parser.parse_args()
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    commands = {"beam": beam, "logprobs": logprobs, "generate": generate}
    if args.command != "batch":
        return commands[args.command](args)
    with open(args.jobs) as f:
        jobs = json.load(f)
    outputs, exit_codes = [], []
    for job in jobs:
        job_args = parser.parse_args(job)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exit_codes.append(commands[job_args.command](job_args))
        outputs.append(printed.getvalue().strip())
    print(json.dumps({"outputs": outputs, "exit_codes": exit_codes}))
    return 0 if all(code == 0 for code in exit_codes) else 1


if __name__ == "__main__":
    sys.exit(main())
