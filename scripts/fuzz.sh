#!/usr/bin/env bash
# Builds the libFuzzer GGUF target with clang and runs it for a bounded time.
#   scripts/fuzz.sh [SECONDS] [extra libFuzzer flags...]     (default 60 s)
# Seeds: ../shared/models/*/*.gguf and ../shared/golden/models/*.gguf when present
# (cut to the first MAX_LEN bytes: the headers are what the parser reads), plus a
# tiny hand-made valid file. New corpus entries go to build-fuzz/corpus/gguf,
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
ninja -C "$build" fuzz/fuzz_gguf

corpus="$build/corpus/gguf"
seeds="$build/seeds/gguf"
artifacts="$build/artifacts"
mkdir -p "$corpus" "$seeds" "$artifacts"

shopt -s nullglob
for f in ../shared/models/*/*.gguf ../shared/golden/models/*.gguf; do
    head -c "$max_len" "$f" > "$seeds/$(basename "$f")"
done
# v3, 1 tensor, 1 kv: general.architecture = "llama"; tensor "w" F32 [4] at 0
{
    printf 'GGUF\x03\x00\x00\x00'
    printf '\x01\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00'
    printf '\x14\x00\x00\x00\x00\x00\x00\x00general.architecture\x08\x00\x00\x00'
    printf '\x05\x00\x00\x00\x00\x00\x00\x00llama'
    printf '\x01\x00\x00\x00\x00\x00\x00\x00w\x01\x00\x00\x00\x04\x00\x00\x00\x00\x00\x00\x00'
    printf '\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00'
    head -c 26 /dev/zero # pad the 102-byte header to 128
    printf '\x00\x00\x80\x3f\x00\x00\x00\x40\x00\x00\x40\x40\x00\x00\x80\x40'
} > "$seeds/tiny.gguf"

echo "fuzz_gguf: ${secs}s, $(ls "$seeds" | wc -l) seeds, max_len $max_len" >&2
"$build/fuzz/fuzz_gguf" -max_total_time="$secs" -max_len="$max_len" -rss_limit_mb=2048 \
    -timeout=10 -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$corpus" "$seeds"
