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
# Kernel mode: scripts/bench_llamacpp.sh --kernels BUILD_DIR (a meson build of this repo)
#   builds a microbenchmark against BUILD_DIR's kernel libraries and prints, per weight type
#   and a few model shapes, the thread CPU time (best of 5, one thread) of the f32-activation
#   row functions (rk_quant_fast: dot per row; to_f32 tiles + the AVX2 f32 GEMM) against the
#   integer path (rk_qdot_fast: 8-bit activations; dot, dot_x4). CPU time, not wall time, so
#   that a loaded machine changes the figures less (caches are still shared).
# GEMV mode: scripts/bench_llamacpp.sh --gemv BUILD_DIR builds scripts/bench_gemv.c against
#   BUILD_DIR's kernels and prints the decode GEMV's GB/s (rk_qdot_fast dot, dot_2w where the
#   type has one) on Q4_K, Q6_K, Q4_1 rows: in cache (1 thread, thread CPU time, best of 300),
#   then streamed from memory (120-300 MB, THREADS threads, wall time, best of 4) with the
#   weights on 4 KiB pages and on transparent huge pages, alternating, 2 rounds.
# Env: THREADS (default 2), NP (prompt tokens, default 512), NG (decode tokens, default 64).
#
# Prints, best of the rounds for each: prefill and decode tok/s of both and the ratios
# ridgekv / llama.cpp, the memcpy bandwidth (GB/s, THREADS threads, 1 GiB buffers, best
# of 5 copies; read + write bytes counted), the read bandwidth (same buffers, a sum) and the
# same read from a buffer on transparent huge pages (where ridgekv's weights sit),
# the weight bytes read per decoded token (every
# tensor of the GGUF except token_embd when an output.weight exists: that table is only
# gathered a row at a time), and ridgekv's decode as a fraction of that bandwidth.
set -euo pipefail
if [ "${1:-}" = "--gemv" ]; then
  bd=${2:?usage: $0 --gemv BUILD_DIR}
  src=$(cd "$(dirname "$0")/.." && pwd)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cc -O2 -std=c11 -mavx2 -mfma -mf16c -DRK_HAVE_AVX2=1 -I"$src/kernels" -I"$src/kernels/include" \
    -I"$src/base/include" "$src/scripts/bench_gemv.c" "$bd/kernels/librk_kernels.a" \
    "$bd/kernels/librk_kernels_avx2.a" "$bd/base/librk_base.a" -lm -lpthread -o "$tmp/gemv"
  # type ids: 3 Q4_1, 12 Q4_K, 14 Q6_K
  for a in "12 1536 2048" "14 1536 2048" "3 576 4096"; do "$tmp/gemv" $a 1 300 0; done
  for r in 1 2; do
    for a in "12 1536 200000" "14 1536 150000" "3 576 300000"; do
      "$tmp/gemv" $a "${THREADS:-2}" 4 0
      "$tmp/gemv" $a "${THREADS:-2}" 4 1
    done
  done
  exit 0
