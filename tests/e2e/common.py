"""Shared helpers for the end-to-end scripts: a tiny test runner that prints
the 'N passed, N failed' summary line CI reads, the official clients for a
server, the `get_weather` tool in each API's shape, and reading a field the
client library does not model."""

import os
import sys
import traceback

BASE = os.environ.get("DS4_E2E_BASE", "http://127.0.0.1:8000")
MODEL = "smollm2"


WEATHER_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def tools(parameters=WEATHER_PARAMETERS):
    """`get_weather` as OpenAI chat tools and as Anthropic tools."""
    description = "The current weather of a city."
    openai_tools = [
        {
            "type": "function",
            "function": {"name": "get_weather", "description": description, "parameters": parameters},
        }
    ]
    anthropic_tools = [{"name": "get_weather", "description": description, "input_schema": parameters}]
    return openai_tools, anthropic_tools


def clients(base):
    """The official openai and anthropic clients for the server at `base`
    (no retries: a failure shows at once)."""
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    an = anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0)
    return oa, an


def extra(obj, key):
    """A field the client library does not model (`reasoning_content`)."""
    return (obj.model_extra or {}).get(key)


def tool_call_turn(call, result, reasoning=None):
    """The assistant turn that made `call` (a streamed OpenAI call gathered as
    `{"id", "name", "arguments"}`) and the tool's answer, as the next request
    sends them back."""
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "id": call["id"],
                "type": "function",
                "function": {"name": call["name"], "arguments": call["arguments"]},
            }
        ],
    }
    if reasoning is not None:
        turn["reasoning_content"] = reasoning
    return [turn, {"role": "tool", "tool_call_id": call["id"], "content": result}]


def run(tests):
    passed = failed = 0
    for test in tests:
        try:
            test()
            passed += 1
            print(f"PASS {test.__name__}")
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {test.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def offline_env(home):
    """The environment for a real agent client: its home in `home` (no
    user settings), every non-loopback connection sent to a dead loopback
    proxy (so a client that tries to phone home fails at once instead of
    reaching the network), and its telemetry and updates switched off."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANTHROPIC_", "OPENAI_", "CODEX_", "CLAUDE_"))}
    dead = "http://127.0.0.1:9"
    env.update(
        HOME=home,
        XDG_CONFIG_HOME=os.path.join(home, ".config"),
        HTTP_PROXY=dead,
        HTTPS_PROXY=dead,
        ALL_PROXY=dead,
        http_proxy=dead,
        https_proxy=dead,
        all_proxy=dead,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        DISABLE_BUG_COMMAND="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        CI="1",
    )
    return env


METRICS_READS = {}


def metrics(base):
    """The server's /metrics as {name{labels}: value} (reads are counted:
    they are responses the server counts too)."""
    import urllib.request

    METRICS_READS[base] = METRICS_READS.get(base, 0) + 1
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read().decode()
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def statuses(base):
    """The client's responses by HTTP status so far, e.g. {200: 5, 400: 1}:
    the server's counts less this harness's own earlier /metrics reads."""
    earlier = METRICS_READS.get(base, 0)
    counts = {
        int(k.split('"')[1]): int(v)
        for k, v in metrics(base).items()
        if k.startswith("ds4_responses_total{status=")
    }
    counts[200] = counts.get(200, 0) - earlier
    return {s: n for s, n in counts.items() if n}
