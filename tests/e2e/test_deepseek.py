"""The official openai and anthropic clients against ds4server serving a
tiny DeepSeek-V4 checkpoint with the real tokenizer
(`tests/fixtures/deepseek_v4/chat/`, trained to call `get_weather` and then
answer; see tools/oracle/deepseek_v4/chat_model.py). Thinking is on (ds4's
default): the reasoning streams apart from the answer, the DSML tool call
streams as a tool call, its result goes back, and the second turn replays
the sampled DSML exactly — so it starts warm on everything the first turn
covered."""

import json
import os
from pathlib import Path

from common import clients, extra, run, tool_call_turn, tools

BASE = os.environ["DS4_E2E_DSV4_BASE"]
MODEL = "deepseek-v4-flash"
SCRIPT = json.loads(
    (Path(__file__).resolve().parent.parent / "fixtures/deepseek_v4/chat/script.json").read_text()
)
TOOLS, A_TOOLS = tools()
oa, an = clients(BASE)


def test_openai_streamed_tool_call_then_warm_answer():
    messages = [{"role": "user", "content": SCRIPT["user"]}]
    stream = oa.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        max_tokens=100,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, calls, finish, usage, fragments = "", "", {}, None, None, 0
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            d = choice.delta
            reasoning += extra(d, "reasoning_content") or ""
            content += d.content or ""
            for tc in d.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function:
                    call["name"] += tc.function.name or ""
                    if tc.function.arguments:
                        call["arguments"] += tc.function.arguments
                        fragments += 1
            finish = choice.finish_reason or finish
    assert reasoning == SCRIPT["reasoning_1"], reasoning
    assert content == "", content
    assert finish == "tool_calls", finish
    assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}, calls
    assert fragments >= 1 and calls[0]["id"].startswith("call_"), calls
    first = usage.prompt_tokens + usage.completion_tokens

    messages += tool_call_turn(calls[0], SCRIPT["tool_result"], reasoning)
    r = oa.chat.completions.create(model=MODEL, messages=messages, tools=TOOLS, max_tokens=100)
    m = r.choices[0].message
    assert m.content == SCRIPT["answer"], m
    assert extra(m, "reasoning_content") == SCRIPT["reasoning_2"], m
    assert r.choices[0].finish_reason == "stop"
    # The second prompt extends the first turn token for token (the sampled
    # DSML replayed by call id), so all of it is reused.
    assert r.usage.prompt_tokens_details.cached_tokens == first, (r.usage, first)


def test_anthropic_streamed_tool_use_then_warm_answer():
    kinds = set()
    with an.messages.stream(
        model=MODEL,
        max_tokens=100,
        tools=A_TOOLS,
        messages=[{"role": "user", "content": SCRIPT["user"]}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.add(event.delta.type)
        msg = stream.get_final_message()
    assert {"thinking_delta", "input_json_delta", "signature_delta"} <= kinds, kinds
    assert msg.stop_reason == "tool_use", msg
    thinking = [b for b in msg.content if b.type == "thinking"]
    tool = [b for b in msg.content if b.type == "tool_use"]
    assert thinking and thinking[0].thinking == SCRIPT["reasoning_1"], msg.content
    assert len(tool) == 1 and tool[0].name == "get_weather" and tool[0].input == {"city": "Paris"}
    first = msg.usage.input_tokens + msg.usage.output_tokens

    r = an.messages.create(
        model=MODEL,
        max_tokens=100,
        tools=A_TOOLS,
        messages=[
            {"role": "user", "content": SCRIPT["user"]},
            {"role": "assistant", "content": msg.content},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": tool[0].id, "content": SCRIPT["tool_result"]}
                ],
            },
        ],
    )
    text = [b.text for b in r.content if b.type == "text"]
    assert text == [SCRIPT["answer"]], r.content
    assert r.stop_reason == "end_turn", r
    assert r.usage.cache_read_input_tokens == first, (r.usage, first)


def test_deepseek_model_aliases_choose_thinking():
    messages = [{"role": "user", "content": SCRIPT["user"]}]
    chat = oa.chat.completions.create(model="deepseek-chat", messages=messages, max_tokens=8)
    assert not extra(chat.choices[0].message, "reasoning_content"), chat
    reasoner = oa.chat.completions.create(model="deepseek-reasoner", messages=messages, max_tokens=8)
    assert extra(reasoner.choices[0].message, "reasoning_content"), reasoner


if __name__ == "__main__":
    run(
        [
            test_openai_streamed_tool_call_then_warm_answer,
            test_anthropic_streamed_tool_use_then_warm_answer,
            test_deepseek_model_aliases_choose_thinking,
        ]
    )
