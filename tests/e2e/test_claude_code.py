"""Claude Code (pinned in .ci/run) against ds4server, non-interactive (`-p`),
no network beyond loopback: with its default tools its prompt (~20K tokens)
exceeds the default model's 8K context and it must show its own "prompt is
too long" error; with a reduced tool set it completes a turn.

Needs DS4_E2E_CLAUDE_BASE (a server of its own, so the status counts printed
at the end are Claude Code's alone) and DS4_E2E_CLAUDE (the binary)."""

import json
import os
import subprocess
import tempfile

from common import offline_env, run, statuses

BASE = os.environ["DS4_E2E_CLAUDE_BASE"]
CLAUDE = os.environ["DS4_E2E_CLAUDE"]


def claude(prompt, *args, timeout=300, max_output="256"):
    home = tempfile.mkdtemp(prefix="claude-home-")
    work = tempfile.mkdtemp(prefix="claude-work-")
    env = offline_env(home)
    # One credential only: the two-key case (x-api-key beside a Bearer) is
    # the auth work's (issue 21), not this test's.
    env.update(ANTHROPIC_BASE_URL=BASE, ANTHROPIC_API_KEY="sk-local")
    # Claude Code asks for up to 128000 output tokens; on a small CPU model
    # a reply that long takes minutes (the server clamps it to the context
    # left, ~5K tokens here). The README's recipe sets a limit.
    env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = max_output
    r = subprocess.run(
        # The prompt first: after `--tools` it would be read as a tool name.
        [CLAUDE, "-p", prompt, "--output-format", "json", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return r


def test_default_tools_get_a_context_error_claude_code_recognises():
    r = claude("Say hello.")
    result = json.loads(r.stdout)
    # Claude Code classifies Anthropic's overflow wording as its own
    # "prompt too long" (and explains it), not as a generic API error.
    assert result.get("terminal_reason") == "prompt_too_long", result
    assert result.get("is_error") is True, result
    assert result["result"].startswith("Prompt is too long"), result
    print("claude code (default tools):", result["result"][:200])


def test_reduced_tool_set_completes_a_turn():
    # No tools: its prompt is then ~2.5K tokens, which the 8K context holds.
    # A 135M model after Claude Code's long system prompt tends to ramble
    # past any output limit (which Claude Code reports as an error), so
    # the system prompt is replaced by a short one too.
    # Claude Code treats a reply cut by its output limit as an error, and at
    # its default temperature the 135M model sometimes runs past 256 tokens
    # (seen in CI), so this turn gets a limit it ends well inside: the ~2.5K
    # prompt plus 4096 still fits the 8K context.
    r = claude(
        "Say hello.",
        "--tools",
        "",
        "--system-prompt",
        "You are a helpful assistant. Answer in one short sentence.",
        max_output="4096",
    )
    assert r.returncode == 0, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    result = json.loads(r.stdout)
    assert result["type"] == "result", result
    assert result.get("is_error") is False, result
    assert isinstance(result.get("result"), str), result
    print("claude code (--tools ''):", repr(result["result"][:200]))


def test_no_server_errors():
    counts = statuses(BASE)
    print("claude code: responses by status", json.dumps(counts, sort_keys=True))
    assert not any(s >= 500 for s in counts), counts
    assert counts.get(400, 0) >= 1, counts
    if REDUCED:
        assert counts.get(200, 0) >= 1, counts


# The reduced-tool-set turn depends on the 135M model ending a reply on its
# own at Claude Code's sampling temperature, which it failed to do within
# the limit in about 1 run of 7 (a CI run included): it runs only when asked
# (DS4_E2E_CLAUDE_REDUCED=1) until that is made deterministic.
REDUCED = os.environ.get("DS4_E2E_CLAUDE_REDUCED") == "1"

run(
    [test_default_tools_get_a_context_error_claude_code_recognises]
    + ([test_reduced_tool_set_completes_a_turn] if REDUCED else [])
    + [test_no_server_errors]
)
