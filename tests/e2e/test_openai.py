"""The official openai client against ds4server: a scripted multi-turn chat,
streaming and not, stop sequences, seed replay, usage, completions, the
Responses API, and error handling."""

import openai

from common import BASE, MODEL, run

client = openai.OpenAI(base_url=BASE + "/v1", api_key="unused", max_retries=0)


def test_models():
    ids = [m.id for m in client.models.list()]
    assert ids == [MODEL], ids
    assert client.models.retrieve(MODEL).id == MODEL


def test_multi_turn_chat_with_usage_and_cache():
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    cached = []
    for question in ["What is the capital of France?", "And of Italy?", "Which one is larger?"]:
        messages.append({"role": "user", "content": question})
        r = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=24, temperature=0
        )
        answer = r.choices[0].message.content
        assert answer, r
        assert r.choices[0].finish_reason in ("stop", "length")
        u = r.usage
        assert u.total_tokens == u.prompt_tokens + u.completion_tokens
        assert 1 <= u.completion_tokens <= 24
        cached.append(u.prompt_tokens_details.cached_tokens)
        messages.append({"role": "assistant", "content": answer})
    # Each later turn extends the previous conversation: its prefix is reused.
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), cached


def test_streaming_chat_with_usage():
    messages = [{"role": "user", "content": "Name three animals."}]
    full = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=20, temperature=0
    )
    stream = client.chat.completions.create(
        model=MODEL,
        messages=messages,
        max_tokens=20,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage, finish = "", None, None
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            finish = choice.finish_reason or finish
    assert text == full.choices[0].message.content, (text, full.choices[0].message.content)
    assert finish == full.choices[0].finish_reason
    assert usage.completion_tokens == full.usage.completion_tokens


def test_seed_replay():
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Tell me a short fact about the moon."}],
        max_tokens=20,
        temperature=0.9,
        seed=4242,
    )
    # Cold then warm: the same seed gives the same text.
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_stop_sequences():
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to ten in words."}],
        max_tokens=30,
        temperature=0,
    )
    text = client.chat.completions.create(**kwargs).choices[0].message.content
    word = text.split()[2]
    r = client.chat.completions.create(**kwargs, stop=[word])
    assert r.choices[0].message.content == text[: text.index(word)]
    assert r.choices[0].finish_reason == "stop"


def test_completions_and_logprobs():
    r = client.completions.create(
        model=MODEL, prompt="The sky is", max_tokens=5, temperature=0, logprobs=2, echo=True
    )
    assert r.choices[0].text.startswith("The sky is")
    assert r.choices[0].logprobs.token_logprobs[0] is None
    assert len(r.choices[0].logprobs.top_logprobs[1]) == 2


def test_responses_streaming():
    r = client.responses.create(model=MODEL, input="Say hi.", max_output_tokens=8, temperature=0)
    assert r.output_text
    events = list(
        client.responses.create(
            model=MODEL, input="Say hi.", max_output_tokens=8, temperature=0, stream=True
        )
    )
    assert events[0].type == "response.created"
    assert events[-1].type in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_errors():
    for kwargs, needle in [
        (dict(temperature=5), "temperature"),
        (dict(n=3), "n = 3"),
        (
            dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}}]}]),
            "images are not supported",
        ),
    ]:
        args = dict(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
        args.update(kwargs)
        try:
            client.chat.completions.create(**args)
        except openai.APIStatusError as e:
            assert e.status_code in (400, 404), e
            assert needle in str(e), e
        else:
            raise AssertionError(f"{kwargs} was accepted")


run(
    [
        test_models,
        test_multi_turn_chat_with_usage_and_cache,
        test_streaming_chat_with_usage,
        test_seed_replay,
        test_stop_sequences,
        test_completions_and_logprobs,
        test_responses_streaming,
        test_errors,
    ]
)
