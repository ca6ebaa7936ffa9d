/* RidgeFill: map files (load, checks) and the session's fill settings. The filled
 * forward itself lives in forward.c; fitting lives in fitters/ridge_calibrate.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "ridgefill_impl.h"
#include "sparse_impl.h"

static const char *const mode_names[] = {"off", "speed", "quality", "identity", "plumb"};

const char *rk_fill_mode_name(rk_fill_mode m) {
    return (unsigned)m < sizeof mode_names / sizeof mode_names[0] ? mode_names[m] : "unknown";
}

bool rk_fill_mode_parse(const char *s, rk_fill_mode *out) {
    for (int i = 0; i < (int)(sizeof mode_names / sizeof mode_names[0]); i++)
        if (!strcmp(s, mode_names[i])) {
            *out = (rk_fill_mode)i;
            return true;
        }
    return false;
}

int32_t rk_fill_default_tail(rk_fill_mode m) { return m == RK_FILL_SPEED ? 1536 : 2048; }
int32_t rk_fill_default_group(rk_fill_mode m) { return m == RK_FILL_QUALITY || m == RK_FILL_SPEED ? 16 : 0; }

rk_fill_params rk_fill_params_default(void) {
    rk_fill_params p = {.mode = RK_FILL_QUALITY, .keep_share = -1.0f, .group = rk_fill_default_group(RK_FILL_QUALITY)};
    return p;
}

int32_t rk_ridge_maps_split(const rk_ridge_maps *r) { return r->split; }

void rk_ridge_maps_destroy(rk_ridge_maps *r) {
    if (!r) return;
    free(r->w);
    free(r->b);
    rk_gguf_destroy(r->gguf);
    rk_mapping_close(&r->map);
    free(r);
}

static rk_status get_i(const rk_gguf *g, const char *key, int64_t *v, rk_err *err) {
    rk_status st = rk_gguf_get_i64(g, key, v, err);
    if (st == RK_E_NOT_FOUND) return rk_err_set(err, st, "ridgefill: map file lacks key '%s'", key);
    return st;
}

rk_status rk_ridge_maps_load(const char *path, const rk_model *m, rk_ridge_maps **out, char *warning,
                             size_t warning_cap, rk_err *err) {
    const rk_hparams *hp = rk_model_hparams(m);
    rk_ridge_maps *r = calloc(1, sizeof *r);
    if (!r) return rk_err_set(err, RK_E_NOMEM, "ridgefill: out of memory");
    rk_status st = rk_mapping_open(path, &r->map, err);
    if (st) goto fail;
    if ((st = rk_gguf_parse(r->map.data, r->map.len, &r->gguf, err))) goto fail;
    rk_str kind;
    if (rk_gguf_get_str(r->gguf, "general.type", &kind, NULL) != RK_OK || !rk_str_eq(kind, "ridgekv.ridge_maps")) {
        st = rk_err_set(err, RK_E_MISMATCH,
                        "ridgefill: not a ridge-map file (general.type is not 'ridgekv.ridge_maps')");
        goto fail;
    }
    if ((st = rk_fingerprint_check(r->gguf, "ridge.model", m, "ridgefill", warning, warning_cap, err))) goto fail;
    int64_t split, dtype;
    if ((st = get_i(r->gguf, "ridge.split", &split, err))) goto fail;
    if (split < 1 || split >= hp->n_layer) {
        st = rk_err_set(err, RK_E_MISMATCH, "ridgefill: split %lld outside 1..%d", (long long)split, hp->n_layer - 1);
        goto fail;
    }
    (void)dtype;
    r->split = (int32_t)split;
    r->n_layer = hp->n_layer;
    r->n_embd = hp->n_embd;
    r->n_vocab = hp->n_vocab;
    float f;
    r->keep_share = rk_gguf_get_f32(r->gguf, "ridge.keep_share", &f, NULL) == RK_OK ? f : 0.1f;
    r->lambda = rk_gguf_get_f32(r->gguf, "ridge.lambda", &f, NULL) == RK_OK ? f : 0.0f;
    rk_str space;
    r->normalized = rk_gguf_get_str(r->gguf, "ridge.space", &space, NULL) == RK_OK && rk_str_eq(space, "normalized");
    rk_str target;
    r->kv_target = rk_gguf_get_str(r->gguf, "ridge.target", &target, NULL) == RK_OK && rk_str_eq(target, "kv");
    if (r->kv_target && r->normalized) {
        st = rk_err_set(err, RK_E_MISMATCH,
                        "ridgefill: K/V maps in the normalized space are not a format ridgekv writes");
        goto fail;
    }
    r->w = calloc((size_t)hp->n_layer, sizeof *r->w);
    r->b = calloc((size_t)hp->n_layer, sizeof *r->b);
    if (!r->w || !r->b) {
        st = rk_err_set(err, RK_E_NOMEM, "ridgefill: out of memory");
        goto fail;
    }
    const int64_t d = hp->n_embd, dout = r->kv_target ? 2 * (int64_t)hp->n_head_kv * hp->head_dim : d;
    for (int l = r->split + 1; l < hp->n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "ridge.%d.weight", l);
        const rk_gguf_tensor *t = rk_gguf_find_tensor(r->gguf, name);
        if (!t || t->ne[0] != d || t->ne[1] != dout || t->ne[2] != 1 || !rk_quant_ref(t->type)) {
            st =
                rk_err_set(err, t ? RK_E_MISMATCH : RK_E_NOT_FOUND, "ridgefill: tensor '%s' %s (expected [%lld, %lld])",
                           name, t ? "has the wrong shape or type" : "is missing", (long long)d, (long long)dout);
            goto fail;
        }
        uint64_t rb;
        rk_dtype_row_bytes(t->type, (uint64_t)d, &rb);
        if ((st = rk_tensor_check_finite(t, "ridgefill", err))) goto fail;
        r->w[l] = (rk_view){t->type, {d, dout, 1, 1}, (size_t)rb, (void *)t->data};
        snprintf(name, sizeof name, "ridge.%d.bias", l);
        t = rk_gguf_find_tensor(r->gguf, name);
        if (!t || t->ne[0] != dout || t->n_dims != 1 || t->type != RK_DT_F32) {
            st = rk_err_set(err, t ? RK_E_MISMATCH : RK_E_NOT_FOUND, "ridgefill: tensor '%s' %s (expected f32 [%lld])",
                            name, t ? "has the wrong shape or type" : "is missing", (long long)dout);
            goto fail;
        }
        if ((st = rk_tensor_check_finite(t, "ridgefill", err))) goto fail;
        r->b[l] = t->data;
    }
    const rk_gguf_tensor *ts = rk_gguf_find_tensor(r->gguf, "ridge.token_score");
    if (ts) {
        if (ts->n_dims != 1 || ts->ne[0] != hp->n_vocab || ts->type != RK_DT_F32) {
            st = rk_err_set(err, RK_E_MISMATCH, "ridgefill: tensor 'ridge.token_score' must be f32 [%d]", hp->n_vocab);
            goto fail;
        }
        if ((st = rk_tensor_check_finite(ts, "ridgefill", err))) goto fail;
        r->token_score = ts->data;
    }
    *out = r;
    return RK_OK;
fail:
    rk_err_wrap(err, "%s", path);
    rk_ridge_maps_destroy(r);
    return st;
}

rk_status rk_session_set_fill(rk_session *s, const rk_fill_params *p, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    rk_fill_params f = *p;
    rk_status sst = rk_sparse_check(&f.sparse, s->m, err); /* sparse.c */
    if (sst) return sst;
    if (f.mode == RK_FILL_OFF) {
        s->fill = f;
        return RK_OK;
    }
    if ((unsigned)f.mode > RK_FILL_PLUMB)
        return rk_err_set(err, RK_E_INVALID_ARG, "ridgefill: bad mode %d", (int)f.mode);
    if (f.tail <= 0) f.tail = rk_fill_default_tail(f.mode); /* the CLI enforces SPEC's minimum of 512; tests go lower */
    if (f.n_sink <= 0) f.n_sink = 4;
    if (f.group < 0 || f.group > 4096)
        return rk_err_set(err, RK_E_INVALID_ARG, "ridgefill: group %d out of range (0: off, 1..4096 rows)", f.group);
    if (!f.maps && (f.mode == RK_FILL_SPEED || f.mode == RK_FILL_QUALITY))
        return rk_err_set(err, RK_E_INVALID_ARG, "ridgefill: --fill %s needs a map file (--ridgefill MAPS.gguf)",
                          rk_fill_mode_name(f.mode));
    if (!f.maps && (f.split < 1 || f.split >= hp->n_layer))
        return rk_err_set(err, RK_E_INVALID_ARG, "ridgefill: --fill %s without maps needs --split in 1..%d",
                          rk_fill_mode_name(f.mode), hp->n_layer - 1);
    if (f.maps && f.maps->n_layer != hp->n_layer)
        return rk_err_set(err, RK_E_MISMATCH, "ridgefill: maps are for %d layers, model has %d", f.maps->n_layer,
                          hp->n_layer);
    if (f.mode == RK_FILL_QUALITY) f.question_aware = true;
    if (f.question_aware) {
        /* the selection reads what the early layers saw: layer-major first phase */
        f.layer_major = true;
        /* the map's share comes with a floor of rows; a share given is taken as it is */
        if (f.keep_rows == 0) f.keep_rows = f.keep_share < 0.0f ? RK_FILL_KEEP_ROWS : -1;
        if (f.keep_share < 0.0f) f.keep_share = f.maps ? f.maps->keep_share : 0.1f;
        if (f.keep_share > 1.0f) f.keep_share = 1.0f;
        if (f.obs <= 0) f.obs = 32;
        if (f.score_layers <= 0) f.score_layers = 3;
        if (f.score_skip == 0) f.score_skip = 2;
        if (f.score_skip < 0) f.score_skip = 0;
        if (f.pool == 0) f.pool = 8;
        if (f.pool < 0) f.pool = 0;
        if (f.baseline == 0) f.baseline = f.obs;
        if (f.baseline < 0) f.baseline = 0;
        if (f.band < 0) f.band = 0;
        if (f.rescore_rows < 0) f.rescore_rows = 0; /* 0: prefill.c's work budget */
        if (f.pool_after == 0) f.pool_after = 16;
        if (f.pool_after < 0) f.pool_after = f.pool;
        const int split = f.maps ? f.maps->split : f.split;
        if (f.score_skip > split - 1) f.score_skip = split - 1;
        if (f.score_layers > split - f.score_skip) f.score_layers = split - f.score_skip;
    }
    s->fill = f;
    return RK_OK;
}

