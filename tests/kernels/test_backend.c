/* Backend plumbing around the ops: prepared weights, backend memory, the
 * op-presence check, the by-name factory (with the CUDA answers a GPU-less or
 * CUDA-less build gives) and the shared thread pool. The ops themselves are
 * test_ops.c's business; here they only show that prepared views and backend
 * buffers are what the ops take. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rk_kernels.h"
#include "tb.h"

static rk_backend *make(const char *name, int n_threads) {
    rk_backend *be = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_create_named(name, n_threads, &be, &err), RK_OK, "%s: %s", name, err.msg);
    cr_assert_str_eq(be->ops->name, strcmp(name, "cpu_portable") ? name : "cpu");
    return be;
}

static const char *const host_names[] = {"cpu_ref", "cpu", "cpu_portable"};
#define FOR_EACH_HOST_BACKEND(be)  \
    for (int i_ = 0; i_ < 3; i_++) \
        for (rk_backend *be = make(host_names[i_], 2); be; rk_backend_destroy(be), be = NULL)

/* ---- factory --------------------------------------------------------------- */
Test(factory, names) {
    rk_backend *be = make("cpu", 3);
    cr_assert_eq(be->n_threads, 3);
    rk_backend_destroy(be);
    be = make("cpu_ref", 8);
    cr_assert_eq(be->n_threads, 1);
    rk_backend_destroy(be);
    rk_err err = {0};
    rk_backend *none = NULL;
    const char *bad[] = {"", "gpu", "CPU", "cpu ", "cudax", "cuda:", "cuda:-1", "cuda:1x", "cuda:99999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_eq(rk_backend_create_named(bad[i], 1, &none, &err), RK_E_INVALID_ARG, "\"%s\"", bad[i]);
        cr_assert_null(none);
        cr_assert(strstr(err.msg, "cuda:N"), "\"%s\": %s", bad[i], err.msg); /* lists the names */
    }
    cr_assert_eq(rk_backend_create_named(NULL, 1, &none, &err), RK_E_INVALID_ARG);
    cr_assert_eq(rk_backend_create_named("cpu", 1, NULL, &err), RK_E_INVALID_ARG);
}

/* In this build: a clear answer for "cuda" whether or not it was compiled and
 * whether or not a GPU is present. */
Test(factory, cuda_answers) {
#if defined(RK_HAVE_CUDA)
    cr_assert(rk_backend_cuda_built());
#else
    cr_assert_not(rk_backend_cuda_built());
#endif
    const char *names[] = {"cuda", "cuda:0", "cuda:7"};
    for (size_t i = 0; i < 3; i++) {
        rk_backend *be = NULL;
        rk_err err = {0};
        rk_status st = rk_backend_create_named(names[i], 0, &be, &err);
        if (!rk_backend_cuda_built()) {
            cr_assert_eq(st, RK_E_UNSUPPORTED);
            cr_assert_str_eq(err.msg, "cuda: not built (configure with nvcc and cuBLAS)");
            cr_assert_null(be);
        } else if (st == RK_OK) { /* a GPU: device 0 at least exists */
            cr_assert_str_eq(be->ops->name, "cuda");
            rk_backend_destroy(be);
        } else {
            /* no GPU ("no device"), or "cuda:7" past the devices there are */
            cr_assert(st == RK_E_UNSUPPORTED ? !strncmp(err.msg, "cuda: no device", 15)
                                             : st == RK_E_INVALID_ARG && strstr(err.msg, "out of range"),
                      "%s: %s %s", names[i], rk_status_name(st), err.msg);
            cr_assert_null(be);
        }
    }
}

/* ---- check_ops --------------------------------------------------------------- */
static rk_status fake_add(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)be, (void)a, (void)err;
    return RK_OK;
}

