#!/usr/bin/env python3
"""Regenerates the ds4-text fixtures from transformers (the oracle).

    tools/oracle/.venv/bin/python tools/oracle/text/generate.py

Writes the corpus (tests/fixtures/text/corpus.jsonl, from make_corpus.py), reads the default model GGUF
(~/.cache/ds4server/models/SmolLM2-135M-Instruct.Q4_1.gguf, or $DS4_TEXT_GGUF), writes:

* smollm_gguf_ids.jsonl: per corpus string, the ids of
  `AutoTokenizer.from_pretrained(dir, gguf_file=name)` with default settings (control tokens
  written in the text are parsed, `add_special_tokens=True`, which adds nothing because the file
  says add_bos=false), the ids with `split_special_tokens=True` (control-token text encoded as
  plain text), and transformers' decode of the ids.
* pre_variants_ids.jsonl: the same vocabulary and merges with `tokenizer.ggml.pre` replaced by
  each pre-tokenizer name we support (and one variant marking a few tokens user-defined), built
  through transformers' own GGUF converter (`get_gguf_tokenizer` + `convert_gguf_tokenizer`).
  No other GGUF is needed: the Rust test edits the metadata of the default model the same way.
* add_bos_eos_ids.jsonl: a metadata-only GGUF written here (default model's tokenizer, pre
  llama-bpe, add_bos_token and add_eos_token set) loaded by AutoTokenizer; `encode(text)` ids,
  which then carry bos and eos.
* smollm_chat_template.jsonl: `apply_chat_template(..., tokenize=False)` for several
  conversations with the GGUF's template, plus small templates that exercise tojson,
  raise_exception, trim/lstrip blocks, pycompat string methods and tools.
"""
import json
import os
import pathlib
import sys
import tempfile

from gguf import GGUFReader, GGUFValueType, GGUFWriter

from transformers import AutoTokenizer

import make_corpus  # noqa: E402  (same folder; Python puts the script's folder on sys.path)
from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer, get_gguf_tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIX = ROOT / "tests/fixtures/text"
GGUF = pathlib.Path(
    os.environ.get("DS4_TEXT_GGUF", pathlib.Path.home() / ".cache/ds4server/models/SmolLM2-135M-Instruct.Q4_1.gguf")
)

# Each variant: (name, pre, ids of tokens re-marked user-defined (type 4)).
# 274 "ing", 764 "ll", 845 "own": marking them user-defined makes
# them match whole in the text, as llama.cpp and transformers both do for type 4.
VARIANTS = [
    ("smollm", "smollm", []),
    ("default", "default", []),
    ("gpt-2", "gpt-2", []),
    ("llama-bpe", "llama-bpe", []),
    ("llama3", "llama3", []),
    ("qwen2", "qwen2", []),
    ("deepseek-v3", "deepseek-v3", []),
    ("deepseek-llm", "deepseek-llm", []),
    ("smollm+user-defined", "smollm", [274, 764, 845]),
]

