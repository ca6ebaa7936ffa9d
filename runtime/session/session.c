/* Session lifecycle: creation (backend, KV cache, scratch), the eval loop over prompt
 * chunks, truncation, progress and work counters. The layer loop is forward.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"

rk_session_params rk_session_params_default(void) {
    rk_session_params p = {0, 0, 512, rk_kv_params_default(), RK_BACKEND_CPU, NULL, false, false};
    return p;
}

rk_status rk_backend_open(rk_backend_kind kind, int n_threads, rk_backend **out, rk_err *err) {
    if ((unsigned)kind > RK_BACKEND_CUDA)
        return rk_err_set(err, RK_E_INVALID_ARG, "session: backend kind %d unknown", (int)kind);
    return rk_backend_create_named(rk_backend_kind_name(kind), n_threads, out, err);
}

void rk_backend_close(rk_backend *be) { rk_backend_destroy(be); }

/* The ops forward.c runs: a backend that lacks one is refused before any work starts. */
static const rk_op forward_ops[] = {RK_OP_GET_ROWS, RK_OP_MATMUL, RK_OP_RMSNORM, RK_OP_ROPE,    RK_OP_ATTN,
                                    RK_OP_SILU_MUL, RK_OP_ADD,    RK_OP_ADD_ROW, RK_OP_CPY_ROWS};

static rk_status prepare_weights(rk_session *s, rk_err *err) {
    const rk_model *m = s->m;
    const int n_layer = m->hp.n_layer;
    rk_status st = rk_backend_check_ops(s->be, forward_ops, (int)(sizeof forward_ops / sizeof forward_ops[0]), err);
    if (st) return st;
    s->w_layers = calloc((size_t)n_layer, sizeof *s->w_layers);
    if (!s->w_layers) return rk_err_set(err, RK_E_NOMEM, "session: out of memory");
#define PREP(dst, src)                                                                      \
    do {                                                                                    \
        if ((src).data && (st = rk_backend_prepare(s->be, &(src), &(dst), err))) return st; \
        if (!(src).data) (dst) = (src);                                                     \
    } while (0)
    PREP(s->w_tok_embd, m->tok_embd);
    PREP(s->w_output_norm, m->output_norm);
    PREP(s->w_output, m->output);
    for (int l = 0; l < n_layer; l++) {
        const rk_layer *L = &m->layers[l];
        rk_layer *W = &s->w_layers[l];
        PREP(W->attn_norm, L->attn_norm);
        PREP(W->wq, L->wq);
        PREP(W->wk, L->wk);
        PREP(W->wv, L->wv);
        PREP(W->wo, L->wo);
        PREP(W->bq, L->bq);
        PREP(W->bk, L->bk);
        PREP(W->bv, L->bv);
        PREP(W->q_norm, L->q_norm);
        PREP(W->k_norm, L->k_norm);
        PREP(W->ffn_norm, L->ffn_norm);
        PREP(W->w_gate, L->w_gate);
        PREP(W->w_up, L->w_up);
        PREP(W->w_down, L->w_down);
    }
#undef PREP
    return RK_OK;
}

/* Activation buffers: backend memory when the backend has its own (the layer loop then
 * never touches them on the host), else malloc. */
static void *act_alloc(rk_session *s, size_t bytes) {
    if (!s->dev) return malloc(bytes);
    void *p = NULL;
    return rk_backend_alloc(s->be, bytes, &p, NULL) == RK_OK ? p : NULL;
}

static void act_free(rk_session *s, void *p) {
    if (s->dev) rk_backend_free(s->be, p);
    else free(p);
}

void rk_session_destroy(rk_session *s) {
    if (!s) return;
    rk_kv_destroy(s->kv);
    free(s->tokens);
    float *acts[] = {s->x, s->xin, s->xs, s->h, s->q, s->k, s->v, s->t, s->gate, s->up, s->logits};
    for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) act_free(s, acts[i]);
    free(s->ex_idx), free(s->fill_idx);
    rk_prefill_deinit(s);
    free(s->w_layers);
    free(s->layer_rows);
    rk_forward_deinit(s);
    if (s->own_be) rk_backend_destroy(s->be);
    free(s);
}

