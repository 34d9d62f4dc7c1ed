"""The official anthropic client against ds4server: multi-turn messages,
streaming and not, count_tokens, stop sequences, seed replay, usage and
errors."""

import anthropic

from common import BASE, MODEL, run

client = anthropic.Anthropic(base_url=BASE, api_key="unused", max_retries=0)

# This client version has no `temperature` keyword; the field goes in the body.
GREEDY = {"temperature": 0}


def test_multi_turn_and_count_tokens():
    messages = []
    for question in ["What is two plus two?", "And times three?"]:
        messages.append({"role": "user", "content": question})
        count = client.messages.count_tokens(model=MODEL, messages=messages, system="Be brief.")
        r = client.messages.create(
            model=MODEL, messages=messages, system="Be brief.", max_tokens=20, extra_body=GREEDY
        )
        assert r.usage.input_tokens == count.input_tokens, (r.usage, count)
        assert r.content[0].type == "text" and r.content[0].text
        assert r.stop_reason in ("end_turn", "max_tokens")
        messages.append({"role": "assistant", "content": r.content[0].text})
    assert r.usage.cache_read_input_tokens > 0


def test_streaming_matches():
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=16,
        extra_body=GREEDY,
    )
    full = client.messages.create(**kwargs)
    with client.messages.stream(**kwargs) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == full.content[0].text
    assert final.usage.output_tokens == full.usage.output_tokens
    assert final.stop_reason == full.stop_reason


def test_stop_sequences_and_seed():
    kwargs = dict(
        model=MODEL,
        messages=[{"role": "user", "content": "Count from one to ten in words."}],
        max_tokens=30,
        extra_body=GREEDY,
    )
    text = client.messages.create(**kwargs).content[0].text
    word = text.split()[2]
    r = client.messages.create(**kwargs, stop_sequences=[word])
    assert r.stop_reason == "stop_sequence" and r.stop_sequence == word
    seeded = dict(kwargs, extra_body={"temperature": 0.8, "seed": 7})
    a = client.messages.create(**seeded).content[0].text
    b = client.messages.create(**seeded).content[0].text
    assert a == b


def test_errors():
    try:
        client.messages.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=0
        )
    except anthropic.BadRequestError as e:
        assert "max_tokens" in str(e), e
    else:
        raise AssertionError("max_tokens = 0 was accepted")


run([test_multi_turn_and_count_tokens, test_streaming_matches, test_stop_sequences_and_seed, test_errors])
