#!/usr/bin/env python3
"""Fails (exit 1) when a test of a meson test log skipped: the test as a whole (exit 77) or
a Criterion test inside it (run with CRITERION_VERBOSITY_LEVEL=1, Criterion prints
"[SKIP] suite::test: why"). Tests left out by a --filter ("Test is disabled") do not count.
scripts/test.sh runs it on the unit suites' log: they need nothing outside the checkout.

Usage: python3 scripts/check_skips.py MESON_LOG.json...
"""
import glob
import json
import re
import sys


def main(paths):
    files = [f for p in paths for f in (glob.glob(p) or [p])]
    bad, n = [], 0
    for path in files:
        for line in open(path, encoding="utf-8", errors="replace"):
            t = json.loads(line)
            n += 1
            out = (t.get("stdout") or "") + (t.get("stderr") or "")
            skips = [s for s in re.findall(r"^\[SKIP\] .*$", out, re.M) if not s.endswith(": Test is disabled")]
            if t.get("result") == "SKIP" or skips:
                bad.append(f"{t['name']}: " + ("; ".join(skips) if skips else "skipped (exit 77)"))
    for b in bad:
        print("check_skips: " + b, file=sys.stderr)
    if n == 0:
        print(f"check_skips: no test results in {', '.join(paths)}", file=sys.stderr)
        return 1
    if bad:
        print(f"check_skips: {len(bad)} of {n} tests skipped", file=sys.stderr)
        return 1
    print(f"check_skips: ok ({n} tests, none skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
