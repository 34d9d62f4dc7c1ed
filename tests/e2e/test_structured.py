"""Structured outputs through the official clients: response_format
(json_object, json_schema), `chat.completions.parse` and `responses.parse`
with pydantic models
(nested objects, arrays, enums, bounded numbers, required fields) valid on
every run, forced tool calls through both SDKs (streaming and not), seed
replay under a grammar, helpful refusals, and a grammar that admits no
token."""

import json
from enum import Enum
from typing import List, Literal

import anthropic
import openai
from pydantic import BaseModel, Field

from common import BASE, MODEL, run

client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)
claude = anthropic.Anthropic(base_url=BASE, api_key="unused", max_retries=0)

SEEDS = range(4)


class Colour(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Address(BaseModel):
    city: str = Field(max_length=20)
    postcode: int = Field(ge=1000, le=99999)


class Person(BaseModel):
    name: str = Field(max_length=24)
    age: int = Field(ge=0, le=120)
    height_m: float = Field(ge=0.5, le=2.5)
    favourite: Colour
    tags: List[Literal["a", "b", "c"]] = Field(max_length=3)
    address: Address


class Inventory(BaseModel):
    items: List[Address] = Field(min_length=1, max_length=2)
    ok: bool


def ask(content):
    return [{"role": "user", "content": content}]


def test_parse_with_pydantic_models():
    for model_cls, prompt in [(Person, "Invent a person."), (Inventory, "List two addresses.")]:
        for seed in SEEDS:
            r = client.chat.completions.parse(
                model=MODEL,
                messages=ask(prompt),
                response_format=model_cls,
                max_tokens=200,
                temperature=1.0,
                seed=seed,
            )
            choice = r.choices[0]
            assert choice.finish_reason == "stop", (seed, choice)
            parsed = choice.message.parsed
            assert isinstance(parsed, model_cls), choice.message.content
            # pydantic validated every bound, enum and required field.
            model_cls.model_validate_json(choice.message.content)


def test_responses_parse_with_a_pydantic_model():
    # The Responses API's text.format, as `responses.parse` sends it.
    for seed in SEEDS[:2]:
        r = client.responses.parse(
            model=MODEL,
            input="Invent a person.",
            text_format=Person,
            max_output_tokens=200,
            temperature=1.0,
            extra_body={"seed": seed},
        )
        assert r.status == "completed", r
        assert isinstance(r.output_parsed, Person), r.output_text
        Person.model_validate_json(r.output_text)


def test_response_format_json_schema_and_object():
    schema = {
        "type": "object",
        "properties": {
            "answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "reasons": {
                "type": "array",
                "items": {"type": "string", "maxLength": 30},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["answer", "confidence", "reasons"],
        "additionalProperties": False,
    }
    for seed in SEEDS:
        r = client.chat.completions.create(
            model=MODEL,
            messages=ask("Is the sky blue?"),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "verdict", "strict": True, "schema": schema},
            },
            max_tokens=160,
            temperature=0.9,
            seed=seed,
        )
        v = json.loads(r.choices[0].message.content)
        assert v["answer"] in ("yes", "no", "maybe"), v
        assert 0 <= v["confidence"] <= 1, v
        assert 1 <= len(v["reasons"]) <= 3 and all(len(x) <= 30 for x in v["reasons"]), v
        assert set(v) == {"answer", "confidence", "reasons"}, v
    # json_object: some JSON object (small schemas keep it short; the
    # object ends before max_tokens on this prompt).
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask('Reply with {"ok": true}.'),
        response_format={"type": "json_object"},
        max_tokens=200,
        temperature=0,
    )
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.startswith("{")


def test_streaming_json_schema():
    # Sampled: whether a seed's object closes within max_tokens depends on
    # the draws (the schema admits extra keys, which a small model may keep
    # inventing), so every stream that stops on its own must validate and
    # at least one of three seeds must stop; a stream cut by the length
    # limit is still a prefix of the schema's language (it opens an object).
    stopped = 0
    for seed in (3, 4, 5):
        stream = client.chat.completions.create(
            model=MODEL,
            messages=ask("Invent a person."),
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "person", "schema": Person.model_json_schema()},
            },
            max_tokens=200,
            temperature=0.7,
            seed=seed,
            stream=True,
        )
        text, finish = "", None
        for c in stream:
            if c.choices:
                text += c.choices[0].delta.content or ""
                finish = c.choices[0].finish_reason or finish
        if finish == "stop":
            Person.model_validate_json(text)
            stopped += 1
        else:
            assert finish == "length" and text.startswith("{"), (finish, text)
    assert stopped >= 1, "no seed's object closed within 200 tokens"


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            # Without it the grammar admits any extra keys, and a sampled
            # call may run past max_tokens.
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"type": "string", "maxLength": 12}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def check_weather(args):
    a = json.loads(args) if isinstance(args, str) else args
    assert isinstance(a["city"], str) and len(a["city"]) <= 30, a
    assert a["unit"] in ("celsius", "fahrenheit"), a


