#!/usr/bin/env bash
# End-to-end: start `ds4server serve` on free loopback ports — the default
# model, a tiny DeepSeek-V4 checkpoint with the real tokenizer and a tiny
# GLM-5 chat checkpoint with its chat template — run the official openai
# and anthropic clients against them (structured outputs included), stop
# them.
# Usage: tests/e2e/run.sh [path/to/ds4server]   (default: target/release/ds4server)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/ds4server}"
. tests/e2e/serve.sh

python3 tests/e2e/dsv4_chat_model.py "$work/dsv4_chat" >/dev/null
DS4_E2E_BASE="$(start default --model-id smollm2)"
DS4_E2E_DSV4_BASE="$(start deepseek_v4 --model "$work/dsv4_chat" --model-id deepseek-v4-flash)"
DS4_E2E_GLM_BASE="$(start glm5_next --model tests/fixtures/glm5_next/chat --model-id glm-5.3-flash)"
export DS4_E2E_BASE DS4_E2E_DSV4_BASE DS4_E2E_GLM_BASE
status=0
python3 tests/e2e/test_openai.py || status=1
python3 tests/e2e/test_anthropic.py || status=1
python3 tests/e2e/test_deepseek.py || status=1
python3 tests/e2e/test_glm.py || status=1
python3 tests/e2e/test_structured.py || status=1
exit "$status"
