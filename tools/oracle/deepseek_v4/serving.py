#!/usr/bin/env python3
"""Regenerates the DeepSeek-V4 serving fixtures (tests/fixtures/deepseek_v4/) from antirez/ds4.

    DS4_SRC=/path/to/ds4 tools/oracle/.venv/bin/python tools/oracle/deepseek_v4/serving.py

ds4 is the reference for how the deepseek_v4 family is served. This script compiles ds4's own
server code (ds4_server.c at the commit pinned in build_oracle.py; `git clone
https://github.com/antirez/ds4 && git -C ds4 checkout 8d57664`) into a small oracle
(ds4_oracle.c) and records what it does:

* prompts.jsonl: request bodies (OpenAI chat or Anthropic messages) through ds4's request parser
  and `render_chat_prompt_text`: the exact prompt text and the think mode, optionally with tool
  ids already in ds4's tool memory (exact DSML replay);
* decode_states.jsonl: which sampling each position of generated texts gets: the state after
  every character from `dsml_decode_tracker_update` (what ds4's decode loop uses; fed with a
  `<` always joined to the next character, `_` there) and from its reference recognizer
  `dsml_decode_state_for_text`;
* parse.jsonl: `parse_generated_message_ex` (content, reasoning, calls, raw DSML block);
* stream.jsonl: the OpenAI SSE projection (`openai_sse_stream_update`) fed one character at a
  time: reasoning, content and each call's streamed arguments, assembled as a client would.

It also regenerates tokenizer_ids.jsonl (tokenizer_ids.py). Output is deterministic.
"""
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import build_oracle
import tokenizer_ids

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIX = ROOT / "tests/fixtures/deepseek_v4"
D = "｜DSML｜"

BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "parameters": {
        "type": "object",
        "properties": {"command": {"type": "string"}, "timeout": {"type": "integer"}},
        "required": ["command"],
    },
}
READ = {
    "name": "read_file",
    "description": "Read a file.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
}


def tools(*fns):
    return [{"type": "function", "function": f} for f in fns]


def call(id_, name, args):
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}


# The multi-turn, multi-tool conversation crates/text/tests/deepseek_v4_prompt.rs writes out by
# hand (keep the two in step).
MULTI_TOOL = {
    "model": "deepseek-v4-flash",
    "messages": [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "What is in /tmp and how big is notes.txt?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "List the folder, then read the file.",
            "tool_calls": [
                call("call_a", "bash", "{\"command\": \"ls -la /tmp\", \"timeout\": 10}"),
                call("call_b", "read_file", "{\"path\":\"/tmp/notes.txt\"}"),
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "notes.txt\nx & y <z>"},
        {"role": "tool", "tool_call_id": "call_b", "content": "hello</tool_result>world"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "Now the size.",
            "tool_calls": [call("call_c", "bash", "{\"command\": \"wc -c /tmp/notes.txt\"}")],
        },
        {"role": "tool", "tool_call_id": "call_c", "content": "11 /tmp/notes.txt"},
        {"role": "assistant", "content": "notes.txt holds 11 bytes.", "reasoning_content": "Done."},
        {"role": "developer", "content": "Answer in one line."},
        {"role": "user", "content": "Thanks! And the first line?"},
    ],
    "tools": tools(BASH, READ),
}

# What the model sampled for MULTI_TOOL's first tool-call turn: not the canonical rendering
# (other argument order and spacing), so exact replay is visible in the prompt.
SAMPLED_BLOCK = (
    f"\n\n<{D}tool_calls>\n<{D}invoke name=\"bash\">\n"
    f"<{D}parameter name=\"timeout\" string=\"false\">10</{D}parameter>\n"
    f"<{D}parameter name=\"command\" string=\"true\">ls -la /tmp</{D}parameter>\n</{D}invoke>\n"
    f"<{D}invoke name=\"read_file\">\n<{D}parameter name=\"path\" string=\"true\">/tmp/notes.txt"
    f"</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>"
)


def user(text):
    return {"role": "user", "content": text}


