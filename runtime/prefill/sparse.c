/* Sparse attention of long prefills: the settings (rk_sparse_params), the calibration file
 * (per layer and head, the attention mass its lines keep), and the layout the layer loop
 * hands the backend's ATTN for one layer (kernels/attn_sparse.c does the work). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "rk_attn_sparse.h"
#include "sparse_impl.h"

/* ---- settings ---------------------------------------------------------------------- */
rk_sparse_params rk_sparse_params_default(void) {
    rk_sparse_params p = {.on = true};
    return p;
}

void rk_sparse_resolve(const rk_sparse_params *p, rk_sparse_params *out) {
    rk_sparse_params r = *p;
    if (r.min_kv <= 0) r.min_kv = 8192;
    if (r.mass <= 0.0f) r.mass = 0.95f;
    if (r.n_sink <= 0) r.n_sink = 64;
    if (r.window <= 0) r.window = 1024;
    if (r.tail == 0) r.tail = 512;
    if (r.tail < 0) r.tail = 0;
    if (r.block <= 0) r.block = 64;
    if (r.n_est <= 0) r.n_est = 64;
    if (r.calib) { /* the geometry the masses were measured with */
        r.block = r.calib->block, r.n_sink = r.calib->n_sink, r.window = r.calib->window, r.n_est = r.calib->n_est;
    }
    *out = r;
}

rk_status rk_sparse_check(const rk_sparse_params *p, const rk_model *m, rk_err *err) {
    if (!p->on) return RK_OK;
    if (p->mass < 0.0f || p->mass > 1.0f || isnan(p->mass))
        return rk_err_set(err, RK_E_INVALID_ARG, "sparse: mass %g outside (0, 1]", (double)p->mass);
    if (p->block < 0 || p->block > 4096 || p->n_est < 0 || p->n_est > 4096)
        return rk_err_set(err, RK_E_INVALID_ARG, "sparse: block %d, est %d (1..4096; 0: default)", p->block, p->n_est);
    if (p->calib && (p->calib->n_layer != m->hp.n_layer || p->calib->n_head != m->hp.n_head))
        return rk_err_set(err, RK_E_MISMATCH, "sparse: calibration for %d layers x %d heads, model has %d x %d",
                          p->calib->n_layer, p->calib->n_head, m->hp.n_layer, m->hp.n_head);
    return RK_OK;
}

typedef struct key_def {
    const char *key;
    double lo, hi;
    bool integer;
} key_def;

static const key_def keys[] = {
    {"min", 1, 1 << 30, true},   {"mass", 1e-6, 1, false}, {"sinks", 1, 1 << 20, true}, {"window", 1, 1 << 24, true},
    {"tail", -1, 1 << 24, true}, {"block", 1, 4096, true}, {"est", 1, 4096, true},
};

rk_status rk_sparse_params_parse(const char *spec, rk_sparse_params *p, rk_err *err) {
    if (!spec || !p) return rk_err_set(err, RK_E_INVALID_ARG, "sparse: no setting");
    rk_sparse_params q = *p;
    char buf[256];
    if (strlen(spec) >= sizeof buf) return rk_err_set(err, RK_E_INVALID_ARG, "sparse: setting too long");
    snprintf(buf, sizeof buf, "%s", spec);
    char *save = NULL, *item = strtok_r(buf, ":", &save);
    if (!item || (strcmp(item, "on") && strcmp(item, "off")))
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "sparse: '%s' is not off, on or on:key=value:... (keys min, mass, "
                          "sinks, window, tail, block, est)",
                          spec);
    q.on = !strcmp(item, "on");
    for (char *kv = strtok_r(NULL, ":", &save); kv; kv = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq || !q.on)
            return rk_err_set(err, RK_E_INVALID_ARG, "sparse: '%s' in '%s' is not key=value after on", kv, spec);
        *eq = '\0';
        const key_def *k = NULL;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (!strcmp(kv, keys[i].key)) k = &keys[i];
        if (!k)
            return rk_err_set(err, RK_E_INVALID_ARG,
                              "sparse: unknown key '%s' (min, mass, sinks, window, tail, block, est)", kv);
        char *end = NULL;
        double v = strtod(eq + 1, &end);
        if (!eq[1] || *end || !(v >= k->lo && v <= k->hi) || (k->integer && v != floor(v)))
            return rk_err_set(err, RK_E_INVALID_ARG, "sparse: %s=%s (%s in %g..%g)", kv, eq + 1,
                              k->integer ? "an integer" : "a number", k->lo, k->hi);
        if (!strcmp(kv, "min")) q.min_kv = (int32_t)v;
        else if (!strcmp(kv, "mass")) q.mass = (float)v;
        else if (!strcmp(kv, "sinks")) q.n_sink = (int32_t)v;
        else if (!strcmp(kv, "window")) q.window = (int32_t)v;
        else if (!strcmp(kv, "tail")) q.tail = v == 0 ? -1 : (int32_t)v; /* tail=0: none */
        else if (!strcmp(kv, "block")) q.block = (int32_t)v;
        else q.n_est = (int32_t)v;
    }
    *p = q;
    return RK_OK;
}

