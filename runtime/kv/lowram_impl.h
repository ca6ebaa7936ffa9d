/* Internal: LowRAM codec state shared by lowram.c (the rk_kv ops: append, attend, commit,
 * truncate, bytes), lowram_fit.c (the fit), lowram_store.c (row formats, exact rows,
 * compression, truncation), lowram_attn.c and the units under lowram_task.h (attention over
 * the compressed cache),
 * lowram_scratch.c (its work areas), lowram_io.c (export / import of the whole state) and lowram_file.c (predictor files);
 * the eigensolver and solves are runtime/linalg. */
#pragma once
#include "kv_impl.h"
#include "rk_linalg.h"

/* default start= (rows): below it every row stays exact, which decodes faster than the
 * compressed form on the 2-core CPU (the crossover measured in docs/LOWRAM.md) */
#define LR_START_DEFAULT 3072
/* default spare rows of decode's key cache per (layer, KV head) beyond the budget's chunks
 * (kslots = this / chunk: 18 chunks of 32 rows) */
#define LR_KC_SPARE_ROWS 576
/* ... and at least one chunk in LR_KC_SPARE_DIV of the compressed ones: the selection's turnover
 * from step to step grows with the chunks there are to choose from (docs/LOWRAM.md: Qwen
 * 1.5B at 15K rebuilt 0.079 of the attended rows with 36 spare
 * chunks, 0.048 with 100) */
#define LR_KC_SPARE_DIV 14

/* Stored row of compressed keys: the rank-r coefficients of one position, stacked over the
 * group's layers. Residual row: δ of one (layer, KV head) and position. */
typedef struct lr_group {
    int l0, n_l;         /* layers l0 .. l0 + n_l - 1 */
    int D, r;            /* stacked dim n_l * kv_dim, rank */
    size_t coef_bytes;   /* bytes of one stored coefficient row */
    float *mean;         /* (D) mean pre-RoPE stacked key */
    float *wdim, *winv;  /* (D) per-dim weight s and 1/s: coef = ((x - mean) s) Bᵀ, x = mean + (coef B)/s */
    void *basis;         /* (r, D) orthonormal rows, by decreasing eigenvalue (f16; f32 when c->wide) */
    uint16_t *cmean;     /* (cap_chunks, r) f16 mean coefficients of each chunk */
    float *open_c;       /* (r) coefficient sum of the last chunk while it is partial */
    double energy_total; /* centred key energy (trace) of the fit rows */
    double energy_kept;  /* of which the r kept directions */
    int64_t n_rows;      /* stored rows */
    bool prefit;         /* fitted and compressed early inside a layer-major eval (lr_prefit),
                             before the codec as a whole is (c->fitted) */
    int32_t *pos;        /* (cap_rows) position of each stored row, increasing */
    uint8_t *coef;       /* (cap_rows, coef_bytes) */
} lr_group;

#define LR_PIN_MAX 32           /* most pinned chunks per (layer, KV head) */
#define LR_FULL_MAX 8           /* most layers that attend every chunk (full_layers) */
#define LR_PIN_TAG 0x534e4950u  /* "PINS": the export's pinned-chunk trailer */
#define LR_FULL_TAG 0x4c4c5546u /* "FULL": the export's full-layer trailer */

typedef struct lr_head {
    float tau; /* later blocks keep a residual when ||δ||² >= tau */
    float r2;  /* R² of V̂ on the fit rows */
    /* decode's cache of rebuilt post-RoPE keys: n_kc slots of one chunk each (rows of c->kc_row bytes:
     * f16, or int8 after an f16 scale) */
    int n_kc;
    int32_t *kc_ch, *kc_rows;     /* (n_kc) chunk held (-1: none) and its row count then */
    uint32_t *kc_epoch, *kc_used; /* (n_kc) codec epoch then; attention call that last used it */
    uint8_t *kc;                  /* (n_kc, chunk, kc_row) */
    int64_t n_res;                /* residual rows stored */
    uint8_t *res;                 /* (cap_rows, res_bytes) in stored-row order */
    uint32_t *mask;               /* (cap_chunks) bit i: stored row chunk*C + i has a residual */
    int32_t *base;                /* (cap_chunks) residual slot of the chunk's first residual */
    int n_pin;                    /* chunks every sparse decode step attends (mass_pin: the ones the */
    int32_t pin[LR_PIN_MAX];      /* last prompt queries pointed at when the fit ran), stored index order */
} lr_head;

