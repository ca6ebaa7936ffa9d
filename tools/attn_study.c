/* Attention measurements of long prefills (docs/RIDGEFILL.md, "Sparse attention").
 *
 *   attn_study rate [--ctx 32768] [--rows 512] [--heads 12] [--kv-heads 2] [--hd 128] [-t N]
 *                   [--reps 3] [--sparse SPEC] [--kv f16|q8|f32]
 *     One prefill chunk's attention (--rows 1: one decode step): --rows query rows at the end
 *     of a --ctx-row cache (f16 unless --kv) of random values (Qwen2.5-1.5B's head shape by default), on the cpu backend; prints the
 *     best time of --reps, its GFLOP/s (4 * head_dim flops per (query, key, head): q.k and
 *     p.v, causal keys only) and the FMA peak of the same threads measured by a tight loop of
 *     independent fused multiply-adds. With --sparse SPEC (rk_sparse_params_parse) the call
 *     runs block-sparse (no dense tail unless tail= is given) and the share of blocks computed
 *     is printed (random data has no pattern: this times the machinery, not a document).
 *
 *   attn_study blocks [-m MODEL] -f TEXT [--len 8192] [-t N] --sparse SPEC
 *     One exact-fill eval of the first --len tokens of TEXT with sparse attention; prints the
 *     calls that went sparse and the share of (query block, head, key block) triples computed. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rk_attn_sparse.h"
#include "rk_ext.h"
#include "rk_kernels.h"
#include "tb.h"

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#endif

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- FMA peak: 10 independent 8-lane accumulators per thread ------------------------ */
typedef struct peak_job {
    int64_t iters;
    double secs;
    float sink;
} peak_job;

static void *peak_thread(void *vp) {
    peak_job *j = vp;
    const double t0 = now();
#if defined(__AVX2__) && defined(__FMA__)
    __m256 a[10], m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int u = 0; u < 10; u++) a[u] = _mm256_set1_ps((float)u);
    for (int64_t i = 0; i < j->iters; i++)
        for (int u = 0; u < 10; u++) a[u] = _mm256_fmadd_ps(a[u], m, c);
    __m256 s = a[0];
    for (int u = 1; u < 10; u++) s = _mm256_add_ps(s, a[u]);
    float out[8];
    _mm256_storeu_ps(out, s);
    j->sink = out[0];
#else
    float a[80];
    for (int u = 0; u < 80; u++) a[u] = (float)u;
    for (int64_t i = 0; i < j->iters; i++)
        for (int u = 0; u < 80; u++) a[u] = fmaf(a[u], 0.999999f, 1e-7f);
    j->sink = a[0] + a[79];
#endif
    j->secs = now() - t0;
    return NULL;
}

/* GFLOP/s of n_threads threads running the loop at once (2 flops per lane per FMA) */
static double fma_peak(int n_threads) {
    pthread_t th[256];
    peak_job job[256];
    const int64_t iters = 20 * 1000 * 1000;
    if (n_threads > 256) n_threads = 256;
    for (int t = 0; t < n_threads; t++) {
        job[t] = (peak_job){.iters = iters};
        pthread_create(&th[t], NULL, peak_thread, &job[t]);
    }
    double worst = 0;
    float sink = 0;
    for (int t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        worst = job[t].secs > worst ? job[t].secs : worst;
        sink += job[t].sink;
    }
    if (sink == 12345.0f) fprintf(stderr, "%g\n", (double)sink); /* keeps the loop */
    return (double)n_threads * (double)iters * 10 * 8 * 2 / worst * 1e-9;
}

