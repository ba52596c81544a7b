#!/usr/bin/env python3
"""Builds the tokenizer fixtures for tests/data/tokenizer_test.cpp in OUT_DIR.

Trains small tokenizers on generated text with the Python `tokenizers` and
`sentencepiece` packages, saves them in the layouts load_tokenizer reads, and
writes OUT_DIR/expected.json with the ids and decoded text that Python's
implementations give for a varied set of texts (the C++ side must match
exactly). Usage: make_tokenizer_fixtures.py OUT_DIR
"""
import copy
import json
import os
import random
import sys

import sentencepiece as spm
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors,
                        trainers)
from transformers import GPT2Tokenizer

GPT2_REGEX = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = LLAMA3_REGEX.replace(r"\p{N}{1,3}", r"\p{N}")
# Digits in pairs, words with their leading space, CJK one character at a time.
CUSTOM_REGEX = r"\p{N}{1,2}|[\p{Han}\p{Hiragana}\p{Katakana}]| ?[\p{L}&&[^\p{Han}]]+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

SNIPPETS = [
    "The quick brown fox jumps over the lazy dog.", "don't", "I'LL", "we've", "they're", "she'd", "it's", "I'm",
    "café", "naïve", "résumé", "Ångström", "Straße", "über", "niño", "Ελληνικά", "русский язык",
    "東京は日本の首都です。", "中文分词测试", "한국어 텍스트", "مرحبا بالعالم", "שלום עולם", "हिन्दी पाठ",
    "😀🎉👍🏽", "👨‍👩‍👧‍👦", "🇩🇪", "x = f(y) + 3.14159;", "def foo(bar):\n\treturn bar * 2\n",
    "https://example.com/path?q=1&r=2", "user@example.org", "$1,234.56", "100%", "2024-01-15", "½ ⅓ ² ³ ٣ ৩",
    "supercalifragilisticexpialidocious", "antidisestablishmentarianism", "  leading", "trailing   ", "\u00a0nbsp",
    "\u3000ideographic space", "line1\r\nline2", "tab\tseparated\tvalues",
]
WORDS = ("time person year way day thing man world life hand part child eye woman place work week case point "
         "government company number group problem fact be have do say get make go know take see come think look "
         "want give use find tell ask seem feel try leave call good new first last long great little own other "
         "old right big high different small large next early young important few public bad same able").split()


def corpus_text(rng, n_lines):
    lines = []
    for _ in range(n_lines):
        parts = []
        for _ in range(rng.randint(3, 14)):
            r = rng.random()
            if r < 0.6:
                w = rng.choice(WORDS)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.75:
                parts.append(rng.choice(SNIPPETS))
            elif r < 0.85:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 7))))
            else:
                parts.append(rng.choice([",", ".", "!", "?", ";", ":", "-", "(", ")", '"', "'"]))
        lines.append(" ".join(parts))
    return lines


