#!/usr/bin/env bash
# Two ridgekv binaries side by side in one run: alternating A B A B ... so that machine
# load hits both alike; prints per prompt length the best TTFT / prefill / decode of each
# and the ratios B/A. Usage:
#   scripts/bench_compare.sh OLD_BIN NEW_BIN [ROUNDS] [-- bench flags]
# default bench flags: -p 512,2048 -n 64 -t 2 -r 1 (each round is one bench run per binary)
set -euo pipefail
a=$1 b=$2; shift 2
rounds=3
if [ $# -gt 0 ] && [ "$1" != "--" ]; then rounds=$1; shift; fi
[ "${1:-}" = "--" ] && shift
flags=("$@")
[ ${#flags[@]} -eq 0 ] && flags=(-p 512,2048 -n 64 -t 2 -r 1)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq 1 "$rounds"); do
  "$a" bench "${flags[@]}" --json > "$tmp/a.$r.json"
  "$b" bench "${flags[@]}" --json > "$tmp/b.$r.json"
done
python3 - "$tmp" "$rounds" "$a" "$b" <<'PY'
import json, sys, os
tmp, rounds, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
def best(tag):
    out = {}
    for r in range(1, rounds + 1):
        d = json.load(open(os.path.join(tmp, f"{tag}.{r}.json")))
        for x in d["results"]:
            k = (x["n_prompt"], x.get("kv", "f16"), x.get("fill", "off"))
            o = out.setdefault(k, {"ttft_ms": 1e30, "prefill_tok_s": 0, "decode_tok_s": 0})
            o["ttft_ms"] = min(o["ttft_ms"], x["ttft_ms"])
            o["prefill_tok_s"] = max(o["prefill_tok_s"], x["prefill_tok_s"])
            o["decode_tok_s"] = max(o["decode_tok_s"], x["decode_tok_s"])
    return out
A, B = best("a"), best("b")
print(f"A = {a}\nB = {b}\nbest of {rounds} alternating rounds; load average {os.getloadavg()[0]:.2f}")
print("| prompt | kv | fill | prefill tok/s A | B | B/A | decode tok/s A | B | B/A |")
print("|---|---|---|---|---|---|---|---|---|")
for k in sorted(A):
    if k not in B: continue
    x, y = A[k], B[k]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {x['prefill_tok_s']:.1f} | {y['prefill_tok_s']:.1f} | "
          f"{y['prefill_tok_s']/x['prefill_tok_s']:.3f} | {x['decode_tok_s']:.1f} | {y['decode_tok_s']:.1f} | "
          f"{y['decode_tok_s']/max(x['decode_tok_s'],1e-9):.3f} |")
PY