/* ---- the calibration file ---------------------------------------------------------------- */
void rk_sparse_calib_destroy(rk_sparse_calib *c) {
    if (!c) return;
    free(c->mass);
    free(c);
}

float rk_sparse_calib_mass(const rk_sparse_calib *c, int layer, int head) {
    if (!c || layer < 0 || layer >= c->n_layer || head < 0 || head >= c->n_head) return -1.0f;
    return c->mass[(size_t)layer * c->n_head + head];
}

static rk_status get_int(const rk_gguf *g, const char *key, int64_t lo, int64_t hi, int32_t *out, rk_err *err) {
    int64_t v;
    rk_status st = rk_gguf_get_i64(g, key, &v, err);
    if (st == RK_E_NOT_FOUND) return rk_err_set(err, RK_E_FORMAT, "sparse: calibration file lacks key '%s'", key);
    if (st) return st;
    if (v < lo || v > hi)
        return rk_err_set(err, RK_E_FORMAT, "sparse: %s = %lld outside %lld..%lld", key, (long long)v, (long long)lo,
                          (long long)hi);
    *out = (int32_t)v;
    return RK_OK;
}

rk_status rk_sparse_calib_parse(const void *bytes, size_t len, const rk_model *m, rk_sparse_calib **out, char *warning,
                                size_t warning_cap, rk_err *err) {
    const rk_hparams *hp = &m->hp;
    rk_gguf *g = NULL;
    rk_sparse_calib *c = calloc(1, sizeof *c);
    rk_status st = c ? rk_gguf_parse(bytes, len, &g, err) : rk_err_set(err, RK_E_NOMEM, "sparse: out of memory");
    if (st) goto fail;
    rk_str kind;
    if (rk_gguf_get_str(g, "general.type", &kind, NULL) != RK_OK || !rk_str_eq(kind, "ridgekv.sparse_attn")) {
        st = rk_err_set(err, RK_E_MISMATCH,
                        "sparse: not a sparse-attention file (general.type is not "
                        "'ridgekv.sparse_attn')");
        goto fail;
    }
    if ((st = rk_fingerprint_check(g, "sparse.model", m, "sparse", warning, warning_cap, err))) goto fail;
    if ((st = get_int(g, "sparse.block", 1, 4096, &c->block, err)) ||
        (st = get_int(g, "sparse.sinks", 1, 1 << 20, &c->n_sink, err)) ||
        (st = get_int(g, "sparse.window", 1, 1 << 24, &c->window, err)) ||
        (st = get_int(g, "sparse.est", 1, 4096, &c->n_est, err)))
        goto fail;
    const rk_gguf_tensor *t = rk_gguf_find_tensor(g, "sparse.mass");
    const int64_t n = (int64_t)hp->n_layer * hp->n_head;
    if (!t || t->type != RK_DT_F32 || t->n_dims != 2 || t->ne[0] != hp->n_head || t->ne[1] != hp->n_layer ||
        t->n_bytes != (uint64_t)n * sizeof(float)) {
        st = rk_err_set(err, RK_E_FORMAT, "sparse: tensor 'sparse.mass' must be f32 [%d, %d] (heads, layers)",
                        hp->n_head, hp->n_layer);
        goto fail;
    }
    c->n_layer = hp->n_layer, c->n_head = hp->n_head;
    if (!(c->mass = malloc((size_t)n * sizeof(float)))) {
        st = rk_err_set(err, RK_E_NOMEM, "sparse: out of memory");
        goto fail;
    }
    memcpy(c->mass, t->data, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        if (!(c->mass[i] > 0.0f && c->mass[i] <= 1.0f)) { /* NaN fails too */
            st = rk_err_set(err, RK_E_FORMAT, "sparse: mass of layer %lld head %lld is %g (expected (0, 1])",
                            (long long)(i / hp->n_head), (long long)(i % hp->n_head), (double)c->mass[i]);
            goto fail;
        }
    rk_gguf_destroy(g);
    *out = c;
    return RK_OK;
fail:
    rk_gguf_destroy(g);
    rk_sparse_calib_destroy(c);
    return st;
}

rk_status rk_sparse_calib_load(const char *path, const rk_model *m, rk_sparse_calib **out, char *warning,
                               size_t warning_cap, rk_err *err) {
    rk_mapping map = {0};
    rk_status st = rk_mapping_open(path, &map, err);
    if (!st) st = rk_sparse_calib_parse(map.data, map.len, m, out, warning, warning_cap, err);
    rk_mapping_close(&map);
    if (st) rk_err_wrap(err, "%s", path);
    return st;
}

bool rk_sparse_key(const rk_sparse_params *p, char *buf, size_t cap) {
    if (!p->on) return false;
    rk_sparse_params r;
    rk_sparse_resolve(p, &r);
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the masses' bytes */
    if (r.calib) {
        const unsigned char *b = (const unsigned char *)r.calib->mass;
        for (size_t i = 0; i < (size_t)r.calib->n_layer * r.calib->n_head * sizeof(float); i++)
            h = (h ^ b[i]) * 0x100000001b3ull;
    }
    snprintf(buf, cap, "min=%d,mass=%a,sinks=%d,window=%d,tail=%d,block=%d,est=%d,calib=%016llx", (int)r.min_kv,
             (double)r.mass, (int)r.n_sink, (int)r.window, (int)r.tail, (int)r.block, (int)r.n_est,
             r.calib ? (unsigned long long)h : 0ull);
    return true;
}

/* ---- the layer loop's layout --------------------------------------------------------- */
void rk_session_sparse_stats(const rk_session *s, rk_sparse_stats *out) {
    const rk_attn_sparse_stats *t = &s->pf->sparse_stats;
    *out = (rk_sparse_stats){t->calls_sparse, t->calls_dense, t->blocks_done, t->blocks_causal};
}

bool rk_sparse_layout(rk_session *s, int l, rk_attn_sparse *sp) {
    if (!s->fill.sparse.on || s->dev) return false;
    rk_sparse_params r;
    rk_sparse_resolve(&s->fill.sparse, &r);
    rk_sparse_acc *acc = s->pf->sparse_acc;
    *sp = (rk_attn_sparse){.block = r.block,
                           .min_kv = acc ? acc->min_kv : r.min_kv,
                           .dense_from = s->pf->sparse_end - r.tail,
                           .n_sink = r.n_sink,
                           .window = r.window,
                           .n_est = r.n_est,
                           .mass = acc ? 1.0f : r.mass,
                           .head_mass = r.calib && !acc ? r.calib->mass + (size_t)l * r.calib->n_head : NULL,
                           .stats = &s->pf->sparse_stats,
                           .cal = acc ? &acc->layer[l] : NULL};
    return true;
}
