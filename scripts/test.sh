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
# every repo path and ridgekv flag the docs and code comments name exists; the docs name no work
# session (docs/*.md < 3400 lines)
python3 scripts/check_paths.py
if [ -d build-asan ]; then meson setup --reconfigure build-asan >/dev/null; else
  meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized; fi
ninja -C build-asan
# the same layering over the symbols the objects define and reference
python3 scripts/check_layers.py --build build-asan
# the unit suites as on a clone without ../shared (RK_NO_SHARED); CRITERION_VERBOSITY_LEVEL=1:
# Criterion names each skipped test ("[SKIP] suite::test: why")
RK_NO_SHARED=1 CRITERION_VERBOSITY_LEVEL=1 meson test -C build-asan --suite unit --print-errorlogs --num-processes 2 \
  --logbase unit-noshared --wrapper "$PWD/scripts/sanitizer_wrap.sh"
# a unit test that skips is a failure: they run on generated fixtures (meson appends the
# wrapper's name to the log's)
python3 scripts/check_skips.py 'build-asan/meson-logs/unit-noshared*.json'
if [ -d build ]; then meson setup --reconfigure build >/dev/null; else meson setup build --buildtype=release; fi
ninja -C build
./build/cli/ridgekv pull >/dev/null
# ../shared's trained models, llama.cpp's goldens and vocabularies, the default model (each
# test skips, naming the file, without them)
meson test -C build-asan --suite shared --print-errorlogs --num-processes 2 --wrapper "$PWD/scripts/sanitizer_wrap.sh"
meson test -C build --suite model --suite cli --print-errorlogs --num-processes 2
echo "all tests passed"