rk_status rk_session_create(const rk_model *m, const rk_session_params *pp, rk_session **out, rk_err *err) {
    const rk_hparams *hp = &m->hp;
    rk_session_params p = pp ? *pp : rk_session_params_default();
    if (p.n_ctx <= 0) p.n_ctx = hp->n_ctx_train;
    const int64_t n_ctx_max = rk_model_n_ctx_max(m);
    if (p.n_ctx > n_ctx_max && !p.ctx_overflow_ok) {
        if (hp->rope_scaling.type == RK_ROPE_SCALING_NONE)
            return rk_err_set(err, RK_E_CONTEXT,
                              "session: context %d is larger than the %d tokens the model was trained on; "
                              "past that it produces garbage. Enable RoPE scaling (yarn or linear, factor >= %.4g) "
                              "or allow the overflow explicitly",
                              (int)p.n_ctx, (int)hp->n_ctx_train,
                              ceil((double)p.n_ctx / hp->n_ctx_train * 1000) / 1000);
        return rk_err_set(err, RK_E_CONTEXT,
                          "session: context %d is larger than the %lld tokens of the model with %s RoPE scaling "
                          "(original %d x factor %g); raise the factor or allow the overflow explicitly",
                          (int)p.n_ctx, (long long)n_ctx_max, rk_rope_scaling_name(hp->rope_scaling.type),
                          (int)hp->rope_scaling.orig_ctx, (double)hp->rope_scaling.factor);
    }
    if (p.n_batch <= 0) p.n_batch = 512;
    if (p.n_batch > p.n_ctx) p.n_batch = p.n_ctx;
    rk_session *s = calloc(1, sizeof *s);
    if (!s) return rk_err_set(err, RK_E_NOMEM, "session: out of memory");
    s->m = m;
    s->p = p;
    s->n_ctx = p.n_ctx;
    rk_status st;
    if (p.shared_backend) {
        s->be = p.shared_backend;
    } else {
        if ((st = rk_backend_open(p.backend, p.n_threads, &s->be, err))) goto fail;
        s->own_be = true;
    }
    if ((st = prepare_weights(s, err))) goto fail;
    s->dev = s->be->ops->mem_alloc != NULL;
    int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim, qd = (int64_t)hp->n_head * hp->head_dim;
    /* the KV policy, fixed for the session's life; on a dev backend it takes its rows in
     * device memory, whatever it stores (kv/kv_stage.c stages a host cache) */
    if ((st = rk_kv_create(m, &p.kv, s->n_ctx, s->be, p.n_threads, s->warning, sizeof s->warning, &s->kv, err)))
        goto fail;
    if (p.n_ctx > n_ctx_max) { /* ctx_overflow_ok: said once, beside any warning of the KV policy */
        size_t w = strlen(s->warning);
        snprintf(s->warning + w, sizeof s->warning - w,
                 "%scontext %d is past the %lld tokens the model handles (%s RoPE scaling): output past %lld "
                 "tokens is likely garbage",
                 w ? "; " : "", (int)p.n_ctx, (long long)n_ctx_max, rk_rope_scaling_name(hp->rope_scaling.type),
                 (long long)n_ctx_max);
    }
    s->tokens = malloc((size_t)s->n_ctx * sizeof(int32_t));
    size_t nb = (size_t)p.n_batch;
    size_t hd = (size_t)(qd > hp->n_embd ? qd : hp->n_embd);
    s->x = act_alloc(s, nb * (size_t)hp->n_embd * sizeof(float));
    s->xin = act_alloc(s, nb * (size_t)hp->n_embd * sizeof(float));
    s->xs = act_alloc(s, nb * (size_t)hp->n_embd * sizeof(float));
    s->ex_idx = malloc(nb * sizeof(int32_t));
    s->fill_idx = malloc(nb * sizeof(int32_t));
    s->h = act_alloc(s, nb * hd * sizeof(float));
    s->q = act_alloc(s, nb * (size_t)qd * sizeof(float));
    s->k = act_alloc(s, nb * (size_t)kvd * sizeof(float));
    s->v = act_alloc(s, nb * (size_t)kvd * sizeof(float));
    s->t = act_alloc(s, nb * hd * sizeof(float));
    s->gate = act_alloc(s, nb * (size_t)hp->n_ff * sizeof(float));
    s->up = act_alloc(s, nb * (size_t)hp->n_ff * sizeof(float));
    s->logits = act_alloc(s, nb * (size_t)hp->n_vocab * sizeof(float));
    if (!s->tokens || !s->x || !s->xin || !s->xs || !s->ex_idx || !s->fill_idx || !s->h || !s->q || !s->k || !s->v ||
        !s->t || !s->gate || !s->up || !s->logits)
        goto nomem;
    s->layer_rows = calloc((size_t)hp->n_layer * 2, sizeof(uint64_t));
    if (!s->layer_rows) goto nomem;
    if ((st = rk_forward_init(s, err)) || (st = rk_prefill_init(s, err)))
        goto fail; /* recorded decode steps; fill state */
    *out = s;
    return RK_OK;
nomem:
    st = rk_err_set(err, RK_E_NOMEM, "session: cannot allocate token history / scratch for n_ctx %lld",
                    (long long)s->n_ctx);
fail:
    rk_session_destroy(s);
    return st;
}