def test_openai_forced_tool_calls():
    for choice, name in [
        ("required", None),
        ({"type": "function", "function": {"name": "get_weather"}}, "get_weather"),
    ]:
        for seed in SEEDS:
            r = client.chat.completions.create(
                model=MODEL,
                messages=ask("What is the weather in Oslo?"),
                tools=[WEATHER, CLOCK],
                tool_choice=choice,
                max_tokens=120,
                temperature=0.8,
                seed=seed,
            )
            c = r.choices[0]
            assert c.finish_reason == "tool_calls", c
            call = c.message.tool_calls[0].function
            if name:
                assert call.name == name, call
            assert call.name in ("get_weather", "get_time"), call
            if call.name == "get_weather":
                check_weather(call.arguments)
    # Streaming.
    stream = client.chat.completions.create(
        model=MODEL,
        messages=ask("Weather in Rome?"),
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=120,
        temperature=0.8,
        seed=5,
        stream=True,
    )
    name, args, finish = "", "", None
    for chunk in stream:
        for ch in chunk.choices:
            for tc in ch.delta.tool_calls or []:
                name += tc.function.name or ""
                args += tc.function.arguments or ""
            finish = ch.finish_reason or finish
    assert name == "get_weather" and finish == "tool_calls", (name, finish)
    check_weather(args)


def test_anthropic_forced_tool_use():
    tools = [
        {
            "name": "get_weather",
            "description": "Current weather",
            "input_schema": WEATHER["function"]["parameters"],
        }
    ]
    for choice in [{"type": "any"}, {"type": "tool", "name": "get_weather"}]:
        m = claude.messages.create(
            model=MODEL,
            max_tokens=120,
            messages=ask("Weather in Lima?"),
            tools=tools,
            tool_choice=choice,
        )
        assert m.stop_reason == "tool_use", m
        block = next(b for b in m.content if b.type == "tool_use")
        assert block.name == "get_weather"
        check_weather(block.input)
        with claude.messages.stream(
            model=MODEL,
            max_tokens=120,
            messages=ask("Weather in Quito?"),
            tools=tools,
            tool_choice=choice,
        ) as stream:
            final = stream.get_final_message()
        block = next(b for b in final.content if b.type == "tool_use")
        check_weather(block.input)
        # count_tokens is not affected by tool_choice.
        n = claude.messages.count_tokens(
            model=MODEL, messages=ask("Weather in Lima?"), tools=tools, tool_choice=choice
        )
        plain = claude.messages.count_tokens(model=MODEL, messages=ask("Weather in Lima?"), tools=tools)
        assert n.input_tokens == plain.input_tokens


def test_seed_replay_under_a_grammar():
    grammar = {"type": "regex", "value": "(Yes|No), because [a-z]+( [a-z]+){2,6}\\."}
    outs = []
    for _ in range(2):
        r = client.chat.completions.create(
            model=MODEL,
            messages=ask("Do cats fly?"),
            max_tokens=40,
            temperature=1.0,
            seed=1234,
            extra_body={"grammar": grammar},
        )
        outs.append(r.choices[0].message.content)
    assert outs[0] == outs[1], outs
    assert outs[0].startswith(("Yes, because ", "No, because ")), outs
    c = client.completions.create(
        model=MODEL,
        prompt="Answer:",
        max_tokens=4,
        extra_body={"grammar": 'start: " " ("yes" | "no")'},
    )
    assert c.choices[0].text in (" yes", " no"), c


def test_unsupported_schema_is_refused_helpfully():
    for body, needle in [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {"type": "object", "not": {"required": ["a"]}},
                    },
                }
            },
            "not",
        ),
        ({"extra_body": {"grammar": {"type": "lark", "value": "start: ("}}}, "grammar"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
    ]:
        try:
            client.chat.completions.create(model=MODEL, messages=ask("hi"), max_tokens=4, **body)
        except openai.BadRequestError as e:
            assert needle in str(e), e
        else:
            raise AssertionError(f"{body} was accepted")


def test_a_grammar_that_admits_no_token_ends_the_turn():
    r = client.chat.completions.create(
        model=MODEL,
        messages=ask("hi"),
        max_tokens=50,
        extra_body={"grammar": {"type": "lark", "value": "start: X\nX: /[a-z]+/ & /[0-9]+/\n"}},
    )
    assert r.choices[0].finish_reason == "no_allowed_token", r
    assert r.usage.completion_tokens == 0, r


run(
    [
        test_parse_with_pydantic_models,
        test_responses_parse_with_a_pydantic_model,
        test_response_format_json_schema_and_object,
        test_streaming_json_schema,
        test_openai_forced_tool_calls,
        test_anthropic_forced_tool_use,
        test_seed_replay_under_a_grammar,
        test_unsupported_schema_is_refused_helpfully,
        test_a_grammar_that_admits_no_token_ends_the_turn,
    ]
)
