#!/usr/bin/env bash
# End-to-end: start `ds4server serve` on free loopback ports — the default
# model, a tiny DeepSeek-V4 checkpoint with the real tokenizer and a tiny
# GLM-5 chat checkpoint with its chat template, a tiny qwen4_exp checkpoint
# with the real Qwen3.5 tokenizer and template — run the official openai
# and anthropic clients against them (structured outputs included); then the
# coding agents (Claude Code, Codex, litellm), each against a server of its
# own so its responses-by-status counts are its alone; stop them all.
# Usage: tests/e2e/run.sh [path/to/ds4server]   (default: target/release/ds4server)
# The agents' npm packages are read from $DS4_E2E_CLIENTS (default
# target/e2e-clients, where .ci/run installs the pinned versions).
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/ds4server}"
. tests/e2e/serve.sh

python3 tests/e2e/dsv4_chat_model.py "$work/dsv4_chat" >/dev/null
DS4_E2E_BASE="$(start default --model-id smollm2)"
DS4_E2E_DSV4_BASE="$(start deepseek_v4 --model "$work/dsv4_chat" --model-id deepseek-v4-flash)"
DS4_E2E_GLM_BASE="$(start glm5_next --model tests/fixtures/glm5_next/chat --model-id glm-5.3-flash)"
DS4_E2E_QWEN_BASE="$(start qwen4_exp --model tests/fixtures/qwen4_exp/chat_vl --model-id qwen3.8-flash-next)"
export DS4_E2E_BASE DS4_E2E_DSV4_BASE DS4_E2E_GLM_BASE DS4_E2E_QWEN_BASE
status=0
python3 tests/e2e/test_openai.py || status=1
python3 tests/e2e/test_anthropic.py || status=1
python3 tests/e2e/test_deepseek.py || status=1
python3 tests/e2e/test_glm.py || status=1
python3 tests/e2e/test_qwen.py || status=1
python3 tests/e2e/test_structured.py || status=1

clients="${DS4_E2E_CLIENTS:-target/e2e-clients}/node_modules/.bin"
if [ -x "$clients/claude" ] && [ -x "$clients/codex" ]; then
  DS4_E2E_CLAUDE="$(realpath "$clients/claude")"
  DS4_E2E_CODEX="$(realpath "$clients/codex")"
  # Greedy replies (neither agent sends a temperature, so the server's
  # default applies): at its default sampling the 135M model now and then
  # rambled past the output limit (Claude Code in about 1 run of 7; Codex
  # looped "no, no, ..." to max_output_tokens in stop 14's CI); greedy,
  # with the paths and time zone the tests fix, each reply is the same
  # short one every run and for every date checked
  # (tests/e2e/agent_prompt_sweep.py).
  DS4_E2E_CLAUDE_BASE="$(start claude_code --model-id smollm2 --temperature 0 --seed 1)"
  DS4_E2E_CODEX_BASE="$(start codex --model-id smollm2 --temperature 0 --seed 1)"
  export DS4_E2E_CLAUDE DS4_E2E_CODEX DS4_E2E_CLAUDE_BASE DS4_E2E_CODEX_BASE
  python3 tests/e2e/test_claude_code.py || status=1
  python3 tests/e2e/test_codex.py || status=1
else
  echo "AGENT TESTS FAILED: Claude Code / Codex not installed in $clients (.ci/run installs them)" >&2
  status=1
fi
DS4_E2E_LITELLM_BASE="$(start litellm --model-id smollm2)"
export DS4_E2E_LITELLM_BASE
python3 tests/e2e/test_litellm.py || status=1
exit "$status"
