/* The CUDA backend against cpu_ref on the one op-case table (test_ops.c's
 * cases, fixtures and compare(), through op_twin.h), every op: NaN/Inf parity
 * then NMSE, once with host views (staged through device scratch) and once
 * with every view in device memory (prepared weights, rk_backend_alloc
 * buffers, strides and padding kept); the table has device-scale cases (split-K
 * attention in prefill and at long contexts, the GEMM shapes of a 1.5B model).
 *
 * Bounds: the table's f32 bounds hold for every f32 path (GEMV on the stored
 * weights for n <= 8, pedantic SGEMM, f32 attention with expf, exact
 * dequantisation and q8_0 quantisation). The prefill GEMM of f16 / bf16 /
 * quantised weights runs in half precision: activations (and an f16 copy of a
 * quantised matrix) are rounded once, relative error u = 2^-11 (f16) or 2^-8
 * (bf16) per factor, so NMSE ~ 2u^2/3; the bound is 64 u^2 (f16 1.5e-5, bf16
 * 9.8e-4: within the 1e-3). Memory contracts: prepare caching, zeroed
 * blocks, stream order without a sync per op. Without a GPU the program exits
 * 77 (meson: SKIP) after printing why. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "lr_attn_case.h"
#include "op_twin.h"
#include "rk_kernels.h"

#define U_F16 4.8828125e-4 /* 2^-11 */
#define U_BF16 3.90625e-3  /* 2^-8 */
#define MAX_CASES 512

/* The bound of the CUDA path case i takes. */
static double cuda_bound(const op_twin_info *c) {
    if (c->op == RK_OP_MATMUL && c->n > 8 && c->type != RK_DT_F32) {
        double u = c->type == RK_DT_BF16 ? U_BF16 : U_F16;
        return 64.0 * u * u;
    }
    return c->nmse;
}

/* ---- device copies of a fixture --------------------------------------- */
typedef struct devmap {
    void *host[8];
    void *dev[8];
    size_t bytes[8];
    bool owned[8]; /* false: a prepared weight, the backend's */
    int n;
} devmap;

static size_t extent(const rk_view *v) {
    uint64_t rb = 0;
    cr_assert(rk_dtype_row_bytes(v->type, (uint64_t)v->ne[0], &rb));
    int64_t rows = v->ne[1] * (v->ne[2] ? v->ne[2] : 1) * (v->ne[3] ? v->ne[3] : 1);
    return rows > 0 ? (size_t)(rows - 1) * v->nb1 + (size_t)rb : 0;
}

/* The same view in device memory: weights prepared, everything else copied
 * whole (strides and padding kept) into an rk_backend_alloc block; a host
 * buffer seen twice (in place) maps to the same block. */
