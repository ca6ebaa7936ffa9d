/* The defaults of a long prompt: see rk_long.h. One function decides RoPE scaling, KV
 * policy and KV budget from the prompt's length and the free memory, so that every command
 * (and bench's "default" fill) runs the same settings. */
#include <string.h>

#include "rk_long.h"

/* bytes of one K or V value of a row in kind */
static double value_bytes(rk_kv_kind kind) {
    switch (kind) {
    case RK_KV_F32: return 4.0;
    case RK_KV_Q8: return 34.0 / 32.0; /* q8_0: f16 scale + 32 int8 per block */
    case RK_KV_Q4: return 18.0 / 32.0; /* q4_0: f16 scale + 16 bytes per block */
    default: return 2.0;
    }
}

uint64_t rk_long_kv_bytes(const rk_model *m, rk_kv_kind kind, int64_t n_rows) {
    if (!m || n_rows <= 0) return 0;
    const rk_hparams *hp = rk_model_hparams(m);
    const double per_row = 2.0 * hp->n_layer * (double)hp->n_head_kv * hp->head_dim * value_bytes(kind);
    return (uint64_t)(per_row * (double)n_rows + 0.5);
}

/* The single place where the default's sparse prefill attention is chosen (0: dense). The
 * exact request never reaches it. */
static int32_t sparse_default(const rk_model *m, const rk_long_request *r) {
    (void)m;
    /* rk_sparse_params_default() acts past its min_kv (8192) keys: shorter prompts stay exact */
    return r->n_prompt >= 8192;
}

rk_status rk_long_defaults_get(const rk_model *m, const rk_long_request *r, rk_long_defaults *out, rk_err *err) {
    if (!m || !r || !out) return rk_err_set(err, RK_E_INVALID_ARG, "defaults: needs a model, a request and an output");
    if (r->n_prompt < 0 || r->n_rows < 0 || r->n_ctx < 0)
        return rk_err_set(err, RK_E_INVALID_ARG, "defaults: negative count (prompt %lld, rows %lld, context %d)",
                          (long long)r->n_prompt, (long long)r->n_rows, (int)r->n_ctx);
    if (r->documented.type != RK_ROPE_SCALING_NONE && !(r->documented.factor >= 1.0f))
        return rk_err_set(err, RK_E_INVALID_ARG, "defaults: documented %s scaling with factor %g (expected >= 1)",
                          rk_rope_scaling_name(r->documented.type), (double)r->documented.factor);
    const rk_hparams *hp = rk_model_hparams(m);
    rk_long_defaults d = {.n_ctx_train = hp->n_ctx_train,
                          .n_ctx_max = rk_model_n_ctx_max(m),
                          .n_rows = r->n_rows ? r->n_rows : r->n_prompt,
                          .rope_set = rk_rope_override_default(),
                          .kv = RK_KV_F16};
    /* ---- RoPE: only what the length needs ---- */
    /* a -c given is what the session holds (a longer prompt is then the caller's refusal);
     * else the rows decide whether scaling is needed, the prompt (and one answer token)
     * whether the length is past reach: the context is capped there and the answer stops */
    const int64_t need = r->n_ctx > 0 ? r->n_ctx : d.n_rows;
    const int64_t must = r->n_ctx > 0 ? r->n_ctx : (r->n_prompt ? r->n_prompt + 1 : d.n_rows);
    if (need > d.n_ctx_train) {
        const bool in_effect = hp->rope_scaling.type != RK_ROPE_SCALING_NONE;
        if (r->overflow_ok) d.rope = RK_LONG_ROPE_NONE;
        else if (in_effect) d.rope = r->rope_explicit ? RK_LONG_ROPE_FLAGS : RK_LONG_ROPE_FILE;
        else if (!r->rope_explicit && r->documented.type != RK_ROPE_SCALING_NONE) {
            d.rope = RK_LONG_ROPE_APPLY;
            d.rope_set.type = r->documented.type;
            d.rope_set.factor = r->documented.factor;
            d.rope_set.orig_ctx = r->documented.orig_ctx > 0 ? r->documented.orig_ctx : hp->n_ctx_train;
            const int64_t scaled = (int64_t)((double)d.rope_set.orig_ctx * d.rope_set.factor);
            d.n_ctx_max = scaled > d.n_ctx_train ? scaled : d.n_ctx_train;
        } else d.rope = RK_LONG_ROPE_TOO_LONG;
        if (d.rope != RK_LONG_ROPE_NONE && must > d.n_ctx_max) d.rope = RK_LONG_ROPE_TOO_LONG;
    }
    if (r->n_ctx > 0) d.n_ctx = r->n_ctx;
    else if (d.n_rows > d.n_ctx_train && d.rope != RK_LONG_ROPE_TOO_LONG) {
        int64_t c = (d.n_rows + 255) / 256 * 256;
        if (!r->overflow_ok && c > d.n_ctx_max) c = d.n_ctx_max;
        d.n_ctx = c > INT32_MAX ? INT32_MAX : (int32_t)c;
    }
    /* ---- KV policy ---- */
    d.kv_f16_bytes = rk_long_kv_bytes(m, RK_KV_F16, d.n_rows);
    if (r->exact) d.kv = RK_KV_F16, d.kv_why = RK_LONG_KV_DEFAULT; /* whatever else was asked */
    else if (r->kv_explicit) d.kv = r->kv_kind, d.kv_why = RK_LONG_KV_EXPLICIT;
    else if (r->n_prompt >= RK_LONG_Q8_MIN_TOKENS) d.kv = RK_KV_Q8, d.kv_why = RK_LONG_KV_LONG;
    else if (r->free_bytes && d.kv_f16_bytes > r->free_bytes / 2) d.kv = RK_KV_Q8, d.kv_why = RK_LONG_KV_MEMORY;
    d.kv_bytes = rk_long_kv_bytes(m, d.kv, d.n_rows);
    /* ---- budget: only when even the chosen kind would crowd the free memory ---- */
    const bool tiers = d.kv == RK_KV_F16 || d.kv == RK_KV_F32 || d.kv == RK_KV_Q8; /* q4, lowram: none */
    if (!r->exact && !r->budget_explicit && tiers && r->free_bytes && d.kv_bytes > r->free_bytes / 4 * 3)
        d.kv_budget = r->free_bytes / 2 / (1u << 20) * (1u << 20);
    if (!r->exact) d.sparse = sparse_default(m, r);
    if (d.sparse) d.n_batch = RK_LONG_SPARSE_BATCH;
    *out = d;
    return RK_OK;
}