rk_status rk_session_set_splice(rk_session *s, const rk_session *exact, int lo, int hi, bool keys, bool values,
                                rk_err *err) {
    if (s->dev) /* the splice copies rows through s->k on the host */
        return rk_err_set(err, RK_E_UNSUPPORTED, "splice: runs on the CPU backends only (backend %s)",
                          s->be->ops->name);
    if (exact->m != s->m || exact->p.kv.kind != s->p.kv.kind || exact->n_ctx != s->n_ctx)
        return rk_err_set(err, RK_E_INVALID_ARG, "splice: the exact session must share model, KV policy and n_ctx");
    if (lo < 0 || hi > s->m->hp.n_layer || lo >= hi)
        return rk_err_set(err, RK_E_INVALID_ARG, "splice: layer range [%d, %d) outside 0..%d", lo, hi,
                          s->m->hp.n_layer);
    s->pf->splice_src = exact;
    s->pf->splice_lo = lo;
    s->pf->splice_hi = hi;
    s->pf->splice_k = keys;
    s->pf->splice_v = values;
    return RK_OK;
}

void rk_session_clear_splice(rk_session *s) { s->pf->splice_src = NULL; }

/* Rows go through the KV interface as f32 (read from src, written into s), a tile of
 * n_batch rows at a time in the session's K scratch (free between layers' cache writers). */
