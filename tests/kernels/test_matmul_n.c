/* RK_OP_MATMUL_N (one activation against up to three weights: a layer's Q, K, V; gate and
 * up) on every CPU backend: bit for bit the MATMULs it stands for, padding of the outputs
 * untouched, at decode (n < 4: one split of every weight's rows, the activation quantised
 * once per format) and prefill sizes (integer tiles of the K-quants in one dispatch, f32
 * tiles weight by weight); the split into MATMULs on a backend without a kernel for it;
 * bad sets rejected with a message. The MATMUL cases of test_ops.c hold each weight's
 * product against cpu_ref, so equality here carries their tolerance over. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "quant_rows.h"
#include "cpu_backends.h"
#include "tb.h"

/* m rows of k elements of type, nb1 = row bytes (rand_row's blocks copied in) */
static rk_view rand_weight(uint32_t type, int64_t k, int64_t m, uint64_t *rng) {
    const size_t rb = row_bytes(type, k);
    uint8_t *w = malloc(rb * (size_t)m);
    cr_assert(w);
    for (int64_t j = 0; j < m; j++) {
        void *base;
        uint8_t *r = rand_row(type, k, rng, &base);
        memcpy(w + (size_t)j * rb, r, rb);
        free(base);
    }
    return (rk_view){type, {k, m, 1, 1}, rb, w};
}

/* (n, m) f32 rows 3 floats wider than m, every float a NaN sentinel of its own */
static rk_view sentinel_dst(int64_t n, int64_t m) {
    const int64_t ld = m + 3;
    uint32_t *d = malloc((size_t)(n * ld) * sizeof(float) + 1);
    cr_assert(d);
    for (int64_t i = 0; i < n * ld; i++) d[i] = 0x7fc00000u | (uint32_t)(i & 0x3fffff);
    return (rk_view){RK_DT_F32, {m, n, 1, 1}, (size_t)ld * sizeof(float), d};
}

static size_t dst_bytes(const rk_view *d) { return (size_t)d->ne[1] * d->nb1; }

static rk_backend *make_be(int which) { return cpu_backend(which); }

typedef struct set_case {
    const char *name;
    int n_w;
    uint32_t type[RK_MATMUL_N_MAX];
    int64_t m[RK_MATMUL_N_MAX];
    int64_t k;
} set_case;

static const set_case sets[] = {
    /* Qwen2.5's Q4_K_M layer shapes, scaled down: Q/K Q4_K, V Q6_K (half the layers) */
    {"qkv q4_K q4_K q6_K", 3, {RK_DT_Q4_K, RK_DT_Q4_K, RK_DT_Q6_K}, {96, 16, 16}, 512},
    /* RidgeFill's late-layer cache writers: K and V alone (Q4_K_M's V is Q6_K) */
    {"kv q4_K q6_K", 2, {RK_DT_Q4_K, RK_DT_Q6_K}, {16, 16}, 512},
    {"gate/up q4_K q4_K", 2, {RK_DT_Q4_K, RK_DT_Q4_K}, {200, 200}, 256},
    /* SmolLM2's Q4_1 layers (integer decode, f32 prefill tiles) and a tied Q8_0 */
    {"qkv q4_1 q4_1 q8_0", 3, {RK_DT_Q4_1, RK_DT_Q4_1, RK_DT_Q8_0}, {72, 24, 24}, 576},
    /* one integer-tile part and two f32-tile parts in one prefill set; odd rows (dot_2w's tail) */
    {"mixed q6_K f16 f32", 3, {RK_DT_Q6_K, RK_DT_F16, RK_DT_F32}, {33, 17, 5}, 256},
    {"one weight bf16", 1, {RK_DT_BF16}, {40}, 64},
    {"q4_0 then an empty weight", 2, {RK_DT_Q4_0, RK_DT_Q4_0}, {50, 0}, 128},
};
static const int64_t ns[] = {1, 2, 3, 4, 9, 37};

Test(matmul_n, equals_its_matmuls_bit_for_bit) {
    for (size_t sc = 0; sc < sizeof sets / sizeof sets[0]; sc++) {
        const set_case *c = &sets[sc];
        uint64_t rng = 0x6d6d6e00u + sc;
        rk_view w[RK_MATMUL_N_MAX];
        for (int i = 0; i < c->n_w; i++) w[i] = rand_weight(c->type[i], c->k, c->m[i], &rng);
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            const int64_t n = ns[ni];
            float *x = rand_x(n * (c->k + 5), &rng); /* rows 5 floats apart beyond k */
            const rk_view xv = {RK_DT_F32, {c->k, n, 1, 1}, (size_t)(c->k + 5) * sizeof(float), x};
            for (int which = 0; which <= 3; which++) {
                rk_backend *be = make_be(which);
                rk_err err = {0};
                rk_matmul_n_args mm = {.n_w = c->n_w};
                rk_view sep[RK_MATMUL_N_MAX];
                for (int i = 0; i < c->n_w; i++) {
                    mm.w[i] = w[i];
                    mm.dst[i] = sentinel_dst(n, c->m[i]);
                    sep[i] = sentinel_dst(n, c->m[i]);
                    rk_op_args one = {.op = RK_OP_MATMUL, .src0 = w[i], .src1 = xv, .dst = sep[i]};
                    cr_assert_eq(rk_backend_run(be, &one, &err), RK_OK, "%s: %s", c->name, err.msg);
                }
                rk_op_args a = {.op = RK_OP_MATMUL_N, .src1 = xv, .mm = &mm};
                cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s n=%lld on %s: %s", c->name, (long long)n,
                             be->ops->name, err.msg);
                for (int i = 0; i < c->n_w; i++) {
                    /* whole buffers, padding included: the same bits, sentinels where nothing is written */
                    cr_assert(memcmp(mm.dst[i].data, sep[i].data, dst_bytes(&sep[i])) == 0,
                              "%s n=%lld on %s x%d: weight %d differs from its MATMUL", c->name, (long long)n,
                              be->ops->name, be->n_threads, i);
                    const float *y = sep[i].data;
                    if (c->m[i] > 0) /* and it was written: row 0, column 0 holds no sentinel */
                        cr_assert(isfinite(y[0]), "%s: weight %d not written", c->name, i);
                    free(mm.dst[i].data);
                    free(sep[i].data);
                }
                rk_backend_destroy(be);
            }
            free(x);
        }
        for (int i = 0; i < c->n_w; i++) free(w[i].data);
    }
}