Test(check_ops, names_the_first_missing_op) {
    const rk_op all[] = {RK_OP_GET_ROWS,     RK_OP_MATMUL,  RK_OP_RMSNORM, RK_OP_ROPE,     RK_OP_ATTN,
                         RK_OP_SILU_MUL,     RK_OP_ADD,     RK_OP_ADD_ROW, RK_OP_CPY_ROWS, RK_OP_LR_KEYS,
                         RK_OP_SCATTER_ROWS, RK_OP_LR_ATTN, RK_OP_MATMUL_N};
    _Static_assert(sizeof all / sizeof all[0] == RK_OP_COUNT, "list every op");
    rk_err err = {0};
    FOR_EACH_HOST_BACKEND(be) {
        cr_assert_eq(rk_backend_check_ops(be, all, RK_OP_COUNT, &err), RK_OK, "%s: %s", be->ops->name, err.msg);
        cr_assert_eq(rk_backend_check_ops(be, NULL, 0, &err), RK_OK);
        rk_op bad[2] = {RK_OP_ADD, RK_OP_COUNT};
        cr_assert_eq(rk_backend_check_ops(be, bad, 2, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "out of range"), "%s", err.msg);
        cr_assert_eq(rk_backend_check_ops(be, all, -1, &err), RK_E_INVALID_ARG);
        cr_assert_eq(rk_backend_check_ops(be, NULL, 2, &err), RK_E_INVALID_ARG);
    }
    /* a backend with only ADD: the first op it lacks is named, with its hint */
    rk_backend_ops ops = {.name = "fake", .op = {[RK_OP_ADD] = fake_add}, .missing_hint = "the fake issue adds it"};
    rk_backend fake = {.ops = &ops, .n_threads = 1};
    const rk_op want[] = {RK_OP_ADD, RK_OP_ADD, RK_OP_GET_ROWS, RK_OP_ATTN};
    cr_assert_eq(rk_backend_check_ops(&fake, want, 2, &err), RK_OK);
    cr_assert_eq(rk_backend_check_ops(&fake, want, 4, &err), RK_E_UNSUPPORTED);
    cr_assert_str_eq(err.msg, "fake: op GET_ROWS not implemented yet (the fake issue adds it)");
    ops.missing_hint = NULL;
    cr_assert_eq(rk_backend_check_ops(&fake, want + 3, 1, &err), RK_E_UNSUPPORTED);
    cr_assert_str_eq(err.msg, "fake: op ATTN not implemented yet");
    cr_assert_eq(rk_backend_check_ops(NULL, want, 1, &err), RK_E_INVALID_ARG);
    /* host defaults for everything memory-related on a table that fills none */
    void *p = NULL;
    cr_assert_eq(rk_backend_alloc(&fake, 10, &p, &err), RK_OK, "%s", err.msg);
    rk_backend_free(&fake, p);
    cr_assert_null(rk_backend_pool(&fake));
}

/* ---- memory ------------------------------------------------------------------- */
Test(memory, alloc_zeroed_aligned_roundtrip) {
    FOR_EACH_HOST_BACKEND(be) {
        rk_err err = {0};
        const size_t sizes[] = {0, 1, 63, 4096, 3u << 20};
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            uint8_t *p = NULL;
            cr_assert_eq(rk_backend_alloc(be, sizes[i], (void **)&p, &err), RK_OK, "%s", err.msg);
            cr_assert(p && (uintptr_t)p % 64 == 0, "%s: %zu bytes at %p", be->ops->name, sizes[i], (void *)p);
            uint8_t *host = malloc(sizes[i] + 1), *back = malloc(sizes[i] + 1);
            cr_assert_eq(rk_backend_download(be, back, p, sizes[i], &err), RK_OK, "%s", err.msg);
            for (size_t j = 0; j < sizes[i]; j++) cr_assert_eq(back[j], 0, "%s: byte %zu not zero", be->ops->name, j);
            for (size_t j = 0; j < sizes[i]; j++) host[j] = (uint8_t)(j * 7 + 1);
            cr_assert_eq(rk_backend_upload(be, p, host, sizes[i], &err), RK_OK, "%s", err.msg);
            memset(back, 0, sizes[i] + 1);
            cr_assert_eq(rk_backend_download(be, back, p, sizes[i], &err), RK_OK, "%s", err.msg);
            cr_assert_eq(memcmp(back, host, sizes[i]), 0, "%s: %zu bytes", be->ops->name, sizes[i]);
            /* offsets inside a block */
            if (sizes[i] > 8) {
                cr_assert_eq(rk_backend_upload(be, p + 5, host, 3, &err), RK_OK);
                cr_assert_eq(rk_backend_download(be, back, p + 4, 5, &err), RK_OK);
                cr_assert(back[0] == host[4] && back[1] == host[0] && back[3] == host[2] && back[4] == host[8]);
            }
            free(host), free(back);
            rk_backend_free(be, p);
        }
        rk_backend_free(be, NULL);
        cr_assert_eq(rk_backend_sync(be, &err), RK_OK);
        cr_assert_eq(rk_backend_alloc(be, 8, NULL, &err), RK_E_INVALID_ARG);
        void *huge = NULL;
        cr_assert_eq(rk_backend_alloc(be, SIZE_MAX - 8, &huge, &err), RK_E_NOMEM);
        cr_assert_null(huge);
        cr_assert_eq(rk_backend_upload(be, NULL, &err, 4, &err), RK_E_INVALID_ARG);
        cr_assert_eq(rk_backend_download(be, &err, NULL, 4, &err), RK_E_INVALID_ARG);
    }
    rk_err err = {0};
    void *p;
    cr_assert_eq(rk_backend_alloc(NULL, 8, &p, &err), RK_E_INVALID_ARG);
    rk_backend_free(NULL, &err); /* no backend: nothing to free, no crash */
    cr_assert_eq(rk_backend_sync(NULL, &err), RK_E_INVALID_ARG);
}

