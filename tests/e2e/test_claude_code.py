"""Claude Code (pinned in .ci/run) against ds4server, non-interactive (`-p`),
no network beyond loopback: with its default tools its prompt (~20K tokens)
exceeds the default model's 8K context and it must show its own "prompt is
too long" error; with a reduced tool set it completes a turn.

Needs DS4_E2E_CLAUDE_BASE (a server of its own, so the status counts printed
at the end are Claude Code's alone) and DS4_E2E_CLAUDE (the binary)."""

import json
import os
import shutil
import subprocess
import tempfile

from common import offline_env, run, statuses

BASE = os.environ["DS4_E2E_CLAUDE_BASE"]
CLAUDE = os.environ["DS4_E2E_CLAUDE"]


def claude(prompt, *args, timeout=300, max_output="256"):
    home = tempfile.mkdtemp(prefix="claude-home-")
    # A fixed working directory: Claude Code writes its path into the
    # prompt, and the server decodes greedily, so the same path makes the
    # same reply every run.
    work = os.path.join(tempfile.gettempdir(), "ds4-e2e-claude-work")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
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
    # the system prompt is replaced by a short one too. The server decodes
    # greedily (`serve --temperature 0`, run.sh; Claude Code sends no
    # temperature), so this reply is the same every run and ends by EOS
    # well inside the limit (at Claude Code's default sampling it ran past
    # it in about 1 run of 7). The limit leaves room: the ~2.5K prompt plus
    # 1024 fits the 8K context.
    r = claude(
        "Say hello.",
        "--tools",
        "",
        "--system-prompt",
        "You are a helpful assistant. Answer in one short sentence.",
        max_output="1024",
        # The greedy reply is 217 tokens; on a 2-core machine shared with
        # builds (load 14) one such turn took over 300 s.
        timeout=600,
    )
    result = json.loads(r.stdout)
    if result.get("is_error") and "output token maximum" in str(result.get("result")):
        # Claude Code puts the date in its prompt, after the user's message,
        # and the 135M model answers that block; greedy, its reply is 217
        # tokens ending by EOS on most dates but loops to the limit on a few
        # (1 of 50 dates sampled with agent_prompt_sweep.py: 2027-01-20).
        # The turn still ran end to end (streamed, stopped for length,
        # reported by Claude Code as its own limit error), so that outcome
        # passes, loudly; any other error fails.
        print(
            "claude code (--tools ''): WARNING: the reply ran to the output limit on this date:",
            result["result"][:200],
        )
        return
    assert r.returncode == 0, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    assert result["type"] == "result", result
    assert result.get("is_error") is False, result
    assert isinstance(result.get("result"), str), result
    print("claude code (--tools ''):", repr(result["result"][:200]))


def test_no_server_errors():
    counts = statuses(BASE)
    print("claude code: responses by status", json.dumps(counts, sort_keys=True))
    assert not any(s >= 500 for s in counts), counts
    assert counts.get(400, 0) >= 1, counts
    assert counts.get(200, 0) >= 1, counts


run(
    [
        test_default_tools_get_a_context_error_claude_code_recognises,
        test_reduced_tool_set_completes_a_turn,
        test_no_server_errors,
    ]
)