typedef struct lr_layer {
    int grp, li;                /* group and index inside it */
    void *W;                    /* (r, kv_dim) V̂ = coef W + b (f16; f32 when c->wide) */
    float *b;                   /* (kv_dim) */
    uint16_t *lmk;              /* (cap_chunks, kv_dim) f16 mean post-RoPE key of each chunk */
    float *open_sum;            /* (kv_dim) key sum of the last chunk while it is partial */
    uint16_t *lmin, *lmax;      /* (cap_chunks, kv_dim) f16 per-dim key range of each chunk (bound selection) */
    float *open_min, *open_max; /* (kv_dim) of the partial chunk */
    lr_head *h;                 /* (n_head_kv) */
    /* sparse decode's value-space chunk summaries, built lazily from cmean (lr_vsum_update):
     * per chunk and KV head an f16 scale and head_dim int8 of V̂(cmean) - b = cmean·W, so an
     * unselected chunk costs head_dim per query head instead of r */
    uint8_t *vsm; /* (cap_chunks, n_head_kv * (2 + head_dim)) */
    int64_t vs_n; /* chunks summarised (the last may be partial: vs_last rows, else 0) */
    int vs_last;
    uint32_t vs_epoch; /* c->epoch when built */
    /* two-level selection (coarse=G): per group of G chunks the row-weighted mean of their f16
     * landmarks (int8 per KV head), built lazily by lr_coarse_update; the first cl_n groups are final (every
     * chunk full), the last one is rebuilt while it may change */
    uint8_t *clmk; /* (cap_chunks / G + 1, n_head_kv, 2 + head_dim): f16 scale, int8 */
    int64_t cl_n;
    uint32_t cl_epoch; /* c->epoch when built */
    bool full;         /* sparse decode attends every chunk (full_layers, chosen at the fit) */
} lr_layer;

/* Per-thread attention scratch. */
typedef struct lr_scratch {
    float *kb, *vb;            /* (sc_ld, head_dim) keys (rebuilt or plain), plain values */
    float *cf;                 /* (chunk, r_max) dequantised coefficients */
    float *sc;                 /* (tile * group, sc_ld) scores, then softmax weights */
    float *st_m, *st_l, *st_a; /* (tile * group) running max, sum, compressed-row mass */
    float *acc_v;              /* (tile * group, head_dim) */
    float *acc_c;              /* (tile * group, r_max) Σ a·coef over compressed rows */
    float *row;                /* (head_dim) */
    int32_t *sel;              /* (cap_chunks) selected chunks */
    float *csc, *csc2;         /* (cap_chunks) chunk scores, sorted copy */
    uint8_t *mark;             /* (cap_chunks) 1: chunk selected */
    float *bias;               /* (chunk) log of each summary row's chunk size */
    float *bsl, *wsl;          /* (r_max, head_dim) basis and predictor columns of one (layer, head) */
    float *pm; /* (LR_SPARSE_MAX_Q * group, cap_chunks) top-p: estimated share per query head and chunk */
    struct lr_ord {
        float v;
        int32_t i;
    } * ord;    /* (cap_chunks) chunks by decreasing share */
    float *spr; /* (LR_SPARSE_MAX_Q * group + 2, head_dim) spread: pair weights, window |k|², per-chunk spread */
    float *ccs; /* (2, cap_chunks) two-level selection: coarse scores, their copy */
    uint64_t n_rebuilt, n_attended;
    uint64_t n_lmk, n_clmk; /* landmarks scored by the selection: chunks, coarse groups */
} lr_scratch;

