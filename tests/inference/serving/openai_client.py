"""The `openai` Python package against `colossus serve`: completions, chat and
streaming through openai.OpenAI(base_url=...), each text checked against the
greedy text the C++ test computed with the library (cases.json).

Usage: openai_client.py BASE_URL MODEL CASES_JSON; prints "ok" and exits 0, or
names the first mismatch and exits 1.
"""
import json
import sys

import openai


def main() -> int:
    base_url, model, cases_path = sys.argv[1:4]
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=60)

    models = [m.id for m in client.models.list().data]
    if models != [model]:
        print(f"models.list() gave {models}, expected [{model!r}]")
        return 1

    for case in cases["completions"]:
        kwargs = dict(model=model, prompt=case["prompt"], max_tokens=case["max_tokens"], temperature=0)
        result = client.completions.create(**kwargs)
        text = result.choices[0].text
        if text != case["expected"]:
            print(f"completion of {case['prompt']!r}: {text!r} != expected {case['expected']!r}")
            return 1
        if result.usage.completion_tokens != case["completion_tokens"] or result.usage.prompt_tokens != case["prompt_tokens"]:
            print(f"completion usage {result.usage} != {case['prompt_tokens']}, {case['completion_tokens']}")
            return 1
        streamed = "".join(chunk.choices[0].text for chunk in client.completions.create(stream=True, **kwargs)
                           if chunk.choices)
        if streamed != case["expected"]:
            print(f"streamed completion of {case['prompt']!r}: {streamed!r} != expected {case['expected']!r}")
            return 1

    for case in cases["chat"]:
        kwargs = dict(model=model, messages=case["messages"], max_tokens=case["max_tokens"], temperature=0)
        result = client.chat.completions.create(**kwargs)
        message = result.choices[0].message
        if message.role != "assistant" or message.content != case["expected"]:
            print(f"chat {case['messages']!r}: {message!r} != expected {case['expected']!r}")
            return 1
        roles, parts, reasons = [], [], []
        for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
            if not chunk.choices:
                usage = chunk.usage
                continue
            delta = chunk.choices[0].delta
            if delta.role:
                roles.append(delta.role)
            if delta.content:
                parts.append(delta.content)
            if chunk.choices[0].finish_reason:
                reasons.append(chunk.choices[0].finish_reason)
        if roles != ["assistant"] or "".join(parts) != case["expected"] or len(reasons) != 1:
            print(f"streamed chat: roles {roles}, text {''.join(parts)!r}, finish {reasons}; expected {case['expected']!r}")
            return 1
        if usage is None or usage.completion_tokens != result.usage.completion_tokens:
            print(f"streamed chat usage {usage} != {result.usage}")
            return 1

    try:
        client.completions.create(model="no-such-model", prompt="x", max_tokens=1)
        print("an unknown model was accepted")
        return 1
    except openai.NotFoundError as e:
        if "no-such-model" not in str(e):
            print(f"unknown model error does not name it: {e}")
            return 1
    try:
        client.completions.create(model=model, prompt="x", max_tokens=-3)
        print("max_tokens=-3 was accepted")
        return 1
    except openai.BadRequestError as e:
        if e.body.get("param") != "max_tokens":
            print(f"max_tokens error has param {e.body.get('param')!r}: {e.body}")
            return 1
    print("ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