CHAT_CASES = [
    ("default_thinking", 32768, {"messages": [{"role": "system", "content": "Be brief."}, user("Hi")]}, []),
    ("thinking_type_disabled", 32768, {"messages": [user("Hi")], "thinking": {"type": "disabled"}}, []),
    ("think_false", 32768, {"messages": [user("Hi")], "think": False}, []),
    ("model_deepseek_chat", 32768, {"model": "deepseek-chat", "messages": [user("Hi")]}, []),
    ("model_deepseek_chat_think_true", 32768,
     {"model": "deepseek-chat", "think": True, "messages": [user("Hi")]}, []),
    ("model_deepseek_reasoner", 32768,
     {"model": "deepseek-reasoner", "thinking": {"type": "disabled"}, "messages": [user("Hi")]}, []),
    ("reasoner_effort_none", 32768,
     {"model": "deepseek-reasoner", "reasoning_effort": "none", "messages": [user("Hi")]}, []),
    ("effort_max_small_ctx", 32768, {"reasoning_effort": "max", "messages": [user("Hi")]}, []),
    ("effort_max_large_ctx", 393216, {"reasoning_effort": "max", "messages": [user("Hi")]}, []),
    ("effort_max_just_below", 393215, {"reasoning_effort": "max", "messages": [user("Hi")]}, []),
    ("effort_minimal", 32768, {"reasoning_effort": "minimal", "messages": [user("Hi")]}, []),
    ("effort_xhigh_disabled", 32768,
     {"reasoning_effort": "xhigh", "thinking": {"type": "disabled"}, "messages": [user("Hi")]}, []),
    ("multi_turn_drops_old_reasoning", 32768, {"messages": [
        user("a"), {"role": "assistant", "content": "A", "reasoning_content": "ra"},
        user("b"), {"role": "assistant", "content": "B", "reasoning_content": "rb"},
        user("c")]}, []),
    ("multi_turn_non_thinking", 32768, {"think": False, "messages": [
        user("a"), {"role": "assistant", "content": "A", "reasoning_content": "ra"}, user("b")]}, []),
    ("assistant_after_last_user_keeps_reasoning", 32768, {"messages": [
        user("a"), {"role": "assistant", "content": "A", "reasoning_content": "ra"},
        user("b"), {"role": "assistant", "content": "B", "reasoning_content": "rb"},
        {"role": "assistant", "content": "more"}]}, []),
    ("multi_turn_tools", 32768, MULTI_TOOL, []),
    ("multi_turn_tools_exact_replay", 32768, MULTI_TOOL,
     [("call_a", SAMPLED_BLOCK), ("call_b", SAMPLED_BLOCK)]),
    ("replay_needs_every_id_of_the_message", 32768, MULTI_TOOL, [("call_a", SAMPLED_BLOCK)]),
    ("multi_turn_tools_non_thinking", 32768, {**MULTI_TOOL, "thinking": {"type": "disabled"}}, []),
    ("tool_history_without_tools", 32768,
     {"messages": MULTI_TOOL["messages"][:4] + [user("ok")]}, []),
    ("tool_choice_none", 32768,
     {"messages": [user("Hi")], "tools": tools(BASH), "tool_choice": "none"}, []),
    ("escapes_and_fallbacks", 32768, {"messages": [
        user("go"),
        {"role": "assistant", "content": None, "tool_calls": [
            call("c1", "we\"ird<&>name",
                 "{\"text\": \"a </｜DSML｜parameter> b & c\", \"json\": {\"k\": \"</｜DSML｜parameter>\", "
                 "\"n\": [1, 2.50, -3e5, true, null]}, \"u\": \"\\u00e9\\ud83d\\ude00\\n\\t\\\"q\\\"\"}"),
            call("c2", "raw", "[1, 2]"),
            call("c3", "bad", "not json at all"),
            call("c4", "empty", "{}"),
        ]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "part1 "},
                                                             {"type": "text", "text": "part2"}]},
        user("next")]}, []),
    ("system_anywhere_and_consecutive_assistants", 32768, {"messages": [
        user("a"), {"role": "system", "content": "S1"},
        {"role": "assistant", "content": "x", "reasoning_content": "r1"},
        {"role": "assistant", "content": "y", "reasoning_content": "r2"},
        {"role": "system", "content": "S2"}, user("b")]}, []),
]

ANTHROPIC_TOOL = {"name": "bash", "description": "Run a shell command.",
                  "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}

ANTHROPIC_CASES = [
    ("anthropic_tools", 32768, {
        "model": "deepseek-v4-flash", "max_tokens": 100, "system": "Be careful.",
        "tools": [ANTHROPIC_TOOL],
        "messages": [
            user("list"),
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "use bash", "signature": "s"},
                {"type": "text", "text": "Listing."},
                {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {"type": "text", "text": "and now?"}]},
        ]}, []),
    ("anthropic_thinking_disabled", 32768, {
        "max_tokens": 100, "thinking": {"type": "disabled"}, "system": [{"type": "text", "text": "S"}],
        "messages": [user("hi")]}, []),
    ("anthropic_effort_max", 393216, {
        "max_tokens": 100, "output_config": {"effort": "max"}, "messages": [user("hi")]}, []),
]

