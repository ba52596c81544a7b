"""Loads a `colossus train` checkpoint's model/ directory with transformers
(model and tokenizer) and prints the mean loss on ids given as JSON, so the
C++ test can compare it with its own forward. Test oracle only."""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, ids_json, text = sys.argv[1], sys.argv[2], sys.argv[3]
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32)
tokenizer = AutoTokenizer.from_pretrained(model_dir)
ids = torch.tensor(json.loads(ids_json), dtype=torch.long)
with torch.no_grad():
    loss = model(input_ids=ids, labels=ids).loss.item()
print(json.dumps({"loss": loss, "encoded": tokenizer.encode(text, add_special_tokens=False)}))
