#!/usr/bin/env bash
# The figures of docs/TIERS.md in one run, default model, 2 threads:
#  1. second-question TTFT: `ask` twice on the same N-token document (the first reads and
#     saves its KV, the second loads it through O_DIRECT, so from disk, not the page cache);
#  2. decode under --kv-budget 25% vs all in memory at N tokens (bench, alternated A B A B);
#  2b. the same for lowram, the budget a quarter of its compressed KV (of the in-memory run);
#  3. zstd on the KV blocks of f16, q8 and lowram (ratio, compress / decompress MB/s, levels
#     1, 3, 9: `zstd -b` on the blocks `ridgekv cache cat` writes);
#  4. save / load throughput of the document cache against dd's sequential write / read
#     (O_DIRECT, 256 MiB) on the same file system, in the same run.
# Usage: scripts/bench_tiers.sh [RIDGEKV_BIN] [N_TOKENS] [ROUNDS]
#   defaults: build/cli/ridgekv (or ridgekv on PATH), 8000, 2. Use a release build.
#   SECTIONS="1 2 2b 3" (the default) picks sections (1 includes 4), e.g. SECTIONS="1 3" to
#   fit a 5-minute quiet slot; 2b also runs the lowram budget over the whole state
#   (RIDGEKV_BUDGET_WHOLE=1) beside the default accounting (docs/TIERS.md).
set -euo pipefail
bin=${1:-}
if [ -z "$bin" ]; then
  if [ -x build/cli/ridgekv ]; then bin=build/cli/ridgekv; else bin=$(command -v ridgekv); fi
