"""Reference results from PyTorch (and transformers) for the optim/amp tests.

Run by the C++ tests with the project's venv Python:
  torch_oracle.py trajectories SPEC.json OUT_DIR   one OUT_DIR/<case>.safetensors per case:
      p0.<i> (initial params), g.<s>.<i> (grad fed at step s, absent = no grad),
      p.<s>.<i> (params after step s), all as the case's dtype
  torch_oracle.py schedules OUT.json               lr sequences of the HF schedules
  torch_oracle.py clip SPEC.json OUT_DIR           torch.nn.utils.clip_grad_norm_ cases
Inputs are drawn here from seeded generators, so C++ only reads files.
"""
import json
import math
import os
import sys

import torch
from safetensors.torch import save_file


def lamb_reference(params, state, lr, betas, eps, weight_decay, bias_correction, adam_w_mode, grad_averaging,
                   use_nvlamb, max_grad_norm):
    """LAMB as apex/Colossal-AI FusedLAMB defines it, written out plainly."""
    beta1, beta2 = betas
    with torch.no_grad():
        divisor = 1.0
        if max_grad_norm > 0:
            sum_sq = 0.0
            for p in params:
                if p.grad is not None:
                    sum_sq += torch.linalg.vector_norm(p.grad, 2).pow(2).item()
            global_norm = math.sqrt(sum_sq)
            if global_norm > max_grad_norm:
                divisor = global_norm / max_grad_norm
        for i, p in enumerate(params):
            if p.grad is None:
                continue
            st = state.setdefault(i, {"step": 0, "m": torch.zeros_like(p), "v": torch.zeros_like(p)})
            st["step"] += 1
            g = p.grad / divisor if divisor != 1.0 else p.grad
            if not adam_w_mode and weight_decay != 0:
                g = g.add(p, alpha=weight_decay)
            grad_weight = 1.0 - beta1 if grad_averaging else 1.0
            st["m"].mul_(beta1).add_(g, alpha=grad_weight)
            st["v"].mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
            bc1, bc2 = 1.0, 1.0
            if bias_correction:
                bc1 = 1.0 - beta1 ** float(st["step"])
                bc2 = 1.0 - beta2 ** float(st["step"])
            update = (st["m"] / bc1) / (st["v"] / bc2).sqrt().add_(eps)
            if adam_w_mode and weight_decay != 0:
                update.add_(p, alpha=weight_decay)
            ratio = 1.0
            if use_nvlamb or weight_decay != 0:
                pn = torch.linalg.vector_norm(p, 2).item()
                un = torch.linalg.vector_norm(update, 2).item()
                if pn != 0 and un != 0:
                    ratio = pn / un
            p.add_(update, alpha=-lr * ratio)


def make_optimizer(case, params):
    kind, kw = case["optimizer"], dict(case.get("kwargs", {}))
    groups = case.get("groups")
    if groups:
        target = [dict(params=[params[i] for i in g["indices"]], **{k: v for k, v in g.items() if k != "indices"})
                  for g in groups]
    else:
        target = params
    if "betas" in kw:
        kw["betas"] = tuple(kw["betas"])
    # foreach=False: the single-tensor path, whose ATen calls colossus mirrors.
    if kind == "SGD":
        return torch.optim.SGD(target, foreach=False, **kw)
    if kind == "Adam":
        return torch.optim.Adam(target, foreach=False, **kw)
    if kind == "AdamW":
        return torch.optim.AdamW(target, foreach=False, **kw)
    raise ValueError(kind)


