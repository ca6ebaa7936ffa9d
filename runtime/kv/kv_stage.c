/* A host-memory cache (q8 / q4, the host tiers, LowRAM) behind a backend with its own
 * memory (cuda). The layer loop keeps K, V and q in device buffers and hands them to the
 * cache it holds, whatever that cache is; this wrapper is that cache for a policy that
 * computes on the host: append downloads K and V and appends them to the inner cache,
 * attention downloads q, runs the inner cache's attention and uploads its output. The
 * other ops go to the inner cache unchanged (their rows are host f32 already).
 *
 * LowRAM's decode steps take the fused device op (lowram_dev.c) where it applies: the K / V
 * rows of such a step stay on the device until flush (after the step's layer passes, before
 * the commit) brings them down in one transfer; every commit, truncation, reset, import or
 * write tells the device copy what changed. kv->counters says which path each attention
 * took. */
#include <stdlib.h>
#include <string.h>

#include "kv_impl.h"

typedef struct stage {
    rk_kv_ops ops;  /* stage_ops with the inner cache's name and capabilities */
    rk_kv *in;      /* the host-memory cache (owned) */
    rk_lrdev *lr;   /* LowRAM's fused decode path, or NULL */
    float *hk, *hv; /* (cap_kv, kv_dim) host copies of K and V */
    float *hq, *ho; /* (cap_q, n_head * head_dim) host copies of q and of the attention output */
    int64_t cap_kv, cap_q;
} stage;

static stage *ST(const rk_kv *kv) { return kv->impl; }

/* Host rows for n rows of K / V (kv) or of q / out (!kv): grown once to the largest call
 * (a prefill chunk), so decode steps allocate nothing. */
static rk_status room(rk_kv *kv, bool for_kv, int64_t n, rk_err *err) {
    stage *c = ST(kv);
    int64_t *cap = for_kv ? &c->cap_kv : &c->cap_q;
    if (n <= *cap) return RK_OK;
    const size_t w = for_kv ? (size_t)kv->kv_dim : (size_t)kv->n_head * (size_t)kv->head_dim;
    float **a = for_kv ? &c->hk : &c->hq, **b = for_kv ? &c->hv : &c->ho;
    free(*a), free(*b);
    *a = malloc((size_t)n * w * sizeof(float));
    *b = malloc((size_t)n * w * sizeof(float));
    if (!*a || !*b) {
        free(*a), free(*b);
        *a = *b = NULL, *cap = 0;
        return rk_err_set(err, RK_E_NOMEM, "kv: host staging of %lld rows", (long long)n);
    }
    *cap = n;
    return RK_OK;
}

static rk_status st_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    stage *c = ST(kv);
    /* LowRAM's fused step: the rows stay on the device until flush (no transfer here) */
    if (c->lr && rk_lrdev_takes(c->lr, n, pos0)) return rk_lrdev_append(c->lr, l, pos0, k, v, n, err);
    const size_t bytes = (size_t)n * (size_t)kv->kv_dim * sizeof(float);
    rk_status st = room(kv, true, n, err);
    if (!st) st = rk_backend_download(kv->be, c->hk, k, bytes, err);
    if (!st) st = rk_backend_download(kv->be, c->hv, v, bytes, err);
    return st ? st : c->in->ops->append(c->in, l, pos0, c->hk, c->hv, n, err);
}

static rk_status st_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    stage *c = ST(kv);
    if (c->lr) { /* LowRAM: the fused op where it applies */
        if (rk_lrdev_takes(c->lr, n_q, pos0)) {
            kv->counters.fused_attn++;
            return rk_lrdev_attend(c->lr, l, q, n_q, pos0, out, err);
        }
        kv->counters.staged_attn++;
    }
    const size_t bytes = (size_t)n_q * (size_t)kv->n_head * (size_t)kv->head_dim * sizeof(float);
    rk_status st = room(kv, false, n_q, err);
    if (!st) st = rk_backend_download(kv->be, c->hq, q, bytes, err);
    if (!st) st = c->in->ops->attend(c->in, l, c->hq, n_q, pos0, c->ho, err);
    return st ? st : rk_backend_upload(kv->be, out, c->ho, bytes, err);
}

static rk_status st_flush(rk_kv *kv, rk_err *err) { return rk_lrdev_flush(ST(kv)->lr, err); }