rk_status rk_session_splice_rows(rk_session *s, const rk_session *src, int lo, int hi, bool keys, bool values,
                                 int64_t row0, int64_t row1, rk_err *err) {
    if (row1 > src->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "splice: the exact session holds %lld rows, the splice needs %lld",
                          (long long)src->n_past, (long long)row1);
    const int64_t tile = s->p.n_batch;
    for (int l = lo; l < hi; l++)
        for (int kv = 0; kv < 2; kv++) {
            if (!(kv ? values : keys)) continue;
            for (int64_t r = row0; r < row1; r += tile) {
                const int64_t n = row1 - r < tile ? row1 - r : tile;
                rk_status st = src->kv->ops->read(src->kv, l, kv, false, r, n, s->k, err);
                if (!st) st = s->kv->ops->write(s->kv, l, kv, r, n, s->k, err);
                if (st)
                    return rk_err_wrap(err, "splice: layer %d rows [%lld, %lld)", l, (long long)r, (long long)(r + n));
            }
        }
    return RK_OK;
}

rk_status rk_session_kv_compare(const rk_session *a, const rk_session *b, int layer, int64_t row0, int64_t row1,
                                bool values, rk_kv_error *out, rk_err *err) {
    const rk_hparams *hp = &a->m->hp;
    if (a->m != b->m || layer < 0 || layer >= hp->n_layer || row0 < 0 || row1 < row0 || row1 > a->n_past ||
        row1 > b->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "kv_compare: sessions differ or rows [%lld, %lld) / layer %d out of range", (long long)row0,
                          (long long)row1, layer);
    rk_kv_error e = {0};
    const int hd = hp->head_dim, kvd = hp->n_head_kv * hd;
    float *ra = malloc(2 * (size_t)kvd * sizeof(float));
    if (!ra) return rk_err_set(err, RK_E_NOMEM, "kv_compare: out of memory");
    float *rb = ra + kvd;
    for (int64_t r = row0; r < row1; r++) {
        rk_status st = a->kv->ops->read(a->kv, layer, values, false, r, 1, ra, err);
        if (!st) st = b->kv->ops->read(b->kv, layer, values, false, r, 1, rb, err);
        if (st) {
            free(ra);
            return st;
        }
        for (int h = 0; h < hp->n_head_kv; h++) {
            double na = 0, nb = 0, dot = 0, diff = 0;
            for (int i = 0; i < hd; i++) {
                double x = ra[h * hd + i], y = rb[h * hd + i];
                na += x * x, nb += y * y, dot += x * y, diff += (x - y) * (x - y);
            }
            na = sqrt(na), nb = sqrt(nb);
            double cosv = na > 0 && nb > 0 ? dot / (na * nb) : 1.0;
            e.total += diff;
            e.norm_part += (na - nb) * (na - nb);
            e.dir_part += 2 * na * nb * (1 - cosv);
            e.ref_energy += nb * nb;
        }
    }
    free(ra);
    *out = e;
    return RK_OK;
}
