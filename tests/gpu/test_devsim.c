/* The session's device path (activations and KV in backend memory, only the
 * logits row downloaded) on a machine without a GPU: "devsim" is a backend
 * with memory of its own whose addresses the host cannot dereference (tagged
 * non-canonical pointers: any host read or write of them faults), running the
 * cpu backend's kernels behind the tags. A session on it must give the cpu
 * backend's logits bit for bit, read and export KV rows through downloads
 * (import through uploads), and refuse what still needs host rows (LowRAM,
 * RidgeFill) with a reason. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_ext.h"
#include "rk_kernels.h"
#include "tb.h"

#define TAG ((uintptr_t)1 << 62) /* bit 62 set, 63 clear: not a canonical x86-64 / AArch64 address */

typedef struct devsim {
    rk_backend be;
    rk_backend_ops ops;
    rk_backend *inner; /* cpu, 1 thread */
    int n_alloc;
    size_t n_down; /* bytes downloaded: the logits rows, KV reads */
} devsim;

static devsim *ds_of(rk_backend *be) { return (devsim *)be->impl; }
static bool tagged(const void *p) { return ((uintptr_t)p & TAG) != 0; }
static void *untag(const void *p) { return (void *)((uintptr_t)p & ~TAG); }

static rk_view host_view(rk_view v) {
    v.data = untag(v.data);
    return v;
}

static rk_status ds_run(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_op_args h = *a;
    h.dst = host_view(a->dst), h.src0 = host_view(a->src0), h.src1 = host_view(a->src1), h.src2 = host_view(a->src2);
    return rk_backend_run(ds_of(be)->inner, &h, err);
}

static bool ds_supports(const rk_backend *be, const rk_op_args *a) {
    rk_op_args h = *a;
    h.dst = host_view(a->dst), h.src0 = host_view(a->src0), h.src1 = host_view(a->src1), h.src2 = host_view(a->src2);
    const rk_backend *in = ((const devsim *)be->impl)->inner;
    return in->ops->supports(in, &h);
}

static rk_status ds_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return rk_err_set(err, RK_E_NOMEM, "devsim: alloc");
    cr_assert(!tagged(p));
    ds_of(be)->n_alloc++;
    *out = (void *)((uintptr_t)p | TAG);
    return RK_OK;
}

static void ds_free(rk_backend *be, void *p) {
    if (!p) return;
    cr_assert(tagged(p), "devsim: free of a host pointer");
    ds_of(be)->n_alloc--;
    free(untag(p));
}

static rk_status ds_upload(rk_backend *be, void *dst, const void *src, size_t n, rk_err *err) {
    (void)be;
    if (!tagged(dst) || tagged(src)) return rk_err_set(err, RK_E_INVALID_ARG, "devsim: upload direction");
    memcpy(untag(dst), src, n);
    return RK_OK;
}

static rk_status ds_download(rk_backend *be, void *dst, const void *src, size_t n, rk_err *err) {
    if (tagged(dst) || !tagged(src)) return rk_err_set(err, RK_E_INVALID_ARG, "devsim: download direction");
    memcpy(dst, untag(src), n);
    ds_of(be)->n_down += n;
    return RK_OK;
}

static rk_status ds_sync(rk_backend *be, rk_err *err) {
    (void)be, (void)err;
    return RK_OK;
}

static void ds_destroy(rk_backend *be) {
    devsim *d = ds_of(be);
    rk_backend_destroy(d->inner);
    free(d);
}

static devsim *devsim_create(void) {
    devsim *d = calloc(1, sizeof *d);
    cr_assert(d);
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_create(1, &d->inner, &err), RK_OK, "%s", err.msg);
    d->be.ops = &d->ops;
    d->be.impl = d;
    d->be.n_threads = 1;
    d->ops.name = "devsim";
    for (int i = 0; i < RK_OP_COUNT; i++) d->ops.op[i] = ds_run;
    d->ops.supports = ds_supports;
    d->ops.destroy = ds_destroy;
    d->ops.prepare = NULL; /* weights stay the mapped host views (the ops untag only tagged pointers) */
    d->ops.mem_alloc = ds_alloc;
    d->ops.mem_free = ds_free;
    d->ops.upload = ds_upload;
    d->ops.download = ds_download;
    d->ops.sync = ds_sync;
    return d;
}

static const char *model_path(char *buf, size_t cap) {
    const char *p = tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf");
    if (p && access(p, R_OK) == 0) return p;
    tb_tiny_spec sp = {.seed = 5}; /* generated llama, no ../shared needed */
    p = tb_tiny_model(&sp, buf, cap);
    cr_assert(p, "%s", buf);
    return p;
}

static rk_session *session_on(const rk_model *m, rk_backend *be, const char *kv, rk_err *err, rk_status *st) {
    rk_session_params p = rk_session_params_default();
    p.n_ctx = 128;
    p.ctx_overflow_ok = true; /* the generated model (no ../shared) was trained on 64: the twins compare, not the text */
    p.n_batch = 16; /* several prefill chunks */
    p.n_threads = 1;
    p.shared_backend = be;
    cr_assert_eq(rk_kv_params_parse(kv, &p.kv, err), RK_OK, "%s", err->msg);
    rk_session *s = NULL;
    *st = rk_session_create(m, &p, &s, err);
    return s;
}