void rk_session_reset(rk_session *s) {
    s->kv->ops->reset(s->kv);
    s->n_past = 0;
    rk_prefill_forget(s, 0);
}
int64_t rk_session_n_past(const rk_session *s) { return s->n_past; }
int64_t rk_session_n_ctx(const rk_session *s) { return s->n_ctx; }
uint64_t rk_session_kv_bytes_per_token(const rk_session *s) {
    return 2ull * (uint64_t)s->kv->n_layer * s->kv->row_bytes;
}
void rk_session_set_progress(rk_session *s, rk_progress_fn fn, void *ud) {
    s->progress = fn;
    s->progress_ud = ud;
}

rk_status rk_session_truncate(rk_session *s, int64_t n, rk_err *err) {
    if (n < 0 || n > s->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "session: cannot truncate to %lld (have %lld tokens)", (long long)n,
                          (long long)s->n_past);
    s->kv->ops->truncate(s->kv, n);
    s->n_past = n;
    rk_prefill_forget(s, n);
    return RK_OK;
}

rk_status rk_session_eval(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    if (n == 0) return rk_err_set(err, RK_E_INVALID_ARG, "session: eval of zero tokens");
    if ((int64_t)n > s->n_ctx - s->n_past)
        return rk_err_set(err, RK_E_CONTEXT, "session: %zu tokens do not fit the context (%lld used of %lld)", n,
                          (long long)s->n_past, (long long)s->n_ctx);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= hp->n_vocab)
            return rk_err_set(err, RK_E_INVALID_ARG, "session: token id %d at %zu outside vocab of %d", ids[i], i,
                              hp->n_vocab);
    const int64_t start = s->n_past;
    memcpy(s->tokens + start, ids, n * sizeof(int32_t));
    rk_status st = rk_prefill_run(s, ids, n, logits, all_rows, err);
    /* rows the cache kept aside during the eval reach its store (a fused device step's) */
    if (!st && s->kv->ops->flush) st = s->kv->ops->flush(s->kv, err);
    /* the cache commits the rows (a compressing cache fits or compresses), or forgets the ones appended */
    if (!st) st = s->kv->ops->commit(s->kv, start + (int64_t)n, err);
    s->counters.lowram_dev_attn = s->kv->counters.fused_attn;
    s->counters.lowram_host_attn = s->kv->counters.staged_attn;
    if (st) {
        s->kv->ops->truncate(s->kv, start);
        return st; /* n_past still says start */
    }
    s->n_past = start + (int64_t)n;
    return RK_OK;
}