/* ---- the split on a backend without a MATMUL_N kernel ------------------------- */
static rk_backend *g_ref; /* the fake backend's MATMUL runs on it */
static int g_calls;
static rk_status fake_matmul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be;
    g_calls++;
    return rk_backend_run(g_ref, a, err);
}

Test(matmul_n, runs_as_matmuls_where_the_backend_has_only_matmul) {
    g_ref = make_be(0);
    rk_backend_ops ops = {.name = "fake", .op = {[RK_OP_MATMUL] = fake_matmul}};
    rk_backend fake = {.ops = &ops, .n_threads = 1};
    rk_err err = {0};
    const rk_op want[] = {RK_OP_MATMUL_N};
    cr_assert_eq(rk_backend_check_ops(&fake, want, 1, &err), RK_OK, "%s", err.msg);
    uint64_t rng = 77;
    rk_matmul_n_args mm = {.n_w = 3};
    rk_view sep[3];
    float *x = rand_x(2 * 256, &rng);
    const rk_view xv = {RK_DT_F32, {256, 2, 1, 1}, 256 * sizeof(float), x};
    for (int i = 0; i < 3; i++) {
        mm.w[i] = rand_weight(i == 2 ? RK_DT_Q6_K : RK_DT_Q4_K, 256, 10 + i, &rng);
        mm.dst[i] = sentinel_dst(2, 10 + i);
        sep[i] = sentinel_dst(2, 10 + i);
        rk_op_args one = {.op = RK_OP_MATMUL, .src0 = mm.w[i], .src1 = xv, .dst = sep[i]};
        cr_assert_eq(rk_backend_run(g_ref, &one, &err), RK_OK, "%s", err.msg);
    }
    rk_op_args a = {.op = RK_OP_MATMUL_N, .src1 = xv, .mm = &mm};
    cr_assert_eq(rk_backend_run(&fake, &a, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(g_calls, 3);
    for (int i = 0; i < 3; i++) cr_assert(memcmp(mm.dst[i].data, sep[i].data, dst_bytes(&sep[i])) == 0, "weight %d", i);
    /* a backend with neither says so, and writes nothing */
    rk_backend_ops none = {.name = "none"};
    rk_backend bare = {.ops = &none, .n_threads = 1};
    cr_assert_eq(rk_backend_check_ops(&bare, want, 1, &err), RK_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "MATMUL_N"), "%s", err.msg);
    cr_assert_eq(rk_backend_run(&bare, &a, &err), RK_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "MATMUL_N not implemented"), "%s", err.msg);
    for (int i = 0; i < 3; i++) free(mm.w[i].data), free(mm.dst[i].data), free(sep[i].data);
    free(x);
    rk_backend_destroy(g_ref);
}

Test(matmul_n, bad_sets_are_rejected) {
    uint64_t rng = 5;
    rk_view w0 = rand_weight(RK_DT_Q4_K, 256, 8, &rng), w1 = rand_weight(RK_DT_Q4_K, 512, 8, &rng);
    float *x = rand_x(256, &rng);
    const rk_view xv = {RK_DT_F32, {256, 1, 1, 1}, 256 * sizeof(float), x};
    rk_view d0 = sentinel_dst(1, 8), d1 = sentinel_dst(1, 8);
    for (int which = 0; which <= 3; which++) {
        rk_backend *be = make_be(which);
        rk_err err = {0};
        rk_op_args a = {.op = RK_OP_MATMUL_N, .src1 = xv};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "NULL mm"), "%s", err.msg);
        rk_matmul_n_args mm = {.n_w = 0};
        a.mm = &mm;
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "0 weights (1..3)"), "%s", err.msg);
        mm.n_w = 4;
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
        /* weight 1's k is not the activation's: named, nothing written */
        mm = (rk_matmul_n_args){.n_w = 2, .w = {w0, w1}, .dst = {d0, d1}};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "weight 1") && strstr(err.msg, "k (src0 512 vs src1 256)"), "%s", err.msg);
        cr_assert(isnan(((float *)d0.data)[0]), "weight 0 written before the check failed");
        rk_backend_destroy(be);
    }
    free(w0.data), free(w1.data), free(d0.data), free(d1.data), free(x);
}