/* Per-thread compression work area (sized for the largest group). */
enum { LR_BLOCK = 32 }; /* rows per batch of projection / prediction during compression */
enum { LR_RUN = 32 };   /* most rows of one decode block of consecutive chosen chunks (comp_run) */
typedef struct lr_cwork {
    float *B, *W;                /* (r, D) basis, (n_l, r, kv_dim) predictors as f32 */
    float *x, *cf, *v, *vh, *e2; /* (LR_BLOCK, D | r | kv_dim | kv_dim | n_l * n_head_kv) */
    uint8_t *crow, *enc;         /* (LR_BLOCK) coefficient rows; (LR_BLOCK, n_l, n_head_kv) residual rows */
    const uint8_t **res;         /* (n_l * n_head_kv) */
} lr_cwork;

/* query rows per task in dense/long evals; evals of at most LR_SPARSE_MAX_Q rows are decode */
enum { LR_TILE = 512, LR_SPARSE_MAX_Q = 4 };
/* state rows (query rows x query heads per KV head) from which a dense eval rebuilds each
 * chunk's values (r x head_dim per row) rather than accumulating r coefficients per pair */
enum { LR_VREBUILD_MIN = 24 };
/* most state rows (query rows x query heads per KV head) of the fused decode loops */
enum { LR_WMAX = 64 };

/* Sparse decode's state between its phases (lowram_attn.c: scores, choice, key rebuild,
 * attention): chunks chosen per KV head, their key-cache slots, and the batch of rows the
 * LR_KEYS op rebuilds (coefficients, positions, output; mean and 1/s rows). Allocated with the
 * scratch (lowram_scratch.c) when the backend runs RK_OP_LR_KEYS on host memory (keys_op). */
typedef struct lr_decode {
    bool keys_op;
    int32_t *sel, *slot; /* (n_head_kv, cap_chunks) */
    int64_t *n_sel;      /* (n_head_kv) */
    int32_t *kmap; /* (n_threads, cap_chunks) -1; a head's key-cache slot of each chunk while its hits are looked up */
    struct lr_vic {
        float v;
        uint32_t used;
        int32_t k;
    } * vic; /* (n_head_kv, vic_cap) miss victims in order */
    size_t vic_cap;
    struct lr_hq {
        int64_t rows, next_i;
        int n_miss, next, n_vic, slot_err;
    } * hq;                 /* (n_head_kv) a step's
                          * state per head between choosing (over the pool) and rebuilding (backend) */
    int64_t bch;            /* chunks one LR_KEYS batch holds (lr_batch_chunks); a full layer's misses take several */
    float *bcf, *bkb, *bmw; /* per KV head (bch * chunk, r_max), (bch * chunk, head_dim); (2, head_dim) */
    float *bcs;             /* per KV head (bch * chunk, n_rot) the rebuilt rows' cos, sin */
    int32_t *bpos, *bmiss;  /* per KV head (bch * chunk), (bch) slots rebuilt */
    float *parts;           /* (n_head_kv * 4, LR_WMAX, head_dim + 2) split decode tasks' states */
    float *qdot;            /* (n_head_kv, LR_SPARSE_MAX_Q * grp, cap_chunks) selection's q·landmark */
    float *score;           /* (n_head_kv, cap_chunks) landmark scores (the first phase) */
} lr_decode;