static rk_view to_dev(rk_backend *be, devmap *m, rk_view v, bool weight) {
    if (!v.data) return v;
    for (int i = 0; i < m->n; i++)
        if (m->host[i] == v.data) {
            v.data = m->dev[i];
            return v;
        }
    rk_err err = {0};
    cr_assert(m->n < 8);
    m->host[m->n] = v.data;
    if (weight) {
        rk_view out;
        cr_assert_eq(rk_backend_prepare(be, &v, &out, &err), RK_OK, "%s", err.msg);
        cr_assert_neq(out.data, v.data, "prepare made no device copy");
        m->dev[m->n] = out.data;
        m->owned[m->n++] = false;
        return out;
    }
    size_t ext = extent(&v);
    void *d = NULL;
    cr_assert_eq(rk_backend_alloc(be, ext, &d, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_upload(be, d, v.data, ext, &err), RK_OK, "%s", err.msg);
    m->dev[m->n] = d;
    m->bytes[m->n] = ext;
    m->owned[m->n++] = true;
    v.data = d;
    return v;
}

/* op_twin_runner: every view in device memory, the op queued, then every
 * buffer copied back (the download waits for the queued op). */
static rk_status run_resident(rk_backend *be, const rk_op_args *h, bool weight, void *ud, rk_err *err) {
    (void)ud;
    devmap m;
    memset(&m, 0, sizeof m);
    rk_op_args d = *h;
    d.src0 = to_dev(be, &m, h->src0, weight);
    d.src1 = to_dev(be, &m, h->src1, false);
    d.src2 = to_dev(be, &m, h->src2, false);
    d.dst = to_dev(be, &m, h->dst, false);
    rk_status st = rk_backend_run(be, &d, err);
    for (int i = 0; i < m.n; i++)
        if (m.owned[i]) {
            if (st == RK_OK) st = rk_backend_download(be, m.host[i], m.dev[i], m.bytes[i], err);
            rk_backend_free(be, m.dev[i]);
        }
    return st;
}

static int case_named(const char *name) {
    for (int i = 0; i < op_twin_count(); i++)
        if (!strcmp(op_twin_case(i).name, name)) return i;
    cr_assert_fail("no case \"%s\" in the table", name);
    return -1;
}

static rk_backend *cuda_or_skip(void) {
    rk_backend *be = NULL;
    rk_err err = {0};
    rk_status st = rk_backend_cuda_create(0, &be, &err);
    if (st == RK_E_UNSUPPORTED) cr_skip_test("%s", err.msg);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    return be;
}

ParameterizedTestParameters(cuda, vs_ref) {
    static int idx[MAX_CASES];
    int n = op_twin_count();
    cr_assert(n <= MAX_CASES);
    for (int i = 0; i < n; i++) idx[i] = i;
    return cr_make_param_array(int, idx, (size_t)n);
}

/* The parameter is an index: Criterion copies parameters into the test process. */
ParameterizedTest(int *ci, cuda, vs_ref, .timeout = 120) {
    const op_twin_info c = op_twin_case(*ci);
    rk_backend *gpu = cuda_or_skip(), *ref = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_ref_create(&ref, &err), RK_OK, "%s", err.msg);
    size_t n_ref = 0, n_got = 0;
    double *want = op_twin_run(*ci, ref, NULL, NULL, &n_ref);
    for (int resident = 0; resident <= 1; resident++) {
        double *got = op_twin_run(*ci, gpu, resident ? run_resident : NULL, NULL, &n_got);
        cr_assert_eq(n_got, n_ref);
        op_twin_compare(*ci, resident ? "cuda (device views)" : "cuda (host views)", cuda_bound(&c), got, want, n_ref);
        free(got);
    }
    free(want);
    rk_backend_destroy(ref);
    rk_backend_destroy(gpu);
}

Test(cuda, rope_unit_vector_pos1) {
    rk_backend *be = cuda_or_skip();
    float x[4] = {1, 0, 0, 0};
    rk_op_args a = {.op = RK_OP_ROPE, .src0 = {RK_DT_F32, {4, 1, 1, 1}, 16, x}};
    a.rope = (rk_rope_params){.mode = RK_ROPE_NEOX, .n_rot = 4, .freq_base = 10000.0f, .pos0 = 1};
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
    cr_assert_float_eq(x[0], cosf(1.0f), 1e-7f);
    cr_assert_float_eq(x[2], sinf(1.0f), 1e-7f);
    cr_assert_eq(x[1], 0.0f);
    cr_assert_eq(x[3], 0.0f);
    rk_backend_destroy(be);
}

/* Two equal keys: the output is exactly their value (softmax 1/2, 1/2). */
Test(cuda, attn_two_equal_keys_average) {
    rk_backend *be = cuda_or_skip();
    float q[4] = {1, -2, 0.5f, 3}, out[4] = {0};
    float kv[2 * 4] = {0.25f, 1, -1, 2, 0.25f, 1, -1, 2};
    rk_op_args a = {.op = RK_OP_ATTN,
                    .src0 = {RK_DT_F32, {4, 1, 1, 1}, 16, q},
                    .dst = {RK_DT_F32, {4, 1, 1, 1}, 16, out},
                    .src1 = {RK_DT_F32, {4, 2, 1, 1}, 16, kv},
                    .src2 = {RK_DT_F32, {4, 2, 1, 1}, 16, kv}};
    a.attn = (rk_attn_params){1, 1, 4, 0.5f, 1};
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
    for (int i = 0; i < 4; i++) cr_expect_eq(out[i], kv[i], "dim %d: %g", i, out[i]);
    rk_backend_destroy(be);
}

