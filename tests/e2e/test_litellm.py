"""litellm (pinned in requirements.txt; aider uses it) against ds4server on
both routes it can take: OpenAI-compatible and Anthropic. A turn completes
under a foreign model name, and context overflow is classified as
litellm's ContextWindowExceededError (which aider turns into its own
guidance), not a generic BadRequestError.

Needs DS4_E2E_LITELLM_BASE (a server of its own, for clean status counts)."""

import json
import os

# No model-cost map from the network: litellm's bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
    os.environ[k] = "http://127.0.0.1:9"
os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"

import litellm  # noqa: E402

from common import run, statuses  # noqa: E402

BASE = os.environ["DS4_E2E_LITELLM_BASE"]
litellm.telemetry = False
litellm.num_retries = 0

# Far above the default model's 8K context.
LONG = [{"role": "user", "content": "many words " * 6000}]
SHORT = [{"role": "user", "content": "Say hi."}]

ROUTES = [
    # (model as litellm spells it, api_base)
    ("openai/gpt-4o", BASE + "/v1"),
    ("anthropic/claude-sonnet-4-5", BASE),
]


def test_a_turn_completes_on_both_routes():
    for model, base in ROUTES:
        r = litellm.completion(
            model=model, api_base=base, api_key="sk-local", messages=SHORT, max_tokens=4
        )
        assert r.choices[0].message.content is not None, (model, r)
        assert r.usage.completion_tokens >= 1, (model, r)


def test_overflow_is_context_window_exceeded_on_both_routes():
    for model, base in ROUTES:
        try:
            litellm.completion(model=model, api_base=base, api_key="sk-local", messages=LONG, max_tokens=16)
        except litellm.ContextWindowExceededError as e:
            print(f"{model}: {type(e).__name__}: {str(e)[:160]}")
        except Exception as e:  # noqa: BLE001 - the wrong class is the failure
            raise AssertionError(f"{model}: {type(e).__name__} instead of ContextWindowExceededError: {e}")
        else:
            raise AssertionError(f"{model}: the long prompt was accepted")


def test_no_server_errors():
    counts = statuses(BASE)
    print("litellm: responses by status", json.dumps(counts, sort_keys=True))
    assert not any(s >= 500 for s in counts), counts


run(
    [
        test_a_turn_completes_on_both_routes,
        test_overflow_is_context_window_exceeded_on_both_routes,
        test_no_server_errors,
    ]
)
