#!/usr/bin/env bash
# Builds the libFuzzer GGUF target with clang and runs it for a bounded time.
#   scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]     (default 60 s)
# Seeds (made by fuzz/gguf_seeds.c with our writer): small valid copies of
# ../shared/models/*/*.gguf and ../shared/golden/models/*.gguf when present (every
# key kept, tensors cut to a block or two), plus synthetic files with every value
# type and every tensor type. New corpus entries go to build-fuzz/corpus/gguf,
# crashes to build-fuzz/artifacts/. Exit status is the fuzzer's (0 = nothing found).
set -euo pipefail

secs="${1:-60}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build=build-fuzz
max_len="${MAX_LEN:-65536}"

if [ ! -f "$build/build.ninja" ]; then
    CC=clang meson setup "$build" -Dfuzz=true -Dtests=false
fi
ninja -C "$build" fuzz/fuzz_gguf fuzz/gguf_seeds

corpus="$build/corpus/gguf"
seeds="$build/seeds/gguf"
artifacts="$build/artifacts"
mkdir -p "$corpus" "$seeds" "$artifacts"

shopt -s nullglob
models=(../shared/models/*/*.gguf ../shared/golden/models/*.gguf)
rm -f "$seeds"/*.gguf
"$build/fuzz/gguf_seeds" "$seeds" "${models[@]}"

echo "fuzz_gguf: ${secs}s, $(ls "$seeds" | wc -l) seeds, max_len $max_len" >&2
"$build/fuzz/fuzz_gguf" -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$corpus" "$seeds"
