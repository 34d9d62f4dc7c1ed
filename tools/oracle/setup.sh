#!/usr/bin/env bash
# Creates the pinned oracle environment in tools/oracle/.venv (torch comes
# with CUDA wheels from PyPI, ~3 GB; it runs on CPU). Triton is not needed.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m venv "$here/.venv"
"$here/.venv/bin/pip" install -r "$here/requirements.txt"
"$here/.venv/bin/pip" uninstall -y triton || true