typedef struct rk_kv_codec rk_kv_codec;
typedef struct lr_tier lr_tier;
struct rk_kv_codec {
    rk_lowram_params p; /* resolved (every 0 default filled in) */
    int n_layer, n_head, n_head_kv, hd, kvd, n_rot, rope_mode;
    int n_group, r_max, D_max;
    int64_t n_ctx, cap_chunks;
    size_t res_bytes; /* bytes of one residual row (one head) */
    size_t kc_row;    /* bytes of one key-cache row (one head): f16 2·head_dim, int8 2 + head_dim */
    int sc_ld;        /* row stride of lr_scratch.sc and rows of kb / vb: max(chunk, LR_RUN) (decode
                           * attends runs of consecutive fine chunks as one block) */
    bool wide;        /* bases and predictors stored f32 (coef f32: the checking setup), else f16 */
    rk_backend *be;   /* borrowed: attention over exact rows before the fit, row conversion */
    lr_group *g;      /* (n_group) */
    lr_layer *ly;     /* (n_layer) */
    bool fitted;
    double prefit_s; /* seconds of lr_prefit inside the eval that fits */
    /* the chunks' f16 mean coefficients (lr_group.cmean) are kept: only the summary rows
     * (summ, csumm) and the device op read them; off, they are neither written nor counted and
     * lr_cmean_need rebuilds them from the coefficient rows (bit for bit) when a reader appears */
    bool cmean_on;
    int64_t comp_end; /* positions [n_sink, comp_end) are compressed or evicted */
    int64_t n_past;   /* committed rows (the session's n_past after the last commit) */
    int64_t n_evicted;
    /* exact rows, owned here (nothing else holds a copy): before the fit every row lives in
     * xk / xv from position x0 = 0; once fitted the sinks move to sk / sv and xk / xv hold
     * [comp_end, ...) only: the window and the rows of the eval in progress */
    uint32_t exact_type; /* RK_DT_F16 or RK_DT_F32 */
    size_t xrow;         /* bytes of one exact row (kv_dim) */
    uint8_t **xk, **xv;  /* (n_layer) of (x_cap, kv_dim): position p at row p - x0 */
    int64_t *x_hi;       /* (n_layer) one past the last position held */
    int64_t x0, x_cap;
    int64_t x_peak;     /* most exact rows one layer has held at once (high-water mark) */
    uint8_t **sk, **sv; /* (n_layer) of (n_sink, kv_dim) while fitted, else NULL */
    /* (n_rot / 2) RoPE frequencies of the model's RoPE in effect (rk_rope_freqs: linear and
     * YaRN scaling included). The codec's pre-RoPE keys are the stored keys rotated back
     * without dividing out YaRN's mscale (a constant factor on every key, which commutes with
     * the rotation), so rebuilding K = RoPE(mean + C·B) is a pure rotation: no kernel applies
     * mscale, and only reads of pre-RoPE rows (lowram_read) divide it out. */
    double *freq;
    double rope_ms;      /* the model's mscale on cos / sin (rk_rope_mscale; 1 without YaRN) */
    rk_rope_params rope; /* the model's RoPE in effect, for RK_OP_LR_KEYS's own angles */
    /* RoPE angles by angle addition (p = hi * LR_ROPE_LO + lo): cos, sin pairs of hi * LR_ROPE_LO
     * (rope_hi, one row per LR_ROPE_LO positions of the context) and of lo (rope_lo): 1/LR_ROPE_LO
     * of a table per position, plus LR_ROPE_LO rows */
    float *rope_hi, *rope_lo; /* (n_ctx / LR_ROPE_LO + 1, n_rot), (LR_ROPE_LO, n_rot) */
    int64_t rope_filled;      /* positions the state has reached (kept for the export format) */
    /* observed queries (post-RoPE) of the last obs_window rows of each layer */
    double *qsq;      /* (n_layer, kv_dim) Σ q² of prefill queries per KV-head dim, pairs averaged */
    float *obs_q;     /* (n_layer, obs_window, n_head * head_dim) ring */
    int64_t *obs_pos; /* (n_layer, obs_window) */
    int32_t *obs_n;   /* (n_layer) rows seen (ring index = n % obs_window) */
    /* predictor file */
    rk_mapping pmap;
    rk_gguf *pgguf;
    int32_t prank; /* basis rows in the file */
    rk_pool *pool; /* the backend's (own_pool false) or the codec's own */
    bool own_pool;
    int n_threads;
    lr_scratch *scr; /* (n_threads), built after the fit */
    lr_cwork *cw;    /* (n_threads), built after the fit */
    size_t scratch_bytes;
    lr_decode dec; /* sparse decode's per-step state (lowram_keys.c, lowram_attn.c) */
    bool isa_base; /* attention by the baseline build of its phases even on an AVX2 CPU (tests) */
    int kc_spare;  /* key-cache slots per (layer, KV head) beyond the budget (lr_kc_spare, at allocation) */
    float rope_base;
    uint32_t epoch;        /* bumped when stored rows change under the key cache (truncation) */
    uint32_t n_calls;      /* attention calls, for the key cache's LRU */
    rk_lowram_stats stats; /* its value_r2 and sel_miss pointers stay NULL: the arrays are below */
    float *sel_miss;       /* (n_layer) the fit's missed share per layer (-1: not measured) */
    float *r2;             /* (n_layer, n_head_kv) the predictors' R², filled when stats are read */
    struct lr_tier *tier;  /* lowram_tier.c: cold rows' pages under a KV budget (NULL: no budget) */
    uint8_t *dk, *dv;      /* lowram_dense.c: one layer's rows rebuilt for a long eval, (d_cap, kv_dim) */
    int64_t d_cap;
    int64_t n_dense; /* calls that took that path (tests) */
};

