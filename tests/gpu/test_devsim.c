/* The session's device path (activations and KV in backend memory, only the
 * logits row downloaded) on a machine without a GPU: "devsim" is a backend
 * with memory of its own whose addresses the host cannot dereference (tagged
 * non-canonical pointers: any host read or write of them faults), running the
 * cpu backend's kernels behind the tags. A session on it must give the cpu
 * backend's logits bit for bit, read and export KV rows through downloads
 * (import through uploads), run RidgeFill's plan (row gathers and scatters, the
 * ridge-map GEMMs, the layer-major split stream, the question-aware selection) on
 * backend memory with the cpu session's logits bit for bit, and refuse what still
 * needs host rows (the eval splice) with a reason. --kv lowram runs its decode attention
 * as the fused LR_ATTN over a device copy of the codec's state (runtime/session/lowram_dev.c)
 * and gives the cpu lowram session's logits within a stated tolerance. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "rk.h"
#include "rk_ext.h"
#include "rk_gguf.h"
#include "rk_io.h"
#include "rk_kernels.h"
#include "tb.h"

#define TAG ((uintptr_t)1 << 62) /* bit 62 set, 63 clear: not a canonical x86-64 / AArch64 address */

typedef struct devsim {
    rk_backend be;
    rk_backend_ops ops;
    rk_backend *inner; /* cpu, 1 thread */
    int n_alloc;
    size_t n_down; /* bytes downloaded: the logits rows, KV reads */
    /* recorded steps (as CUDA graphs are): ops between step_begin and step_end are kept
     * and run by step_end; a transfer meanwhile breaks the recording */
    bool recording, broken;
    rk_op_args *rec;
    int n_rec, cap_rec;
    int n_steps, n_ran, fail_every; /* step_end calls; recordings run; every fail_every-th end fails */
    /* bytes of backend memory live now and at most (a size header sits before each block) */
    size_t live, peak;
    /* pinned host blocks and the copy lane (GPU KV tiers): lane copies are queued and run
     * at the next join or sync (lane_defer) or at once; queued copies count as in flight */
    bool lane_defer;
    struct ds_copy {
        void *dst;
        const void *src;
        size_t n;
        bool to_device;
    } *lane;
    int n_lane, cap_lane, n_host;
    size_t lane_up, lane_down;
    int n_joins;
} devsim;

static devsim *ds_of(rk_backend *be) { return (devsim *)be->impl; }
static bool tagged(const void *p) { return ((uintptr_t)p & TAG) != 0; }
static void *untag(const void *p) { return (void *)((uintptr_t)p & ~TAG); }

static rk_view host_view(rk_view v) {
    v.data = untag(v.data);
    return v;
}

static rk_status ds_run(rk_backend *be, const rk_op_args *a, rk_err *err) {
    devsim *d = ds_of(be);
    if (d->recording) { /* kept as it is now: views, parameters, ids (valid until step_end) */
        if (d->n_rec == d->cap_rec) {
            d->cap_rec = d->cap_rec ? 2 * d->cap_rec : 256;
            d->rec = realloc(d->rec, (size_t)d->cap_rec * sizeof *d->rec);
            cr_assert(d->rec);
        }
        d->rec[d->n_rec++] = *a;
        return RK_OK;
    }
    rk_op_args h = *a;
    h.dst = host_view(a->dst), h.src0 = host_view(a->src0), h.src1 = host_view(a->src1), h.src2 = host_view(a->src2);
    rk_lr_attn_args L;
    if (a->op == RK_OP_LR_ATTN && a->lr) { /* the codec state: every pointer must be backend memory */
        L = *a->lr;
        const void **ps[] = {(const void **)&L.freq, &L.sk, &L.sv, &L.xk, &L.xv, (const void **)&L.pos,
                             (const void **)&L.coef, (const void **)&L.basis, (const void **)&L.mean,
                             (const void **)&L.winv, (const void **)&L.lmk, (const void **)&L.cmean,
                             (const void **)&L.W, (const void **)&L.b, (const void **)&L.res,
                             (const void **)&L.mask, (const void **)&L.base};
        for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
            cr_assert(!*ps[i] || tagged(*ps[i]), "devsim: LR_ATTN state pointer %zu in host memory", i);
            *ps[i] = untag(*ps[i]);
        }
        cr_assert(tagged(a->src0.data) && tagged(a->dst.data), "devsim: LR_ATTN q / out in host memory");
        h.lr = &L;
    }
    return rk_backend_run(ds_of(be)->inner, &h, err);
}

static bool ds_supports(const rk_backend *be, const rk_op_args *a) {
    rk_op_args h = *a;
    h.dst = host_view(a->dst), h.src0 = host_view(a->src0), h.src1 = host_view(a->src1), h.src2 = host_view(a->src2);
    const rk_backend *in = ((const devsim *)be->impl)->inner;
    return in->ops->supports(in, &h);
}

static rk_status ds_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    char *p = calloc(1, bytes + 64);
    if (!p) return rk_err_set(err, RK_E_NOMEM, "devsim: alloc");
    cr_assert(!tagged(p));
    devsim *d = ds_of(be);
    memcpy(p, &bytes, sizeof bytes);
    d->n_alloc++;
    d->live += bytes;
    if (d->live > d->peak) d->peak = d->live;
    *out = (void *)((uintptr_t)(p + 64) | TAG);
    return RK_OK;
}

static void ds_free(rk_backend *be, void *p) {
    if (!p) return;
    cr_assert(tagged(p), "devsim: free of a host pointer");
    devsim *d = ds_of(be);
    char *raw = (char *)untag(p) - 64;
    size_t bytes;
    memcpy(&bytes, raw, sizeof bytes);
    d->n_alloc--;
    d->live -= bytes;
    free(raw);
}

