/* Internal: session state shared by forward.c, ridgefill.c and calibrate.c. */
#pragma once
#include "model_impl.h"
#include "rk_ext.h"


struct rk_ridge_maps {
    rk_mapping map;
    rk_gguf *gguf;
    int32_t split, n_layer, n_embd;
    rk_view *w;          /* n_layer entries; valid for split < l < n_layer (W_S = I) */
    const float **b;     /* bias per layer, same range */
    const float *token_score; /* (n_vocab) hard-token score, NULL when absent */
    int32_t n_vocab;
    float keep_share, score_threshold_default;
    float lambda;
    bool normalized;     /* maps act on rmsnorm(x_S) and predict rmsnorm(x_l) */
};

struct rk_session {
    const rk_model *m;
    rk_backend *be;
    bool own_be;          /* false: borrowed from rk_session_params.shared_backend */
    rk_session_params p;
    /* the model's weights as this backend prepared them (once, at creation: uploaded for
     * CUDA; the same views on the CPU) */
    rk_layer *w_layers;   /* (n_layer) */
    rk_view w_tok_embd, w_output_norm, w_output;
    int64_t n_ctx, n_past;
    uint32_t kv_type;
    size_t kv_row_bytes;  /* kv_dim * element size */
    void **k_cache;       /* n_layer x (n_ctx, kv_dim) */
    void **v_cache;
    /* scratch for one chunk of n_batch rows */
    float *x;             /* (n_batch, n_embd) residual stream */
    float *xin;           /* (n_batch, n_embd) layer input used by the cache writers */
    float *xs;            /* (n_batch, n_embd) split stream of filled rows (compacted) */
    float *xe;            /* (n_batch, n_embd) compacted exact rows */
    float *h;             /* (n_batch, max(n_embd, q_dim)) normed input / attention output */
    float *q;             /* (n_batch, q_dim) */
    float *k, *v;         /* (n_batch, kv_dim) */
    float *t;             /* (n_batch, max(n_embd, q_dim)) projection output */
    float *gate, *up;     /* (n_batch, n_ff) */
    float *logits;        /* (n_batch, n_vocab) */
    int32_t *ex_idx;      /* (n_batch) chunk rows that run exactly in late layers */
    int32_t *fill_idx;    /* (n_batch) chunk rows filled in late layers */
    rk_progress_fn progress;
    void *progress_ud;
    rk_tap_fn tap;
    void *tap_ud;
    rk_fill_params fill;
    float score_threshold; /* quality: token_score >= threshold -> kept exact */
    rk_session_counters counters;
    /* eval splice: copy exact K/V of layers [lo, hi) over the bulk rows before the tail */
    struct rk_kv_codec *kvc;   /* LowRAM compressed KV (lowram.c); NULL: plain cache */
    const rk_session *splice_src;
    int splice_lo, splice_hi;
    bool splice_k, splice_v;
    char warning[512];    /* rk_session_warning */
};


/* ---- LowRAM hooks (implemented in lowram.c) ------------------------------------
 * The plain f16/f32 cache stays the write target for every new row; a codec keeps a
 * compressed copy of older rows and may release their plain pages. forward.c calls: */
typedef struct rk_kv_codec rk_kv_codec;
/* After every successful eval call (n_new rows were appended at n_past - n_new). */
rk_status rk_kvc_after_eval(rk_kv_codec *c, rk_session *s, int64_t n_new, rk_err *err);
/* Attention for query rows at positions pos0.. of layer l when the codec holds
 * compressed rows of that layer; *handled false: forward.c uses the plain cache. */
rk_status rk_kvc_attention(rk_kv_codec *c, rk_session *s, int layer, const float *q, int64_t n_q, int64_t pos0,
                           float *out, bool *handled, rk_err *err);
void rk_kvc_destroy(rk_kv_codec *c);

/* forward.c: one pass of a prefill plan (runtime/prefill/plan_impl.h) over its chunk:
 * layers [layer_lo, layer_hi) for rows pos0.. (KV rows written at their positions;
 * n_past is the caller's to advance). logits: NULL, or the last row's / every row's. */
struct rk_chunk_plan;
rk_status rk_forward_chunk(rk_session *s, const struct rk_chunk_plan *p, const int32_t *ids, float *logits,
                           bool all_rows, rk_err *err);

/* kv/lowram.c: turns the codec on (p != NULL) or off for the session (at creation). */
rk_status rk_session_set_lowram(rk_session *s, const rk_lowram_params *p, char *warning, size_t warning_cap,
                                rk_err *err);