/* ---- lowram_dense.c ------------------------------------------------------------ */
/* True when layer l's long eval of n_q rows takes the rebuild-once path: fitted, no
 * eviction, not the rowattn ablation, n_q at least a few tens of rows. */
bool lr_dense_wanted(const rk_kv_codec *c, int l, int64_t n_q);
/* Attention of n_q query rows at pos0 over every row of layer l, the compressed ones
 * rebuilt into c->dk / c->dv, by the backend's ATTN. */
rk_status lr_dense_attend(const rk_kv *kv, rk_kv_codec *c, int l, const float *q, int64_t n_q, int64_t pos0, float *out,
                          rk_err *err);
/* Frees the rebuilt rows (after each eval: they never outlive it). */
void lr_dense_free(rk_kv_codec *c);

/* ---- lowram_fit.c -------------------------------------------------------------- */
/* Fits basis and predictors on rows [n_sink, n_past), compresses [n_sink, n_past - window),
 * allocates the attention scratch, then drops the compressed rows' exact copies. On
 * failure nothing is dropped and the codec stays unfitted. */
rk_status lr_fit(rk_kv_codec *c, int64_t n_past, rk_err *err);
/* Marks the full layers (full_layers) from stats.sel_miss, measured by the fit. */
void lr_choose_full(rk_kv_codec *c);
/* Inside a layer-major eval that will end at n_past rows and fit there (lr_fit_due): the
 * groups whose layers all lie below l_end are fitted and compressed now, and the pages of
 * their exact rows [max(sinks, n_before), n_past - window) are given back to the system, so
 * the exact prompt of every layer never coexists with the compressed one. Rows from before
 * the eval (< n_before) stay: a failed eval truncates back to them (lr_prefit_undo). lr_fit
 * at the commit does the other groups and finishes. */
rk_status lr_prefit(rk_kv_codec *c, int l_end, int64_t n_past, int64_t n_before, rk_err *err);
/* The commit at n_past rows will fit (the conditions of lowram_commit) */
bool lr_fit_due(const rk_kv_codec *c, int64_t n_past);
/* Forgets groups fitted by lr_prefit of an eval that failed (the codec is not fitted) */
void lr_prefit_undo(rk_kv_codec *c);
/* (Re)allocates group g's arrays for its rank g->r (and its layers' and heads'); n_rows = 0. */
bool lr_group_alloc(rk_kv_codec *c, lr_group *g);

/* ---- lowram_store.c ------------------------------------------------------------ */
/* Encodes n values as one stored row of `type` (F32, F16, Q8_0: int8, Q4_0: int4) into
 * dst, and writes back into v what decoding gives. */