Test(devsim, session_matches_cpu_bit_for_bit) {
    char path[1024];
    model_path(path, sizeof path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    const int nv = rk_model_hparams(m)->n_vocab;
    const char *kvs[] = {"f32", "f16"};
    for (int k = 0; k < 2; k++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_status st;
        rk_session *a = session_on(m, cpu, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_session *b = session_on(m, &ds->be, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        cr_assert_gt(ds->n_alloc, 10, "activations and KV in backend memory");
        int32_t ids[40];
        uint64_t r = 9;
        for (int i = 0; i < 40; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
        float *la = malloc((size_t)40 * nv * sizeof(float)), *lb = malloc((size_t)40 * nv * sizeof(float));
        /* prefill 30 tokens (2 chunks), all rows; then 10 decode steps, last row each */
        cr_assert_eq(rk_session_eval(a, ids, 30, la, true, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(b, ids, 30, lb, true, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)30 * nv * sizeof(float)) == 0, "kv %s: prefill logits differ", kvs[k]);
        for (int t = 30; t < 40; t++) {
            size_t before = ds->n_down;
            cr_assert_eq(rk_session_eval(a, ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(b, ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: decode %d logits differ", kvs[k], t);
            /* the only transfer back of a decode step: one logits row */
            cr_expect_eq(ds->n_down - before, (size_t)nv * sizeof(float), "kv %s step %d: %zu bytes came back",
                         kvs[k], t, ds->n_down - before);
        }
        /* KV rows as attention sees them, through downloads */
        const int64_t kvd = (int64_t)rk_model_hparams(m)->n_head_kv * rk_model_hparams(m)->head_dim;
        float *ra = malloc((size_t)40 * kvd * sizeof(float)), *rb = malloc((size_t)40 * kvd * sizeof(float));
        cr_assert_eq(rk_session_kv_rows(a, 1, true, false, 0, 40, ra, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_rows(b, 1, true, false, 0, 40, rb, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(ra, rb, (size_t)40 * kvd * sizeof(float)) == 0, "kv %s: KV rows differ", kvs[k]);
        /* truncate + re-eval stays equal */
        cr_assert_eq(rk_session_truncate(a, 20, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_truncate(b, 20, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(a, ids + 25, 5, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(b, ids + 25, 5, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: after truncate", kvs[k]);
        /* export through downloads: the cpu session's block, byte for byte; imported into a
         * fresh device session, the next step's logits are the original's */
        void *ba = NULL, *bb = NULL;
        size_t na = 0, nb = 0;
        cr_assert_eq(rk_session_kv_export(a, 0, 25, &ba, &na, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_export(b, 0, 25, &bb, &nb, &err), RK_OK, "%s", err.msg);
        cr_expect(na == nb && memcmp(ba, bb, na) == 0, "kv %s: exported blocks differ (%zu vs %zu bytes)", kvs[k], na,
                  nb);
        rk_session *c = session_on(m, &ds->be, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_import(c, bb, nb, &err), RK_OK, "%s", err.msg);
        cr_expect_eq(rk_session_n_past(c), 25);
        float *lc = malloc((size_t)nv * sizeof(float));
        cr_assert_eq(rk_session_truncate(a, 25, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(a, ids + 25, 1, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(c, ids + 25, 1, lc, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lc, (size_t)nv * sizeof(float)) == 0, "kv %s: logits after import differ", kvs[k]);
        /* a block cut short is refused, nothing changed */
        cr_expect_neq(rk_session_kv_import(c, bb, nb - 7, &err), RK_OK);
        cr_expect_eq(rk_session_n_past(c), 26);
        free(lc), free(ba), free(bb);
        rk_session_destroy(c);
        free(ra), free(rb), free(la), free(lb);
        rk_session_destroy(a);
        rk_session_destroy(b);
        cr_expect_eq(ds->n_alloc, 0, "kv %s: %d blocks leaked", kvs[k], ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    rk_model_destroy(m);
}

Test(devsim, host_only_features_are_refused) {
    char path[1024];
    model_path(path, sizeof path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    devsim *ds = devsim_create();
    rk_status st;
    rk_session *s = session_on(m, &ds->be, "lowram", &err, &st);
    cr_expect_eq(st, RK_E_UNSUPPORTED);
    cr_expect_null(s);
    cr_expect(strstr(err.msg, "lowram") && strstr(err.msg, "devsim"), "%s", err.msg);
    cr_expect_eq(ds->n_alloc, 0, "a refused session left %d blocks", ds->n_alloc);
    s = session_on(m, &ds->be, "f16", &err, &st);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    rk_fill_params f = {0};
    f.mode = RK_FILL_IDENTITY;
    f.split = 1;
    cr_expect_eq(rk_session_set_fill(s, &f, &err), RK_E_UNSUPPORTED);
    cr_expect(strstr(err.msg, "CPU backends"), "%s", err.msg);
    rk_session_destroy(s);
    rk_backend_destroy(&ds->be);
    rk_model_destroy(m);
}
