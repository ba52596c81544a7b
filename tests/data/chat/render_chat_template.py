"""Oracle for tests/inference/serving: renders chat templates with transformers.

Usage: render_chat_template.py JOBS.json  ->  prints a JSON list, one entry per job:
{"text": rendered} or {"error": "ExceptionType: message"}.

A job is {"template": source, ...} plus either
  "messages", "add_generation_prompt", "special_tokens", "kwargs":
      tokenizer.apply_chat_template(messages, tokenize=False, ...) on a tokenizer
      carrying those special tokens (the path a model's tokenizer takes), or
  "context":
      the template compiled by transformers' own Jinja environment, rendered with
      the context's keys as variables (for single language features).
"""

import json
import sys

from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import _compile_jinja_template


def run(job):
    if "context" in job:
        return _compile_jinja_template(job["template"]).render(**job["context"])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")),
        **job.get("special_tokens", {}),
    )
    return tokenizer.apply_chat_template(
        job["messages"],
        chat_template=job["template"],
        add_generation_prompt=job.get("add_generation_prompt", False),
        tokenize=False,
        **job.get("kwargs", {}),
    )


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    results = []
    for job in jobs:
        try:
            results.append({"text": run(job)})
        except Exception as e:  # the test compares the message with ours
            results.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write(json.dumps(results, ensure_ascii=False))


if __name__ == "__main__":
    main()
