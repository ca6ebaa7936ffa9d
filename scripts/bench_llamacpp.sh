#!/usr/bin/env bash
# ridgekv vs llama.cpp on one GGUF, back to back, plus the machine's memory bandwidth
# measured in the same run. llama.cpp is never part of this repo: build its llama-bench
# outside it (cmake -B build -DGGML_NATIVE=ON -DLLAMA_CURL=OFF && cmake --build build
# --target llama-bench -j2) and pass that build directory.
#
# Usage: scripts/bench_llamacpp.sh LLAMA_BUILD_DIR [MODEL.gguf] [ROUNDS] [RIDGEKV_BIN]
#   MODEL    default ~/.cache/ridgekv/SmolLM2-135M-Instruct.Q4_1.gguf
#   ROUNDS   alternating rounds (default 3): ridgekv, llama.cpp, memcpy, ridgekv, ...
#   RIDGEKV  default build-rel/cli/ridgekv (meson setup build-rel --buildtype=release)
# Env: THREADS (default 2), NP (prompt tokens, default 512), NG (decode tokens, default 64).
#
# Prints, best of the rounds for each: prefill and decode tok/s of both and the ratios
# ridgekv / llama.cpp, the memcpy bandwidth (GB/s, THREADS threads, 1 GiB buffers, best
# of 5 copies; read + write bytes counted) and the read bandwidth (same buffers, a sum),
# the weight bytes read per decoded token (every
# tensor of the GGUF except token_embd when an output.weight exists: that table is only
# gathered a row at a time), and ridgekv's decode as a fraction of that bandwidth.
set -euo pipefail
ll=${1:?usage: $0 LLAMA_BUILD_DIR [MODEL.gguf] [ROUNDS] [RIDGEKV_BIN]}
model=${2:-$HOME/.cache/ridgekv/SmolLM2-135M-Instruct.Q4_1.gguf}
rounds=${3:-3}
rk=${4:-build-rel/cli/ridgekv}
threads=${THREADS:-2}
np=${NP:-512}
ng=${NG:-64}
lb="$ll/bin/llama-bench"
[ -x "$lb" ] || { echo "bench_llamacpp: no llama-bench at $lb" >&2; exit 2; }
[ -x "$rk" ] || { echo "bench_llamacpp: no ridgekv binary at $rk" >&2; exit 2; }
[ -r "$model" ] || { echo "bench_llamacpp: cannot read model $model" >&2; exit 2; }

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# memcpy bandwidth: THREADS threads each copying its half of a 1 GiB buffer
cat > "$tmp/membw.c" <<'EOF'
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t n_bytes = (size_t)1 << 30;
static char *src, *dst;
static int nt;
static int mode; /* 0 memcpy, 1 read (sum of 64-bit words) */
static unsigned long long sums[64];
static void *job(void *a) {
    size_t i = (size_t)a, part = n_bytes / nt;
    if (mode == 0) {
        memcpy(dst + i * part, src + i * part, part);
    } else {
        const unsigned long long *p = (const unsigned long long *)(src + i * part);
        unsigned long long s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t k = 0; k < part / 8; k += 4) s0 += p[k], s1 += p[k + 1], s2 += p[k + 2], s3 += p[k + 3];
        sums[i] = s0 + s1 + s2 + s3;
    }
    return NULL;
}
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
int main(int argc, char **argv) {
    nt = argc > 1 ? atoi(argv[1]) : 1;
    if (nt < 1 || nt > 64) return 2;
    src = malloc(n_bytes);
    dst = malloc(n_bytes);
    if (!src || !dst) return 1;
    memset(src, 1, n_bytes);
    memset(dst, 2, n_bytes);
    for (mode = 0; mode < 2; mode++) {
        double best = 0;
        for (int r = 0; r < 5; r++) {
            pthread_t th[64];
            double t0 = now();
            for (int i = 0; i < nt; i++) pthread_create(&th[i], NULL, job, (void *)(size_t)i);
            for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
            double gbs = (mode == 0 ? 2.0 : 1.0) * n_bytes / (now() - t0) / 1e9;
            if (gbs > best) best = gbs;
        }
        printf("%.2f ", best);
    }
    printf("\n");
    return dst[12345] == 1 && sums[0] != 0 ? 0 : 1;
}
EOF
cc -O3 -march=native -pthread -o "$tmp/membw" "$tmp/membw.c"

for r in $(seq 1 "$rounds"); do
  "$rk" bench -m "$model" -p "$np" -n "$ng" -t "$threads" -r 1 --json > "$tmp/rk.$r.json" 2>/dev/null
  "$lb" -m "$model" -p "$np" -n "$ng" -t "$threads" -r 1 -o json > "$tmp/ll.$r.json" 2>/dev/null
  "$tmp/membw" "$threads" > "$tmp/bw.$r.txt"