GENERIC_TEMPLATES = {
    # Exercises trim_blocks/lstrip_blocks (block tags on their own indented lines),
    # loop controls, pycompat methods and the generation prompt.
    "blocks": (
        "{%- for m in messages %}\n"
        "    {% if m.role == 'system' %}\n"
        "[SYS] {{ m.content.strip() | upper }}\n"
        "    {% else %}\n"
        "<{{ m['role'] }}>{{ m.content.replace('\\n', ' ') }}</{{ m['role'] }}>\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}<assistant>{% endif %}\n"
    ),
    # tojson (transformers' own filter: ensure_ascii=False, no HTML escaping, Python separators).
    "tojson": (
        "{{ bos_token }}{% if tools %}TOOLS: {{ tools | tojson }}\n"
        "INDENTED: {{ tools[0] | tojson(indent=2) }}\n{% endif %}"
        "{% for m in messages %}{{ m | tojson }}\n{% endfor %}{{ eos_token }}"
    ),
    "raise": (
        "{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}"
        "{{ raise_exception('Only user and assistant roles are supported, got ' + m.role) }}"
        "{% endif %}{{ m.content }}{% endfor %}"
    ),
    # Python string methods through pycompat, namespace, slicing, loop vars.
    "pycompat": (
        "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
        "{{ loop.index }}:{{ m.role.title() }}:{{ m.content.lower() }}|{{ m.content.split(' ')[0] }}"
        "|{{ m.content.startswith('Hi') }}|{{ m.content[:3] }}|{{ m.content.lstrip().rstrip('!') }}\n"
        "{% endfor %}count={{ ns.n }} last={{ messages[-1].role }}"
    ),
    # A Qwen2.5-style tools template: tool schemas, assistant tool calls with `tojson`
    # arguments, grouped tool responses, `is defined`, `default`, loop.index0 look-behind.
    "tools": (
        "{%- if tools %}\n"
        "{{- '<|im_start|>system\\n' }}\n"
        "{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}\n"
        "{{- '# Tools\\n\\n<tools>' }}\n"
        "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}\n"
        "{{- '\\n</tools><|im_end|>\\n' }}\n"
        "{%- elif messages[0].role == 'system' %}\n"
        "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
        "{%- else %}\n"
        "{{- '<|im_start|>system\\nYou are helpful.<|im_end|>\\n' }}\n"
        "{%- endif %}\n"
        "{%- for message in messages %}\n"
        "  {%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}\n"
        "    {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}\n"
        "  {%- elif message.role == 'assistant' %}\n"
        "    {{- '<|im_start|>' + message.role }}\n"
        "    {%- if message.content %}{{- '\\n' + message.content }}{%- endif %}\n"
        "    {%- for tool_call in message.tool_calls | default([]) %}\n"
        "      {%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}\n"
        "      {{- '\\n<tool_call>\\n{\"name\": \"' + tool_call.name + '\", \"arguments\": ' }}\n"
        "      {{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}\n"
        "    {%- endfor %}\n"
        "    {{- '<|im_end|>\\n' }}\n"
        "  {%- elif message.role == 'tool' %}\n"
        "    {%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}\n"
        "    {{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}\n"
        "    {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}\n"
        "  {%- endif %}\n"
        "{%- endfor %}\n"
        "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}\n"
        "{# strftime_now: the date varies, its length does not #}{{ '' if (strftime_now('%d %b %Y') | length) == 11 else 'bad date' }}"
    ),
}

# Conversations only the tools template can render (content null, tool calls, tool role).
TOOL_CONVERSATIONS = {
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Zürich and Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich", "days": 2}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            ],
        },
        {"role": "tool", "content": "{\"temp\": 3.5}"},
        {"role": "tool", "content": "sunny, 12 °C"},
        {"role": "assistant", "content": "Zürich 3.5 °C, Paris sunny."},
        {"role": "user", "content": "Thanks"},
    ],
}

CONVERSATIONS = {
    "user_only": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is 2+2?"},
    ],
    "multi_turn": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke.\nA short one."},
    ],
    "system_multi_turn": [
        {"role": "system", "content": "  Be nice!  "},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hey."},
        {"role": "user", "content": "Unicode: 你好 😀 <b>&amp;</b> \"quoted\""},
    ],
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city, in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
                "required": ["city"],
            },
        },
    }
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    print(f"{len(rows)} rows -> {path.relative_to(ROOT)}")


# Metadata the add-bos/eos file overrides; the Rust test applies the same edits.
ADD_BOS_EOS_OVERRIDES = {
    "tokenizer.ggml.pre": "llama-bpe",
    "tokenizer.ggml.add_bos_token": True,
    "tokenizer.ggml.add_eos_token": True,
}


