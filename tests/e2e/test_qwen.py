"""The official openai and anthropic clients against ds4server serving a
tiny qwen4_exp checkpoint with the real Qwen3.5/3.6 tokenizer and chat
template (`tests/fixtures/qwen4_exp/chat/`, random weights; see
tools/oracle/qwen4_exp/chat_model.py). A random model writes random text, so
what must hold is structural: thinking on (the template's default) streams
reasoning apart from the answer; a forced tool call streams as a tool call in
Qwen3.5's XML format with JSON arguments (OpenAI argument deltas, Anthropic
`input_json_delta`); the second turn, the call rendered back by the
template, starts warm on the first turn's prompt (`cached_tokens`). The
checkpoint has a vision tower (`tests/fixtures/qwen4_exp/chat_vl/`, see
tools/oracle/qwen4_exp/chat_vl_model.py): an image chat through both clients
(a data URL, a base64 block; streamed and not) counts the image's tokens in
`usage`, and bad images get a 400 that says what to fix."""

import base64
import json
import os
import pathlib
import zlib

from common import clients, extra, run, tool_call_turn, tools

BASE = os.environ["DS4_E2E_QWEN_BASE"]
MODEL = "qwen3.8-flash-next"
# A closed schema: the forced call cannot run past max_tokens in a free
# string (the enum is written raw, as the template writes strings).
PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string", "enum": ["Paris", "Tokyo"]}},
    "required": ["city"],
}
TOOLS, A_TOOLS = tools(PARAMETERS)
USER = "What is the weather in Paris?"
oa, an = clients(BASE)
IMAGES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "qwen4_exp" / "vl" / "images"
# exact.png is 96x64 pixels: 3x2 merged tokens under chat_vl's processor,
# wide.jpg 300x120 → 288x128: 9x4.
EXACT, WIDE = 6, 36


def image_b64(name):
    return base64.b64encode((IMAGES / name).read_bytes()).decode()


def oa_image(data, media="image/png"):
    return [
        {"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}},
        ]}
    ]


def an_image(data, media="image/png"):
    return [
        {"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}},
            {"type": "text", "text": "What is in this picture?"},
        ]}
    ]


def test_openai_streamed_reasoning_apart():
    stream = oa.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": USER}],
        max_tokens=24,
        seed=7,
        stream=True,
    )
    reasoning, content, finish = "", "", None
    for chunk in stream:
        for choice in chunk.choices:
            reasoning += extra(choice.delta, "reasoning_content") or ""
            content += choice.delta.content or ""
            finish = choice.finish_reason or finish
    # The template opened `<think>`: whatever the model wrote until it
    # closes the block is reasoning, never content, and never the markers.
    assert reasoning, (reasoning, content)
    assert "<think>" not in reasoning + content and "</think>" not in reasoning + content
    assert finish in ("length", "stop"), finish


def test_openai_forced_tool_call_then_warm_second_turn():
    messages = [{"role": "user", "content": USER}]
    stream = oa.chat.completions.create(
        model=MODEL,
        messages=messages,
        tools=TOOLS,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        reasoning_effort="none",
        max_tokens=60,
        seed=7,
        stream=True,
        stream_options={"include_usage": True},
    )
    calls, finish, usage, fragments, content = {}, None, None, 0, ""
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            content += choice.delta.content or ""
            for tc in choice.delta.tool_calls or []:
                call = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
                call["id"] = tc.id or call["id"]
                if tc.function:
                    call["name"] += tc.function.name or ""
                    if tc.function.arguments:
                        call["arguments"] += tc.function.arguments
                        fragments += 1
            finish = choice.finish_reason or finish
    assert finish == "tool_calls", (finish, calls, content)
    assert list(calls) == [0] and calls[0]["name"] == "get_weather", calls
    args = json.loads(calls[0]["arguments"])
    assert args["city"] in ("Paris", "Tokyo"), args
    assert fragments >= 2, fragments
    first_prompt = usage.prompt_tokens

    messages += tool_call_turn(calls[0], "Sunny, 21 C")
    r = oa.chat.completions.create(
        model=MODEL, messages=messages, tools=TOOLS, reasoning_effort="none", max_tokens=8, seed=7
    )
    assert r.choices[0].finish_reason in ("length", "stop", "tool_calls"), r
    # The first turn's prompt is a prefix of the second's (the template
    # renders the empty reasoning block of a thinking-off turn as the
    # generation prompt wrote it), so it is reused.
    assert r.usage.prompt_tokens_details.cached_tokens >= first_prompt, (r.usage, first_prompt)


