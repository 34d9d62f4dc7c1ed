"""The official openai and anthropic clients against ds4server serving a
tiny GLM-5 chat checkpoint (`tests/fixtures/glm5_next/chat/`, trained to
call `get_weather` in GLM's format and then answer; see
tools/oracle/glm5_next/chat_model.py). The model writes
`<think>…</think>` and then a `<tool_call>name<arg_key>…` block ended by
`<|observation|>`; the server streams the reasoning apart, the call as a
tool call with JSON arguments, and the second turn — the call rendered back
by the model's own chat template — starts warm on everything the first turn
covered. (The model is a toy taught two replies: the tests decode greedily
(temperature 0), which it follows with a wide logit margin.)"""

import json
import os
from pathlib import Path

from common import clients, extra, run, tool_call_turn, tools

BASE = os.environ["DS4_E2E_GLM_BASE"]
MODEL = "glm-5.3-flash"
SCRIPT = json.loads(
    (Path(__file__).resolve().parent.parent / "fixtures/glm5_next/chat/script.json").read_text()
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
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    reasoning, content, calls, finish, usage = "", "", {}, None, None
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
                    call["arguments"] += tc.function.arguments or ""
            finish = choice.finish_reason or finish
    assert reasoning == SCRIPT["reasoning_1"], reasoning
    assert content.strip() == "", content
    assert finish == "tool_calls", finish
    assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris"}, calls
    first = usage.prompt_tokens + usage.completion_tokens

    messages += tool_call_turn(calls[0], SCRIPT["tool_result"], reasoning)
    r = oa.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, max_tokens=100, temperature=0
    )
    m = r.choices[0].message
    assert m.content == SCRIPT["answer"], m
    assert extra(m, "reasoning_content") == SCRIPT["reasoning_2"], m
    assert r.choices[0].finish_reason == "stop"
    # The template renders the call back exactly as it was sampled (and the
    # `<|observation|>` that ended it opens the tool turn), so the whole
    # first turn is reused.
    assert r.usage.prompt_tokens_details.cached_tokens >= first, (r.usage, first)


def test_anthropic_streamed_tool_use_then_answer():
    kinds = set()
    with an.messages.stream(
        model=MODEL,
        max_tokens=100,
        extra_body={"temperature": 0},
        tools=A_TOOLS,
        messages=[{"role": "user", "content": SCRIPT["user"]}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.add(event.delta.type)
        msg = stream.get_final_message()
    assert {"thinking_delta", "input_json_delta"} <= kinds, kinds
    assert msg.stop_reason == "tool_use", msg
    thinking = [b for b in msg.content if b.type == "thinking"]
    tool = [b for b in msg.content if b.type == "tool_use"]
    assert thinking and thinking[0].thinking == SCRIPT["reasoning_1"], msg.content
    assert len(tool) == 1 and tool[0].name == "get_weather" and tool[0].input == {"city": "Paris"}
    first = msg.usage.input_tokens + msg.usage.output_tokens

    r = an.messages.create(
        model=MODEL,
        max_tokens=100,
        extra_body={"temperature": 0},
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
    assert r.usage.cache_read_input_tokens >= first, (r.usage, first)


if __name__ == "__main__":
    run([test_openai_streamed_tool_call_then_warm_answer, test_anthropic_streamed_tool_use_then_answer])
