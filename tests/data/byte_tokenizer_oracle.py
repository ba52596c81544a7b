#!/usr/bin/env python3
"""What Python makes of the files save_byte_tokenizer writes (tests only).

  byte_tokenizer_oracle.py DIR TEXTS_JSON
      Prints one JSON object: for each text of the JSON list, the ids with and
      without special tokens and the decoded text that tokenizers'
      Tokenizer.from_file(DIR/tokenizer.json) and transformers'
      AutoTokenizer.from_pretrained(DIR) give; and AutoTokenizer's vocabulary
      size, class and bos/eos/pad ids.
"""
import json
import sys

import transformers
from tokenizers import Tokenizer


def main() -> int:
    directory, texts_path = sys.argv[1], sys.argv[2]
    transformers.logging.set_verbosity_error()
    with open(texts_path, encoding="utf-8") as f:
        texts = json.load(f)
    raw = Tokenizer.from_file(f"{directory}/tokenizer.json")
    auto = transformers.AutoTokenizer.from_pretrained(directory)
    cases = []
    for text in texts:
        ids = raw.encode(text, add_special_tokens=False).ids
        ids_special = raw.encode(text, add_special_tokens=True).ids
        auto_ids = auto.encode(text, add_special_tokens=False)
        auto_special = auto.encode(text, add_special_tokens=True)
        cases.append({
            "tokenizers": {"ids": ids, "ids_special": ids_special,
                           "decoded": raw.decode(ids, skip_special_tokens=False),
                           "decoded_skip": raw.decode(ids_special, skip_special_tokens=True)},
            "transformers": {"ids": auto_ids, "ids_special": auto_special,
                             "decoded": auto.decode(auto_ids, skip_special_tokens=False),
                             "decoded_skip": auto.decode(auto_special, skip_special_tokens=True)},
        })
    print(json.dumps({"vocab_size": len(auto), "class": type(auto).__name__, "bos": auto.bos_token_id,
                      "eos": auto.eos_token_id, "pad": auto.pad_token_id, "cases": cases}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