static rk_status st_commit(rk_kv *kv, int64_t n_past, rk_err *err) {
    stage *c = ST(kv);
    rk_status st = c->in->ops->commit(c->in, n_past, err);
    rk_lrdev_changed(c->lr, st != RK_OK);
    kv->n_past = c->in->n_past;
    return st;
}

static void st_truncate(rk_kv *kv, int64_t n) {
    stage *c = ST(kv);
    c->in->ops->truncate(c->in, n);
    rk_lrdev_changed(c->lr, true);
    kv->n_past = c->in->n_past;
}

static void st_reset(rk_kv *kv) {
    stage *c = ST(kv);
    c->in->ops->reset(c->in);
    rk_lrdev_changed(c->lr, true);
    kv->n_past = c->in->n_past;
}

static rk_status st_read(const rk_kv *kv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                         rk_err *err) {
    const rk_kv *in = ST(kv)->in;
    return in->ops->read(in, l, values, pre_rope, row0, n, dst, err);
}

static rk_status st_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    stage *c = ST(kv);
    rk_status st = c->in->ops->write(c->in, l, values, row0, n, src, err);
    if (!st) rk_lrdev_changed(c->lr, true);
    return st;
}

static void st_bytes(const rk_kv *kv, rk_kv_bytes *out) {
    const rk_kv *in = ST(kv)->in;
    in->ops->bytes(in, out);
}

static void st_stats(const rk_kv *kv, rk_lowram_stats *out) {
    const rk_kv *in = ST(kv)->in;
    in->ops->stats(in, out);
}

static void st_tier_stats(const rk_kv *kv, rk_kv_tier_stats *out) {
    const rk_kv *in = ST(kv)->in;
    in->ops->tier_stats(in, out);
}

static int st_params(const rk_kv *kv, rk_kv_param *out) {
    const rk_kv *in = ST(kv)->in;
    return in->ops->params(in, out);
}

static rk_status st_export(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    const rk_kv *in = ST(kv)->in;
    return in->ops->export_rows(in, row0, row1, out, err);
}

static rk_status st_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    stage *c = ST(kv);
    rk_status st = c->in->ops->import_rows(c->in, row0, n_rows, p, n, err);
    rk_lrdev_changed(c->lr, true);
    kv->n_past = c->in->n_past;
    return st;
}

static void st_destroy(rk_kv *kv) {
    stage *c = ST(kv);
    if (!c) return;
    rk_lrdev_destroy(c->lr);
    rk_kv_destroy(c->in);
    free(c->hk), free(c->hv), free(c->hq), free(c->ho);
    free(c);
    kv->impl = NULL;
}

/* stages / layers_done: none (a staged prefill keeps its stream on the host; the session
 * runs it on host backends only) */
static const rk_kv_ops stage_ops = {
    .mem = RK_KV_MEM_BACKEND,
    .recordable = false, /* transfers inside the step */
    .append = st_append,
    .attend = st_attend,
    .commit = st_commit,
    .truncate = st_truncate,
    .reset = st_reset,
    .read = st_read,
    .write = st_write,
    .bytes = st_bytes,
    .params = st_params,
    .export_rows = st_export,
    .import_rows = st_import,
    .destroy = st_destroy,
};

rk_status rk_kv_stage_wrap(rk_kv **kvp, bool lowram, rk_err *err) {
    rk_kv *in = *kvp;
    stage *c = calloc(1, sizeof *c);
    rk_kv *o = calloc(1, sizeof *o);
    double *freq = malloc((size_t)(in->n_rot / 2 + 1) * sizeof(double));
    if (!c || !o || !freq) {
        free(c), free(o), free(freq);
        return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    }
    rk_status st = lowram ? rk_lrdev_create(in, &c->lr, err) : RK_OK;
    if (st) {
        free(c), free(o), free(freq);
        return st;
    }
    *o = *in; /* the shape, the policy kind, the backend, n_past, row_bytes */
    memcpy(freq, in->rope_freq, (size_t)(in->n_rot / 2 + 1) * sizeof(double));
    o->rope_freq = freq;
    o->counters = (rk_kv_counters){0};
    c->in = in;
    c->ops = stage_ops;
    c->ops.name = in->ops->name;
    c->ops.writable = in->ops->writable;
    c->ops.stats = in->ops->stats ? st_stats : NULL;
    c->ops.tier_stats = in->ops->tier_stats ? st_tier_stats : NULL;
    c->ops.flush = c->lr ? st_flush : NULL;
    o->ops = &c->ops;
    o->impl = c;
    *kvp = o;
    return RK_OK;
}