def write_tokenizer_only_gguf(path, overrides):
    """Copies the default model's tokenizer.* and llama.* metadata (no tensors) with overrides."""
    reader = GGUFReader(str(GGUF))
    writer = GGUFWriter(str(path), "llama")
    seen = set()
    for name, field in reader.fields.items():
        if not (name.startswith("tokenizer.") or name.startswith("llama.")):
            continue
        seen.add(name)
        kind = field.types[0]
        sub = field.types[1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, overrides.get(name, field.contents()), kind, sub_type=sub)
    for name, value in overrides.items():
        if name not in seen:
            writer.add_key_value(name, value, GGUFValueType.BOOL if isinstance(value, bool) else GGUFValueType.STRING)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main():
    make_corpus.write()
    # split("\n"), not splitlines(): the corpus holds U+2028 and friends unescaped.
    corpus = [json.loads(line) for line in (FIX / "corpus.jsonl").read_text(encoding="utf-8").split("\n") if line]
    tok = AutoTokenizer.from_pretrained(str(GGUF.parent), gguf_file=GGUF.name)
    assert not tok.add_bos_token, "the default model says add_bos=false; fixtures assume it"

    rows = []
    for text in corpus:
        ids = tok.encode(text)  # add_special_tokens=True: adds nothing for this file
        plain = tok(text, split_special_tokens=True)["input_ids"]
        rows.append(
            {
                "text": text,
                "ids": ids,
                "ids_plain": plain,
                "decoded": tok.decode(ids),
                "decoded_skip_special": tok.decode(ids, skip_special_tokens=True),
            }
        )
    write_jsonl(FIX / "smollm_gguf_ids.jsonl", rows)

    architecture, base_dict, _ = get_gguf_tokenizer(str(GGUF))
    variant_rows = []
    for name, pre, user_defined in VARIANTS:
        d = dict(base_dict, pre_tokenizer_type=pre)
        types = list(d["token_type"])
        for i in user_defined:
            types[i] = 4
        d["token_type"] = types
        backend, _ = convert_gguf_tokenizer(architecture, d)
        ids = [backend.encode(text, add_special_tokens=False).ids for text in corpus]
        variant_rows.append({"variant": name, "pre": pre, "user_defined": user_defined, "ids": ids})
    write_jsonl(FIX / "pre_variants_ids.jsonl", variant_rows)

    with tempfile.TemporaryDirectory() as tmp:
        write_tokenizer_only_gguf(pathlib.Path(tmp) / "add_bos_eos.gguf", ADD_BOS_EOS_OVERRIDES)
        synth = AutoTokenizer.from_pretrained(tmp, gguf_file="add_bos_eos.gguf")
        assert synth.add_bos_token
        write_jsonl(
            FIX / "add_bos_eos_ids.jsonl",
            [{"overrides": ADD_BOS_EOS_OVERRIDES}] + [{"text": t, "ids": synth.encode(t)} for t in corpus],
        )

    cases = []
    for conv_name, conv in CONVERSATIONS.items():
        for agp in (False, True):
            out = tok.apply_chat_template(conv, tokenize=False, add_generation_prompt=agp)
            cases.append(
                {"name": f"gguf/{conv_name}/agp={agp}", "template": None, "messages": conv,
                 "add_generation_prompt": agp, "tools": None, "expected": out}
            )
    for tname, source in GENERIC_TEMPLATES.items():
        convs = dict(CONVERSATIONS, **(TOOL_CONVERSATIONS if tname == "tools" else {}))
        for conv_name, conv in convs.items():
            for agp, tools in ((False, None), (True, TOOLS if tname in ("tojson", "tools") else None)):
                case = {"name": f"{tname}/{conv_name}/agp={agp}", "template": source, "messages": conv,
                        "add_generation_prompt": agp, "tools": tools}
                try:
                    case["expected"] = tok.apply_chat_template(
                        conv, chat_template=source, tools=tools, tokenize=False, add_generation_prompt=agp
                    )
                except Exception as err:  # raise_exception: the message must reach the user
                    case["error"] = str(err)
                cases.append(case)
    write_jsonl(FIX / "smollm_chat_template.jsonl", cases)
    write_jsonl(
        FIX / "smollm_special.jsonl",
        [{"bos_token": tok.bos_token, "eos_token": tok.eos_token, "unk_token": tok.unk_token,
          "pad_token": tok.pad_token, "vocab_size": len(tok), "chat_template": tok.chat_template}],
    )


if __name__ == "__main__":
    sys.exit(main())
