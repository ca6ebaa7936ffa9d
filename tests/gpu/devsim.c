/* The devsim backend (devsim.h) and the functions the device-path tests share. */
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

#include "devsim.h"

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
        const void **ps[] = {(const void **)&L.freq,
                             &L.sk,
                             &L.sv,
                             &L.xk,
                             &L.xv,
                             (const void **)&L.pos,
                             (const void **)&L.coef,
                             (const void **)&L.basis,
                             (const void **)&L.mean,
                             (const void **)&L.winv,
                             (const void **)&L.lmk,
                             (const void **)&L.cmean,
                             (const void **)&L.W,
                             (const void **)&L.b,
                             (const void **)&L.res,
                             (const void **)&L.mask,
                             (const void **)&L.base};
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
        memcpy(c->to_device ? untag(c->dst) : c->dst, c->to_device && !tagged(c->src) ? c->src : untag(c->src), c->n);
    }
    d->n_lane = 0;
}

static rk_status ds_lane_copy(rk_backend *be, void *dst, const void *src, size_t n, bool to_device, rk_err *err) {
    devsim *d = ds_of(be);
    if (d->recording) {
        d->broken = true;
        return rk_err_set(err, RK_E_UNSUPPORTED, "devsim: a lane copy while a step is recorded");
    }
    if (to_device ? !tagged(dst) : tagged(dst) || !tagged(src)) /* to_device: from host or device memory */
        return rk_err_set(err, RK_E_INVALID_ARG, "devsim: lane copy direction");
    if (d->n_lane == d->cap_lane) {
        d->cap_lane = d->cap_lane ? 2 * d->cap_lane : 64;
        d->lane = realloc(d->lane, (size_t)d->cap_lane * sizeof *d->lane);
        cr_assert(d->lane);
    }
    d->lane[d->n_lane++] = (struct ds_copy){dst, src, n, to_device};
    if (to_device && tagged(src)) d->lane_d2d += n;
    else if (to_device) d->lane_up += n;
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

devsim *devsim_create(void) {
    devsim *d = calloc(1, sizeof *d);
    cr_assert(d);
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_create(1, &d->inner, &err), RK_OK, "%s", err.msg);
    d->be.ops = &d->ops;
    d->be.impl = d;
    d->be.n_threads = 1;
    d->ops.name = "devsim";
    for (int i = 0; i < RK_OP_COUNT; i++) /* MATMUL_N as its MATMULs, as on cuda (rk_backend_run) */
        if (i != RK_OP_MATMUL_N) d->ops.op[i] = ds_run;
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

const char *model_path(char *buf, size_t cap) {
    const char *p = tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf");
    if (p && access(p, R_OK) == 0) return p;
    tb_tiny_spec sp = {.seed = 5}; /* generated llama, no ../shared needed */
    p = tb_tiny_model(&sp, buf, cap);
    cr_assert(p, "%s", buf);
    return p;
}

rk_session *session_on(const rk_model *m, rk_backend *be, const char *kv, rk_err *err, rk_status *st) {
    return session_on_graphs(m, be, kv, false, err, st);
}

rk_session *session_on_graphs(const rk_model *m, rk_backend *be, const char *kv, bool cuda_graphs, rk_err *err,
                              rk_status *st) {
    rk_session_params p = rk_session_params_default();
    p.cuda_graphs = cuda_graphs;
    p.n_ctx = 128;
    p.ctx_overflow_ok =
        true;       /* the generated model (no ../shared) was trained on 64: the twins compare, not the text */
    p.n_batch = 16; /* several prefill chunks */
    p.n_threads = 1;
    p.shared_backend = be;
    cr_assert_eq(rk_kv_params_parse(kv, &p.kv, err), RK_OK, "%s", err->msg);
    rk_session *s = NULL;
    *st = rk_session_create(m, &p, &s, err);
    return s;
}

/* A generated tiny model, loaded (its file removed at once). */
rk_model *load_tiny(tb_tiny_spec sp) {
    char path[1024];
    cr_assert(tb_tiny_model(&sp, path, sizeof path), "%s", path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    unlink(path);
    return m;
}