Test(cuda, limits_and_bad_shapes) {
    rk_backend *be = cuda_or_skip();
    static float q[256], y[256], kv[256];
    rk_err err = {0};
    /* head_dim past the attention kernel's tiles: refused by name, before any work */
    rk_op_args at = {.op = RK_OP_ATTN,
                     .src0 = {RK_DT_F32, {256, 1, 1, 1}, 1024, q},
                     .dst = {RK_DT_F32, {256, 1, 1, 1}, 1024, y},
                     .src1 = {RK_DT_F32, {256, 1, 1, 1}, 1024, kv},
                     .src2 = {RK_DT_F32, {256, 1, 1, 1}, 1024, kv}};
    at.attn = (rk_attn_params){1, 1, 256, 0.0625f, 0};
    cr_assert_eq(rk_backend_run(be, &at, &err), RK_E_UNSUPPORTED);
    cr_assert(strstr(err.msg, "ATTN"), "%s", err.msg);
    /* K and V of different types */
    uint16_t kh[64] = {0};
    rk_op_args mix = {.op = RK_OP_ATTN,
                      .src0 = {RK_DT_F32, {16, 1, 1, 1}, 64, q},
                      .dst = {RK_DT_F32, {16, 1, 1, 1}, 64, y},
                      .src1 = {RK_DT_F16, {16, 1, 1, 1}, 32, kh},
                      .src2 = {RK_DT_F32, {16, 1, 1, 1}, 64, kv}};
    mix.attn = (rk_attn_params){1, 1, 16, 0.25f, 0};
    cr_assert_eq(rk_backend_run(be, &mix, &err), RK_E_UNSUPPORTED);
    rk_op_args bad = {
        .op = RK_OP_ADD, .src0 = {RK_DT_F32, {8, 1, 1, 1}, 32, q}, .dst = {RK_DT_F32, {4, 1, 1, 1}, 16, y}};
    cr_assert_eq(rk_backend_run(be, &bad, &err), RK_E_INVALID_ARG);
    rk_backend_destroy(be);
}

Test(cuda, check_ops_has_every_op) {
    rk_backend *be = cuda_or_skip();
    const rk_op all[] = {RK_OP_GET_ROWS,     RK_OP_MATMUL,  RK_OP_RMSNORM, RK_OP_ROPE,     RK_OP_ATTN,
                         RK_OP_SILU_MUL,     RK_OP_ADD,     RK_OP_ADD_ROW, RK_OP_CPY_ROWS, RK_OP_LR_KEYS,
                         RK_OP_SCATTER_ROWS, RK_OP_LR_ATTN, RK_OP_MATMUL_N};
    _Static_assert(sizeof all / sizeof all[0] == RK_OP_COUNT, "every op");
    rk_err err = {0};
    cr_assert_eq(rk_backend_check_ops(be, all, RK_OP_COUNT, &err), RK_OK, "%s", err.msg);
    cr_assert_null(rk_backend_pool(be));
    rk_backend_destroy(be);
}

/* A prepared quantised weight through the GEMM path twice: the f16 copy is made
 * once and reused (same bits), and a GEMV after it still reads the q4_K copy. */
Test(cuda, gemm_copy_made_once) {
    rk_backend *be = cuda_or_skip();
    int i = case_named("matmul q4_K 1536 -> 256 n=24");
    size_t n1 = 0, n2 = 0;
    double *a = op_twin_run(i, be, run_resident, NULL, &n1);
    double *b = op_twin_run(i, be, run_resident, NULL, &n2);
    cr_assert_eq(n1, n2);
    cr_expect(memcmp(a, b, n1 * sizeof(double)) == 0, "second GEMM on the kept copy differs");
    free(a);
    free(b);
    rk_backend_destroy(be);
}

