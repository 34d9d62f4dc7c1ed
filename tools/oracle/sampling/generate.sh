#!/bin/sh
# Regenerate all sampling fixtures (tests/fixtures/sampling/) deterministically.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/../.venv/bin/python" "$here/generate.py" "$@"
