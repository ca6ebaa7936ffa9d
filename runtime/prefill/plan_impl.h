/* Internal: the prefill plan. For each prompt chunk it says which rows run which layers
 * exactly and where the late-layer inputs of the other rows come from; forward.c runs
 * one plan through one readable layer loop, prefill.c drives the chunks (chunk-major, or
 * layer-major: layers 0..S-1 over the whole prompt before any late layer). */
#pragma once
#include <math.h>
#include <string.h>

#include "rk_attn_sparse.h"
#include "session_impl.h"

/* Quality mode's exact bulk rows with the map's share: at least RK_FILL_KEEP_ROWS of them
 * while that is at most RK_FILL_KEEP_MAX of the bulk. A document of 8-16K tokens then keeps a
 * quarter of its rows exact instead of a tenth: with a tenth, fact questions about 9K-token
 * documents lost 4.5 points against exact (docs/LONG_CONTEXT.md, "Measured"), the other
 * facts' exact rows sitting in a context that is mostly predicted. From 16K bulk rows on the
 * count stays 4096 until the share (0.1) is larger, so long reads cost what they did. */
#define RK_FILL_KEEP_ROWS 4096
#define RK_FILL_KEEP_MAX 0.25

/* The bulk rows of n scored ones that quality mode keeps exact (f resolved by
 * rk_session_set_fill: keep_share >= 0, keep_rows > 0 or -1). */
static inline int64_t rk_fill_keep_count(const rk_fill_params *f, int64_t n) {
    if (n <= 0) return 0;
    int64_t k = (int64_t)llround((double)f->keep_share * (double)n);
    if (f->keep_rows > 0) {
        const int64_t hi = (int64_t)llround(RK_FILL_KEEP_MAX * (double)n);
        const int64_t r = f->keep_rows < hi ? f->keep_rows : hi;
        if (r > k) k = r;
    }
    return k < n ? k : n;
}

/* The prefill module's state in a session (rk_session.pf): rk_prefill_init makes it with the
 * session, rk_prefill_deinit frees it, rk_prefill_forget drops what rows [n, ...) fed. */
typedef struct rk_prefill_state {
    /* question-aware selection of the last eval call that made one (select.c):
     * keep[pos - keep_lo] for bulk rows [keep_lo, keep_hi) says the row stays exact in late
     * layers; selecting says whether the running eval call uses it (plan.c) */
    uint8_t *keep;
    int64_t keep_lo, keep_hi;
    /* the document's own selection over the same rows (what its eval chose, or what a loaded
     * stream held): a later question's selection is this plus its own rows, so the state a
     * question leaves does not depend on the questions before it */
    uint8_t *keep0;
    bool selecting;
    /* the split stream of that call's bulk rows [xs_lo, xs_hi) as f16 (n_embd a row) and what
     * the text rows before its question paid each of them (per query row, 0 before the
     * sinks' end): a later call re-scores them by its own question (prefill.c) */
    uint16_t *xs_keep;
    float *xs_base;
    int64_t xs_lo, xs_hi;
    int32_t xs_split;
    /* xs_keep is malloc'd (xs_map 0) or lies in a read-only map of a file (xs_map bytes from
     * xs_map_base): from rk_fill_params.stream_file KiB on, an unlinked file in spill_dir;
     * loaded from the document cache, its stream file. A long document's stream then costs
     * the process only the pages a reader holds, and readers of many rows release them
     * block by block (rk_prefill_xs_release) */
    const void *xs_map_base;
    size_t xs_map;
    char spill_dir[1024];
    rk_fill_rescore_stats rescore;
    /* eval splice (ridgefill.c): copy exact K/V of layers [lo, hi) over the bulk rows before the tail */
    const rk_session *splice_src;
    int splice_lo, splice_hi;
    bool splice_k, splice_v;
    struct rk_fill_group *fg; /* grouped filled rows of the running fill prefill, or NULL (fill_group.c) */
    /* sparse attention (sparse.c): the running eval call's end (rows below it), the counters,
     * and the calibration pass's accumulators (NULL outside one) */
    int64_t sparse_end;
    rk_attn_sparse_stats sparse_stats;
    struct rk_sparse_acc *sparse_acc;
} rk_prefill_state;
rk_status rk_prefill_init(rk_session *s, rk_err *err);
void rk_prefill_deinit(rk_session *s);
/* Rows from n on left the session (truncate, reset): the kept stream goes if it reaches them. */
void rk_prefill_forget(rk_session *s, int64_t n);
/* Frees the kept stream (memory or file map) and its baseline. */
void rk_prefill_xs_drop(rk_prefill_state *f);
/* The process lets go of the kept stream's pages below row r (from xs_lo) when it lives in a
 * file; nothing otherwise. The rows read the same afterwards. Pages already let go cost
 * nothing, so a reader going up the rows calls it with the row it has reached. */