static rk_status ds_host_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    void *p = calloc(1, bytes ? bytes : 1);
    if (!p) return rk_err_set(err, RK_E_NOMEM, "devsim: host_alloc");
    ds_of(be)->n_host++;
    *out = p;
    return RK_OK;
}

static void ds_host_free(rk_backend *be, void *p) {
    if (!p) return;
    devsim *d = ds_of(be);
    cr_assert(!tagged(p), "devsim: host_free of backend memory");
    for (int i = 0; i < d->n_lane; i++)
        cr_assert(d->lane[i].dst != p && d->lane[i].src != p, "devsim: host block freed under a queued lane copy");
    d->n_host--;
    free(p);
}

static void lane_run(devsim *d) {
    for (int i = 0; i < d->n_lane; i++) {
        struct ds_copy *c = &d->lane[i];
        memcpy(c->to_device ? untag(c->dst) : c->dst, c->to_device ? c->src : untag(c->src), c->n);
    }
    d->n_lane = 0;
}

static rk_status ds_lane_copy(rk_backend *be, void *dst, const void *src, size_t n, bool to_device, rk_err *err) {
    devsim *d = ds_of(be);
    if (d->recording) {
        d->broken = true;
        return rk_err_set(err, RK_E_UNSUPPORTED, "devsim: a lane copy while a step is recorded");
    }
    if (to_device ? !tagged(dst) || tagged(src) : tagged(dst) || !tagged(src))
        return rk_err_set(err, RK_E_INVALID_ARG, "devsim: lane copy direction");
    if (d->n_lane == d->cap_lane) {
        d->cap_lane = d->cap_lane ? 2 * d->cap_lane : 64;
        d->lane = realloc(d->lane, (size_t)d->cap_lane * sizeof *d->lane);
        cr_assert(d->lane);
    }
    d->lane[d->n_lane++] = (struct ds_copy){dst, src, n, to_device};
    if (to_device) d->lane_up += n;
    else d->lane_down += n;
    if (!d->lane_defer) lane_run(d);
    return RK_OK;
}

static rk_status ds_lane_join(rk_backend *be, rk_err *err) {
    (void)err;
    devsim *d = ds_of(be);
    d->n_joins++;
    lane_run(d);
    return RK_OK;
}

static rk_status ds_lane_sync(rk_backend *be, rk_err *err) {
    (void)err;
    lane_run(ds_of(be));
    return RK_OK;
}

static rk_status ds_step_begin(rk_backend *be, rk_err *err) {
    devsim *d = ds_of(be);
    if (d->recording) return rk_err_set(err, RK_E_INVALID_ARG, "devsim: nested step");
    d->recording = true, d->broken = false, d->n_rec = 0;
    return RK_OK;
}

static rk_status ds_step_end(rk_backend *be, bool run, rk_err *err) {
    devsim *d = ds_of(be);
    if (!d->recording) return rk_err_set(err, RK_E_INVALID_ARG, "devsim: step_end without step_begin");
    d->recording = false;
    d->n_steps++;
    if (d->broken || (d->fail_every && d->n_steps % d->fail_every == 0))
        return rk_err_set(err, RK_E_UNSUPPORTED, "devsim: the recorded step broke");
    if (!run) return RK_OK;
    for (int i = 0; i < d->n_rec; i++) {
        rk_status st = ds_run(be, &d->rec[i], err);
        if (st) return st;
    }
    d->n_ran++;
    return RK_OK;
}

static rk_status ds_no_transfer(devsim *d, rk_err *err) {
    if (!d->recording) return RK_OK;
    d->broken = true;
    return rk_err_set(err, RK_E_UNSUPPORTED, "devsim: a transfer while a step is recorded");
}

static rk_status ds_upload(rk_backend *be, void *dst, const void *src, size_t n, rk_err *err) {
    if (ds_no_transfer(ds_of(be), err)) return RK_E_UNSUPPORTED;
    if (!tagged(dst) || tagged(src)) return rk_err_set(err, RK_E_INVALID_ARG, "devsim: upload direction");
    memcpy(untag(dst), src, n);
    return RK_OK;
}

static rk_status ds_download(rk_backend *be, void *dst, const void *src, size_t n, rk_err *err) {
    if (ds_no_transfer(ds_of(be), err)) return RK_E_UNSUPPORTED;
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
    cr_assert_eq(d->n_lane, 0, "devsim: %d lane copies still queued at destroy", d->n_lane);
    free(d->lane);
    free(d->rec);
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
    d->ops.step_begin = ds_step_begin;
    d->ops.step_end = ds_step_end;
    d->ops.host_alloc = ds_host_alloc;
    d->ops.host_free = ds_host_free;
    d->ops.lane_copy = ds_lane_copy;
    d->ops.lane_join = ds_lane_join;
    d->ops.lane_sync = ds_lane_sync;
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
    rk_session *s = session_on(m, &ds->be, "f16", &err, &st);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    rk_session *x = session_on(m, &ds->be, "f16", &err, &st);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    cr_expect_eq(rk_session_set_splice(s, x, 0, 1, true, true, &err), RK_E_UNSUPPORTED);
    cr_expect(strstr(err.msg, "splice") && strstr(err.msg, "devsim"), "%s", err.msg);
    rk_session_destroy(x);
    rk_session_destroy(s);
    rk_backend_destroy(&ds->be);
    rk_model_destroy(m);
}

/* ---- RidgeFill on backend memory ------------------------------------------------ */

/* A map file for m with random maps near the identity (W = I + N(0, 0.02^2), small
 * biases; K/V maps: N(0, 0.1^2) entries), weights of type wt, written to path. */