def sample_texts(rng):
    texts = [
        "Hello, world!", "don't stop believing; I'LL say it's fine. We've, they're, I'd", "'s 't 're 've 'm 'll 'd",
        "café naïve résumé Ångström", "東京は日本の首都です。中文测试", "مرحبا بالعالم", "😀🎉👍🏽 👨‍👩‍👧‍👦 🇩🇪",
        "   multiple   spaces   ", "tabs\t\tand\tnewlines\n\n\nend", "line1\r\nline2\r\n\r\n", "\n", " ", "",
        "a", "12345678901234567890", "3.14159 2,718 1e-9", "x" * 300, "supercalifragilisticexpialidocious" * 3,
        "before<|endoftext|>after", "<|endoftext|>", "a <|endoftext|> b<|endoftext|><|endoftext|>c",
        "<|endoftext|> leading and trailing <|endoftext|>", "text with <|pad|> inside", "<|endoftext",
        "def foo(bar):\n\treturn bar * 2\n", "  \n  \t x", "\u00a0\u3000\u2028 odd spaces", "½ ⅓ ² ³ ٣ ৩ Ⅻ",
        "MiXeD CaSe 'S 'T 'Re", "éé 東東 😀😀", "ſ 's 'S", "a\u0301 combining", "trailing newline\n",
        "<tool> call <tool>x<tool> magic magically [END]  after", "<|begin_of_text|>hi<|end_of_text|>",
        # Decomposed and compatibility forms (the normalizers' work).
        "e\u0301cole A\u030angstro\u0308m", "\ufb01ne \ufb02ow \u2460\u2461 \uff26\uff55\uff4c\uff4c", "\u1100\u1161\u11a8",
        "\u01c5 \u2126 \u212b \u0344", "n\u0303o\u0308 <|begin_of_text|>e\u0301",
        # SentencePiece-style: its specials and meta space in the text, case mapping, digits and punctuation.
        "<s>hello</s> world<s>", "\u2581already \u2581\u2581spaced\u2581", " one leading", "MAGIC magic Magical",
        "\u0130stanbul \u03a3\u0391\u03a3 \u00c9COLE", "v1.2.3-rc4 (x+y)=[z]; \u00bfque? \u00abguillemets\u00bb",
    ]
    for _ in range(25):
        texts.append(" ".join(corpus_text(rng, 1)) + rng.choice(["", "\n", "  ", "<|endoftext|>", "\t"]))
    texts.append("\n".join(corpus_text(rng, 40)))
    # Short random strings over the characters where the regexes branch.
    pool = list(" \t\n\r\u00a0\u3000'sStTdDlLrevm_aZé中😀1٣½,.!-\u0301") + ["<|endoftext|>", "<|pad|>", "<tool>",
                                                                           "magic", "[END]", "'ll", "'RE"]
    for _ in range(300):
        texts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 24))))
    return texts


def train_byte_level(lines, pre_tokenizer, special_tokens):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=special_tokens, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    return tok


BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]
LLAMA2_DECODER = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    decoders.Strip(content=" ", left=1)])


def state(component):
    """The tokenizer.json spelling of a normalizer, pre-tokenizer or decoder."""
    return json.loads(component.__getstate__())


def train_sentencepiece_style(lines, normalizer, pre_tokenizer):
    """SentencePiece-style BPE as LLaMA-2's tokenizer.json has it: <unk> <s> </s>, the 256 <0xNN> byte
    tokens, then merges over a small alphabet (limit_alphabet), so CJK and emoji fall back to bytes."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=700, limit_alphabet=90, show_progress=False,
                                  special_tokens=["<unk>", "<s>", "</s>"] + BYTE_TOKENS)
    tok.train_from_iterator(lines, trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    # The byte tokens are vocabulary, not added tokens.
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in ("<unk>", "<s>", "</s>")]
    return spec


def from_spec(spec, **parts):
    """A tokenizer from a tokenizer.json dict with some components replaced (None: removed)."""
    spec = copy.deepcopy(spec)
    for key, value in parts.items():
        spec[key] = state(value) if value is not None and not isinstance(value, dict) else value
    return Tokenizer.from_str(json.dumps(spec)), spec


def component_cases(texts, llama_tok):
    """Normalizers, pre-tokenizers and decoders alone, as tokenizers runs them."""
    norms = [normalizers.Lowercase(), normalizers.Strip(left=True, right=False), normalizers.Strip(),
             normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581"), normalizers.Replace("ab", "X"),
             normalizers.Replace(Regex(r"\s+"), " "), normalizers.Replace(Regex(r"\A +| +\z"), ""),
             normalizers.Replace(Regex(r"x*"), "-"), normalizers.Replace(Regex(r"\A\u2581"), "\u2581\u2581"),
             normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Prepend("\u2581"),
                                   normalizers.Replace(" ", "\u2581")])]
    pres = [pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)
            for scheme in ("always", "first", "never") for split in (True, False)]
    pres += [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.Digits(individual_digits=False),
             pre_tokenizers.Whitespace(), pre_tokenizers.WhitespaceSplit()]
    pres += [pre_tokenizers.Punctuation(behavior=b) for b in ("isolated", "removed", "contiguous",
                                                             "merged_with_previous", "merged_with_next")]
    for pattern in (Regex(r"\s+"), Regex(r"\p{N}|x*"), " ", Regex(r"[aeiou]")):
        for behavior in ("removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"):
            pres += [pre_tokenizers.Split(pattern, behavior=behavior, invert=invert) for invert in (False, True)]
    pres += [pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]),
             pre_tokenizers.Sequence([pre_tokenizers.Metaspace(prepend_scheme="first"),
                                      pre_tokenizers.Split(Regex("<s>|\u2581\u2581"), behavior="isolated")])]
    decs = [LLAMA2_DECODER, decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(content="\u2581", left=2),
            decoders.Replace(Regex("\u2581+"), "_"), decoders.Metaspace(),
            decoders.Metaspace(prepend_scheme="never"),
            decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(prepend_scheme="first")])]
    token_lists = [llama_tok.encode(text).tokens for text in texts[:120]]
    token_lists += [["<0xE4>", "<0xB8>", "a", "<0xE4>", "<0xB8>", "<0xAD>", "<0x0a>", "<0xFF>"], ["<0x+A>", "<0xzz>"],
                    ["\u2581\u2581", "\u2581a", "b\u2581"], [], [""], ["\u2581"]]
    return {
        "normalizers": [{"json": state(n), "outputs": [n.normalize_str(t) for t in texts]} for n in norms],
        "pre_tokenizers": [{"json": state(p), "outputs": [[piece for piece, _ in p.pre_tokenize_str(t)]
                                                          for t in texts]} for p in pres],
        "decoders": [{"json": state(d), "cases": [{"tokens": tokens, "text": d.decode(tokens)}
                                                  for tokens in token_lists]} for d in decs],
    }


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def save(tok, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tok.save(path)


def sentencepiece_roundtrip(text):
    """Whether decode(encode(text)) gives text back for a SentencePiece-style tokenizer: not when the text
    holds the meta space or a special token (they come back as a space and with spaces around)."""
    return not any(s in text for s in ("\u2581", "<s>", "</s>"))


def byte_offsets(text, char_offsets):
    """tokenizers' offsets (code points) as UTF-8 byte offsets."""
    starts = [0]
    for ch in text:
        starts.append(starts[-1] + len(ch.encode("utf-8")))
    return [[starts[b], starts[e]] for b, e in char_offsets]


