/* Internal: session state shared by runtime/prefill/ (forward.c, ridgefill.c) and fitters/ridge_calibrate.c. */
#pragma once
#include "kv_impl.h"
#include "model_impl.h"
#include "rk_ext.h"


struct rk_ridge_maps {
    rk_mapping map;
    rk_gguf *gguf;
    int32_t split, n_layer, n_embd;
    rk_view *w;               /* n_layer entries; valid for split < l < n_layer (W_S = I) */
    const float **b;          /* bias per layer, same range */
    const float *token_score; /* (n_vocab) hard-token score, NULL when absent */
    int32_t n_vocab;
    float keep_share, score_threshold_default;
    float lambda;
    bool normalized; /* maps act on rmsnorm(x_S) and predict rmsnorm(x_l) */
    bool kv_target;  /* maps predict each late layer's pre-RoPE K and V (2 kv_dim outputs:
                            K then V) instead of its input */
};

/* forward.c's recorded decode steps (rk_forward_init; rk_forward_chunk) */
typedef struct rk_fwd_graphs {
    bool on;              /* asked for (rk_session_params.cuda_graphs) and possible for this session */
    bool capturing;       /* inside a recorded step: output_head ends it before the download */
    int fail_run;         /* consecutive failed recordings: 3 turn graphs off */
    uint64_t *saved_rows; /* (n_layer, 2) the session's layer_rows before the step being recorded */
} rk_fwd_graphs;

struct rk_session {
    const rk_model *m;
    rk_backend *be;
    bool own_be; /* false: borrowed from rk_session_params.shared_backend */
    bool dev;    /* the backend has its own memory (cuda): activations below live there, only the
                           * logits come back (rk_backend_download); fill and taps need host rows */
    rk_session_params p;
    /* the model's weights as this backend prepared them (once, at creation: uploaded for
     * CUDA; the same views on the CPU) */
    rk_layer *w_layers; /* (n_layer) */
    rk_view w_tok_embd, w_output_norm, w_output;
    int64_t n_ctx, n_past;
    rk_kv *kv;       /* the KV cache of the policy p.kv, reached only through its ops (kv/kv_impl.h);
                           * on a dev backend it takes k, v, q and the attention output in device memory */
    int32_t *tokens; /* (n_ctx) token ids of rows [0, n_past) */
    /* scratch for one chunk of n_batch rows */
    float *x;          /* (n_batch, n_embd) residual stream */
    float *xin;        /* (n_batch, n_embd) layer input used by the cache writers */
    float *xs;         /* (n_batch, n_embd) split stream of filled rows (compacted) */
    float *h;          /* (n_batch, max(n_embd, q_dim)) normed input / attention output */
    float *q;          /* (n_batch, q_dim) */
    float *k, *v;      /* (n_batch, kv_dim) */
    float *t;          /* (n_batch, max(n_embd, q_dim)) projection output */
    float *gate, *up;  /* (n_batch, n_ff) */
    float *logits;     /* (n_batch, n_vocab) */
    int32_t *ex_idx;   /* (n_batch) chunk rows that run exactly in late layers */
    int32_t *fill_idx; /* (n_batch) chunk rows filled in late layers */
    rk_progress_fn progress;
    void *progress_ud;
    rk_tap_fn tap;
    void *tap_ud;
    struct rk_prefill_ckpt *ckpt; /* borrowed: the checkpoint hook of the running read (prefill_ckpt.h) */
    rk_fill_params fill;
    rk_session_counters counters;
    uint64_t *layer_rows; /* (n_layer, 2) rows that ran exact, rows filled, per layer (rk_session_layer_rows) */
    rk_fwd_graphs graphs;
    char warning[512];           /* rk_session_warning */
    struct rk_prefill_state *pf; /* the prefill module's: selection, kept stream, splice, fill groups
                                  * (prefill/plan_impl.h) */
};

/* forward.c: the recorded decode steps when p.cuda_graphs asks for them, the backend records
 * steps and the cache's steps can be recorded (rk_kv_ops.recordable); deinit frees them. */
rk_status rk_forward_init(rk_session *s, rk_err *err);
void rk_forward_deinit(rk_session *s);

/* forward.c: one pass of a prefill plan (runtime/prefill/plan_impl.h) over its chunk:
 * layers [layer_lo, layer_hi) for rows pos0.. (KV rows written at their positions;
 * n_past is the caller's to advance). logits: NULL, or the last row's / every row's. */
struct rk_chunk_plan;
rk_status rk_forward_chunk(rk_session *s, const struct rk_chunk_plan *p, const int32_t *ids, float *logits,
                           bool all_rows, rk_err *err);

/* Row moves of the prefill plan (forward.c), rows of d floats ld* apart, n <= 0 a no-op.
 * On a host backend memmove / memcpy; on a backend with its own memory (cuda) backend ops on
 * its buffers (GET_ROWS of f32 rows, SCATTER_ROWS, CPY_ROWS), queued on its stream.
 * gather: dst[i] = src[idx[i]] (idx increasing; in place only on a host backend);
 * scatter: dst[idx[i]] = src[i] (idx distinct; dst and src apart); copy: dst[i] = src[i]. */
rk_status rk_session_rows_gather(rk_session *s, float *dst, int64_t ldd, const float *src, int64_t lds,
                                 const int32_t *idx, int64_t n, int64_t d, rk_err *err);
rk_status rk_session_rows_scatter(rk_session *s, float *dst, int64_t ldd, const float *src, int64_t lds,
                                  const int32_t *idx, int64_t n, int64_t d, rk_err *err);
rk_status rk_session_rows_copy(rk_session *s, float *dst, const float *src, int64_t n, int64_t d, rk_err *err);

/* Eval splice: replaces K and/or V rows [row0, row1) of layers [lo, hi) of s with those of
 * src (read as f32 through the interface, in tiles of the session's scratch). */
rk_status rk_session_splice_rows(rk_session *s, const rk_session *src, int lo, int hi, bool keys, bool values,
                                 int64_t row0, int64_t row1, rk_err *err);

/* rk_session_kv_import of a block of n bytes streamed through pull (rk_kv_block_import_stream):
 * the document cache's load, which never holds the whole block. */
rk_status rk_session_kv_import_stream(rk_session *s, uint64_t n, rk_kv_pull pull, void *ctx, rk_err *err);

/* rk_session_fill_stream_set taking x, base and keep (malloc'd; freed on failure too)
 * instead of copying them: the document cache's load of a long document's stream. With map
 * (a read-only map of map_len bytes, rk_io.h), x lies in it and the map is the session's
 * (unmapped on failure too). */
rk_status rk_session_fill_stream_adopt(rk_session *s, int64_t row0, int64_t n, int32_t split, uint16_t *x, float *base,
                                       uint8_t *keep, const void *map, size_t map_len, rk_err *err);
