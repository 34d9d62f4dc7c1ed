"""Shared helpers for the end-to-end scripts: a tiny test runner that prints
the 'N passed, N failed' summary line CI reads."""

import os
import sys
import traceback

BASE = os.environ.get("DS4_E2E_BASE", "http://127.0.0.1:8000")
MODEL = "smollm2"


def run(tests):
    passed = failed = 0
    for test in tests:
        try:
            test()
            passed += 1
            print(f"PASS {test.__name__}")
        except Exception:  # noqa: BLE001 - report every failure and go on
            failed += 1
            print(f"FAIL {test.__name__}")
            traceback.print_exc()
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
