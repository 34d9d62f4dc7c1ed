#!/usr/bin/env bash
# schemathesis against `ds4server serve` with the default model: every
# operation of the served /openapi.json, a bounded number of cases each,
# every check (a 5xx, a status or content type the document does not list,
# a response that does not match its schema, a schema-valid request that is
# refused, a schema-invalid one that is accepted, ...).
# Usage: tests/schemathesis/run.sh [path/to/ds4server] [cases per operation]
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/ds4server}"
cases="${2:-8}"
. tests/e2e/serve.sh

# About 3 minutes on an idle 2-core machine (1,311 cases at 8 per
# operation); a turn is given 120 s, as a loaded machine needs (at load 12,
# with builds running, a few generated turns took over 60 s).
# A short context keeps each generated turn short (schemathesis sends any
# max_tokens the schema allows; a turn never runs past the context).
base="$(start schemathesis --model-id smollm2 --ctx 128 --seed 1)"
st="${SCHEMATHESIS:-schemathesis}"
"$st" --config-file tests/schemathesis/schemathesis.toml run "$base/openapi.json" \
  --checks all \
  --max-examples "$cases" \
  --seed 20261201 \
  --generation-deterministic \
  --no-shrink \
  --request-timeout 120