# Generated texts for the decode-state, parse and stream oracles.
BLOCK = (
    f"\n\n<{D}tool_calls>\n<{D}invoke name=\"edit\">\n"
    f"<{D}parameter name=\"path\" string=\"true\">/tmp/a &amp; b.py</{D}parameter>\n"
    f"<{D}parameter name=\"edits\" string=\"false\">[{{\"old\": \"x\\u003c/{D}parameter>\", \"new\": \"y\\\"z\"}}, 3]"
    f"</{D}parameter>\n</{D}invoke>\n<{D}invoke name=\"bash\">\n"
    f"<{D}parameter name=\"command\" string=\"true\">echo 'é😀' &lt; in</{D}parameter>\n"
    f"</{D}invoke>\n</{D}tool_calls>"
)
GENERATED = [
    # The prompt opened <think>: a thinking reply starts inside it.
    ("thinking_then_tools", True, "Plan: edit then run.</think>I'll do it." + BLOCK),
    ("thinking_unclosed_dsml_not_executable", True, "maybe" + BLOCK),
    ("dsml_inside_thinking_then_text", True, "think" + BLOCK + "</think>Plain answer."),
    ("non_thinking_tools", False, "Sure." + BLOCK),
    ("non_thinking_text_only", False, "Just text, a < b && c > d.\n\nDone.  "),
    ("short_syntax", False, "x\n\n<DSML｜tool_calls>\n<DSML｜invoke name=\"f\">\n"
     "<DSML｜parameter name=\"a\" string=\"true\">1</DSML｜parameter>\n</DSML｜invoke>\n</DSML｜tool_calls>"),
    ("plain_xml_syntax", False, "<tool_calls>\n<invoke name=\"g\">\n<parameter name=\"b\" string=\"false\">2"
     "</parameter>\n</invoke>\n</tool_calls>"),
    ("text_after_block_is_dropped", False, "a" + BLOCK + "\ntrailing text"),
    ("missing_string_attr_and_nested", False,
     f"<{D}tool_calls>\n<{D}invoke name=\"h\">\n<{D}parameter name=\"p\">plain</{D}parameter>\n"
     f"<{D}parameter name=\"obj\">\n<{D}parameter name=\"k\" string=\"true\">v</{D}parameter>\n"
     f"<{D}parameter name=\"n\" string=\"false\">5</{D}parameter>\n</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>"),
    ("unclosed_block", False, "go" + BLOCK[:BLOCK.index("</" + D + "invoke>")]),
    ("two_newlines_inside_text", False, "para one\n\npara two\n\n<tool_c"),
    # ds4's parsers cut a JSON value at the first closing tag even inside a JSON string (the
    # prompt tells the model to write it as \u003c); its decode tracker reads JSON strings.
    ("end_tag_inside_json_string", False,
     f"<{D}tool_calls>\n<{D}invoke name=\"j\">\n<{D}parameter name=\"v\" string=\"false\">"
     f"{{\"s\": \"a</{D}parameter>b\"}}</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>"),
]


def run(exe, *args):
    out = subprocess.run([str(exe), *map(str, args)], capture_output=True, check=True)
    return out.stdout.decode("utf-8")


def write_jsonl(name, rows):
    path = FIX / name
    with path.open("w", encoding="utf-8", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    print(f"wrote {path.relative_to(ROOT)} ({len(rows)} rows)")


def sse_assemble(text):
    out = {"reasoning": "", "content": "", "calls": []}
    for line in text.split("\n"):
        if not line.startswith("data: "):
            continue
        delta = json.loads(line[6:])["choices"][0]["delta"]
        out["reasoning"] += delta.get("reasoning_content", "")
        out["content"] += delta.get("content", "")
        for tc in delta.get("tool_calls", []):
            while len(out["calls"]) <= tc["index"]:
                out["calls"].append({"name": "", "arguments": ""})
            c = out["calls"][tc["index"]]
            c["name"] += tc["function"].get("name", "")
            c["arguments"] += tc["function"].get("arguments", "")
    return out


def main():
    src = pathlib.Path(os.environ.get("DS4_SRC", ""))
    if not (src / "ds4_server.c").is_file():
        sys.exit("set DS4_SRC to an antirez/ds4 checkout at commit " + build_oracle.DS4_COMMIT)
    FIX.mkdir(parents=True, exist_ok=True)
    tokenizer_ids.main()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        exe = build_oracle.build(src, tmp / "build")

        def file(name, text):
            p = tmp / name
            p.write_text(text, encoding="utf-8")
            return p

        rows = []
        for api, cases in (("chat", CHAT_CASES), ("anthropic", ANTHROPIC_CASES)):
            for name, ctx, body, memory in cases:
                body_file = file(name + ".json", json.dumps(body, ensure_ascii=False, separators=(",", ":")))
                mem_args = []
                for i, (id_, dsml) in enumerate(memory):
                    mem_args += [id_, file(f"{name}.mem{i}", dsml)]
                rows.append({
                    "name": name, "api": api, "ctx": ctx, "body": body,
                    "memory": [list(m) for m in memory],
                    "think": run(exe, "think", body_file, ctx, api),
                    "prompt": run(exe, api, body_file, ctx, *mem_args),
                })
        write_jsonl("prompts.jsonl", rows)

        states, parsed, streamed = [], [], []
        for name, think, text in GENERATED:
            t = file(name + ".txt", text)
            states.append({"name": name, "text": text, "reference": run(exe, "states", t),
                           "tracker": run(exe, "tracker", t)})
            parsed.append({"name": name, "text": text, "think": think,
                           **json.loads(run(exe, "parse", t, int(think)))})
            streamed.append({"name": name, "text": text, "think": think,
                             **sse_assemble(run(exe, "stream", t, int(think)))})
        write_jsonl("decode_states.jsonl", states)
        write_jsonl("parse.jsonl", parsed)
        write_jsonl("stream.jsonl", streamed)


if __name__ == "__main__":
    main()
