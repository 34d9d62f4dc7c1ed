#!/usr/bin/env bash
# Browser: start `ds4server serve` on free loopback ports — the default model
# as is, and again with --api-key (and a small --ctx and no queue, for the
# key prompt and the too-long and busy messages) — and drive the page in
# Debian's headless Chromium with Playwright (tests/browser/test_page.py).
# Screenshots go to $DS4_BROWSER_SCREENSHOTS (default: a new temp dir; the
# path is printed).
# Usage: tests/browser/run.sh [path/to/ds4server]   (default: target/release/ds4server)
set -euo pipefail
cd "$(dirname "$0")/../.."
bin="${1:-target/release/ds4server}"
. tests/e2e/serve.sh

DS4_BROWSER_KEY="browser-test-key"
DS4_BROWSER_BASE="$(start open --model-id smollm2)"
DS4_BROWSER_KEY_BASE="$(start keyed --model-id smollm2 --api-key "$DS4_BROWSER_KEY" --ctx 2048 --max-queue 0)"
export DS4_BROWSER_BASE DS4_BROWSER_KEY_BASE DS4_BROWSER_KEY
python3 tests/browser/test_page.py