fi
if [ "${1:-}" = "--kernels" ]; then
  bd=${2:?usage: $0 --kernels BUILD_DIR}
  src=$(cd "$(dirname "$0")/.." && pwd)
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cat > "$tmp/mb.c" <<'EOF'
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "quant_impl.h"
#include "ops_impl.h"
static double cpu_now(void){struct timespec t;clock_gettime(CLOCK_THREAD_CPUTIME_ID,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int argc,char**argv){
  uint32_t type = argc>1? (uint32_t)atoi(argv[1]) : RK_DT_Q4_K;
  int64_t k = argc>2? atoll(argv[2]):1536, m = argc>3? atoll(argv[3]):8960, n = argc>4? atoll(argv[4]):64;
  uint64_t rb=0; rk_dtype_row_bytes(type,k,&rb);
  uint8_t *w = malloc(rb*m); for (size_t i=0;i<rb*m;i++) w[i]=rand();
  const rk_dtype_traits *tr = rk_dtype_get(type);
  // sane f16 scales: set every 2-byte f16 to 0.01 at block starts is type specific; just keep random bytes but fix exponents
  for (size_t b=0;b<rb*m/tr->type_size;b++){ uint8_t*q=w+b*tr->type_size; uint16_t h=rk_f32_to_f16(0.01f);
    if(type==RK_DT_Q6_K) memcpy(q+208,&h,2); else {memcpy(q,&h,2); if(type==RK_DT_Q4_K||type==RK_DT_Q4_1) memcpy(q+2,&h,2);} }
  float *x = malloc(4*k*n); for(int64_t i=0;i<k*n;i++) x[i]=(rand()%2000-1000)/1000.0f;
  float *y = malloc(4*m*n); float *buf = aligned_alloc(64, 4*k*64);
  const rk_quant_fns *f = rk_quant_fast(type); const rk_qdot_fns *qd = rk_qdot_fast(type);
  size_t xr = (size_t)(k/qd->act_block)*qd->act_bytes; uint8_t *xq = malloc(xr*n);
  double best[4]={1e9,1e9,1e9,1e9};
  for(int rep=0;rep<5;rep++){
    double t0=cpu_now(); for(int64_t j=0;j<m;j++) y[j]=f->dot(w+rb*j,x,k); double t1=cpu_now();
    qd->quant_act(x,xq,k); for(int64_t j=0;j<m;j++) y[j]=qd->dot(w+rb*j,xq,k); double t2=cpu_now();
    if(t1-t0<best[0])best[0]=t1-t0; if(t2-t1<best[1])best[1]=t2-t1;
    // gemm old: tiles of 16 rows
    t0=cpu_now();
    for(int64_t j0=0;j0<m;j0+=16){ for(int j=0;j<16;j++) f->to_f32(w+rb*(j0+j),buf+j*k,k); rk_cpu_kern_avx2.gemm_nt(n,16,k,x,k,buf,k,y+j0,m);} 
    t1=cpu_now();
    for(int64_t t=0;t<n;t++) qd->quant_act(x+t*k,xq+t*xr,k);
    for(int64_t j0=0;j0<m;j0+=128) for(int64_t t=0;t+4<=n;t+=4) for(int64_t j=j0;j<j0+128&&j<m;j++){float o[4]; qd->dot_x4(w+rb*j,xq+t*xr,xr,k,o); y[t*m+j]=o[0];}
    t2=cpu_now();
    if(t1-t0<best[2])best[2]=t1-t0; if(t2-t1<best[3])best[3]=t2-t1;
  }
  printf("type %u k %lld m %lld: gemv f32-path %.2f ms (%.1f GB/s), int %.2f ms (%.1f GB/s) ratio %.2f | gemm n=%lld f32 %.1f ms int %.1f ms ratio %.2f\n",
    type,(long long)k,(long long)m,best[0]*1e3,rb*m/best[0]/1e9,best[1]*1e3,rb*m/best[1]/1e9,best[0]/best[1],(long long)n,best[2]*1e3,best[3]*1e3,best[2]/best[3]);
  return 0;
}
EOF
  cc -O2 -std=c11 -mavx2 -mfma -mf16c -DRK_HAVE_AVX2=1 -I"$src/kernels" -I"$src/kernels/include" \
    -I"$src/base/include" "$tmp/mb.c" "$bd/kernels/librk_kernels.a" "$bd/kernels/librk_kernels_avx2.a" \
    "$bd/base/librk_base.a" -lm -lpthread -o "$tmp/mb"
  # type ids: 2 Q4_0, 3 Q4_1, 8 Q8_0, 12 Q4_K, 14 Q6_K; k m n: Qwen2.5-1.5B and SmolLM2-135M shapes
  for a in "12 1536 8960" "14 8960 1536" "12 1536 1536" "14 1536 8960" "3 576 1536" "3 1536 576" "8 576 1536" "2 576 1536"; do
    "$tmp/mb" $a 64
  done
  exit 0
fi
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
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static size_t n_bytes = (size_t)1 << 30;
static char *src, *dst;
static int nt;
static int mode; /* 0 memcpy, 1 read (sum of 64-bit words), 2 read from huge pages */
static char *hsrc; /* n_bytes advised MADV_HUGEPAGE, as ridgekv's weight copy */
static unsigned long long sums[64];
static void *job(void *a) {
    size_t i = (size_t)a, part = n_bytes / nt;
    if (mode == 0) {
        memcpy(dst + i * part, src + i * part, part);
    } else {
        const unsigned long long *p = (const unsigned long long *)((mode == 2 ? hsrc : src) + i * part);
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
    const size_t hp = (size_t)2 << 20;
    char *r = mmap(NULL, n_bytes + hp, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r == MAP_FAILED) return 1;
    hsrc = (char *)(((uintptr_t)r + hp - 1) & ~(uintptr_t)(hp - 1));
    madvise(hsrc, n_bytes, MADV_HUGEPAGE);
    memset(hsrc, 1, n_bytes);
    for (mode = 0; mode < 3; mode++) {
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

# CPU probe: THREADS threads each run 8-bit multiply-adds (maddubs/madd, the K-quant dots'
# instructions) for ~0.2 s on registers, then ~0.2 s over a 3 MiB buffer of their own
# (past a 512 KiB L2, inside the shared L3: the in-cache GEMV's footprint); prints the
# slowest thread's G multiply-adds/s and GB/s. On a shared VM the machine's speed moved by up to 1.5x between runs: printed beside each round.
cat > "$tmp/probe.c" <<'EOF'
#include <immintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double rate[64][2];
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
#define BUF ((size_t)3 << 20)
static void *job(void *a) {
    size_t i = (size_t)a;
    __m256i x[8], acc[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) x[k] = _mm256_set1_epi8((char)(k + 1 + i)), acc[k] = _mm256_setzero_si256();
    const __m256i one = _mm256_set1_epi16(1), step = _mm256_set1_epi8(1);
    __m256i y = _mm256_set1_epi8(3);
    long iters = 0;
    double t0 = now(), t;
    do {
        for (int r = 0; r < 1000; r++) {
            y = _mm256_and_si256(_mm256_add_epi8(y, step), _mm256_set1_epi8(63)); /* not loop-invariant */
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                acc[k] = _mm256_add_epi32(acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(x[k], y), one));
        }
        iters += 1000;
    } while ((t = now()) - t0 < 0.2);
    rate[i][0] = iters * 8.0 * 32 / (t - t0) / 1e9;
    unsigned char *b = aligned_alloc(64, BUF);
    if (!b) return NULL;
    memset(b, (int)(i + 5), BUF);
    long bytes = 0;
    t0 = now();
    do {
        for (size_t o = 0; o < BUF; o += 256)
#pragma GCC unroll 8
            for (int k = 0; k < 8; k++)
                acc[k] = _mm256_add_epi32(
                    acc[k], _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(b + o + 32 * k)), y), one));
        bytes += (long)BUF;
    } while ((t = now()) - t0 < 0.2);
    rate[i][1] = bytes / (t - t0) / 1e9;
    int s = 0;
#pragma GCC unroll 8
    for (int k = 0; k < 8; k++) s += _mm256_extract_epi32(acc[k], 0);
    if (s == 12345) rate[i][1] += 1e-9;
    free(b);
    return NULL;
}
int main(int argc, char **argv) {
    int nt = argc > 1 ? atoi(argv[1]) : 1;
    if (nt < 1 || nt > 64) return 2;
    pthread_t th[64];
    for (int i = 0; i < nt; i++) pthread_create(&th[i], NULL, job, (void *)(size_t)i);
    for (int i = 0; i < nt; i++) pthread_join(th[i], NULL);
    double lo[2] = {rate[0][0], rate[0][1]};
    for (int i = 1; i < nt; i++)
        for (int j = 0; j < 2; j++) lo[j] = rate[i][j] < lo[j] ? rate[i][j] : lo[j];
    printf("%.1f %.1f\n", lo[0], lo[1]);
    return 0;
}
EOF
cc -O2 -mavx2 -pthread -o "$tmp/probe" "$tmp/probe.c"

