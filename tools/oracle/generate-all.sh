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
"$py" "$here/qwen4_exp/generate_vl.py"
"$py" "$here/deepseek_v4/generate.py"
"$py" "$here/deepseek_v4/chat_model.py"
"$py" "$here/glm5_next/generate.py"
# Stored weight types: block bytes and their values from gguf-py, llama.cpp and torch.
"$py" "$here/quant/generate.py"
# The families' tiny checkpoints as FP8 / FP4 / BF16 safetensors (after the families above).
"$py" "$here/quant_safetensors/generate.py"
"$py" "$here/hf_gguf/write.py"
# DeepSeek-V4 serving fixtures come from antirez/ds4's own code (deepseek_v4/README.md).
if [ -n "${DS4_SRC:-}" ]; then
  "$py" "$here/deepseek_v4/serving.py"
else
  echo "DS4_SRC not set: of the DeepSeek-V4 serving fixtures only the tokenizer one is regenerated" >&2
  "$py" "$here/deepseek_v4/tokenizer_ids.py"
fi
echo "fixtures regenerated; review with: git status tests/fixtures"
