/* Decode GEMV microbenchmark (scripts/bench_llamacpp.sh --gemv BUILD_DIR builds and runs it):
 * rk_qdot_fast's dot (dot_2w where the type has one) over m rows of k weights of one type.
 *   bench_gemv TYPE K M THREADS REPS HUGE
 * THREADS 1: thread CPU time (the matrix should fit in cache); more: wall time, rows split
 * evenly. HUGE 1: the weights on transparent huge pages (madvise, as rk_mapping_open_huge
 * gives them), 0: MADV_NOHUGEPAGE. Prints GB/s of weight bytes, best of REPS. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "quant_impl.h"

static int nt;
static uint8_t *w, *xq;
static uint64_t rb;
static int64_t k, m;
static const rk_qdot_fns *qd;
static float *y;

static double now(void) {
    struct timespec t;
    clock_gettime(nt == 1 ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void *job(void *a) {
    const int64_t i = (int64_t)(size_t)a, j1 = m * (i + 1) / nt;
    int64_t j = m * i / nt;
    if (qd->dot_2w)
        for (; j + 2 <= j1; j += 2) qd->dot_2w(w + rb * j, rb, xq, k, y + j);
    for (; j < j1; j++) y[j] = qd->dot(w + rb * j, xq, k);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: bench_gemv TYPE K M THREADS REPS HUGE\n");
        return 2;
    }
    const uint32_t type = (uint32_t)atoi(argv[1]);
    k = atoll(argv[2]);
    m = atoll(argv[3]);
    nt = atoi(argv[4]);
    const int reps = atoi(argv[5]), huge = atoi(argv[6]);
    qd = rk_qdot_fast(type);
    if (!qd || nt < 1 || nt > 64 || !rk_dtype_row_bytes(type, (uint64_t)k, &rb)) {
        fprintf(stderr, "bench_gemv: no integer dot for type %u, k %lld, or bad thread count\n", type, (long long)k);
        return 2;
    }
    const size_t hp = (size_t)2 << 20, sz = ((size_t)(rb * m) + hp - 1) & ~(hp - 1);
    w = aligned_alloc(hp, sz);
    if (!w) return 1;
    if (madvise(w, sz, huge ? MADV_HUGEPAGE : MADV_NOHUGEPAGE)) perror("madvise");
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < rb * m; i++) s ^= s << 13, s ^= s >> 7, s ^= s << 17, w[i] = (uint8_t)s;
    const rk_dtype_traits *tr = rk_dtype_get(type);
    const uint16_t h = rk_f32_to_f16(0.01f); /* finite block scales */
    for (size_t b = 0; b < rb * m / tr->type_size; b++) {
        uint8_t *q = w + b * tr->type_size;
        if (type == RK_DT_Q6_K) memcpy(q + 208, &h, 2);
        else memcpy(q, &h, 2), memcpy(q + 2, &h, 2);
    }
    float *x = malloc(sizeof(float) * (size_t)k);
    y = malloc(sizeof(float) * (size_t)m);
    xq = malloc((size_t)(k / qd->act_block) * qd->act_bytes);
    if (!x || !y || !xq) return 1;
    for (int64_t i = 0; i < k; i++) x[i] = (float)((i * 37) % 2000 - 1000) / 1000.0f;
    qd->quant_act(x, xq, k);
    double best = 1e9;
    for (int r = 0; r < reps; r++) {
        pthread_t th[64];
        const double t0 = now();
        for (int i = 1; i < nt; i++) pthread_create(&th[i], NULL, job, (void *)(size_t)i);
        job(0);
        for (int i = 1; i < nt; i++) pthread_join(th[i], NULL);
        const double t = now() - t0;
        if (t < best) best = t;
    }
    printf("%s k %lld m %lld, %d thread(s), %s: %.1f GB/s\n", rk_dtype_name(type), (long long)k, (long long)m, nt,
           nt == 1 ? "in cache"
           : huge  ? "huge pages"
                   : "4 KiB pages",
           (double)(rb * m) / best / 1e9);
    return 0;
}