static void write_maps(const rk_model *m, int split, uint32_t wt, bool normalized, bool kv, char *path, size_t cap) {
    const rk_hparams *hp = rk_model_hparams(m);
    const int d = hp->n_embd, L = hp->n_layer, dout = kv ? 2 * hp->n_head_kv * hp->head_dim : d;
    rk_err e = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(32, &w, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.type", "ridgekv.ridge_maps", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "ridge.split", (uint32_t)split, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_fingerprint_write(w, "ridge.model", m, &e), RK_OK, "%s", e.msg);
    if (normalized) cr_assert_eq(rk_gguf_writer_set_str(w, "ridge.space", "normalized", &e), RK_OK, "%s", e.msg);
    if (kv) cr_assert_eq(rk_gguf_writer_set_str(w, "ridge.target", "kv", &e), RK_OK, "%s", e.msg);
    float *wf = malloc((size_t)d * dout * sizeof(float)), *b = malloc((size_t)dout * sizeof(float));
    uint16_t *wh = malloc((size_t)d * dout * sizeof(uint16_t));
    cr_assert(wf && b && wh);
    uint64_t r = 77;
    for (int l = split + 1; l < L; l++) {
        for (int o = 0; o < dout; o++) {
            b[o] = 0.01f * (float)tb_rand_normal(&r);
            for (int i = 0; i < d; i++) {
                float v = (kv ? 0.1f : 0.02f) * (float)tb_rand_normal(&r) + (!kv && i == o ? 1.0f : 0.0f);
                wf[(size_t)o * d + i] = v;
                wh[(size_t)o * d + i] = rk_f32_to_f16(v);
            }
        }
        char nm[64];
        int64_t ne[2] = {d, dout};
        snprintf(nm, sizeof nm, "ridge.%d.weight", l);
        const bool f16 = wt == RK_DT_F16;
        cr_assert_eq(rk_gguf_writer_add_tensor(w, nm, wt, 2, ne, f16 ? (void *)wh : (void *)wf,
                                               (uint64_t)d * dout * (f16 ? 2 : 4), &e),
                     RK_OK, "%s", e.msg);
        snprintf(nm, sizeof nm, "ridge.%d.bias", l);
        int64_t nb[1] = {dout};
        cr_assert_eq(rk_gguf_writer_add_tensor(w, nm, RK_DT_F32, 1, nb, b, (uint64_t)dout * 4, &e), RK_OK, "%s",
                     e.msg);
    }
    void *bytes;
    size_t n;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &n, &e), RK_OK, "%s", e.msg);
    rk_gguf_writer_destroy(w);
    cr_assert(tb_tmp_path(path, cap, "rk_devsim", ".maps.gguf"), "%s", path);
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, n, &e), RK_OK, "%s", e.msg);
    free(bytes), free(wf), free(wh), free(b);
}

