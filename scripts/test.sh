#!/usr/bin/env bash
# README command 2: unit suites under ASan+UBSan, then the model and CLI suites on a
# release build with the default model (fetched once into the cache, reused after).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# the layering (base <- {formats, kernels, io} <- linalg <- runtime <- fitters <- eval <- cli), no include cycles
python3 scripts/check_layers.py
# every repo path and ridgekv flag the docs name exists; the docs name no work session (docs/*.md < 3000 lines)
python3 scripts/check_paths.py --docs-only
if [ -d build-asan ]; then meson setup --reconfigure build-asan >/dev/null; else
  meson setup build-asan -Db_sanitize=address,undefined -Db_lundef=false --buildtype=debugoptimized; fi
meson test -C build-asan --suite unit --print-errorlogs --num-processes 2 --wrapper "$PWD/scripts/sanitizer_wrap.sh"
if [ -d build ]; then meson setup --reconfigure build >/dev/null; else meson setup build --buildtype=release; fi
ninja -C build
./build/cli/ridgekv pull >/dev/null
meson test -C build --suite model --suite cli --print-errorlogs --num-processes 2
echo "all tests passed"