/* ---- rate --------------------------------------------------------------------------- */
static int cmd_rate(int argc, char **argv) {
    int64_t ctx = 32768, rows = 512;
    int heads = 12, kv_heads = 2, hd = 128, threads = 0, reps = 3;
    const char *sparse = NULL, *kv = "f16";
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) {
            fprintf(stderr, "attn_study rate: %s needs a value\n", a);
            return 2;
        }
        i++;
        if (!strcmp(a, "--ctx")) ctx = atoll(v);
        else if (!strcmp(a, "--rows")) rows = atoll(v);
        else if (!strcmp(a, "--heads")) heads = atoi(v);
        else if (!strcmp(a, "--kv-heads")) kv_heads = atoi(v);
        else if (!strcmp(a, "--hd")) hd = atoi(v);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--reps")) reps = atoi(v);
        else if (!strcmp(a, "--sparse")) sparse = v;
        else if (!strcmp(a, "--kv")) kv = v;
        else {
            fprintf(stderr, "attn_study rate: unknown option %s\n", a);
            return 2;
        }
    }
    if (ctx < rows || rows < 1 || heads < 1 || kv_heads < 1 || heads % kv_heads || hd < 1 || reps < 1) {
        fprintf(stderr, "attn_study rate: need ctx >= rows >= 1, heads a multiple of kv-heads\n");
        return 2;
    }
    const uint32_t kv_type = !strcmp(kv, "q8") ? RK_DT_Q8_0 : !strcmp(kv, "f32") ? RK_DT_F32 : RK_DT_F16;
    if (strcmp(kv, "q8") && strcmp(kv, "f32") && strcmp(kv, "f16")) {
        fprintf(stderr, "attn_study rate: --kv takes f16, q8 or f32\n");
        return 2;
    }
    if (kv_type == RK_DT_Q8_0 && hd % 32) {
        fprintf(stderr, "attn_study rate: a q8 cache needs a head size that is a multiple of 32\n");
        return 2;
    }
    rk_err e = {0};
    rk_sparse_params sp = {0};
    if (sparse && rk_sparse_params_parse(sparse, &sp, &e)) {
        fprintf(stderr, "attn_study rate: %s\n", e.msg);
        return 2;
    }
    rk_backend *be = NULL;
    if (rk_backend_cpu_create(threads, &be, &e)) {
        fprintf(stderr, "attn_study rate: %s\n", e.msg);
        return 1;
    }
    const int64_t kvd = (int64_t)kv_heads * hd, qd = (int64_t)heads * hd;
    uint64_t row_b = 0;
    rk_dtype_row_bytes(kv_type, (uint64_t)kvd, &row_b);
    float *tmp = malloc((size_t)kvd * sizeof(float));
    char *k = malloc((size_t)ctx * row_b), *v = malloc((size_t)ctx * row_b);
    float *q = malloc((size_t)(rows * qd) * sizeof(float)), *o = malloc((size_t)(rows * qd) * sizeof(float));
    if (!k || !v || !q || !o || !tmp) {
        fprintf(stderr, "attn_study rate: out of memory\n");
        return 1;
    }
    uint64_t rng = 1;
    for (int side = 0; side < 2; side++)
        for (int64_t r = 0; r < ctx; r++) {
            char *dst = (side ? v : k) + (size_t)r * row_b;
            for (int64_t i = 0; i < kvd; i++) tmp[i] = tb_rand_normal(&rng);
            if (kv_type == RK_DT_F32) memcpy(dst, tmp, (size_t)kvd * sizeof(float));
            else if (kv_type == RK_DT_Q8_0) rk_quant_q8_0_from_f32(tmp, dst, kvd);
            else
                for (int64_t i = 0; i < kvd; i++) ((uint16_t *)dst)[i] = rk_f32_to_f16(tmp[i]);
        }
    free(tmp);
    for (int64_t i = 0; i < rows * qd; i++) q[i] = tb_rand_normal(&rng);
    rk_op_args a = {.op = RK_OP_ATTN};
    a.src0 = (rk_view){RK_DT_F32, {qd, rows, 1, 1}, (size_t)qd * sizeof(float), q};
    a.dst = (rk_view){RK_DT_F32, {qd, rows, 1, 1}, (size_t)qd * sizeof(float), o};
    a.src1 = (rk_view){kv_type, {kvd, ctx, 1, 1}, (size_t)row_b, k};
    a.src2 = (rk_view){kv_type, {kvd, ctx, 1, 1}, (size_t)row_b, v};
    a.attn = (rk_attn_params){heads, kv_heads, hd, 1.0f / sqrtf((float)hd), ctx - rows};
    rk_attn_sparse_stats st = {0};
    rk_attn_sparse lay;
    if (sp.on) {
        const int64_t tail = sp.tail > 0 ? sp.tail : 0; /* one call: no eval tail unless given */
        lay = (rk_attn_sparse){.block = sp.block ? sp.block : 64,
                               .min_kv = sp.min_kv ? sp.min_kv : 8192,
                               .dense_from = tail ? ctx - tail : INT64_MAX,
                               .n_sink = sp.n_sink ? sp.n_sink : 64,
                               .window = sp.window ? sp.window : 1024,
                               .n_est = sp.n_est ? sp.n_est : 64,
                               .mass = sp.mass > 0 ? sp.mass : 0.95f,
                               .stats = &st};
        a.attn_sparse = &lay;
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = now();
        if (rk_backend_run(be, &a, &e)) {
            fprintf(stderr, "attn_study rate: %s\n", e.msg);
            return 1;
        }
        const double dt = now() - t0;
        best = dt < best ? dt : best;
    }
    /* causal (query, key) pairs: rows at positions ctx - rows .. ctx - 1 */
    const double pairs = (double)rows * (double)(ctx - rows) + (double)rows * (double)(rows + 1) / 2;
    const double gflop = 4.0 * hd * heads * pairs * 1e-9;
    const int nt = be->n_threads;
    printf("attention: ctx %lld, rows %lld, %d heads / %d KV heads of %d, %d threads, %s cache%s\n", (long long)ctx,
           (long long)rows, heads, kv_heads, hd, nt, kv, sp.on ? ", sparse" : "");
    printf("  best of %d: %.4f s, %.2f GFLOP (dense equivalent), %.2f GFLOP/s", reps, best, gflop, gflop / best);
    if (rows == 1) printf(", %.2f GB/s of K and V", 2.0 * (double)ctx * (double)row_b / best * 1e-9); /* read once */
    printf("\n");
    if (sp.on && st.blocks_causal)
        printf("  sparse: %llu of %llu blocks computed (%.3f), over %d calls\n", (unsigned long long)st.blocks_done,
               (unsigned long long)st.blocks_causal, (double)st.blocks_done / (double)st.blocks_causal, reps);
    const double peak = fma_peak(nt);
    printf("FMA peak (%d threads, 8-lane f32): %.2f GFLOP/s; attention at %.1f%% of it\n", nt, peak,
           100.0 * gflop / best / peak);
    free(k), free(v), free(q), free(o);
    rk_backend_destroy(be);
    return 0;
}