void rk_prefill_xs_release(const rk_session *s, int64_t r);

/* fill_group.c: RidgeFill's grouped attention (rk_fill_params.group > 0). During one
 * prefill call from row 0 with fill on a host backend, the late layers' exact rows attend
 * to a per-layer list instead of the cache: every exact row's K/V as the cache holds it
 * (f16), and every run of up to `group` consecutive filled rows of a chunk (never the first
 * n_sink positions) as one row, the run's mean K and mean V with score bias log(count): the
 * attention c identical rows would get. begin: none (s->pf->fg NULL) unless it applies. append:
 * after RoPE, the chunk's rows (plan p; rows in p->fill_idx are filled when filled is true).
 * attend: as the cache's attention. end: frees it. */
typedef struct rk_fill_group rk_fill_group;
struct rk_chunk_plan;
rk_status rk_fill_group_begin(rk_session *s, int64_t start, int split, rk_err *err);
bool rk_fill_group_on(const rk_session *s, int l);
rk_status rk_fill_group_append(rk_session *s, const struct rk_chunk_plan *p, int l, bool filled, rk_err *err);
rk_status rk_fill_group_attend(rk_session *s, int l, const float *q, int64_t n_q, int64_t pos0, float *out,
                               rk_err *err);
void rk_fill_group_end(rk_session *s);


/* Where the late-layer input of a filled row comes from (SPEC §2). */
typedef enum rk_fill_src {
    RK_SRC_RIDGE,    /* x̂_l = W_l x_S + b_l (W_S = I) */
    RK_SRC_IDENTITY, /* x̂_l = x_S: the training-free baseline */
    RK_SRC_EXACT,    /* the row's own exact input through the fill path (plumb: the oracle) */
} rk_fill_src;

typedef struct rk_chunk_plan {
    int64_t pos0, n;        /* rows pos0 .. pos0 + n - 1 */
    int layer_lo, layer_hi; /* this pass runs layers [layer_lo, layer_hi) */
    int split;              /* first late layer: filled rows run only the cache writers there */
    rk_fill_src src;
    int64_t n_ex, n_fill;
    const int32_t *ex_idx;   /* (n_ex) chunk rows with Q/attention/O/MLP in late layers, increasing */
    const int32_t *fill_idx; /* (n_fill) chunk rows filled in late layers, increasing */
    const float *x_in;       /* layer_lo > 0: (n, n_embd) input of layer layer_lo */
    float *x_out;            /* layer_hi < n_layer: (n, n_embd) receives the input of layer layer_hi */
    /* question-aware scoring (select.c): the post-RoPE queries of prompt rows [q_pos0,
     * q_pos0 + q_n) at layers [q_lo, q_hi) go to q_keep, (q_hi - q_lo, q_n, n_head * head_dim) */
    float *q_keep;
    int q_lo, q_hi;
    int64_t q_pos0, q_n;
} rk_chunk_plan;

