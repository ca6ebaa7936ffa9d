#!/usr/bin/env bash
# The measurements behind docs/PERFORMANCE.md and the speed tables of docs/RIDGEFILL.md.
# Usage: scripts/bench.sh [OUTDIR]   (needs build/ and the default model; maps are made if absent)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out}
mkdir -p "$out"
bin=./build/cli/ridgekv
maps=${RIDGEKV_MAPS:-$out/smollm2.maps.gguf}
{ echo "# $(date -u +%FT%TZ) $(uname -srm)"; lscpu | grep -E 'Model name|^CPU\(s\)'; } > "$out/machine.txt"
# 1. exact engine: prefill and decode, 2 threads
$bin bench -p 512,2048 -n 64 -t 2 -r 3 --json > "$out/engine.json"
# 2. RidgeFill maps: calibrate on Austen (held out from evaluation), then TTFT per mode in one run
[ -f "$maps" ] || $bin calibrate --text ../shared/corpus/austen_emma.txt --text ../shared/corpus/austen_persuasion.txt \
  --max-tokens 65536 -o "$maps" > "$out/calibrate.txt"
$bin bench -p 2048,4096,8192 -n 0 -t 2 -r 2 --ridgefill "$maps" --fill off,speed,quality --json > "$out/ridgefill.json"
echo "wrote $out/"