/* ---- blocks ------------------------------------------------------------------------- */
static int cmd_blocks(int argc, char **argv) {
    const char *model = NULL, *text = NULL, *sparse = NULL;
    int len = 8192, threads = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        const char *a = argv[i], *v = argv[i + 1];
        if (!strcmp(a, "-m")) model = v;
        else if (!strcmp(a, "-f")) text = v;
        else if (!strcmp(a, "--len")) len = atoi(v);
        else if (!strcmp(a, "-t")) threads = atoi(v);
        else if (!strcmp(a, "--sparse")) sparse = v;
        else {
            fprintf(stderr, "attn_study blocks: unknown option %s\n", a);
            return 2;
        }
    }
    char mbuf[4096];
    if (!model) model = tb_default_model(mbuf, sizeof mbuf);
    if (!text || !sparse || len < 2) {
        fprintf(stderr, "attn_study blocks: -f TEXT and --sparse SPEC are needed\n");
        return 2;
    }
    rk_err e = {0};
    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_fill_params fp = {.mode = RK_FILL_OFF};
    if (rk_sparse_params_parse(sparse, &fp.sparse, &e) || rk_model_load(model, &m, &e)) {
        fprintf(stderr, "attn_study blocks: %s\n", e.msg);
        return 1;
    }
    size_t nb = 0;
    char *txt = tb_read_file(text, &nb);
    int32_t *ids = NULL;
    size_t n = 0;
    if (!txt || rk_model_tokenize(m, txt, nb, true, false, &ids, &n, &e)) {
        fprintf(stderr, "attn_study blocks: cannot read or tokenize %s %s\n", text, e.msg);
        return 1;
    }
    free(txt);
    if (n > (size_t)len) n = (size_t)len;
    rk_session_params p = rk_session_params_default();
    p.n_ctx = (int32_t)n, p.n_threads = threads;
    if (rk_session_create(m, &p, &s, &e) || rk_session_set_fill(s, &fp, &e) ||
        rk_session_eval(s, ids, n, NULL, false, &e)) {
        fprintf(stderr, "attn_study blocks: %s\n", e.msg);
        return 1;
    }
    rk_sparse_stats st;
    rk_session_sparse_stats(s, &st);
    printf("%s: %zu tokens, sparse %s: %llu calls sparse, %llu dense; %llu of %llu blocks computed (%.3f)\n", text, n,
           sparse, (unsigned long long)st.calls_sparse, (unsigned long long)st.calls_dense,
           (unsigned long long)st.blocks_done, (unsigned long long)st.blocks_causal,
           st.blocks_causal ? (double)st.blocks_done / (double)st.blocks_causal : 1.0);
    rk_session_destroy(s);
    free(ids);
    rk_model_destroy(m);
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "rate")) return cmd_rate(argc, argv);
    if (argc >= 2 && !strcmp(argv[1], "blocks")) return cmd_blocks(argc, argv);
    fprintf(stderr, "usage: attn_study rate [--ctx N] [--rows N] [--heads H] [--kv-heads K] [--hd D] [-t N] "
                    "[--reps R] [--sparse SPEC]\n"
                    "       attn_study blocks [-m MODEL] -f TEXT [--len N] [-t N] --sparse SPEC\n");
    return 2;
}
