#!/usr/bin/env python3
"""TRL as the oracle for SFT example preparation (tests only).

  sft_oracle.py OUT_DIR
      Writes OUT_DIR/tokenizer/ (a byte-level BPE trained here: <s> added in
      front by its post-processor, </s> the end of text, <pad>),
      with a ChatML chat template whose assistant turns are {% generation %}
      blocks), and the records of each case in OUT_DIR/<case>.jsonl with the rows
      TRL's SFTTrainer prepares from them (max_length 24 or 64, keep_start) in
      OUT_DIR/<case>.trl.json = [{"input_ids": [...], "labels": [...]}] (labels:
      -100 where a token is no target; examples left with no target dropped, as
      TRL drops them). Cases: prompt_completion, text, chat_all (messages, every
      token), chat_assistant (messages, assistant_only_loss), chat_prompt_completion
      (message lists, the completion) and chat_prompt_completion_assistant.
"""
import json
import pathlib
import sys
import tempfile

import transformers
from datasets import Dataset
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from trl import SFTConfig, SFTTrainer

CORPUS = ["The quick brown fox jumps over the lazy dog.", "What is two plus two? The answer is four.",
          "Colossus trains models in C++.", "café, naïve, 中文, emoji 🙂", "def add(a, b):\n    return a + b\n"] * 4

PROMPT_COMPLETION = [
    {"prompt": "What is two plus two?", "completion": " The answer is four."},
    # A prompt ending in a space: " The" merges across the boundary, so the
    # completion starts where the two tokenizations diverge.
    {"prompt": "The answer is ", "completion": "four."},
    {"prompt": "café ", "completion": "naïve 中文 🙂"},
    {"prompt": "Already ended: ", "completion": "yes</s>"},
    # Longer than max_length: cut at 24 tokens, in the completion.
    {"prompt": "The quick brown fox.", "completion": " The quick brown fox jumps over the lazy dog. " * 2},
    # A prompt longer than max_length leaves no target: TRL drops the example.
    {"prompt": "The quick brown fox jumps over the lazy dog. " * 3, "completion": " Colossus trains models."},
]
CHAT = [
    {"messages": [{"role": "user", "content": "What is two plus two?"},
                  {"role": "assistant", "content": "The answer is four."}]},
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "café?"},
                  {"role": "assistant", "content": "naïve 中文 🙂"}, {"role": "user", "content": "And?"},
                  {"role": "assistant", "content": "def add(a, b):\n    return a + b\n"}]},
    # Longer than max_length: the second assistant turn is cut.
    {"messages": [{"role": "user", "content": "The quick brown fox."},
                  {"role": "assistant", "content": "The quick brown fox jumps over the lazy dog. " * 3}]},
]
CHAT_PROMPT_COMPLETION = [
    {"prompt": [{"role": "user", "content": "What is two plus two?"}],
     "completion": [{"role": "assistant", "content": "The answer is four."}]},
    {"prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Colossus?"}],
     "completion": [{"role": "assistant", "content": "Trains models in C++."}]},
]
# ChatML with the assistant's content and end of turn in a generation block.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' -}}{% generation %}{{- message['content'] + '<|im_end|>' -}}{% endgeneration %}"
    "{{- '\\n' -}}"
    "{%- else -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")

TEXT = [{"text": "The quick brown fox jumps over the lazy dog."}, {"text": "def add(a, b):\n    return a + b\n"},
        {"text": "Colossus trains models in C++. " * 6}, {"text": "ends with eos</s>"}]


def tokenizer(out_dir: pathlib.Path):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=320, special_tokens=["<s>", "</s>", "<pad>", "<|im_start|>",
                                                                                       "<|im_end|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                        show_progress=False))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir / "tokenizer")
    return fast


def prepared(fast, records, work: str, max_length: int = 24, **options):
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(fast), hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=64))
    args = SFTConfig(output_dir=work, max_length=max_length, report_to=[], use_cpu=True, **options)
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(records), processing_class=fast)
    rows = []
    for row in trainer.train_dataset:
        rows.append({"input_ids": list(row["input_ids"]), "labels": list(row["labels"])})
    return rows


def main() -> int:
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    transformers.logging.set_verbosity_error()
    fast = tokenizer(out_dir)
    with tempfile.TemporaryDirectory() as work:
        cases = (("prompt_completion", PROMPT_COMPLETION, {}), ("text", TEXT, {}),
                 ("chat_all", CHAT, {"max_length": 64}),
                 ("chat_assistant", CHAT, {"max_length": 64, "assistant_only_loss": True}),
                 ("chat_prompt_completion", CHAT_PROMPT_COMPLETION, {"max_length": 64}),
                 ("chat_prompt_completion_assistant", CHAT_PROMPT_COMPLETION,
                  {"max_length": 64, "assistant_only_loss": True}))
        for name, records, options in cases:
            (out_dir / f"{name}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records),
                                                  encoding="utf-8")
            (out_dir / f"{name}.trl.json").write_text(json.dumps(prepared(fast, records, work, **options)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
