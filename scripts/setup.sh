#!/usr/bin/env bash
# README command 1: install Debian packages, build, fetch the default model, run it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
if [ -d build ]; then meson setup --reconfigure build >/dev/null; else meson setup build --buildtype=release; fi
ninja -C build
./build/cli/ridgekv pull
./build/cli/ridgekv prepare   # RidgeFill maps for the default model, once (about 90 s on 2 cores)
./build/cli/ridgekv run --chat --temp 0 -n 96 -p "${1:-Explain in two sentences why the sky is blue.}"