def test_anthropic_streamed_forced_tool_use():
    kinds = set()
    with an.messages.stream(
        model=MODEL,
        max_tokens=60,
        thinking={"type": "disabled"},
        tools=A_TOOLS,
        tool_choice={"type": "tool", "name": "get_weather"},
        messages=[{"role": "user", "content": USER}],
    ) as stream:
        for event in stream:
            if event.type == "content_block_delta":
                kinds.add(event.delta.type)
        msg = stream.get_final_message()
    assert "input_json_delta" in kinds, kinds
    assert msg.stop_reason == "tool_use", msg
    tool = [b for b in msg.content if b.type == "tool_use"]
    assert len(tool) == 1 and tool[0].name == "get_weather", msg.content
    assert tool[0].input["city"] in ("Paris", "Tokyo"), tool[0].input


def test_anthropic_thinking_budget_splits_reasoning_from_answer():
    # The budget ends the reasoning block (the server closes it with the
    # family's marker) and the rest of max_tokens is the answer.
    msg = an.messages.create(
        model=MODEL,
        max_tokens=1040,
        thinking={"type": "enabled", "budget_tokens": 1024},
        messages=[{"role": "user", "content": USER}],
    )
    kinds = [b.type for b in msg.content]
    assert kinds and kinds[0] == "thinking", kinds
    thinking = msg.content[0].thinking
    assert thinking and "</think>" not in thinking, thinking[-80:]


def test_openai_image_chat_counts_image_tokens():
    small = oa.chat.completions.create(
        model=MODEL, messages=oa_image(image_b64("exact.png")), max_tokens=8, seed=3
    )
    big = oa.chat.completions.create(
        model=MODEL, messages=oa_image(image_b64("wide.jpg"), "image/jpeg"), max_tokens=8, seed=3
    )
    assert small.choices[0].finish_reason in ("length", "stop"), small
    assert big.usage.prompt_tokens - small.usage.prompt_tokens == WIDE - EXACT, (small.usage, big.usage)
    stream = oa.chat.completions.create(
        model=MODEL,
        messages=oa_image(image_b64("exact.png")),
        max_tokens=8,
        seed=3,
        stream=True,
        stream_options={"include_usage": True},
    )
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
    assert usage.prompt_tokens == small.usage.prompt_tokens, usage
    # The same image again: warm.
    assert usage.prompt_tokens_details.cached_tokens > 0, usage


def test_anthropic_image_chat_counts_image_tokens():
    messages = an_image(image_b64("exact.png"))
    counted = an.messages.count_tokens(model=MODEL, messages=messages).input_tokens
    msg = an.messages.create(model=MODEL, max_tokens=8, messages=messages)
    assert msg.usage.input_tokens == counted, (msg.usage, counted)
    big = an.messages.count_tokens(model=MODEL, messages=an_image(image_b64("wide.jpg"), "image/jpeg"))
    assert big.input_tokens - counted == WIDE - EXACT, (big, counted)
    with an.messages.stream(model=MODEL, max_tokens=8, messages=messages) as stream:
        for _ in stream:
            pass
        final = stream.get_final_message()
    assert final.usage.input_tokens == counted, final.usage


def test_bad_images_get_a_400_that_says_what_to_fix():
    import anthropic
    import openai

    png = (IMAGES / "exact.png").read_bytes()
    cases = [
        (base64.b64encode(png[: len(png) // 2]).decode(), "truncated or malformed"),
        (base64.b64encode(b"just some text saved as cat.png").decode(), "not a image/png image"),
    ]
    for data, says in cases:
        try:
            oa.chat.completions.create(model=MODEL, messages=oa_image(data), max_tokens=4)
            raise AssertionError("accepted a bad image")
        except openai.BadRequestError as e:
            assert says in str(e) and "messages[0].content[1]" in str(e), str(e)
        try:
            an.messages.create(model=MODEL, max_tokens=4, messages=an_image(data))
            raise AssertionError("accepted a bad image")
        except anthropic.BadRequestError as e:
            assert says in str(e), str(e)
    # A huge image: over the processor's pixel limit, refused from its header.
    # A 40000x40000 header (its CRC fixed) on the small image's data.
    huge = bytearray(png)
    huge[16:24] = (40000).to_bytes(4, "big") * 2  # IHDR width and height
    huge[29:33] = zlib.crc32(bytes(huge[12:29])).to_bytes(4, "big")
    try:
        oa.chat.completions.create(model=MODEL, messages=oa_image(base64.b64encode(bytes(huge)).decode()), max_tokens=4)
        raise AssertionError("accepted a huge image")
    except openai.BadRequestError as e:
        assert "pixels" in str(e) and "smaller" in str(e), str(e)


if __name__ == "__main__":
    run(
        [
            test_openai_streamed_reasoning_apart,
            test_openai_forced_tool_call_then_warm_second_turn,
            test_anthropic_streamed_forced_tool_use,
            test_anthropic_thinking_budget_splits_reasoning_from_answer,
            test_openai_image_chat_counts_image_tokens,
            test_anthropic_image_chat_counts_image_tokens,
            test_bad_images_get_a_400_that_says_what_to_fix,
        ]
    )