/* A generated tiny model, loaded (its file removed at once). */
static rk_model *load_tiny(tb_tiny_spec sp) {
    char path[1024];
    cr_assert(tb_tiny_model(&sp, path, sizeof path), "%s", path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    unlink(path);
    return m;
}

/* Every fill mode and map kind: a devsim session gives the cpu session's logits bit for
 * bit (all rows of a 70-token prompt in 16-row chunks: bulk chunks, a chunk crossing
 * into the tail, filled rows NaN), the same work counters and selection, then the same
 * decode steps over the filled cache; nothing read on the host (devsim faults). */
Test(devsim, fill_session_matches_cpu_bit_for_bit, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.arch = TB_ARCH_QWEN2, .n_layer = 5, .seed = 21}); /* QKV bias, NEOX */
    rk_err err = {0};
    const int nv = rk_model_hparams(m)->n_vocab, L = rk_model_hparams(m)->n_layer, split = 2;
    enum { N = 70, DEC = 4, TAIL = 20 };
    struct {
        const char *name;
        rk_fill_mode mode;
        int maps; /* 0 none, 1 f32 input maps, 2 f16 normalised input maps, 3 K/V maps */
        bool question_aware, layer_major;
    } cases[] = {
        {"identity", RK_FILL_IDENTITY, 0, false, false},
        {"plumb", RK_FILL_PLUMB, 0, false, false},
        {"speed f32 maps", RK_FILL_SPEED, 1, false, false},
        {"speed f16 normalised maps, layer-major", RK_FILL_SPEED, 2, false, true},
        {"speed K/V maps", RK_FILL_SPEED, 3, false, false},
        {"quality (question-aware, layer-major) f32 maps", RK_FILL_QUALITY, 1, true, true},
        {"quality K/V maps", RK_FILL_QUALITY, 3, true, true},
    };
    char mp[3][512];
    rk_ridge_maps *maps[3] = {NULL};
    for (int k = 0; k < 3; k++) {
        write_maps(m, split, k == 1 ? RK_DT_F16 : RK_DT_F32, k == 1, k == 2, mp[k], sizeof mp[k]);
        cr_assert_eq(rk_ridge_maps_load(mp[k], m, &maps[k], NULL, 0, &err), RK_OK, "%s", err.msg);
    }
    int32_t ids[N + DEC];
    uint64_t r = 3;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    float *la = malloc((size_t)N * nv * sizeof(float)), *lb = malloc((size_t)N * nv * sizeof(float));
    cr_assert(la && lb);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_status st;
        rk_session *a = session_on(m, cpu, "f16", &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_session *b = session_on(m, &ds->be, "f16", &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_fill_params f = {.mode = cases[c].mode, .tail = TAIL, .split = split, .obs = 8, .baseline = 4,
                            .keep_share = 0.25f, .layer_major = cases[c].layer_major,
                            .question_aware = cases[c].question_aware};
        if (cases[c].maps) f.maps = maps[cases[c].maps - 1];
        cr_assert_eq(rk_session_set_fill(a, &f, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_assert_eq(rk_session_set_fill(b, &f, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_assert_eq(rk_session_eval(a, ids, N, la, true, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_assert_eq(rk_session_eval(b, ids, N, lb, true, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_expect(memcmp(la, lb, (size_t)N * nv * sizeof(float)) == 0, "%s: prefill logits differ", cases[c].name);
        /* the fill did happen: bulk rows filled at every late layer, the tail exact */
        const rk_session_counters *ca = rk_session_get_counters(a), *cb = rk_session_get_counters(b);
        cr_expect(memcmp(ca, cb, sizeof *ca) == 0, "%s: work counters differ", cases[c].name);
        if (cases[c].mode != RK_FILL_PLUMB) {
            cr_expect_gt(cb->filled_rows[L - 1], 0, "%s: no row was filled", cases[c].name);
            int n_nan = 0; /* filled rows have no logits (quality keeps the sinks and its selection) */
            for (int i = 0; i < N - TAIL; i++) n_nan += isnan(lb[(size_t)i * nv]);
            cr_expect_gt(n_nan, 0, "%s: every bulk row has logits", cases[c].name);
        }
        cr_expect(!isnan(lb[(size_t)(N - 1) * nv]), "%s: the last row has no logits", cases[c].name);
        if (cases[c].question_aware) {
            cr_expect_eq(rk_session_fill_kept(a, 0, N), rk_session_fill_kept(b, 0, N), "%s: selections differ",
                         cases[c].name);
            cr_expect_gt(rk_session_fill_kept(b, 0, N), 0, "%s: nothing kept", cases[c].name);
        }
        /* decode over the filled cache */
        for (int t = N; t < N + DEC; t++) {
            cr_assert_eq(rk_session_eval(a, ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(b, ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "%s: decode %d differs", cases[c].name, t);
        }
        rk_session_destroy(a);
        rk_session_destroy(b);
        cr_expect_eq(ds->n_alloc, 0, "%s: %d blocks leaked", cases[c].name, ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    for (int k = 0; k < 3; k++) rk_ridge_maps_destroy(maps[k]), unlink(mp[k]);
    free(la), free(lb);
    rk_model_destroy(m);
}

/* ---- host-memory KV policies behind a device session ----------------------------- */

/* q8 blocks and the memory tiers (--kv-budget: every cold chunk spilled to the block store
 * and read back for attention) keep their rows on the host: the layer loop downloads K, V
 * and q and uploads the attention output. Same logits as the cpu session, bit for bit,
 * over a prompt long enough to spill, then decode steps. */
Test(devsim, host_kv_policies_match_cpu_bit_for_bit, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.n_layer = 2, .seed = 9});
    rk_err err = {0};
    const int nv = rk_model_hparams(m)->n_vocab;
    enum { N = 1300, DEC = 3 };
    int32_t *ids = malloc((N + DEC) * sizeof(int32_t));
    uint64_t r = 5;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    char dir[512];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk_devsim_spill"), "%s", dir);
    const struct {
        const char *kv;
        uint64_t budget;
    } cases[] = {{"q8", 0}, {"f16", 1}, {"q8", 1}};
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = 1536;
            p.ctx_overflow_ok = true;
            p.n_batch = 256;
            p.n_threads = 1;
            p.shared_backend = k ? &ds->be : cpu;
            cr_assert_eq(rk_kv_params_parse(cases[c].kv, &p.kv, &err), RK_OK, "%s", err.msg);
            p.kv.budget = cases[c].budget;
            p.kv.spill_dir = dir;
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s %s", cases[c].kv, err.msg);
        }
        cr_assert_eq(rk_session_eval(ss[0], ids, N, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[1], ids, N, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s budget %llu: prefill logits differ",
                  cases[c].kv, (unsigned long long)cases[c].budget);
        for (int t = N; t < N + DEC; t++) {
            cr_assert_eq(rk_session_eval(ss[0], ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(ss[1], ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s budget %llu: decode %d differs",
                      cases[c].kv, (unsigned long long)cases[c].budget, t);
        }
        if (cases[c].budget) { /* the rows did go to the store and came back */
            rk_kv_tier_stats t;
            rk_session_kv_tier_stats(ss[1], &t);
            cr_expect(t.on && t.bytes_spilled > 0 && t.bytes_read > 0, "kv %s: spilled %llu, read %llu", cases[c].kv,
                      (unsigned long long)t.bytes_spilled, (unsigned long long)t.bytes_read);
        }
        rk_session_destroy(ss[0]);
        rk_session_destroy(ss[1]);
        cr_expect_eq(ds->n_alloc, 0, "kv %s: %d blocks leaked", cases[c].kv, ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    rmdir(dir);
    free(la), free(lb), free(ids);
    rk_model_destroy(m);
}

/* ---- GPU KV tiers (runtime/session/kv_dev.c) ------------------------------------------- */

/* A backend without the entries (cpu) serves the same calls: zeroed 64-byte aligned heap
 * blocks, lane copies as synchronous upload / download, join and sync no-ops. */
Test(devsim, lane_calls_fall_back_on_host_backends) {
    rk_backend *cpu = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
    float *h = NULL, *d = NULL;
    cr_assert_eq(rk_backend_host_alloc(cpu, 1000 * sizeof(float), (void **)&h, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_alloc(cpu, 1000 * sizeof(float), (void **)&d, &err), RK_OK, "%s", err.msg);
    cr_expect(((uintptr_t)h & 63) == 0 && h[0] == 0 && h[999] == 0);
    for (int i = 0; i < 1000; i++) h[i] = (float)i;
    cr_assert_eq(rk_backend_lane_copy(cpu, d, h, 1000 * sizeof(float), true, &err), RK_OK, "%s", err.msg);
    cr_expect(d[999] == 999.0f, "the copy up ran at once");
    d[5] = -1;
    cr_assert_eq(rk_backend_lane_copy(cpu, h, d, 1000 * sizeof(float), false, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_lane_join(cpu, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_lane_sync(cpu, &err), RK_OK, "%s", err.msg);
    cr_expect(h[5] == -1.0f && h[6] == 6.0f, "the copy down ran at once");
    cr_expect_eq(rk_backend_lane_copy(cpu, NULL, h, 4, true, &err), RK_E_INVALID_ARG);
    cr_expect(strstr(err.msg, "NULL pointer"), "%s", err.msg);
    rk_backend_free(cpu, d);
    rk_backend_host_free(cpu, h);
    rk_backend_host_free(cpu, NULL);
    rk_backend_destroy(cpu);
}

/* --kv-budget on a device backend, f16 / f32: whole layers in device memory, the others in
 * pinned host blocks moved on the copy lane (prefetched one layer ahead). Budgets of 2 and
 * 3 layers of a 4-layer model (0 / 1 resident layers, 4 / 3 cold ones sharing two device
 * slots), the lane's copies run at once or only at the next join / sync (deferred: a missed
 * join reads a stale slot). Against the unbudgeted device session and the cpu session: the
 * same ATTN over the same rows, so the logits are bit for bit the same through a chunked
 * prefill, decode steps, a truncation and more decode; KV rows read back, the exported
 * block and an import agree too. The moves happen (bytes up and down, prefetched layers)
 * and the device holds exactly the resident layers and the two slots: the budgeted
 * session's backend memory is the plain one's less (n_layer - resident - 2) layers. */
Test(devsim, kv_budget_device_tiers_match_plain, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.n_layer = 4, .seed = 13});
    rk_err err = {0};
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab;
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, n_ctx = 512;
    enum { N = 300, DEC = 8 };
    int32_t ids[N + DEC];
    uint64_t r = 17;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float)),
          *lc = malloc((size_t)nv * sizeof(float));
    float *ra = malloc((size_t)N * kvd * sizeof(float)), *rb = malloc((size_t)N * kvd * sizeof(float));
    const char *kvs[] = {"f16", "f32"};
    for (int c = 0; c < 8; c++) {
        const char *kv = kvs[c & 1];
        const int fit = 2 + ((c >> 1) & 1); /* layers the budget buys */
        const bool defer = (c >> 2) & 1;
        const uint64_t layer = 2ull * (uint64_t)n_ctx * (uint64_t)kvd * (c & 1 ? 4 : 2);
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *dp = devsim_create(), *dt = devsim_create();
        dt->lane_defer = defer;
        rk_session *ss[3] = {NULL, NULL, NULL};
        rk_backend *bes[3] = {cpu, &dp->be, &dt->be};
        for (int k = 0; k < 3; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = n_ctx;
            p.ctx_overflow_ok = true;
            p.n_batch = 64; /* 5 prefill chunks */
            p.n_threads = 1;
            p.shared_backend = bes[k];
            cr_assert_eq(rk_kv_params_parse(kv, &p.kv, &err), RK_OK, "%s", err.msg);
            if (k == 2) p.kv.budget = (uint64_t)fit * layer + layer / 2;
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s %s", kv, err.msg);
        }
        const int res = fit - 2;
        /* device bytes: the plain session's less the layers that are not there */
        cr_expect_eq(dp->live - dt->live, (size_t)(4 - res - 2) * layer, "kv %s fit %d: device bytes %zu vs plain %zu",
                     kv, fit, dt->live, dp->live);
        cr_expect_eq(dt->n_host, 2 * (4 - res), "kv %s fit %d: %d pinned host blocks", kv, fit, dt->n_host);
        float *ls[3] = {la, lb, lc};
        for (int k = 0; k < 3; k++) cr_assert_eq(rk_session_eval(ss[k], ids, N, ls[k], false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0 && memcmp(la, lc, (size_t)nv * sizeof(float)) == 0,
                  "kv %s fit %d defer %d: prefill logits differ", kv, fit, defer);
        for (int round = 0; round < 2; round++) {
            for (int t = N; t < N + DEC; t++) {
                for (int k = 0; k < 3; k++)
                    cr_assert_eq(rk_session_eval(ss[k], ids + t, 1, ls[k], false, &err), RK_OK, "%s", err.msg);
                cr_expect(memcmp(la, lc, (size_t)nv * sizeof(float)) == 0 && memcmp(lb, lc, (size_t)nv * sizeof(float)) == 0,
                          "kv %s fit %d defer %d round %d: decode %d differs", kv, fit, defer, round, t);
            }
            for (int k = 0; k < 3; k++) cr_assert_eq(rk_session_truncate(ss[k], N + 2, &err), RK_OK, "%s", err.msg);
        }
        rk_kv_tier_stats t;
        rk_session_kv_tier_stats(ss[2], &t);
        /* every cold layer's rows went down once per append, and up for every pass but what
         * the slots held: well over a prompt's worth each way */
        const uint64_t cold_rows_bytes = (uint64_t)(4 - res) * 2ull * N * (uint64_t)kvd * (c & 1 ? 4 : 2);
        cr_expect(t.on && t.bytes_spilled >= cold_rows_bytes && t.bytes_read > cold_rows_bytes,
                  "kv %s fit %d: down %llu, up %llu (a prompt's cold rows: %llu)", kv, fit,
                  (unsigned long long)t.bytes_spilled, (unsigned long long)t.bytes_read, (unsigned long long)cold_rows_bytes);
        cr_expect(t.bytes_read == dt->lane_up && t.bytes_spilled == dt->lane_down, "kv %s: counters vs the lane's bytes", kv);
        /* hits: appends of resident layers (none when the budget buys only the two slots) */
        cr_expect(t.misses > 0 && t.prefetched > 0 && t.prefetched <= t.misses && (res ? t.hits > 0 : t.hits == 0),
                  "kv %s fit %d: hits %llu misses %llu prefetched %llu", kv, fit, (unsigned long long)t.hits,
                  (unsigned long long)t.misses, (unsigned long long)t.prefetched);
        cr_expect_eq(t.resident_bytes, (uint64_t)fit * layer, "kv %s fit %d: resident %llu", kv, fit,
                     (unsigned long long)t.resident_bytes);
        cr_expect(t.resident_bytes <= t.budget);
        cr_expect(dt->n_joins > 0, "no lane join");
        /* rows read back (a cold and a resident layer) and the exported block */
        for (int l = 0; l < 4; l += 3) {
            cr_assert_eq(rk_session_kv_rows(ss[0], l, false, false, 0, N, ra, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_kv_rows(ss[2], l, false, false, 0, N, rb, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(ra, rb, (size_t)N * kvd * sizeof(float)) == 0, "kv %s: layer %d rows differ", kv, l);
        }
        void *ba = NULL, *bb = NULL;
        size_t na = 0, nb = 0;
        cr_assert_eq(rk_session_kv_export(ss[0], 0, N, &ba, &na, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_export(ss[2], 0, N, &bb, &nb, &err), RK_OK, "%s", err.msg);
        cr_expect(na == nb && memcmp(ba, bb, na) == 0, "kv %s: exported blocks differ", kv);
        /* imported into the budgeted session after a reset: the next step as the cpu's */
        rk_session_reset(ss[2]);
        cr_assert_eq(rk_session_kv_import(ss[2], bb, nb, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_truncate(ss[0], N, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[0], ids + N, 1, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[2], ids + N, 1, lc, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lc, (size_t)nv * sizeof(float)) == 0, "kv %s fit %d: logits after import differ", kv, fit);
        free(ba), free(bb);
        for (int k = 0; k < 3; k++) rk_session_destroy(ss[k]);
        cr_expect(dp->n_alloc == 0 && dt->n_alloc == 0 && dt->n_host == 0, "kv %s: blocks leaked", kv);
        rk_backend_destroy(&dp->be);
        rk_backend_destroy(&dt->be);
        rk_backend_destroy(cpu);
    }
    free(la), free(lb), free(lc), free(ra), free(rb);
    rk_model_destroy(m);
}

/* The disk step of the GPU KV tiers: a host budget of one or two pinned layers for four
 * cold layers, so the others go on to the spill file (the block store) and come back when
 * their slot is filled or their new rows go down. Same logits bit for bit as the plain
 * devsim session through a chunked prefill, decode, a truncation and more decode; rows read
 * back equal; pinned host blocks bounded by the host budget; disk writes and reads happen.
 * Faults: a spill directory that does not exist fails at create, naming it; a file size
 * limit (a full disk, for the store: EFBIG) fails an eval with the spill file named, no
 * abort, and the session is destroyed cleanly. */
Test(devsim, kv_budget_disk_step_matches_plain, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.n_layer = 4, .seed = 13});
    rk_err err = {0};
    const rk_hparams *hp = rk_model_hparams(m);
    const int nv = hp->n_vocab;
    const int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, n_ctx = 512;
    enum { N = 300, DEC = 8 };
    int32_t ids[N + DEC];
    uint64_t r = 17;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    float *ra = malloc((size_t)N * kvd * sizeof(float)), *rb = malloc((size_t)N * kvd * sizeof(float));
    char dir[] = "/tmp/rk-devtier-XXXXXX";
    cr_assert(mkdtemp(dir));
    const uint64_t layer = 2ull * (uint64_t)n_ctx * (uint64_t)kvd * 2; /* f16 */
    for (int c = 0; c < 3; c++) {
        const int n_pin = 1 + (c & 1);
        devsim *dp = devsim_create(), *dt = devsim_create();
        dt->lane_defer = c == 2;
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = n_ctx;
            p.ctx_overflow_ok = true;
            p.n_batch = 64;
            p.n_threads = 1;
            p.shared_backend = k ? &dt->be : &dp->be;
            cr_assert_eq(rk_kv_params_parse("f16", &p.kv, &err), RK_OK, "%s", err.msg);
            if (k) {
                p.kv.budget = 2 * layer; /* the two slots: every layer cold */
                p.kv.host_budget = (uint64_t)n_pin * layer + layer / 3;
                p.kv.spill_dir = dir;
                p.kv.spill_backend = c == 1 ? 2 : 0;
            }
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s", err.msg);
        }
        cr_expect_eq(dt->n_host, 2 * n_pin, "pin %d: %d pinned host blocks", n_pin, dt->n_host);
        cr_assert_eq(rk_session_eval(ss[0], ids, N, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[1], ids, N, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "pin %d: prefill logits differ", n_pin);
        for (int round = 0; round < 2; round++) {
            for (int t = N; t < N + DEC; t++) {
                cr_assert_eq(rk_session_eval(ss[0], ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
                cr_assert_eq(rk_session_eval(ss[1], ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
                cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "pin %d round %d: decode %d differs", n_pin, round, t);
            }
            for (int k = 0; k < 2; k++) cr_assert_eq(rk_session_truncate(ss[k], N + 2, &err), RK_OK, "%s", err.msg);
        }
        rk_kv_tier_stats t;
        rk_session_kv_tier_stats(ss[1], &t);
        const uint64_t cold_rows_bytes = 2ull * N * (uint64_t)kvd * 2; /* one layer's prompt rows */
        cr_expect(t.host_bytes == (uint64_t)n_pin * layer && t.host_bytes <= (uint64_t)n_pin * layer + layer / 3,
                  "host bytes %llu", (unsigned long long)t.host_bytes);
        cr_expect(t.disk_writes > 0 && t.disk_reads > 0 && t.disk_bytes_written >= cold_rows_bytes &&
                      t.disk_bytes_read >= cold_rows_bytes,
                  "pin %d: disk writes %llu (%llu B), reads %llu (%llu B)", n_pin, (unsigned long long)t.disk_writes,
                  (unsigned long long)t.disk_bytes_written, (unsigned long long)t.disk_reads,
                  (unsigned long long)t.disk_bytes_read);
        cr_expect(t.resident_bytes == 2 * layer && dp->live - dt->live == 2 * layer, "device bytes %zu vs %zu", dt->live, dp->live);
        for (int l = 0; l < 4; l++) {
            cr_assert_eq(rk_session_kv_rows(ss[0], l, true, false, 0, N, ra, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_kv_rows(ss[1], l, true, false, 0, N, rb, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(ra, rb, (size_t)N * kvd * sizeof(float)) == 0, "pin %d: layer %d values differ", n_pin, l);
        }
        for (int k = 0; k < 2; k++) rk_session_destroy(ss[k]);
        cr_expect(dp->n_alloc == 0 && dt->n_alloc == 0 && dt->n_host == 0, "blocks leaked");
        rk_backend_destroy(&dp->be);
        rk_backend_destroy(&dt->be);
    }
    /* faults: no such directory; a full file (RLIMIT_FSIZE, pread/pwrite threads) */
    for (int f = 0; f < 2; f++) {
        devsim *dt = devsim_create();
        rk_session_params p = rk_session_params_default();
        p.n_ctx = n_ctx;
        p.ctx_overflow_ok = true;
        p.n_batch = 64;
        p.n_threads = 1;
        p.shared_backend = &dt->be;
        cr_assert_eq(rk_kv_params_parse("f16", &p.kv, &err), RK_OK, "%s", err.msg);
        p.kv.budget = 2 * layer;
        p.kv.host_budget = layer;
        p.kv.spill_backend = 2;
        p.kv.spill_buffered = true;
        p.kv.spill_dir = f ? dir : "/nonexistent-rk-dir";
        rk_session *s = NULL;
        rk_status st = rk_session_create(m, &p, &s, &err);
        if (!f) {
            cr_expect(st != RK_OK && strstr(err.msg, "/nonexistent-rk-dir"), "create: %d %s", st, err.msg);
            rk_session_destroy(s);
        } else {
            cr_assert_eq(st, RK_OK, "%s", err.msg);
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {4096, 4096};
            cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
            st = rk_session_eval(s, ids, N, la, false, &err);
            cr_expect(st != RK_OK && strstr(err.msg, "spill file"), "full: %d %s", st, err.msg);
            rk_session_destroy(s);
        }
        cr_expect(dt->n_alloc == 0 && dt->n_host == 0, "fault %d: blocks leaked", f);
        rk_backend_destroy(&dt->be);
    }
    rmdir(dir);
    free(la), free(lb), free(ra), free(rb);
    rk_model_destroy(m);
}

/* ---- LowRAM on backend memory --------------------------------------------------------- */

/* --kv lowram on devsim: prefill through the host codec (staged rows), the fit at commit on
 * the host, then every decode step's attention is the fused LR_ATTN (cpu_ref's kernel behind
 * the tags) over the device copy of the codec's state: chosen chunks' keys rebuilt, summaries,
 * sinks and the window ring (rows appended by CPY_ROWS on the device). Against the cpu
 * lowram session (the codec's own sparse path): the same selection rule and formulas, f32
 * sums in other orders and rebuilt keys summed in double vs f32 before their f16 rounding,
 * so the logits agree to a few f32 roundings per layer, amplified by the layers: the bound is
 * 1e-3 of the logit range (measured: ~1e-6), and the greedy token of every step is the same.
 * A truncation (the device copy dropped and uploaded again) and a second decode run agree
 * too. */
Test(devsim, lowram_session_matches_cpu, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.arch = TB_ARCH_QWEN2, .n_layer = 4, .n_embd = 64, .n_head = 4, .n_head_kv = 2, .seed = 21});
    rk_err err = {0};
    const int nv = rk_model_hparams(m)->n_vocab, n_layer = rk_model_hparams(m)->n_layer;
    enum { N = 300, DEC = 40 };
    int32_t ids[N + DEC];
    uint64_t r = 17;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    /* The fused op rounds its rebuilt keys as the codec's key cache holds them: f16 rows
     * (kcache=f16) or int8 rows with an f16 scale per row and head (kcache=int8, the
     * default: key_int8). An option the op lacks (bound) takes the host codec on a device:
     * the last spec checks that fallback against the CPU. */
    const char *specs[] = {"lowram:window=32,budget=64,kcache=f16", "lowram:window=48,budget=96,nosumm,evict=0.3,kcache=f16",
                           "lowram:window=32,budget=64", "lowram:window=48,budget=96,nosumm,evict=0.3",
                           "lowram:window=32,budget=64,bound"};
    const bool fused[] = {true, true, true, true, false};
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = 512;
            p.ctx_overflow_ok = true;
            p.n_batch = 64;
            p.n_threads = 1;
            p.shared_backend = k ? &ds->be : cpu;
            cr_assert_eq(rk_kv_params_parse(specs[c], &p.kv, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s: %s", specs[c], err.msg);
        }
        float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
        double worst = 0;
        for (int pass = 0; pass < 2; pass++) {
            const int t0 = pass ? N + DEC / 2 : N; /* pass 1: after a truncation back to t0 */
            if (pass) {
                cr_assert_eq(rk_session_truncate(ss[0], t0, &err), RK_OK, "%s", err.msg);
                cr_assert_eq(rk_session_truncate(ss[1], t0, &err), RK_OK, "%s", err.msg);
            } else {
                cr_assert_eq(rk_session_eval(ss[0], ids, N, la, false, &err), RK_OK, "%s", err.msg);
                cr_assert_eq(rk_session_eval(ss[1], ids, N, lb, false, &err), RK_OK, "%s", err.msg);
                cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "%s: prefill logits differ", specs[c]);
            }
            for (int t = t0; t < N + DEC; t++) {
                cr_assert_eq(rk_session_eval(ss[0], ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
                const size_t down0 = ds->n_down;
                cr_assert_eq(rk_session_eval(ss[1], ids + t, 1, lb, false, &err), RK_OK, "%s step %d: %s", specs[c], t,
                             err.msg);
                /* a fused step downloads the logits row and, once, every layer's pending K / V rows (4 slots
                 * each of K and V, f32): nothing per layer (the first step after a sync may also upload) */
                const size_t kvd = (size_t)rk_model_hparams(m)->n_head_kv * rk_model_hparams(m)->head_dim;
                if (fused[c])
                    cr_expect_eq(ds->n_down - down0, (size_t)nv * 4 + (size_t)n_layer * 8 * kvd * 4,
                                 "%s step %d: %zu bytes down", specs[c], t, ds->n_down - down0);
                float lo = la[0], hi = la[0];
                int aa = 0, ab = 0;
                double d = 0;
                for (int i = 0; i < nv; i++) {
                    lo = la[i] < lo ? la[i] : lo, hi = la[i] > hi ? la[i] : hi;
                    d = fmax(d, fabs((double)la[i] - lb[i]));
                    if (la[i] > la[aa]) aa = i;
                    if (lb[i] > lb[ab]) ab = i;
                }
                const double rel = d / (hi - lo);
                worst = rel > worst ? rel : worst;
                cr_expect(rel <= 1e-3, "%s step %d: logits differ by %.3g of their range", specs[c], t, rel);
                cr_expect_eq(aa, ab, "%s step %d: greedy token %d vs %d", specs[c], t, aa, ab);
            }
        }
        const rk_session_counters *k = rk_session_get_counters(ss[1]);
        /* every decode step of every layer ran the fused op (or, with an option it lacks, none
         * did): 40 + 20 steps */
        const uint64_t steps = (uint64_t)(DEC + DEC / 2) * (uint64_t)n_layer;
        cr_expect(fused[c] ? k->lowram_dev_attn == steps : k->lowram_host_attn >= steps, "%s: %llu fused, %llu host",
                  specs[c], (unsigned long long)k->lowram_dev_attn, (unsigned long long)k->lowram_host_attn);
        if (!fused[c]) cr_expect_eq(k->lowram_dev_attn, 0, "%s: %llu fused", specs[c], (unsigned long long)k->lowram_dev_attn);
        rk_lowram_stats st;
        rk_session_lowram_stats(ss[1], &st);
        cr_expect(st.fitted && st.rank_min > 0, "%s: the codec fitted", specs[c]);
        fprintf(stderr, "devsim lowram %s: worst logit difference %.3g of the range\n", specs[c], worst);
        rk_session_destroy(ss[0]);
        rk_session_destroy(ss[1]);
        cr_expect_eq(ds->n_alloc, 0, "%s: %d blocks leaked", specs[c], ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
        free(la), free(lb);
    }
    rk_model_destroy(m);
}

/* ---- recorded decode steps (RIDGEKV_CUDA_GRAPHS) ------------------------------------ */

/* With RIDGEKV_CUDA_GRAPHS=1 each decode step is recorded and run as one unit by the
 * backend (devsim keeps the ops and runs them at step_end, as a CUDA graph launch would):
 * the logits stay the cpu session's bit for bit, prefill chunks are never recorded, and a
 * recording that breaks (every 4th here) runs again unrecorded with the same result. A
 * host-memory KV policy (q8) is never recorded (its appends download). */
Test(devsim, recorded_decode_steps_match_cpu_bit_for_bit) {
    char path[1024];
    model_path(path, sizeof path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    const int nv = rk_model_hparams(m)->n_vocab;
    enum { P = 30, DEC = 12 };
    int32_t ids[P + DEC];
    uint64_t r = 11;
    for (int i = 0; i < P + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    const char *kvs[] = {"f16", "f32", "q8"};
    for (int k = 0; k < 3; k++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        ds->fail_every = 4;
        rk_status st;
        rk_session *a = session_on(m, cpu, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        setenv("RIDGEKV_CUDA_GRAPHS", "1", 1);
        rk_session *b = session_on(m, &ds->be, kvs[k], &err, &st);
        unsetenv("RIDGEKV_CUDA_GRAPHS");
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(a, ids, P, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(b, ids, P, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: prefill differs", kvs[k]);
        cr_expect_eq(ds->n_steps, 0, "kv %s: a prefill chunk was recorded", kvs[k]);
        for (int t = P; t < P + DEC; t++) {
            cr_assert_eq(rk_session_eval(a, ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(b, ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: decode %d differs", kvs[k], t);
        }
        const rk_session_counters *c = rk_session_get_counters(b);
        if (k < 2) {
            cr_expect_eq(ds->n_steps, DEC, "kv %s: %d steps recorded", kvs[k], ds->n_steps);
            cr_expect_eq(c->graph_fallbacks, DEC / 4, "kv %s: %llu fallbacks", kvs[k],
                         (unsigned long long)c->graph_fallbacks);
            cr_expect_eq(c->graph_steps, DEC - DEC / 4, "kv %s: %llu recorded steps", kvs[k],
                         (unsigned long long)c->graph_steps);
            cr_expect_eq((int)c->graph_steps, ds->n_ran);
            cr_expect(memcmp(rk_session_get_counters(a)->exact_rows, c->exact_rows, sizeof c->exact_rows) == 0,
                      "kv %s: a rerun step counted twice", kvs[k]);
        } else {
            cr_expect_eq(ds->n_steps, 0, "kv q8: recorded");
            cr_expect_eq(c->graph_steps, 0);
        }
        rk_session_destroy(a);
        rk_session_destroy(b);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    free(la), free(lb);
    rk_model_destroy(m);
}
