#!/bin/bash
# Decode speed of `ridgekv ask` over a document already in the document cache, for several
# KV policies, alternating, ROUNDS rounds:
#   decode tok/s = (tokens generated - 1) / (wall(-n N) - wall(-n 1))
# so that loading the model and the cached KV, tokenizing the document and the question's
# prefill cancel out. Also prints the KV bytes that `ask -v` reports after the answer.
#
#   scripts/ask_decode_sweep.sh BIN MODEL DOC ROUNDS N KV1 [KV2 ...]
#   scripts/ask_decode_sweep.sh build/cli/ridgekv ~/.cache/ridgekv/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
#       /tmp/pers64k.txt 2 200 lowram lowram:kslots=150 lowram:kslots=300
#
# The first run of a policy whose stored state differs reads the whole document (minutes);
# run each KV item once before timing (decode-only options such as kslots, budget and full
# share the cached state of their base policy: docs/LOWRAM.md).
set -euo pipefail
if [ $# -lt 6 ]; then
    sed -n '2,14p' "$0" >&2
    exit 2
fi
BIN=$1 MODEL=$2 DOC=$3 ROUNDS=$4 N=$5
shift 5
Q="Retell the whole story in detail, chapter by chapter."
ERR=$(mktemp)
trap 'rm -f "$ERR"' EXIT

wall() { # KV N -> seconds
    local t0 t1
    t0=$(date +%s.%N)
    if ! "$BIN" ask -m "$MODEL" --doc "$DOC" --kv "$1" --fill off -t 2 -n "$2" --seed 1 -v "$Q" 2>"$ERR" >/dev/null; then
        echo "ask_decode_sweep: ridgekv ask --kv $1 failed:" >&2
        tail -5 "$ERR" >&2
        exit 1
    fi
    t1=$(date +%s.%N)
    awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }'
}

wall "$1" 1 >/dev/null # warm-up: the model's and the cached KV's pages
printf '%-28s %5s %4s %8s %8s %10s %s\n' kv round gen "n1 s" "nN s" "tok/s" "KV (f16)"
for ((r = 1; r <= ROUNDS; r++)); do
    for kv in "$@"; do
        a=$(wall "$kv" 1)
        b=$(wall "$kv" "$N")
        ng=$(grep -o '[0-9]* tokens generated' "$ERR" | cut -d' ' -f1)
        kvb=$(grep -o 'KV [a-z0-9]*.*MiB)' "$ERR" | sed 's/.*, \([0-9.]* MiB (f16: [0-9.]* MiB)\)/\1/')
        tps=$(awk -v n="$ng" -v a="$a" -v b="$b" 'BEGIN { print (n - 1) / (b - a) }')
        printf '%-28s %5d %4d %8.2f %8.2f %10.2f %s\n' "$kv" "$r" "$ng" "$a" "$b" "$tps" "$kvb"
    done
done
