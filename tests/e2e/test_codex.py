"""Codex CLI (pinned in .ci/run) against ds4server over the Responses API,
non-interactive (`codex exec`), no network beyond loopback: a turn
completes, and a resumed turn starts warm (the server reuses the session's
prompt tokens instead of prefilling them again).

Needs DS4_E2E_CODEX_BASE (a server of its own: the cache and status counts
read here are Codex's alone) and DS4_E2E_CODEX (the binary)."""

import json
import os
import shutil
import subprocess
import tempfile

from common import metrics, offline_env, run, statuses

BASE = os.environ["DS4_E2E_CODEX_BASE"]
CODEX = os.environ["DS4_E2E_CODEX"]
# Fixed paths, emptied each run: Codex writes its home (the skills root)
# and its working directory into the prompt, and the server decodes
# greedily (run.sh), so the same paths give the same replies every run.
# What still varies is the date in Codex's <environment_context>; the
# replies to both prompts below were checked for every date from
# 2026-12-01 to 2028-12-31 with tests/e2e/agent_prompt_sweep.py (all end
# by EOS after 3-4 tokens).
ROOT = os.path.join(tempfile.gettempdir(), "ds4-e2e-codex")
shutil.rmtree(ROOT, ignore_errors=True)
HOME = os.path.join(ROOT, "home")
WORK = os.path.join(ROOT, "work")
os.makedirs(HOME)
os.makedirs(WORK)

# The provider block the README documents. No `env_key`: the server has no
# --api-key here. Retries off so a refusal shows at once.
CONFIG = f"""
model = "smollm2"
model_provider = "ds4"
approval_policy = "never"
sandbox_mode = "read-only"

[model_providers.ds4]
name = "ds4server"
base_url = "{BASE}/v1"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0

[analytics]
enabled = false
"""


# Codex's own prompt (~10K tokens: its instructions, a multi-agent tool
# namespace, goals tools, web search) exceeds the default model's 8K
# context; these settings (the README's small-context recipe) bring it to
# ~2.5K tokens.
INSTRUCTIONS = os.path.join(HOME, "instructions.md")
SMALL = [
    "--disable", "multi_agent",
    "--disable", "goals",
    "-c", 'web_search="disabled"',
    "-c", f'model_instructions_file="{INSTRUCTIONS}"',
]


def codex(*args, timeout=300):
    with open(INSTRUCTIONS, "w") as f:
        f.write("You are a coding agent running in a terminal. Answer briefly.\n")
    codex_home = os.path.join(HOME, ".codex")
    os.makedirs(codex_home, exist_ok=True)
    with open(os.path.join(codex_home, "config.toml"), "w") as f:
        f.write(CONFIG)
    env = offline_env(HOME)
    env["CODEX_HOME"] = codex_home
    # Codex writes these into the prompt too.
    env.update(TZ="Etc/UTC", SHELL="/bin/bash")
    return subprocess.run(
        [CODEX, "exec", *args],
        cwd=WORK,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def events(r):
    out = []
    for line in r.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out


def cached_tokens():
    return metrics(BASE).get("ds4_cached_prompt_tokens_total", 0)


def turn_completed(r):
    evs = events(r)
    kinds = [e.get("type") for e in evs]
    assert r.returncode == 0, (r.returncode, r.stdout[-3000:], r.stderr[-3000:])
    assert "turn.completed" in kinds, (kinds, r.stderr[-3000:])
    return evs


def test_exec_completes_a_turn_and_resume_starts_warm():
    r = codex("--json", "--skip-git-repo-check", *SMALL, "Reply with one word: hello.")
    turn_completed(r)
    before = cached_tokens()
    r = codex("resume", "--json", "--skip-git-repo-check", *SMALL, "--last", "Now reply with one word: bye.")
    turn_completed(r)
    reused = cached_tokens() - before
    # The resumed prompt repeats the whole first turn (instructions, tools,
    # both messages): most of it must come from the session, not a prefill.
    assert reused >= 500, f"the resumed turn reused only {reused} prompt tokens"
    print(f"codex: the resumed turn reused {int(reused)} prompt tokens")


def test_no_server_errors():
    counts = statuses(BASE)
    print("codex: responses by status", json.dumps(counts, sort_keys=True))
    assert not any(s >= 500 for s in counts), counts
    assert counts.get(200, 0) >= 2, counts


run([test_exec_completes_a_turn_and_resume_starts_warm, test_no_server_errors])
