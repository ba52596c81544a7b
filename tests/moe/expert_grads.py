"""Shared by the MoE oracles: a transformers model's gradients under the names
its save_pretrained writes. transformers 5 holds each block's experts as two
3D parameters (experts.gate_up_proj (E, 2I, H), experts.down_proj (E, H, I));
on disk, and in Colossus, each expert has its own gate / up / down matrices,
named per family (Mixtral: w1 / w3 / w2 under block_sparse_moe instead of
mlp; Qwen-MoE, DeepSeek: gate_proj / up_proj / down_proj).
"""

QWEN_NAMES = ("gate_proj", "up_proj", "down_proj")
MIXTRAL_NAMES = ("w1", "w3", "w2")


def checkpoint_grads(model, inter, names=QWEN_NAMES, rename=lambda name: name):
    gate, up, down = names
    out = {}
    for name, p in model.named_parameters():
        g = p.grad
        name = rename(name)
        if name.endswith("experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            for e in range(g.shape[0]):
                out[f"grad.{base}{e}.{gate}.weight"] = g[e, :inter].contiguous()
                out[f"grad.{base}{e}.{up}.weight"] = g[e, inter:].contiguous()
        elif name.endswith("experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(g.shape[0]):
                out[f"grad.{base}{e}.{down}.weight"] = g[e].contiguous()
        else:
            out["grad." + name] = g.contiguous()
    return out