void lr_encode_row(uint32_t type, float *v, int n, uint8_t *dst);
/* Stacked pre-RoPE keys of group g at position p (an exact row): x (D). */
void lr_stacked_key(const rk_kv_codec *c, const lr_group *g, int64_t p, float *x);
/* Coefficients cf (n, r) of the stacked keys x (n, D, destroyed) on basis B (r, D) as f32. */
void lr_project(const lr_group *g, const float *B, int n, float *x, float *cf);
/* f32 copies (malloc'd) of the group's basis (r, D) and its layers' predictors (n_l, r, kv_dim). */
bool lr_working_copies(const rk_kv_codec *c, const lr_group *g, float **B, float **W);
/* Residuals of layer li of group g for n rows at positions pos with dequantised coefficients
 * cq (n, r): row a's encoded head h at enc + a*enc_stride + h*res_bytes (enc may be NULL),
 * ||δ_h||² at e2[a*e2_stride + h]. v, vh: (n, kv_dim) scratch; v ends holding δ. */
void lr_residuals(const rk_kv_codec *c, const lr_group *g, const float *W, int li, int n, const int64_t *pos,
                  const float *cq, float *v, float *vh, uint8_t *enc, size_t enc_stride, float *e2, size_t e2_stride);
/* Appends stored row p to group g: encoded coefficients, their dequantised values cq,
 * per (layer, head) an encoded residual or NULL; updates masks and chunk landmarks.
 * tmp: kv_dim scratch. */
void lr_append_row(rk_kv_codec *c, lr_group *g, int64_t p, const uint8_t *coef_row, const float *cq,
                   const uint8_t *const *res, float *tmp);
/* Chunk mean coefficients of group g, every stored chunk, into dst (n_ch, r) f16, from the
 * coefficient rows (the same float sums as appending). */
rk_status lr_cmean_fill(const rk_kv_codec *c, const lr_group *g, uint16_t *dst, rk_err *err);
/* Turns cmean_on on, filling every fitted group's chunk means first (RK_E_NOMEM: still off). */
rk_status lr_cmean_need(rk_kv_codec *c, rk_err *err);
/* Writes the open (partial) chunk's f16 means after a run of lr_append_row calls. */
void lr_append_close(rk_kv_codec *c, lr_group *g);
/* Compresses exact rows [c->comp_end, end) with the fitted basis and predictors. */
rk_status lr_compress(rk_kv_codec *c, int64_t end, rk_err *err);
/* Forgets stored rows at positions >= pos (the session was truncated to pos). */
void lr_truncate(rk_kv_codec *c, int64_t pos);
/* Coefficients the value predictor uses (its rows past them are 0): value_rank, capped at r. */
static inline int lr_vr(const rk_kv_codec *c, const lr_group *g) {
    return c->p.value_rank > 0 && c->p.value_rank < g->r ? c->p.value_rank : g->r;
}

/* Chunks sparse decode attends per query and KV head in layer l: every chunk in a full
 * layer (full_layers), early_budget's in the range [el0, el1), budget's elsewhere; at most
 * the context's (then its keys are all in the key cache). lr_n_sel_max: the most of any
 * layer (the decode scratch's size). */
static inline int64_t lr_n_sel(const rk_kv_codec *c, int l) {
    if (c->ly && c->ly[l].full) return c->cap_chunks;
    const int64_t b =
        c->p.early_budget > 0 && l >= c->p.early_l0 && l < c->p.early_l1 ? c->p.early_budget : c->p.budget;
    const int64_t n = (b + c->p.chunk - 1) / c->p.chunk;
    return n < c->cap_chunks ? n : c->cap_chunks;
}
static inline int64_t lr_n_sel_max(const rk_kv_codec *c) {
    int64_t n = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const int64_t k = lr_n_sel(c, l);
        n = k > n ? k : n;
    }
    return n;
}
/* Chunks one key-rebuild batch of sparse decode holds: the most any budgeted (not full)
 * layer chooses, at least LR_BATCH_MIN, at most the context's. A full layer's first step
 * (every chunk missing) rebuilds in several batches, so the batch does not grow with the
 * context. kbatch= (p.key_batch) sets it. */