def trajectories(spec_path, out_dir):
    with open(spec_path) as f:
        cases = json.load(f)
    for case in cases:
        gen = torch.Generator().manual_seed(case["seed"])
        dtype = getattr(torch, case.get("dtype", "float32"))
        params = [torch.randn(s, generator=gen).to(dtype) for s in case["shapes"]]
        out = {f"p0.{i}": p.clone() for i, p in enumerate(params)}
        skip = {(s, i) for s, i in case.get("skip", [])}
        grad_scale = case.get("grad_scale", 1.0)
        low = dtype in (torch.bfloat16, torch.float16)
        # bf16/fp16: colossus updates an fp32 copy and rounds back each step.
        work = [p.float() for p in params] if low else params
        if case["optimizer"] == "Lamb":
            lamb_state = {}
            opt = None
        else:
            opt = make_optimizer(case, work)
        for s in range(case["steps"]):
            for i, p in enumerate(params):
                if (s, i) in skip:
                    work[i].grad = None
                    continue
                g = (torch.randn(p.shape, generator=gen) * grad_scale).to(dtype)
                out[f"g.{s}.{i}"] = g.clone()
                if low:
                    work[i].data.copy_(p.float())
                work[i].grad = g.float() if low else g
            if opt is None:
                kw = case["kwargs"]
                lamb_reference(work, lamb_state, kw["lr"], tuple(kw["betas"]), kw["eps"], kw["weight_decay"],
                               kw["bias_correction"], kw["adam_w_mode"], kw["grad_averaging"], kw["use_nvlamb"],
                               kw["max_grad_norm"])
            else:
                opt.step()
            for i, p in enumerate(params):
                if low:
                    p.copy_(work[i].detach())
                out[f"p.{s}.{i}"] = p.detach().clone()
        save_file(out, os.path.join(out_dir, case["name"] + ".safetensors"))


def schedules(out_path):
    from transformers import (get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup,
                              get_cosine_with_min_lr_schedule_with_warmup, get_linear_schedule_with_warmup)
    base_lr, steps = 3e-4, 130
    makers = {
        "constant_w5": lambda o: get_constant_schedule_with_warmup(o, 5),
        "constant_w0": lambda o: get_constant_schedule_with_warmup(o, 0),
        "linear_w10_t100": lambda o: get_linear_schedule_with_warmup(o, 10, 100),
        "linear_w0_t50": lambda o: get_linear_schedule_with_warmup(o, 0, 50),
        "cosine_w10_t100": lambda o: get_cosine_schedule_with_warmup(o, 10, 100),
        "cosine_w7_t90_c1.5": lambda o: get_cosine_schedule_with_warmup(o, 7, 90, num_cycles=1.5),
        "cosine_min_lr": lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, 10, 100, min_lr=3e-5),
        "cosine_min_rate": lambda o: get_cosine_with_min_lr_schedule_with_warmup(o, 10, 100, min_lr_rate=0.1),
    }
    result = {"base_lr": base_lr, "steps": steps, "lrs": {}}
    for name, make in makers.items():
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=base_lr)
        sched = make(opt)
        lrs = [opt.param_groups[0]["lr"]]
        for _ in range(steps):
            opt.step()
            sched.step()
            lrs.append(opt.param_groups[0]["lr"])
        result["lrs"][name] = lrs
    with open(out_path, "w") as f:
        json.dump(result, f)


def clip(spec_path, out_dir):
    with open(spec_path) as f:
        cases = json.load(f)
    for case in cases:
        gen = torch.Generator().manual_seed(case["seed"])
        params = [torch.zeros(s, requires_grad=True) for s in case["shapes"]]
        out = {}
        for i, p in enumerate(params):
            p.grad = torch.randn(p.shape, generator=gen) * case["scale"]
            out[f"g_in.{i}"] = p.grad.clone()
        norm_type = float("inf") if case["norm_type"] == "inf" else float(case["norm_type"])
        total = torch.nn.utils.clip_grad_norm_(params, case["max_norm"], norm_type=norm_type)
        for i, p in enumerate(params):
            out[f"g_out.{i}"] = p.grad.clone()
        out["total_norm"] = total.reshape(1).clone()
        save_file(out, os.path.join(out_dir, case["name"] + ".safetensors"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    mode = sys.argv[1]
    if mode == "trajectories":
        trajectories(sys.argv[2], sys.argv[3])
    elif mode == "schedules":
        schedules(sys.argv[2])
    elif mode == "clip":
        clip(sys.argv[2], sys.argv[3])
    else:
        raise SystemExit(f"unknown mode {mode}")