for r in $(seq 1 "$rounds"); do
  "$tmp/probe" "$threads" > "$tmp/prk.$r.txt"
  "$rk" bench -m "$model" -p "$np" -n "$ng" -t "$threads" -r 1 --json > "$tmp/rk.$r.json" 2>/dev/null
  "$tmp/probe" "$threads" > "$tmp/pll.$r.txt"
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
hbw, hbw_all = best("bw.%d.txt", lambda p: float(open(p).read().split()[2]))
wb = gguf_decode_bytes(model)
print(f"model {os.path.basename(model)}, {threads} threads, prompt {np_}, decode {ng}; "
      f"best of {rounds} alternating rounds; load average {os.getloadavg()[0]:.2f} (shared machine)")
print("| | ridgekv | llama.cpp | ratio |")
print("|---|---|---|---|")
print(f"| prefill tok/s | {rk_pp:.1f} | {ll_pp:.1f} | {rk_pp / ll_pp:.2f}x |")
print(f"| decode tok/s | {rk_tg:.1f} | {ll_tg:.1f} | {rk_tg / ll_tg:.2f}x |")
print(f"per round: ridgekv pp {['%.1f' % v for v in rk_pp_all]} tg {['%.1f' % v for v in rk_tg_all]}; "
      f"llama.cpp pp {['%.1f' % v for v in ll_pp_all]} tg {['%.1f' % v for v in ll_tg_all]}")
def probe(tag):
    return ["%s reg / %s L3" % tuple(open(os.path.join(tmp, "%s.%d.txt" % (tag, r))).read().split())
            for r in range(1, rounds + 1)]
print(f"CPU probe before each run (slowest thread: G 8-bit multiply-adds/s on registers / "
      f"GB/s of them over 3 MiB): ridgekv {probe('prk')}, llama.cpp {probe('pll')}")
eff = rk_tg * wb / 1e9
print(f"memcpy bandwidth ({threads} threads, read+write): {bw:.1f} GB/s (rounds {['%.1f' % v for v in bw_all]})")
print(f"read bandwidth ({threads} threads, sum of 64-bit words): {rbw:.1f} GB/s (rounds {['%.1f' % v for v in rbw_all]})")
print(f"read bandwidth from huge pages (same sum, the buffer advised MADV_HUGEPAGE like ridgekv's weights): "
      f"{hbw:.1f} GB/s (rounds {['%.1f' % v for v in hbw_all]})")
print(f"weight bytes per decoded token: {wb / 1e6:.1f} MB; ridgekv decode streams {eff:.1f} GB/s = "
      f"{100 * eff / bw:.0f}% of memcpy, {100 * eff / rbw:.0f}% of read, {100 * eff / hbw:.0f}% of huge-page read; "
      f"llama.cpp {ll_tg * wb / 1e9:.1f} GB/s = {100 * ll_tg * wb / 1e9 / bw:.0f}% of memcpy")
PY