#define LR_BATCH_MIN 64
static inline int64_t lr_batch_chunks(const rk_kv_codec *c) {
    int64_t n = LR_BATCH_MIN;
    if (c->p.key_batch > 0) return c->p.key_batch < c->cap_chunks ? c->p.key_batch : c->cap_chunks;
    for (int l = 0; l < c->n_layer; l++) {
        if (c->ly && c->ly[l].full) continue;
        const int64_t k = lr_n_sel(c, l);
        n = k > n ? k : n;
    }
    return n < c->cap_chunks ? n : c->cap_chunks;
}

/* Spare key-cache slots per (layer, KV head): kslots= (p.kc_extra) when set, else
 * LR_KC_SPARE_ROWS rows' worth of chunks or one in LR_KC_SPARE_DIV of the compressed chunks
 * now, whichever is more (results do not depend on it: a miss rebuilds the same keys). */
static inline int lr_kc_spare(const rk_kv_codec *c) {
    if (c->p.kc_extra > 0) return c->p.kc_extra;
    int64_t rows = 0;
    for (int gi = 0; gi < c->n_group; gi++) rows = c->g[gi].n_rows > rows ? c->g[gi].n_rows : rows;
    const int64_t by_rows = (LR_KC_SPARE_ROWS + c->p.chunk - 1) / c->p.chunk;
    const int64_t by_chunks = (rows + c->p.chunk - 1) / c->p.chunk / LR_KC_SPARE_DIV;
    return (int)(by_chunks > by_rows ? by_chunks : by_rows);
}

/* ---- exact rows (lowram_store.c) ----
 * Row p of layer l (keys or values) as stored: sinks while fitted, else xk / xv at p - x0
 * (inline: attention calls it per row). */
static inline const uint8_t *lr_exact_ptr(const rk_kv_codec *c, int l, bool values, int64_t p) {
    if (p < c->x0) return (values ? c->sv : c->sk)[l] + (size_t)p * c->xrow; /* only sinks lie below x0 */
    return (values ? c->xv : c->xk)[l] + (size_t)(p - c->x0) * c->xrow;
}
/* Makes room for positions up to end (exclusive) in every layer's xk / xv. */
bool lr_exact_reserve(rk_kv_codec *c, int64_t end);
/* After a fit or a compression: drops exact rows [n_sink, comp_end) (their compressed form
 * is the only one now): the sinks go to sk / sv, xk / xv start at comp_end. shrink: give
 * the memory of the dropped rows back (after the fit). False on allocation failure,
 * nothing changed. */
bool lr_exact_compact(rk_kv_codec *c, bool shrink);
/* Back to unfitted storage with rows [0, n) held (n <= n_sink): sinks return to xk / xv. */
void lr_exact_unfit(rk_kv_codec *c, int64_t n);
/* Allocates sk / sv (contents undefined); false on allocation failure. */
bool lr_exact_sinks(rk_kv_codec *c);
void lr_exact_free(rk_kv_codec *c);
/* Records that the state reached position n (the angles come from lr_rope_cs). */
void lr_rope_fill(rk_kv_codec *c, int64_t n);
/* RoPE angles, at most LR_ROPE_MAX rotary dims: cs[2i], cs[2i+1] = cos, sin of p * freq[i]. */
enum { LR_ROPE_LO = 64, LR_ROPE_MAX = 1024 };
static inline void lr_rope_cs(const rk_kv_codec *c, int64_t p, float *cs) {
    const float *a = c->rope_hi + (size_t)(p / LR_ROPE_LO) * c->n_rot,
                *b = c->rope_lo + (size_t)(p % LR_ROPE_LO) * c->n_rot;
    for (int i = 0; i < c->n_rot; i += 2) {
        cs[i] = a[i] * b[i] - a[i + 1] * b[i + 1];
        cs[i + 1] = a[i + 1] * b[i] + a[i] * b[i + 1];
    }
}
/* Reads exact row p of layer l (keys post-RoPE, or values) as f32 into dst (kv_dim). */
void lr_plain_row(const rk_kv_codec *c, int l, bool values, int64_t p, float *dst);
/* Rotates the kv_dim row x (n_head_kv heads) at position p: inverse = true un-rotates. */
void lr_rope_row(const rk_kv_codec *c, float *x, int n_heads, int64_t p, bool inverse);
/* One stored row of n values into f32: f32, f16, int8 (f16 scale, then n int8) or q4_0-style
 * (RK_DT_Q4_0: f16 scale, then n/2 bytes, low nibble first, offset 8); each value one product
 * q·scale, the AVX2 path bit for bit the scalar one. */