fi
n=${2:-8000}   # bench asks for a context of N + 33: 8000 stays inside an 8192-token model
rounds=${3:-2}
sections=" ${SECTIONS:-1 2 2b 3} "
want() { [[ "$sections" == *" $1 "* ]]; }
here=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/rk-bench-tiers-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
model=${RIDGEKV_MODEL:-${XDG_CACHE_HOME:-$HOME/.cache}/ridgekv/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || { echo "bench_tiers: no model at $model (ridgekv pull)" >&2; exit 1; }
export XDG_CACHE_HOME=$tmp/xdg
echo "bench_tiers: $bin, model $model, N=$n tokens, $rounds rounds, $(nproc) cores (shared: numbers are noisy)"

# a document of about N tokens of the model (the corpus repeated; ~4 bytes per token)
corpus=$(ls "$here"/../shared/corpus/austen_emma.txt 2>/dev/null || true)
[ -n "$corpus" ] || corpus=$here/samples/docs/ridgekv_design.md
mkdoc() { : > "$2"; while [ "$(wc -c < "$2")" -lt $(($1 * 4)) ]; do cat "$corpus" >> "$2"; done
          head -c $(($1 * 4)) "$2" > "$2.cut" && mv "$2.cut" "$2"; }
doc=$tmp/doc.txt
# section 1's document stays inside the default model's trained 8192 tokens (ask refuses a
# context past it): at most 7000 tokens, context N + 1024
n1=$(( n > 7000 ? 7000 : n ))
mkdoc "$n1" "$doc"
ctx=$((n1 + 1024))

if want 1; then
echo "== 1. second question on the same document (TTFT); 4. save / load vs dd =="
ttft() { sed -n 's/.*time to first token \([0-9.]*\) s.*/\1/p' "$1" | tail -1; }
for r in $(seq 1 "$rounds"); do
  rm -rf "$XDG_CACHE_HOME"
  "$bin" ask -m "$model" -t 2 -c "$ctx" -n 16 -v --doc "$doc" "What is this document about?" > "$tmp/a1.out" 2> "$tmp/a1.err"
  sync
  echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true # when allowed; O_DIRECT reads bypass the page cache anyway
  "$bin" ask -m "$model" -t 2 -c "$ctx" -n 16 -v --doc "$doc" "Who wrote it?" > "$tmp/a2.out" 2> "$tmp/a2.err"
  grep -h "reused cached KV\|document cache:" "$tmp/a1.err" "$tmp/a2.err" | sed 's/^/  /'
  t1=$(ttft "$tmp/a1.err"); t2=$(ttft "$tmp/a2.err")
  python3 -c "import sys; a,b=float(sys.argv[1]),float(sys.argv[2]); print(f'  round $r: first TTFT {a:.2f} s, second {b:.3f} s: {100*b/a:.2f}% of the first')" "$t1" "$t2"
done
mkdir -p "$XDG_CACHE_HOME"
dd if=/dev/zero of="$XDG_CACHE_HOME/dd.bin" bs=1M count=256 oflag=direct conv=fsync 2>&1 | tail -1 | sed 's/^/  dd write: /'
dd if="$XDG_CACHE_HOME/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | sed 's/^/  dd read:  /'
rm -f "$XDG_CACHE_HOME/dd.bin"
fi

if want 2; then
echo "== 2. decode with --kv-budget 25% vs all in memory, N=$n =="
for r in $(seq 1 "$rounds"); do
  "$bin" bench -m "$model" -p "$n" -n 32 -r 1 -t 2 --json > "$tmp/m.$r.json" 2> /dev/null
  "$bin" bench -m "$model" -p "$n" -n 32 -r 1 -t 2 --kv-budget 25% --json > "$tmp/b.$r.json" 2> "$tmp/b.$r.err"
  grep "kv tier" "$tmp/b.$r.err" | tail -1 | sed 's/^/  /'
done
python3 - "$tmp" "$rounds" <<'PY'
import json, sys, os
tmp, rounds = sys.argv[1], int(sys.argv[2])
def best(tag):
    return max(json.load(open(os.path.join(tmp, f"{tag}.{r}.json")))["results"][0]["decode_tok_s"] for r in range(1, rounds + 1))
m, b = best("m"), best("b")
print(f"  decode: all in memory {m:.2f} tok/s, budget 25% {b:.2f} tok/s: {b/m:.2f}x (best of {rounds})")
PY
fi

if want 2b; then
echo "== 2b. lowram decode with --kv-budget = 25% of its compressed KV vs all in memory, N=$n =="
for r in $(seq 1 "$rounds"); do
  "$bin" bench -m "$model" -p "$n" -n 32 -r 1 -t 2 --kv lowram --json > "$tmp/lm.$r.json" 2> /dev/null
  quarter=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["results"][0]["kv_bytes"]["total"] // 4)' "$tmp/lm.$r.json")
  "$bin" bench -m "$model" -p "$n" -n 32 -r 1 -t 2 --kv lowram --kv-budget "$quarter" --json > "$tmp/lb.$r.json" 2> "$tmp/lb.$r.err"
  echo "  budget $quarter bytes (a quarter of the in-memory run's lowram KV)"
  grep "kv tier" "$tmp/lb.$r.err" | tail -3 | sed 's/^/  /'
  RIDGEKV_BUDGET_WHOLE=1 "$bin" bench -m "$model" -p "$n" -n 32 -r 1 -t 2 --kv lowram --kv-budget "$quarter" --json > "$tmp/lw.$r.json" 2> "$tmp/lw.$r.err"
  echo "  the same budget over the whole state (RIDGEKV_BUDGET_WHOLE=1):"
  grep "kv tier" "$tmp/lw.$r.err" | tail -3 | head -1 | sed 's/^/  /'
done
python3 - "$tmp" "$rounds" <<'PY'
import json, sys, os
tmp, rounds = sys.argv[1], int(sys.argv[2])
def best(tag):
    return max(json.load(open(os.path.join(tmp, f"{tag}.{r}.json")))["results"][0]["decode_tok_s"] for r in range(1, rounds + 1))
m, b, w = best("lm"), best("lb"), best("lw")
print(f"  lowram decode: all in memory {m:.2f} tok/s, budget 25% on the movable rows {b:.2f} tok/s: {b/m:.2f}x, "
      f"over the whole state {w:.2f} tok/s: {w/m:.2f}x (best of {rounds})")
PY
fi

if want 3; then
zn=${ZSTD_TOKENS:-2048}
echo "== 3. zstd on KV blocks (f16, q8, lowram) of a $zn-token document =="
mkdoc "$zn" "$tmp/z.txt"
for kv in f16 q8 lowram; do
  rm -rf "$XDG_CACHE_HOME"
  "$bin" ask -m "$model" -t 2 -c $((zn + 2048)) -n 1 --kv "$kv" -v --doc "$tmp/z.txt" "Summary?" > /dev/null 2> "$tmp/z.err"
  grep -h "document cache: saved" "$tmp/z.err" | sed "s/^/  $kv: /"
  key=$("$bin" cache ls 2>/dev/null | awk '{print $1}' | head -1)
  "$bin" cache cat "$key" > "$tmp/$kv.rkkv"
  echo "  $kv block: $(wc -c < "$tmp/$kv.rkkv") bytes; zstd -b (level#file : in -> out (ratio), compress, decompress):"
  for lv in 1 3 9; do
    echo "    level $lv: $(zstd -b$lv -i1 "$tmp/$kv.rkkv" 2>&1 | tr "\r" "\n" | grep "MB/s" | tail -1 | sed "s/.*: *//")"
  done
done
fi