Test(memory, prepare_host_backends_alias) {
    FOR_EACH_HOST_BACKEND(be) {
        uint8_t q[3 * 34] = {0};
        rk_view w = {RK_DT_Q8_0, {64, 1, 1, 1}, 68, q}, out;
        memset(&out, 0x5a, sizeof out);
        rk_err err = {0};
        cr_assert_eq(rk_backend_prepare(be, &w, &out, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(memcmp(&out, &w, sizeof w), 0, "%s: host backends take the view as it is", be->ops->name);
        /* rejected: rows not whole blocks, unknown dtype, NULL data, short stride; out untouched */
        rk_view keep = out;
        rk_view bad[4] = {{RK_DT_Q8_0, {48, 1, 1, 1}, 68, q},
                          {77, {64, 1, 1, 1}, 68, q},
                          {RK_DT_F32, {8, 2, 1, 1}, 32, NULL},
                          {RK_DT_F16, {8, 2, 1, 1}, 8, q}};
        for (int i = 0; i < 4; i++) {
            cr_assert_eq(rk_backend_prepare(be, &bad[i], &out, &err), RK_E_INVALID_ARG, "%s case %d", be->ops->name, i);
            cr_assert(strstr(err.msg, "prepare"), "%s", err.msg);
            cr_assert_eq(memcmp(&out, &keep, sizeof out), 0);
        }
        cr_assert_eq(rk_backend_prepare(be, NULL, &out, &err), RK_E_INVALID_ARG);
        cr_assert_eq(rk_backend_prepare(be, &w, NULL, &err), RK_E_INVALID_ARG);
    }
}

/* A decode-like sequence in backend memory: prepared weights, GET_ROWS of the
 * embedding into an allocated buffer, MATMUL into another, download. Exact
 * small integers so every backend gives the same bits. */
Test(memory, ops_on_backend_buffers) {
    float emb[4 * 8], w[3 * 8];
    for (int i = 0; i < 32; i++) emb[i] = (float)(i % 5) - 2.0f;
    for (int i = 0; i < 24; i++) w[i] = (float)(i % 3) - 1.0f;
    int32_t ids[2] = {3, 1};
    float want[6];
    for (int t = 0; t < 2; t++)
        for (int j = 0; j < 3; j++) {
            float s = 0;
            for (int p = 0; p < 8; p++) s += emb[ids[t] * 8 + p] * w[j * 8 + p];
            want[t * 3 + j] = s;
        }
    FOR_EACH_HOST_BACKEND(be) {
        rk_err err = {0};
        rk_view ve, vw;
        cr_assert_eq(rk_backend_prepare(be, &(rk_view){RK_DT_F32, {8, 4, 1, 1}, 32, emb}, &ve, &err), RK_OK);
        cr_assert_eq(rk_backend_prepare(be, &(rk_view){RK_DT_F32, {8, 3, 1, 1}, 32, w}, &vw, &err), RK_OK);
        float *x = NULL, *y = NULL, got[6];
        cr_assert_eq(rk_backend_alloc(be, 2 * 8 * sizeof(float), (void **)&x, &err), RK_OK);
        cr_assert_eq(rk_backend_alloc(be, 2 * 3 * sizeof(float), (void **)&y, &err), RK_OK);
        rk_op_args g = {.op = RK_OP_GET_ROWS, .src0 = ve, .dst = {RK_DT_F32, {8, 2, 1, 1}, 32, x}, .ids = ids};
        cr_assert_eq(rk_backend_run(be, &g, &err), RK_OK, "%s", err.msg);
        rk_op_args m = {.op = RK_OP_MATMUL, .src0 = vw, .src1 = g.dst, .dst = {RK_DT_F32, {3, 2, 1, 1}, 12, y}};
        cr_assert_eq(rk_backend_run(be, &m, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_backend_download(be, got, y, sizeof got, &err), RK_OK, "%s", err.msg);
        for (int i = 0; i < 6; i++) cr_assert_eq(got[i], want[i], "%s at %d", be->ops->name, i);
        rk_backend_free(be, x);
        rk_backend_free(be, y);
    }
}

/* ---- pool ------------------------------------------------------------------------ */
Test(pool, backend_pool_getter) {
    rk_backend *cpu = make("cpu", 3), *ref = make("cpu_ref", 1);
    cr_assert_not_null(rk_backend_pool(cpu));
    cr_assert_eq(rk_pool_size(rk_backend_pool(cpu)), 3);
    cr_assert_null(rk_backend_pool(ref));
    cr_assert_null(rk_backend_pool(NULL));
    rk_backend_destroy(cpu);
    rk_backend_destroy(ref);
}

typedef struct mm_job {
    rk_backend *be;
    const void *w; /* q8_0: the GEMM path dequantises tiles into per-backend scratch */
    const float *x;
    const float *want;
    int iters, bad;
} mm_job;

enum { MM_N = 16, MM_K = 256, MM_M = 96 };

static void *mm_thread(void *vp) {
    mm_job *j = vp;
    float *y = malloc(MM_N * MM_M * sizeof(float));
    for (int it = 0; it < j->iters; it++) {
        memset(y, 0, MM_N * MM_M * sizeof(float));
        rk_op_args a = {.op = RK_OP_MATMUL,
                        .src0 = {RK_DT_Q8_0, {MM_K, MM_M, 1, 1}, MM_K / 32 * 34, (void *)j->w},
                        .src1 = {RK_DT_F32, {MM_K, MM_N, 1, 1}, MM_K * 4, (void *)j->x},
                        .dst = {RK_DT_F32, {MM_M, MM_N, 1, 1}, MM_M * 4, y}};
        rk_err err = {0};
        if (rk_backend_run(j->be, &a, &err) != RK_OK || memcmp(y, j->want, MM_N * MM_M * sizeof(float))) j->bad++;
    }
    free(y);
    return NULL;
}

/* Two cpu backends on one borrowed pool, driven from two threads at once: the
 * pool serialises their parallel sections and each keeps its own scratch, so
 * both produce the single-backend result every time; destroying them leaves
 * the pool to its owner. */
Test(pool, two_backends_share_one_pool) {
    rk_pool *pool = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_pool_create(2, &pool, &err), RK_OK, "%s", err.msg);
    rk_backend *a = NULL, *b = NULL;
    cr_assert_eq(rk_backend_cpu_create_with_pool(pool, &a, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_cpu_create_with_pool(pool, &b, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(a->n_threads, 2);
    cr_assert_eq(rk_backend_pool(a), pool);
    cr_assert_eq(rk_backend_pool(b), pool);
    uint64_t s = 77;
    float *wf = malloc(MM_M * MM_K * 4), *x = malloc(MM_N * MM_K * 4), *want = malloc(MM_N * MM_M * 4);
    uint8_t *w = malloc(MM_M * MM_K / 32 * 34);
    for (int i = 0; i < MM_M * MM_K; i++) wf[i] = tb_rand_normal(&s);
    rk_quant_q8_0_from_f32(wf, w, MM_M * MM_K);
    for (int i = 0; i < MM_N * MM_K; i++) x[i] = tb_rand_normal(&s);
    mm_job ref = {.be = a, .w = w, .x = x, .want = want, .iters = 0};
    { /* the result of backend a alone */
        rk_op_args m = {.op = RK_OP_MATMUL,
                        .src0 = {RK_DT_Q8_0, {MM_K, MM_M, 1, 1}, MM_K / 32 * 34, w},
                        .src1 = {RK_DT_F32, {MM_K, MM_N, 1, 1}, MM_K * 4, x},
                        .dst = {RK_DT_F32, {MM_M, MM_N, 1, 1}, MM_M * 4, want}};
        cr_assert_eq(rk_backend_run(a, &m, &err), RK_OK, "%s", err.msg);
    }
    mm_job ja = ref, jb = ref;
    ja.iters = jb.iters = 200;
    jb.be = b;
    pthread_t ta, tb;
    cr_assert_eq(pthread_create(&ta, NULL, mm_thread, &ja), 0);
    cr_assert_eq(pthread_create(&tb, NULL, mm_thread, &jb), 0);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    cr_assert_eq(ja.bad + jb.bad, 0, "%d + %d runs differed", ja.bad, jb.bad);
    rk_backend_destroy(a);
    rk_backend_destroy(b);
    /* the pool is still the caller's and still works */
    cr_assert_eq(rk_pool_size(pool), 2);
    rk_backend *c = NULL;
    cr_assert_eq(rk_backend_cpu_create_with_pool(pool, &c, &err), RK_OK);
    ja.be = c, ja.iters = 3;
    mm_thread(&ja);
    cr_assert_eq(ja.bad, 0);
    rk_backend_destroy(c);
    rk_pool_destroy(pool);
    cr_assert_eq(rk_backend_cpu_create_with_pool(NULL, &c, &err), RK_E_INVALID_ARG);
    free(w), free(wf), free(x), free(want);
}