void lr_decode_row(uint32_t type, const uint8_t *src, int n, float *dst);
/* Dequantises n coefficient rows of group g starting at stored row i0 into dst (n, r). */
void lr_coef_rows(const rk_kv_codec *c, const lr_group *g, int64_t i0, int64_t n, float *dst);
/* Block [r0, r0+nr) x [c0, c0+nc) of a stored (basis or predictor) matrix with rows of ld
 * elements, as f32 into dst (nr, nc); and the rounding store of a whole f32 matrix. */
void lr_mat_f32(const rk_kv_codec *c, const void *m, size_t ld, int r0, int nr, int c0, int nc, float *dst);
void lr_mat_store(const rk_kv_codec *c, void *m, size_t n, const float *src);
/* Dequantises residual slot j of (layer, head) into dst (head_dim). */
void lr_res_row(const rk_kv_codec *c, const lr_head *h, int64_t j, float *dst);

/* ---- lowram_attn.c (lowram_task.h: its phases) ---------------------------------- */
rk_status lr_attention(rk_kv_codec *c, int layer, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err);
/* Brings layer l's value summaries (L->vsm) up to its stored chunks; false on allocation
 * failure (decode then sums coefficients instead). */
bool lr_vsum_update(rk_kv_codec *c, int l);
/* Brings layer l's coarse landmarks (L->clmk, coarse=G) up to its stored chunks; false on
 * allocation failure (the selection is then one level). */
bool lr_coarse_update(rk_kv_codec *c, int l);
/* ---- lowram_scratch.c ---------------------------------------------------------- */
/* Allocates per-thread scratch once ranks are known. */
rk_status lr_scratch_alloc(rk_kv_codec *c, rk_err *err);
void lr_scratch_free(rk_kv_codec *c);

/* ---- lowram_file.c ------------------------------------------------------------- */
/* Maps and checks the predictor file named in c->p (fingerprint, group size, dims). */
rk_status lr_pred_open(rk_kv_codec *c, const rk_model *m, char *warning, size_t cap, rk_err *err);
/* Group g's mean (D) and first r basis rows from the file; per layer W rows (first r) and b. */
bool lr_pred_basis(const rk_kv_codec *c, int g, int r, float *mean, float *basis);
bool lr_pred_value(const rk_kv_codec *c, int l, int r, float *W, float *b);
/* The file's eigenvalues of group g (prank of them) into w. */
bool lr_pred_eig(const rk_kv_codec *c, int g, double *w);

/* ---- lowram.c / lowram_io.c ---------------------------------------------------------------- */
/* A codec for kv's shape with resolved parameters p, no pool and no predictor file (those
 * are the caller's to add). */
rk_status lr_codec_new(const rk_kv *kv, const rk_lowram_params *p, int n_threads, rk_kv_codec **out, rk_err *err);
/* Frees what a fit allocated (stores, work areas); a reset and lr_codec_free call it. */
void lr_fit_release(rk_kv_codec *c);
void lr_codec_free(rk_kv_codec *c);
/* Every resolved parameter a state depends on, as block parameters. */
int lr_params(const rk_kv_codec *c, rk_kv_param *out);
/* Whole-state export (rows [0, n_past)) and import into a codec holding no rows. */
rk_status lr_export(const rk_kv_codec *c, rk_kv_buf *out, rk_err *err);
rk_status lr_import(rk_kv_codec *c, const rk_kv *kv, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err);
