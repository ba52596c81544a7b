"""Loads a model directory saved by Colossus with transformers and prints the
causal-LM loss on the given ids (JSON list of rows), so the C++ test can compare
it with its own. Test oracle only."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

model_dir, ids_json = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
ids = torch.tensor(json.loads(ids_json), dtype=torch.long)
with torch.no_grad():
    loss = model(input_ids=ids, labels=ids).loss.item()
print(json.dumps({"loss": loss}))