def hf_entry(name, path, tok, texts, corpus, roundtrip, bos, eos, pad):
    """roundtrip: True, False, or a function of the text."""
    vocab = tok.get_vocab()
    entry = {"name": name, "path": path, "vocab_size": tok.get_vocab_size(),
             "bos": vocab.get(bos) if bos else None, "eos": vocab.get(eos) if eos else None,
             "pad": vocab.get(pad) if pad else None, "cases": [],
             "vocab_sample": sorted(vocab.items(), key=lambda kv: kv[1])[::23],
             "corpus_ids": tok.encode(corpus, add_special_tokens=False).ids,
             "corpus_roundtrip": roundtrip(corpus) if callable(roundtrip) else roundtrip}
    for text in texts:
        encoding = tok.encode(text, add_special_tokens=False)
        ids = encoding.ids
        ids_special = tok.encode(text, add_special_tokens=True).ids
        entry["cases"].append({"text": text, "ids": ids, "ids_special": ids_special,
                               "byte_offsets": byte_offsets(text, encoding.offsets),
                               "decoded": tok.decode(ids, skip_special_tokens=False),
                               "decoded_special_skip": tok.decode(ids_special, skip_special_tokens=True),
                               "roundtrip": roundtrip(text) if callable(roundtrip) else roundtrip})
    return entry


def transformers_entry(name, path, tk, texts, corpus):
    vocab = tk.get_vocab()
    entry = {"name": name, "path": path, "vocab_size": len(tk), "bos": tk.bos_token_id,
             "eos": tk.eos_token_id, "pad": tk.pad_token_id, "cases": [],
             "vocab_sample": sorted(vocab.items(), key=lambda kv: kv[1])[::23],
             "corpus_ids": tk(corpus, add_special_tokens=False)["input_ids"]}
    for text in texts:
        ids = tk(text, add_special_tokens=False)["input_ids"]
        ids_special = tk(text, add_special_tokens=True)["input_ids"]
        entry["cases"].append({"text": text, "ids": ids, "ids_special": ids_special,
                               "decoded": tk.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False),
                               "decoded_special_skip": tk.decode(ids_special, skip_special_tokens=True,
                                                                 clean_up_tokenization_spaces=False),
                               "roundtrip": True})
    return entry