done

python3 - "$tmp" "$rounds" "$model" "$threads" "$np" "$ng" <<'PY'
import json, os, struct, sys
tmp, rounds, model, threads, np_, ng = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6])

def gguf_decode_bytes(path):
    """Bytes of the tensors a decode step streams (see the header of this script)."""
    # ggml type -> (block elements, block bytes)
    ts = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
          9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176),
          14: (256, 210), 15: (256, 292), 30: (1, 2)}
    f = open(path, "rb")
    def rd(fmt):
        return struct.unpack("<" + fmt, f.read(struct.calcsize("<" + fmt)))[0]
    def rstr():
        return f.read(rd("Q")).decode("utf-8", "replace")
    assert f.read(4) == b"GGUF", "not a GGUF file"
    ver = rd("I"); n_t = rd("Q"); n_kv = rd("Q")
    sizes = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
    def skip(t):
        if t == 8: rstr()
        elif t == 9:
            et = rd("I"); n = rd("Q")
            for _ in range(n): skip(et)
        else: f.read(sizes[t])
    for _ in range(n_kv):
        rstr(); skip(rd("I"))
    total, names = 0, {}
    for _ in range(n_t):
        name = rstr(); nd = rd("I"); dims = [rd("Q") for _ in range(nd)]; t = rd("I"); rd("Q")
        ne = 1
        for d in dims: ne *= d
        be, bb = ts[t]
        names[name] = ne // be * bb
    emb = names.get("token_embd.weight", 0)
    total = sum(names.values())
    if "output.weight" in names: total -= emb
    return total

def best(pattern, key):
    vals = []
    for r in range(1, rounds + 1):
        vals.append(key(os.path.join(tmp, pattern % r)))
    return max(vals), vals

def rk_val(field):
    def k(p):
        d = json.load(open(p))
        return max(x[field] for x in d["results"])
    return k

def ll_val(kind):
    def k(p):
        d = json.load(open(p))
        for x in d:
            if kind == "pp" and x["n_prompt"] > 0 and x["n_gen"] == 0: return x["avg_ts"]
            if kind == "tg" and x["n_gen"] > 0 and x["n_prompt"] == 0: return x["avg_ts"]
        raise SystemExit("llama-bench json without the %s test" % kind)
    return k

rk_pp, rk_pp_all = best("rk.%d.json", rk_val("prefill_tok_s"))
rk_tg, rk_tg_all = best("rk.%d.json", rk_val("decode_tok_s"))
ll_pp, ll_pp_all = best("ll.%d.json", ll_val("pp"))
ll_tg, ll_tg_all = best("ll.%d.json", ll_val("tg"))
bw, bw_all = best("bw.%d.txt", lambda p: float(open(p).read().split()[0]))
rbw, rbw_all = best("bw.%d.txt", lambda p: float(open(p).read().split()[1]))
wb = gguf_decode_bytes(model)
print(f"model {os.path.basename(model)}, {threads} threads, prompt {np_}, decode {ng}; "
      f"best of {rounds} alternating rounds; load average {os.getloadavg()[0]:.2f} (shared machine)")
print("| | ridgekv | llama.cpp | ratio |")
print("|---|---|---|---|")
print(f"| prefill tok/s | {rk_pp:.1f} | {ll_pp:.1f} | {rk_pp / ll_pp:.2f}x |")
print(f"| decode tok/s | {rk_tg:.1f} | {ll_tg:.1f} | {rk_tg / ll_tg:.2f}x |")
print(f"per round: ridgekv pp {['%.1f' % v for v in rk_pp_all]} tg {['%.1f' % v for v in rk_tg_all]}; "
      f"llama.cpp pp {['%.1f' % v for v in ll_pp_all]} tg {['%.1f' % v for v in ll_tg_all]}")
eff = rk_tg * wb / 1e9
print(f"memcpy bandwidth ({threads} threads, read+write): {bw:.1f} GB/s (rounds {['%.1f' % v for v in bw_all]})")
print(f"read bandwidth ({threads} threads, sum of 64-bit words): {rbw:.1f} GB/s (rounds {['%.1f' % v for v in rbw_all]})")
print(f"weight bytes per decoded token: {wb / 1e6:.1f} MB; ridgekv decode streams {eff:.1f} GB/s = "
      f"{100 * eff / bw:.0f}% of memcpy, {100 * eff / rbw:.0f}% of read; "
      f"llama.cpp {ll_tg * wb / 1e9:.1f} GB/s = {100 * ll_tg * wb / 1e9 / bw:.0f}% of memcpy")
PY
