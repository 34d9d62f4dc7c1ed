#!/usr/bin/env bash
# Regenerate every committed fixture under tests/fixtures/ from the reference
# implementations. Needs the pinned environment (tools/oracle/setup.sh) and,
# for the text and llama oracles, the default model (`ds4server pull`).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../.."
py="$here/.venv/bin/python"
[ -x "$py" ] || { echo "run tools/oracle/setup.sh first" >&2; exit 1; }
"$here/sampling/generate.sh"
"$py" "$here/text/generate.py"
"$py" "$here/llama/generate.py"
"$py" "$here/qwen4_exp/generate.py"
"$py" "$here/deepseek_v4/generate.py"
"$py" "$here/glm5_next/generate.py"
echo "fixtures regenerated; review with: git status tests/fixtures"
