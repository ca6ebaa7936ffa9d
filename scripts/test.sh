#!/usr/bin/env bash
# README command 2: the layering and format checks, unit suites under ASan+UBSan (no unit
# test may skip: they run on generated fixtures), then, with the default model (fetched once
# into the cache, reused after), the suite that needs ../shared under ASan+UBSan and the
# model and CLI suites on a release build.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# the layering (base <- {formats, kernels, io} <- linalg <- runtime <- fitters <- eval <- cli), no include cycles
python3 scripts/check_layers.py
bash scripts/check_format.sh
if [ -d build-asan ]; then meson setup --reconfigure build-asan >/dev/null; else
  meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized; fi
ninja -C build-asan
# the same layering over the symbols the objects define and reference
python3 scripts/check_layers.py --build build-asan
# the unit suites as on a clone without ../shared (RK_NO_SHARED); CRITERION_VERBOSITY_LEVEL=1:
# Criterion names each skipped test ("[SKIP] suite::test: why")
RK_NO_SHARED=1 CRITERION_VERBOSITY_LEVEL=1 meson test -C build-asan --suite unit --print-errorlogs --num-processes 2 \
  --wrapper "$PWD/scripts/sanitizer_wrap.sh"
# a unit test that skips is a failure: they run on generated fixtures
python3 - build-asan/meson-logs/testlog.json <<'PY'
import json, re, sys
bad = []
for line in open(sys.argv[1]):
    t = json.loads(line)
    if "unit" not in t.get("suite", []):
        continue
    out = (t.get("stdout") or "") + (t.get("stderr") or "")
    # ("Test is disabled": left out by the test's --filter, not skipped)
    skips = [s for s in re.findall(r"^\[SKIP\] .*$", out, re.M) if not s.endswith(": Test is disabled")]
    if t.get("result") == "SKIP" or skips:
        bad.append(f"{t['name']}: " + ("; ".join(skips) if skips else "skipped (exit 77)"))
for b in bad:
    print("unit suite skipped a test: " + b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
if [ -d build ]; then meson setup --reconfigure build >/dev/null; else meson setup build --buildtype=release; fi
ninja -C build
./build/cli/ridgekv pull >/dev/null
# ../shared's trained models, llama.cpp's goldens and vocabularies, the default model (each
# test skips, naming the file, without them)
meson test -C build-asan --suite shared --print-errorlogs --num-processes 2 --wrapper "$PWD/scripts/sanitizer_wrap.sh"
meson test -C build --suite model --suite cli --print-errorlogs --num-processes 2
echo "all tests passed"