def sentencepiece_entry(name, path, sp, texts, corpus):
    def opt(i):
        return i if i >= 0 else None
    entry = {"name": name, "path": path, "vocab_size": sp.get_piece_size(),
             "bos": opt(sp.bos_id()), "eos": opt(sp.eos_id()), "pad": opt(sp.pad_id()), "cases": [],
             "vocab_sample": [[sp.id_to_piece(i), i] for i in range(0, sp.get_piece_size(), 37)
                              if not sp.is_unknown(i)],
             "corpus_ids": sp.encode(corpus)}
    for text in texts:
        ids = sp.encode(text)
        ids_special = sp.encode(text, add_bos=True)
        entry["cases"].append({"text": text, "ids": ids, "ids_special": ids_special, "decoded": sp.decode(ids),
                               "decoded_special_skip": sp.decode(ids_special), "roundtrip": False})
    return entry


def main():
    out = sys.argv[1]
    rng = random.Random(1234)
    lines = corpus_text(rng, 3000) + SNIPPETS * 5
    texts = sample_texts(rng)
    entries = []
    # The training text; also encoded whole as one long input.
    corpus = "\n".join(lines)
    write(os.path.join(out, "corpus.txt"), corpus)

    # GPT-2 style: ByteLevel pre-tokenizer with the GPT-2 regex.
    gpt2 = train_byte_level(lines, pre_tokenizers.ByteLevel(add_prefix_space=False), ["<|endoftext|>"])
    gpt2.post_processor = processors.ByteLevel(trim_offsets=False)
    gpt2.add_special_tokens(["<|pad|>"])
    save(gpt2, os.path.join(out, "gpt2_json", "tokenizer.json"))
    entries.append(hf_entry("gpt2_json", "gpt2_json", gpt2, texts, corpus, True, "<|endoftext|>", "<|endoftext|>",
                            None))

    # The same tokenizer with merges in the legacy "a b" form, loaded as a file.
    legacy = json.loads(gpt2.to_str())
    legacy["model"]["merges"] = [" ".join(m) for m in legacy["model"]["merges"]]
    write(os.path.join(out, "legacy", "gpt2_legacy.json"), json.dumps(legacy, ensure_ascii=False))
    legacy_tok = Tokenizer.from_str(json.dumps(legacy))
    entries.append(hf_entry("gpt2_legacy_merges", "legacy/gpt2_legacy.json", legacy_tok, texts, corpus, True,
                            "<|endoftext|>", "<|endoftext|>", None))

    # GPT-2's original layout: vocab.json + merges.txt, checked by transformers.
    os.makedirs(os.path.join(out, "gpt2_files"), exist_ok=True)
    gpt2.model.save(os.path.join(out, "gpt2_files"))
    tk = GPT2Tokenizer.from_pretrained(os.path.join(out, "gpt2_files"))
    entries.append(transformers_entry("gpt2_files", "gpt2_files", tk, texts, corpus))

    # Added-token options, add_prefix_space, and a tokenizer_config naming pad.
    added = Tokenizer.from_str(gpt2.to_str())
    added.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    added.add_tokens([AddedToken("<tool>", lstrip=True), AddedToken("magic", single_word=True)])
    added.add_special_tokens([AddedToken("[END]", rstrip=True)])
    save(added, os.path.join(out, "gpt2_added", "tokenizer.json"))
    write(os.path.join(out, "gpt2_added", "tokenizer_config.json"),
          json.dumps({"bos_token": None, "eos_token": {"content": "[END]"}, "pad_token": "<|pad|>"}))
    entries.append(hf_entry("gpt2_added", "gpt2_added", added, texts, corpus, False, None, "[END]", "<|pad|>"))

    # LLaMA-3 style: Split with its regex, ByteLevel without regex, a BOS
    # template, ignore_merges.
    llama_pre = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated"),
                                         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama = train_byte_level(lines, llama_pre, ["<|begin_of_text|>", "<|end_of_text|>"])
    llama.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", llama.token_to_id("<|begin_of_text|>"))])
    llama_json = json.loads(llama.to_str())
    llama_json["model"]["ignore_merges"] = True
    llama = Tokenizer.from_str(json.dumps(llama_json))
    save(llama, os.path.join(out, "llama3_json", "tokenizer.json"))
    write(os.path.join(out, "llama3_json", "tokenizer_config.json"),
          json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                      "pad_token": "<|end_of_text|>"}))
    entries.append(hf_entry("llama3_json", "llama3_json", llama, texts, corpus, True, "<|begin_of_text|>",
                            "<|end_of_text|>", "<|end_of_text|>"))

    # Qwen2's regex (single digits), same vocabulary.
    qwen_json = copy.deepcopy(llama_json)
    qwen_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = QWEN2_REGEX
    qwen_json["model"]["ignore_merges"] = False
    qwen = Tokenizer.from_str(json.dumps(qwen_json))
    save(qwen, os.path.join(out, "qwen2_json", "tokenizer.json"))
    entries.append(hf_entry("qwen2_json", "qwen2_json", qwen, texts, corpus, True, "<|begin_of_text|>", None, None))

    # Qwen2's normalizer (NFC), and compatibility forms through a Sequence:
    # decode gives the normalized text, so no round trip.
    for name, normalizer in [("qwen2_nfc", {"type": "NFC"}),
                             ("qwen2_nfkc", {"type": "Sequence", "normalizers": [{"type": "NFD"}, {"type": "NFKC"}]})]:
        normalized_json = copy.deepcopy(qwen_json)
        normalized_json["normalizer"] = normalizer
        normalized = Tokenizer.from_str(json.dumps(normalized_json))
        save(normalized, os.path.join(out, name, "tokenizer.json"))
        entries.append(hf_entry(name, name, normalized, texts, corpus, False, "<|begin_of_text|>", None, None))

    # A Split regex none of the hand-written pre-tokenizers spells (Oniguruma).
    custom_json = copy.deepcopy(qwen_json)
    custom_json["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = CUSTOM_REGEX
    custom = Tokenizer.from_str(json.dumps(custom_json))
    save(custom, os.path.join(out, "custom_regex", "tokenizer.json"))
    entries.append(hf_entry("custom_regex", "custom_regex", custom, texts, corpus, True, "<|begin_of_text|>", None,
                            None))

    # A ByteLevel pre-tokenizer after Digits, same vocabulary as GPT-2.
    gpt2_digits, _ = from_spec(json.loads(gpt2.to_str()), pre_tokenizer=pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]))
    save(gpt2_digits, os.path.join(out, "gpt2_digits", "tokenizer.json"))
    entries.append(hf_entry("gpt2_digits", "gpt2_digits", gpt2_digits, texts, corpus, True, "<|endoftext|>",
                            "<|endoftext|>", None))

    # SentencePiece-style BPE in tokenizer.json. LLaMA-2 / Phi-3 / Mistral-v0.1: Prepend + Replace normalizer,
    # no pre-tokenizer, byte fallback, the four-decoder Sequence, <s> template.
    llama2_norm = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    llama2_spec = train_sentencepiece_style(
        lines, llama2_norm, pre_tokenizers.Metaspace(prepend_scheme="never", split=True))
    llama2, llama2_spec = from_spec(llama2_spec, pre_tokenizer=None, decoder=LLAMA2_DECODER)
    save(llama2, os.path.join(out, "llama2_json", "tokenizer.json"))
    write(os.path.join(out, "llama2_json", "tokenizer_config.json"),
          json.dumps({"bos_token": "<s>", "eos_token": "</s>", "pad_token": None}))
    entries.append(hf_entry("llama2_json", "llama2_json", llama2, texts, corpus, sentencepiece_roundtrip, "<s>",
                            "</s>", None))
    # The same directory with the tokenizer.model it came from: tokenizer.json is still the one read.
    write(os.path.join(out, "llama2_json", "tokenizer.model"), "not read")

    # Gemma: Replace-only normalizer (no dummy prefix), decoder without Strip; and ignore_merges.
    gemma_spec = copy.deepcopy(llama2_spec)
    gemma_spec["model"]["ignore_merges"] = True
    gemma, _ = from_spec(gemma_spec, normalizer=normalizers.Replace(" ", "\u2581"), decoder=decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]))
    save(gemma, os.path.join(out, "gemma_json", "tokenizer.json"))
    entries.append(hf_entry("gemma_json", "gemma_json", gemma, texts, corpus, sentencepiece_roundtrip, "<s>", None,
                            None))

    # Newer converters: no normalizer, a Metaspace pre-tokenizer (prepend_scheme first, split false). Decode
    # strips the space that a leading space became, as tokenizers does.
    metaspace, _ = from_spec(llama2_spec, normalizer=None,
                             pre_tokenizer=pre_tokenizers.Metaspace(prepend_scheme="first", split=False))
    save(metaspace, os.path.join(out, "metaspace_json", "tokenizer.json"))
    entries.append(hf_entry("metaspace_json", "metaspace_json", metaspace, texts, corpus,
                            lambda t: sentencepiece_roundtrip(t) and not t.startswith(" "), "<s>", None, None))

    # Digits / Punctuation / Whitespace pre-tokenizers over a normalizer Sequence (NFKC, Lowercase, Strip,
    # a Regex Replace), no decoder; <unk> (fused) for the 4-byte chars whose byte tokens are missing, and a
    # normalized added token whose content the normalizer lowercases.
    words_norm = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
                                       normalizers.Replace(Regex(" {2,}"), " ")])
    words_pre = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True),
                                         pre_tokenizers.Punctuation()])
    words_spec = train_sentencepiece_style(lines, words_norm, words_pre)
    for b in range(0xF0, 0xF5):
        words_spec["model"]["vocab"][f"<x{b:02X}>"] = words_spec["model"]["vocab"].pop(f"<0x{b:02X}>")
    words, _ = from_spec(words_spec, decoder=None)
    words.add_tokens([AddedToken("MAGIC", normalized=True)])
    save(words, os.path.join(out, "words_json", "tokenizer.json"))
    entries.append(hf_entry("words_json", "words_json", words, texts, corpus, False, "<s>", None, None))

    # SentencePiece: LLaMA-2 style BPE with byte fallback, and unigram.
    os.makedirs(os.path.join(out, "sp_bpe"), exist_ok=True)
    for model_type, prefix, extra in [("bpe", os.path.join(out, "sp_bpe", "tokenizer"), {"byte_fallback": True}),
                                      ("unigram", os.path.join(out, "unigram"), {})]:
        spm.SentencePieceTrainer.train(input=os.path.join(out, "corpus.txt"), model_prefix=prefix, vocab_size=1000, model_type=model_type,
                                       character_coverage=0.9995, minloglevel=2, num_threads=1, **extra)
    sp_bpe = spm.SentencePieceProcessor(model_file=os.path.join(out, "sp_bpe", "tokenizer.model"))
    entries.append(sentencepiece_entry("sp_bpe", "sp_bpe", sp_bpe, texts, corpus))
    sp_uni = spm.SentencePieceProcessor(model_file=os.path.join(out, "unigram.model"))
    entries.append(sentencepiece_entry("sp_unigram", "unigram.model", sp_uni, texts, corpus))

    # Error cases.
    write(os.path.join(out, "bad", "malformed", "tokenizer.json"), '{"model": {"type": "BPE", "vocab": {')
    wordpiece = {"version": "1.0", "added_tokens": [], "normalizer": None, "pre_tokenizer": None,
                 "post_processor": None, "decoder": None,
                 "model": {"type": "WordPiece", "unk_token": "[UNK]", "vocab": {"[UNK]": 0, "a": 1}}}
    write(os.path.join(out, "bad", "wordpiece", "tokenizer.json"), json.dumps(wordpiece))
    os.makedirs(os.path.join(out, "bad", "empty_dir"), exist_ok=True)

    # The pre-tokenizer regexes alone, as Oniguruma (inside `tokenizers`) splits.
    splits = {}
    for name, regex in [("gpt2", GPT2_REGEX), ("llama3", LLAMA3_REGEX), ("qwen2", QWEN2_REGEX)]:
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated")
        splits[name] = [[piece for piece, _ in split.pre_tokenize_str(text)] for text in texts]

    write(os.path.join(out, "expected.json"),
          json.dumps({"texts": texts, "splits": splits, "tokenizers": entries, **component_cases(texts, llama2)},
                     ensure_ascii=False))


if __name__ == "__main__":
    main()