/* cost.c: the cost model of prefill progress. The work of a chunk plan in FLOPs, in three
 * parts: the matrices (per row and layer all of them for exact rows; K, V and the ridge map
 * for filled ones; the output projection for rows with logits); the attention the plan pays
 * whatever the data (4 x n_head x head_dim FLOPs per (query, key) pair: dense rows, the
 * sinks' and window's blocks of sparse rows, and the estimation, RK_COST_EST_WEIGHT a pair);
 * and the other causal blocks of sparse rows, of which the estimated lines select a share
 * measured as the call runs. Late-layer exact rows with grouped attention attend to the exact
 * rows and one row per run of filled rows. Progress is the predicted time of the work done
 * over that of all the work, time = a x matrices + b x attention, with b / a fitted on the
 * chunks' wall times as they run (rk_cost_fit), starting from the model's prior
 * (rk_cost_attn_prior). */
#define RK_COST_ATTN_WEIGHT 2.0 /* the prior of a fit that was given none */
#define RK_COST_EST_WEIGHT 2.0  /* an estimating pair: its score, exp, and the line sums */
typedef struct rk_cost_ctx {
    int64_t start, bulk_end, end; /* the eval call's rows [start, end), bulk rows [start, bulk_end) */
    double share;                 /* share of bulk rows exact in late layers (expected) */
    int group;                    /* grouped late-layer attention: runs of up to group filled rows (0: off) */
    bool logits, all_rows;        /* logits of the last row, or of every row */
    /* sparse attention of the full-attention layers (sparse.c's resolved settings) */
    bool sp_on;
    int64_t sp_min_kv, sp_dense_from;
    int64_t sp_block, sp_sink_b, sp_window, sp_n_est;
} rk_cost_ctx;
typedef struct rk_cost {
    double mat, attn, lines; /* FLOPs: matrices, attention paid, sparse blocks left to the lines */
} rk_cost;
struct rk_chunk_plan;
rk_cost rk_cost_chunk(const rk_session *s, const rk_cost_ctx *c, const struct rk_chunk_plan *p);
/* FLOPs of one exact row through one layer's matrices (Q, K, V, O and the gated MLP). */
double rk_cost_full_row(const rk_hparams *hp);
/* The prior of b / a below for a model: CPU attention's FLOP rate over the matrix kernels'
 * grows with the heads' width. Measured: a third for SmolLM2-135M's 64-wide heads on one
 * thread; 1 / 1.17 for Qwen2.5-1.5B's 128-wide heads on two (the fit over the early pass of
 * a 106K-token read). The prior is the power of the width through both: 1.2 x
 * (128 / head_dim)^1.32, kept within 0.5 .. 4. */
double rk_cost_attn_prior(const rk_hparams *hp);
/* Sums of the fit y = a x1 + b x2 (y: a chunk's seconds, x1 its matrix FLOPs, x2 its
 * attention FLOPs as run) and its ratio b / a (the prior until two chunks ran, pulled
 * toward it, kept within 1/20 .. 20 times it; prior 0: RK_COST_ATTN_WEIGHT). */
typedef struct rk_cost_fit {
    double s11, s12, s22, s1y, s2y;
    int n;
    double prior;
} rk_cost_fit;
void rk_cost_fit_add(rk_cost_fit *f, double x1, double x2, double y);
double rk_cost_fit_ratio(const rk_cost_fit *f);

/* Plans the chunk of n rows at pos0 for layers [lo, hi): rows below bulk_end are bulk
 * rows, filled in late layers as the session's fill mode says. Index lists live in the
 * session's scratch (valid until the next plan). */
void rk_plan_chunk(rk_session *s, int64_t pos0, int64_t n, int64_t bulk_end, int lo, int hi, rk_chunk_plan *p);
/* Row moves between a chunk and its compacted subsets (idx increasing, d floats a row):
 * gather dst[i] = src[idx[i]] (in place is safe), scatter dst[idx[i]] = src[i]. */
static inline void rk_rows_gather(float *dst, const float *src, const int32_t *idx, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) memmove(dst + i * d, src + (int64_t)idx[i] * d, (size_t)d * sizeof(float));
}
static inline void rk_rows_scatter(float *dst, const float *src, const int32_t *idx, int64_t n, int64_t d) {
    for (int64_t i = 0; i < n; i++) memcpy(dst + (int64_t)idx[i] * d, src + i * d, (size_t)d * sizeof(float));
}

