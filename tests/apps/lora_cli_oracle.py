#!/usr/bin/env python3
"""The LoRA command-line round trip's Python side (tests only).

  lora_cli_oracle.py make OUT_DIR
      OUT_DIR/model/ (sft_trl_oracle.py's tiny LLaMA and tokenizer) and
      OUT_DIR/data.jsonl (its prompt/completion records).
  lora_cli_oracle.py check BASE ADAPTER MERGED
      PEFT's PeftModel(BASE, ADAPTER) and its merge_and_unload against
      transformers loading MERGED (the directory `colossus lora merge` wrote):
      fp32 logits on a fixed batch must agree to 1e-4 relative; prints the
      differences, exits 1 when they do not.
"""
import json
import pathlib
import sys

import peft
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from sft_trl_oracle import records, save_model  # noqa: E402


def main() -> int:
    transformers.logging.set_verbosity_error()
    if sys.argv[1] == "make":
        out = pathlib.Path(sys.argv[2])
        out.mkdir(parents=True, exist_ok=True)
        save_model(out)
        (out / "data.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records()),
                                        encoding="utf-8")
        return 0
    base_dir, adapter_dir, merged_dir = sys.argv[2:5]
    ids = torch.tensor([[1, 20, 33, 41, 57, 60, 72, 88], [1, 90, 12, 5, 44, 61, 70, 3]])
    base = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    peft_model = peft.PeftModel.from_pretrained(base, adapter_dir)
    with torch.no_grad():
        adapted = peft_model(ids).logits
        peft_merged = peft_model.merge_and_unload()(ids).logits
        ours = transformers.LlamaForCausalLM.from_pretrained(merged_dir, dtype=torch.float32)(ids).logits
        plain = transformers.LlamaForCausalLM.from_pretrained(base_dir, dtype=torch.float32)(ids).logits
    scale = adapted.abs().max().item()
    diffs = {"merged_vs_peft": (ours - adapted).abs().max().item() / scale,
             "merged_vs_peft_merge": (ours - peft_merged).abs().max().item() / scale,
             "adapter_effect": (adapted - plain).abs().max().item() / scale}
    print(json.dumps(diffs))
    ok = diffs["merged_vs_peft"] < 1e-4 and diffs["merged_vs_peft_merge"] < 1e-4 and diffs["adapter_effect"] > 1e-4
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