Test(cuda, prepare_caches_and_memory_contracts) {
    rk_backend *be = cuda_or_skip();
    rk_err err = {0};
    uint16_t w[4 * 8];
    for (int i = 0; i < 32; i++) w[i] = rk_f32_to_f16((float)(i % 7) - 3.0f);
    rk_view hv = {RK_DT_F16, {8, 4, 1, 1}, 16, w}, p1, p2;
    cr_assert_eq(rk_backend_prepare(be, &hv, &p1, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_prepare(be, &hv, &p2, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(p1.data, p2.data, "the second prepare must hit the cache");
    cr_assert(p1.data != (void *)w && p1.nb1 == 16 && p1.type == RK_DT_F16 && p1.ne[0] == 8 && p1.ne[1] == 4);
    uint16_t back[32];
    memset(w + 8, 0, 16); /* the device copy does not depend on the host memory any more */
    cr_assert_eq(rk_backend_download(be, back, p1.data, sizeof back, &err), RK_OK, "%s", err.msg);
    for (int i = 0; i < 32; i++)
        cr_assert_eq(back[i], i >= 8 && i < 16 ? rk_f32_to_f16((float)(i % 7) - 3.0f) : w[i], "at %d", i);
    rk_view other = hv;
    other.ne[1] = 2; /* same data, another shape */
    cr_assert_eq(rk_backend_prepare(be, &other, &p2, &err), RK_E_INVALID_ARG);
    cr_assert(strstr(err.msg, "prepare whole tensors"), "%s", err.msg);
    cr_assert_eq(rk_backend_upload(be, p1.data, w, 2, &err), RK_E_INVALID_ARG, "prepared weights are read-only");
    rk_backend_free(be, p1.data); /* not an alloc block: ignored, still usable */
    cr_assert_eq(rk_backend_download(be, back, p1.data, 2, &err), RK_OK, "%s", err.msg);
    float *d = NULL, z[64];
    cr_assert_eq(rk_backend_alloc(be, sizeof z, (void **)&d, &err), RK_OK, "%s", err.msg);
    memset(z, 0xff, sizeof z);
    cr_assert_eq(rk_backend_download(be, z, d, sizeof z, &err), RK_OK, "%s", err.msg);
    for (int i = 0; i < 64; i++) cr_assert_eq(z[i], 0.0f);
    cr_assert_eq(rk_backend_download(be, z, d + 1, sizeof z, &err), RK_E_INVALID_ARG, "past the block");
    cr_assert_eq(rk_backend_upload(be, z, z, 4, &err), RK_E_INVALID_ARG, "host destination");
    rk_backend_free(be, d);
    rk_backend_destroy(be); /* frees the prepared copy */
}

/* 200 dependent ops on device buffers with no wait between them, then one
 * download: the stream keeps them in order. Small integers: exact. */
Test(cuda, queued_ops_stay_in_order) {
    rk_backend *be = cuda_or_skip();
    rk_err err = {0};
    enum { R = 3, D = 1000 };
    float *y = NULL, *a = NULL, h[R * D];
    cr_assert_eq(rk_backend_alloc(be, sizeof h, (void **)&y, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_alloc(be, D * sizeof(float), (void **)&a, &err), RK_OK, "%s", err.msg);
    for (int i = 0; i < D; i++) h[i] = (float)(i % 5);
    cr_assert_eq(rk_backend_upload(be, a, h, D * sizeof(float), &err), RK_OK, "%s", err.msg);
    rk_op_args op = {
        .op = RK_OP_ADD_ROW, .dst = {RK_DT_F32, {D, R, 1, 1}, D * 4, y}, .src0 = {RK_DT_F32, {D, 1, 1, 1}, D * 4, a}};
    for (int it = 0; it < 200; it++) cr_assert_eq(rk_backend_run(be, &op, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_download(be, h, y, sizeof h, &err), RK_OK, "%s", err.msg);
    for (int i = 0; i < R * D; i++) cr_assert_eq(h[i], 200.0f * (float)(i % D % 5), "at %d", i);
    rk_backend_free(be, y);
    rk_backend_free(be, a);
    rk_backend_destroy(be);
}

/* LR_ATTN (LowRAM's fused decode attention) on the device against cpu_ref, the state in
 * device memory (uploaded blocks), q and out once as host views (staged) and once in
 * device memory. f32 sums in both, in other orders (split over units, then combined), and
 * keys rounded to f16 in both: NMSE bound 1e-9 as test_lr_attn.c's against double, plus
 * the rare f16 rounding of a key landing on the other side (a 2^-11 change of one key
 * element); every case again with the int8 key cache's rounding (key_int8, 3e-7). The
 * state on the host is refused by name. */
Test(cuda, lr_attn_matches_cpu_ref, .timeout = 120) {
    rk_backend *gpu = cuda_or_skip(), *ref = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_ref_create(&ref, &err), RK_OK, "%s", err.msg);
    struct {
        int nh, nkv, hd, C, r;
        int64_t rows, sink, win, nq;
        int sel;
        bool summ;
        int mode;
    } cs[] = {
        {12, 2, 128, 32, 96, 280, 4, 40, 1, 4, true, RK_ROPE_NEOX},      /* qwen2.5-1.5b heads */
        {8, 2, 64, 32, 48, 203, 4, 70, 4, 3, true, RK_ROPE_NORM},        /* 4 query rows, partial chunk */
        {4, 4, 32, 16, 20, 100, 0, 10, 2, 50, true, RK_ROPE_NEOX},       /* every chunk chosen */
        {6, 3, 64, 32, 30, 150, 4, 5, 1, 2, false, RK_ROPE_NEOX},        /* no summaries */
        {12, 2, 128, 32, 160, 32000, 4, 150, 1, 16, true, RK_ROPE_NEOX}, /* 32K rows: 1000 chunks */
    };
    const size_t n_cs = sizeof cs / sizeof cs[0];
    for (size_t i = 0; i < 2 * n_cs; i++) { /* the second round: keys as the int8 key cache (key_int8) */
        lr_case c;
        const size_t ci = i % n_cs;
        lr_case_make(&c, cs[ci].nh, cs[ci].nkv, cs[ci].hd, cs[ci].C, cs[ci].r, cs[ci].rows, cs[ci].sink, cs[ci].win,
                     cs[ci].nq, cs[ci].sel, cs[ci].summ, cs[ci].mode, 100 + ci);
        c.L.key_int8 = i >= n_cs;
        rk_op_args a = lr_case_args(&c, &c.L, c.q, c.out);
        cr_assert_eq(rk_backend_run(ref, &a, &err), RK_OK, "%s", err.msg);
        const int64_t n = c.n_q * c.n_head * c.hd;
        float *want = malloc((size_t)n * 4), *got = malloc((size_t)n * 4);
        memcpy(want, c.out, (size_t)n * 4);
        /* the state on the host: refused by name */
        rk_status st = rk_backend_run(gpu, &a, &err);
        cr_expect_eq(st, RK_E_UNSUPPORTED);
        cr_expect(strstr(err.msg, "device memory"), "%s", err.msg);
        rk_lr_attn_args D;
        void *dev[24];
        int n_dev = 0;
        cr_assert_eq(lr_case_upload(&c, gpu, &D, dev, &n_dev, &err), RK_OK, "%s", err.msg);
        void *dq = NULL, *dout = NULL;
        cr_assert_eq(rk_backend_alloc(gpu, (size_t)n * 4, &dq, &err), RK_OK);
        cr_assert_eq(rk_backend_alloc(gpu, (size_t)n * 4, &dout, &err), RK_OK);
        cr_assert_eq(rk_backend_upload(gpu, dq, c.q, (size_t)n * 4, &err), RK_OK);
        for (int resident = 0; resident <= 1; resident++) {
            memset(got, 0, (size_t)n * 4);
            rk_op_args g = lr_case_args(&c, &D, resident ? dq : c.q, resident ? dout : got);
            cr_assert_eq(rk_backend_run(gpu, &g, &err), RK_OK, "case %zu: %s", i, err.msg);
            if (resident) cr_assert_eq(rk_backend_download(gpu, got, dout, (size_t)n * 4, &err), RK_OK, "%s", err.msg);
            double e = 0, s2 = 0;
            bool finite = true;
            for (int64_t k = 0; k < n; k++) {
                const double d = (double)got[k] - want[k];
                e += d * d, s2 += (double)want[k] * want[k];
                finite &= isfinite(got[k]);
            }
            cr_expect(finite, "case %zu: non-finite output", i);
            /* int8 keys: a code on the other side of a tie moves one element by max|k| / 127,
             * (2^11 / 127)^2 = 260 times the f16 room (test_lr_attn.c): 3e-7 */
            cr_expect(e / (s2 > 0 ? s2 : 1) <= (c.L.key_int8 ? 3e-7 : 1e-9), "case %zu (%s, int8 keys %d): NMSE %.3g",
                      i, resident ? "device q" : "host q", c.L.key_int8, e / (s2 > 0 ? s2 : 1));
        }
        for (int k = 0; k < n_dev; k++) rk_backend_free(gpu, dev[k]);
        rk_backend_free(gpu, dq);
        rk_backend_free(gpu, dout);
        free(want), free(got);
        lr_case_free(&c);
    }
    rk_backend_destroy(ref);
    rk_backend_destroy(gpu);
}

/* No GPU: say so and exit 77 so meson reports SKIP. The probe runs in a child
 * so this process never initialises CUDA before Criterion starts its workers. */
int main(int argc, char *argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        rk_backend *be = NULL;
        rk_err err = {0};
        rk_status st = rk_backend_cuda_create(0, &be, &err);
        if (st != RK_OK) fprintf(stderr, "test_cuda: %s\n", err.msg);
        rk_backend_destroy(be);
        _exit(st == RK_OK ? 0 : st == RK_E_UNSUPPORTED ? 77 : 1);
    }
    int ws = 0;
    if (pid > 0 && waitpid(pid, &ws, 0) == pid && WIFEXITED(ws) && WEXITSTATUS(ws) == 77) {
        fprintf(stderr, "test_cuda: SKIP (no usable CUDA device)\n");
        return 77;
    }
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (criterion_handle_args(argc, argv, true)) result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    return result;
}

/* The copy lane and pinned host blocks (GPU KV tiers, runtime/kv/kv_dev.c): a lane
 * copy starts after the ops queued before it and a join makes the ops after it wait; values
 * are copied exactly. 64 MiB each way (large enough that a missing wait would show: the
 * ADD after the join reads the uploaded values, the copy down after the ADD sees its
 * result). Bad pointers are refused by name. On a host backend the same calls fall back to
 * heap blocks and synchronous copies (checked on cpu here too). */
Test(cuda, lane_copies_order_with_ops, .timeout = 60) {
    rk_backend *gpu = cuda_or_skip(), *cpu = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
    rk_backend *bes[2] = {gpu, cpu};
    const int64_t n = 16 << 20; /* floats */
    const size_t bytes = (size_t)n * sizeof(float);
    for (int b = 0; b < 2; b++) {
        rk_backend *be = bes[b];
        float *h = NULL, *h2 = NULL;
        void *d = NULL, *ones = NULL;
        cr_assert_eq(rk_backend_host_alloc(be, bytes, (void **)&h, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_host_alloc(be, bytes, (void **)&h2, &err), RK_OK, "%s", err.msg);
        cr_expect(h[0] == 0 && h[n - 1] == 0, "host blocks are zeroed");
        cr_assert_eq(rk_backend_alloc(be, bytes, &d, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_alloc(be, bytes, &ones, &err), RK_OK, "%s", err.msg);
        for (int64_t i = 0; i < n; i++) h[i] = (float)(i % 1000) * 0.25f, h2[i] = 1.0f;
        cr_assert_eq(rk_backend_upload(be, ones, h2, bytes, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_lane_copy(be, d, h, bytes, true, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_lane_join(be, &err), RK_OK, "%s", err.msg);
        rk_op_args add = {.op = RK_OP_ADD,
                          .src0 = {RK_DT_F32, {n, 1, 1, 1}, bytes, ones},
                          .dst = {RK_DT_F32, {n, 1, 1, 1}, bytes, d}};
        cr_assert_eq(rk_backend_run(be, &add, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_lane_copy(be, h2, d, bytes, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_lane_sync(be, &err), RK_OK, "%s", err.msg);
        int64_t bad = 0;
        for (int64_t i = 0; i < n; i++) bad += h2[i] != (float)(i % 1000) * 0.25f + 1.0f;
        cr_expect_eq(bad, 0, "%s: %lld values wrong after lane up, join, ADD, lane down", be->ops->name,
                     (long long)bad);
        if (b == 0) { /* host memory where device memory belongs */
            cr_expect_eq(rk_backend_lane_copy(be, h2, h, 64, true, &err), RK_E_INVALID_ARG);
            cr_expect(strstr(err.msg, "not inside a buffer"), "%s", err.msg);
        }
        rk_backend_free(be, d);
        rk_backend_free(be, ones);
        rk_backend_host_free(be, h);
        rk_backend_host_free(be, h2);
    }
    rk_backend_destroy(cpu);
    rk_backend_destroy(gpu);
}