void rk_session_set_tap(rk_session *s, rk_tap_fn fn, void *ud) {
    s->tap = fn;
    s->tap_ud = ud;
}

const rk_session_counters *rk_session_get_counters(const rk_session *s) { return &s->counters; }

void rk_session_layer_rows(const rk_session *s, int layer, uint64_t *exact, uint64_t *filled) {
    const bool in = layer >= 0 && layer < s->m->hp.n_layer;
    if (exact) *exact = in ? s->layer_rows[2 * layer] : 0;
    if (filled) *filled = in ? s->layer_rows[2 * layer + 1] : 0;
}

rk_status rk_session_kv_rows(const rk_session *s, int layer, bool values, bool pre_rope, int64_t row0, int64_t n,
                             float *dst, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    if (layer < 0 || layer >= hp->n_layer || row0 < 0 || n < 0 || row0 > s->n_past || n > s->n_past - row0)
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "session: KV rows [%lld, %lld) of layer %d outside [0, %lld) x %d layers", (long long)row0,
                          (long long)(row0 + n), layer, (long long)s->n_past, hp->n_layer);
    return s->kv->ops->read(s->kv, layer, values, pre_rope, row0, n, dst, err);
}

void rk_session_kv_bytes(const rk_session *s, rk_kv_bytes *out) { s->kv->ops->bytes(s->kv, out); }

void rk_session_lowram_stats(const rk_session *s, rk_lowram_stats *out) {
    memset(out, 0, sizeof *out);
    if (s->kv->ops->stats) s->kv->ops->stats(s->kv, out);
}

const char *rk_session_warning(const rk_session *s) { return s->warning; }

void rk_session_kv_tier_stats(const rk_session *s, rk_kv_tier_stats *out) {
    memset(out, 0, sizeof *out);
    if (s->kv->ops->tier_stats) s->kv->ops->tier_stats(s->kv, out);
}

/* ---- backend names ------------------------------------------------------------------- */

static const char *const backend_names[] = {"cpu", "cpu_ref", "cuda"};

const char *rk_backend_kind_name(rk_backend_kind k) {
    return (unsigned)k <= RK_BACKEND_CUDA ? backend_names[k] : "unknown";
}

bool rk_backend_kind_parse(const char *s, rk_backend_kind *out) {
    for (int i = 0; i <= RK_BACKEND_CUDA; i++)
        if (s && !strcmp(s, backend_names[i])) {
            *out = (rk_backend_kind)i;
            return true;
        }
    return false;
}

/* ---- token history, KV export / import (the encodings: kv/kv_block.c and the policies) ---- */

const int32_t *rk_session_tokens(const rk_session *s) { return s->tokens; }

rk_status rk_session_kv_export(const rk_session *s, int64_t row0, int64_t row1, void **blk, size_t *n, rk_err *err) {
    return rk_kv_block_export(s->kv, s->m, s->tokens, row0, row1, blk, n, err);
}

rk_status rk_session_kv_import_stream(rk_session *s, uint64_t n, rk_kv_pull pull, void *ctx, rk_err *err) {
    rk_status st = rk_kv_block_import_stream(s->kv, s->m, n, pull, ctx, s->tokens, err);
    if (st) return st;
    s->n_past = s->kv->n_past;
    return RK_OK;
}

rk_status rk_session_kv_import(rk_session *s, const void *blk, size_t n, rk_err *err) {
    rk_status st = rk_kv_block_import(s->kv, s->m, blk, n, s->tokens, err);
    if (st) return st;
    s->n_past = s->kv->n_past;
    return RK_OK;
}