/* First late layer of the session's fill settings (n_layer when fill is off). */
int rk_plan_split(const rk_session *s);
/* Brings the filled rows' split stream xs (n_fill, n_embd) into the space the maps act
 * on (rmsnorm(x_S) for normalised maps; unchanged otherwise). Once per chunk. */
rk_status rk_plan_split_stream(rk_session *s, const rk_chunk_plan *p, float *xs, rk_err *err);
/* Writes the cache writers' input of late layer l into xin (n, n_embd): exact rows from
 * x (compacted: row i of x is chunk row ex_idx[i]; else chunk row i), filled rows from
 * their source given the split stream xs (n_fill, n_embd). */
rk_status rk_plan_late_inputs(rk_session *s, const rk_chunk_plan *p, int l, const float *x, bool compacted,
                              const float *xs, float *xin, rk_err *err);
/* K/V maps (rk_ridge_maps.kv_target): replaces the filled rows' pre-RoPE K and V of late
 * layer l > split in k, v (n, kv_dim; after the projections and k-norm, before RoPE) with
 * the maps' prediction from their split stream xs (n_fill, n_embd). No-op otherwise. */
rk_status rk_plan_predict_kv(rk_session *s, const rk_chunk_plan *p, int l, const float *xs, float *k, float *v,
                             rk_err *err);
/* select.c: the layer loop's hook after layer l's exact rows (early layers: every row of
 * the chunk, uncompacted): copies the queries the plan asks for (q_keep) from s->q. */
void rk_plan_keep_queries(const rk_session *s, const rk_chunk_plan *p, int l);
/* select.c: adds to score[j - row0] (rows [row0, row1)) the softmax attention weight that
 * each of the n_obs query rows q (n_obs, n_head * head_dim; post-RoPE; row i at position
 * obs_pos0 + i) pays key row j of layer l, summed over query heads; the softmax of row i
 * runs over the keys [0, obs_pos0 + i] the cache holds, as causal attention does. */
rk_status rk_select_score(rk_session *s, int l, const float *q, int64_t n_obs, int64_t obs_pos0, int64_t row0,
                          int64_t row1, float *score, rk_err *err);
/* select.c: max-pools score (n) over `radius` rows either side, then marks in keep the
 * n_keep rows with the largest pooled score (ties: the earlier row); keep is not cleared. */
rk_status rk_select_top(const float *score, int64_t n, int radius, int64_t n_keep, uint8_t *keep, rk_err *err);
/* select.c: the selection of quality mode over n scored bulk rows: the last min(band,
 * n_keep) rows (the recency band, nearest the exact tail) are marked, then the other
 * n_keep - that of the rows before them by rk_select_top; keep is not cleared. */
rk_status rk_select_rows(const float *score, int64_t n, int radius, int64_t n_keep, int64_t band, uint8_t *keep,
                         rk_err *err);
/* select.c: a later question's rows: keep = base, plus the rows outside base with the largest
 * pooled score (the most of the scores from `after` rows before the row to `radius` rows
 * after it; ties: the earlier row), at most max_new of them and only rows whose pooled score
 * is above 0. *n_new: the rows added. */
rk_status rk_select_extra(const float *score, int64_t n, int radius, int after, const uint8_t *base, int64_t max_new,
                          uint8_t *keep, int64_t *n_new, rk_err *err);
/* sparse.c: the block-sparse layout of layer l's attention for n_q rows at pos0 in the
 * running eval call, or false when that attention runs dense (sparse off, a device backend,
 * RidgeFill's grouped late layers). sp borrows the session's state until the next call. */
struct rk_attn_sparse;
bool rk_sparse_layout(rk_session *s, int l, struct rk_attn_sparse *sp);
/* prefill.c: an eval call's rows through the model in chunks (what rk_session_eval runs). */
rk_status rk_prefill_run(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err);
