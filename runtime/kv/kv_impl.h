/* Internal: rk_kv, the one KV-cache interface. The session holds one rk_kv, its policy
 * fixed at creation (rk_session_params.kv); the layer loop appends every layer's post-RoPE
 * K and V rows and asks the cache to attend, whatever the cache stores, and never asks which
 * policy it holds: what differs between caches is in the capability fields of rk_kv_ops.
 *   kv_plain.c  f16 / f32 rows; append and attention are the backend's CPY_ROWS and ATTN
 *   kv_q8.c     llama.cpp's q8_0 / q4_0 blocks (f16 scale + 32 codes per 32 values); ATTN on the
 *               blocks when the backend takes them, else f32 ATTN over dequantised rows
 *   kv_tier.c   f16 / f32 / q8_0 rows in host memory under a budget, the rest spilled
 *   kv_dev.c    f16 / f32 rows on a backend with its own memory under a budget (GPU KV tiers)
 *   lowram*.c   the LowRAM codec: exact rows (sinks, window, rows of the current eval) in
 *               its own buffers, older rows only compressed
 *   kv_stage.c  a host-memory cache behind a backend with its own memory: the host<->device
 *               staging of K, V, q and the attention output; with LowRAM, its fused device
 *               decode attention (lowram_dev.c)
 *   kv.c        creation, the codec thread pool, RoPE undo, byte buffers
 *   kv_block.c  export / import blocks: header, checksum, every check before any change
 * Rows are (kv_dim = n_head_kv * head_dim) wide; keys are stored post-RoPE. */
#pragma once
#include "rk_ext.h"
#include "rk_kernels.h"

typedef struct rk_kv rk_kv;

/* ---- byte buffers for export / import ------------------------------------------------ */
/* Growing output buffer; an allocation failure sets fail and turns later puts into no-ops
 * (the writer checks fail once at the end). Little-endian.
 * With a sink, p is a fixed window of cap bytes (the caller's): a put that does not fit
 * hands the window's bytes, then a put of cap bytes or more its own, to sink, so that a
 * payload of any size streams through bounded memory (rk_kv_flush hands the rest). With
 * dry, a put only counts: total is the payload's size, nothing is copied. total counts
 * every byte put, in every mode. */
typedef struct rk_kv_buf {
    uint8_t *p;
    size_t n, cap;
    bool fail, dry;
    uint64_t total;
    void (*sink)(void *ctx, const uint8_t *p, size_t n);
    void *ctx;
} rk_kv_buf;
void rk_kv_put(rk_kv_buf *b, const void *src, size_t n);
void rk_kv_flush(rk_kv_buf *b);
void rk_kv_put_u32(rk_kv_buf *b, uint32_t v);
void rk_kv_put_u64(rk_kv_buf *b, uint64_t v);
void rk_kv_put_f64(rk_kv_buf *b, double v);

/* Bounds-checked reader: a get past the end sets fail and returns NULL / 0, so a parser
 * checks fail once per section. Sizes are checked with overflow-safe forms. */
typedef struct rk_kv_rd {
    const uint8_t *p;
    size_t n, off;
    bool fail;
} rk_kv_rd;
const uint8_t *rk_kv_get(rk_kv_rd *r, size_t n);
/* Like rk_kv_get for count elements of size bytes each (false product overflow -> fail). */
const uint8_t *rk_kv_get_n(rk_kv_rd *r, uint64_t count, size_t size);
uint32_t rk_kv_get_u32(rk_kv_rd *r);
uint64_t rk_kv_get_u64(rk_kv_rd *r);
double rk_kv_get_f64(rk_kv_rd *r);

/* A policy parameter that an imported block must match (name at most 15 chars). */
typedef struct rk_kv_param {
    char name[16];
    double value;
} rk_kv_param;
enum { RK_KV_MAX_PARAMS = 32 };

/* ---- the interface -------------------------------------------------------------------- */
/* Where the rows that append takes and attention reads live (k, v, q, out of the ops). */
typedef enum rk_kv_mem {
    RK_KV_MEM_HOST,    /* host memory: the cache runs on the host (its own code, or a host backend) */
    RK_KV_MEM_BACKEND, /* the backend's activation buffers (device memory on a backend with its own;
                        * host memory on a CPU backend) */
} rk_kv_mem;

typedef struct rk_kv_ops {
    const char *name;
    /* ---- capabilities and residency: what a caller asks instead of the policy's name ---- */
    rk_kv_mem mem;   /* where append / attend take their rows; rk_kv_create hands a session on a
                      * backend with its own memory only RK_KV_MEM_BACKEND caches (a host cache
                      * goes behind kv_stage.c, which moves the rows) */
    bool writable;   /* held rows can be rewritten in place: an append at pos0 below the held rows
                      * replaces rows [pos0, pos0 + n) and keeps the rows after them (the
                      * re-scoring prefill rewrites kept rows so). False: compressed or tiered
                      * rows (write may still take some rows, or answer RK_E_UNSUPPORTED) */
    bool recordable; /* a decode step's append and attend are backend ops on fixed buffers, with no
                      * host work and no transfer: the step can run as one recorded unit (CUDA
                      * graphs, rk_backend_step_begin) */
    /* Stores post-RoPE keys k and values v, (n, kv_dim) f32, of layer l at positions
     * pos0..pos0+n-1. pos0 is at most the rows the layer holds (rows from pos0 on are
     * replaced). Layers fill independently: a layer-major prefill appends all rows of
     * layer 0 before layer 1. */
    rk_status (*append)(rk_kv *kv, int layer, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err);
    /* Causal attention of query rows q (n_q, n_head * head_dim), post-RoPE, at positions
     * pos0.. of layer l: row i sees rows [0, pos0 + i] of the layer (already appended);
     * query head h uses KV head h / (n_head / n_head_kv). out (n_q, n_head * head_dim). */
    rk_status (*attend)(rk_kv *kv, int layer, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err);
    /* End of a successful eval call: rows [0, n_past) of every layer are appended and now
     * belong to the session (LowRAM fits / compresses here). On failure the caller
     * truncates back to the rows committed before. */
    rk_status (*commit)(rk_kv *kv, int64_t n_past, rk_err *err);
    /* Forgets rows >= n of every layer (n <= kv->n_past, or n = kv->n_past to drop the rows
     * of a failed eval). */
    void (*truncate)(rk_kv *kv, int64_t n);
    /* Forgets every row and what was learnt from them (LowRAM: the fit). */
    void (*reset)(rk_kv *kv);
    /* Rows [row0, row0 + n) of layer l as f32 into dst (n, kv_dim): what attention sees.
     * Keys with pre_rope have the rotation undone. Rows must be held (appended). */
    rk_status (*read)(const rk_kv *kv, int layer, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                      rk_err *err);
    /* Replaces held rows [row0, row0 + n) of layer l (keys post-RoPE) with src (n, kv_dim);
     * RK_E_UNSUPPORTED where the policy cannot (compressed rows). */
    rk_status (*write)(rk_kv *kv, int layer, bool values, int64_t row0, int64_t n, const float *src, rk_err *err);
    /* Bytes of the state of the kv->n_past committed rows, by part. */
    void (*bytes)(const rk_kv *kv, rk_kv_bytes *out);
    /* LowRAM's fit statistics; NULL for the other policies (zeros). */
    void (*stats)(const rk_kv *kv, rk_lowram_stats *out);
    /* The parameters a block's payload depends on (written in its header, compared at import);
     * returns how many were written to out (at most RK_KV_MAX_PARAMS). */
    int (*params)(const rk_kv *kv, rk_kv_param *out);
    /* Appends the payload of rows [row0, row1) (row1 <= n_past) in the policy's own encoding. */
    rk_status (*export_rows)(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err);
    /* Bytes export_rows appends for rows [row0, row1), known without making them; NULL: the
     * size is the encoding's (a streaming export counts it with a dry pass first). */
    uint64_t (*export_bytes)(const rk_kv *kv, int64_t row0, int64_t row1);
    /* Streaming import of the rows encoding (per layer its K rows, then its V rows: the
     * payload rk_kv_rows_export makes): writes n rows of layer l's keys (values) from p (n
     * rows of row_bytes) at rows [row0, row0 + n), all >= n_past, after checking them
     * (RK_E_FORMAT). n_past does not move: rows past it are not held until the importer
     * sets it, so a failure leaves nothing changed. NULL: the policy takes its payload
     * whole (import_rows). */
    rk_status (*import_part)(rk_kv *kv, int layer, bool values, int64_t row0, int64_t n, const uint8_t *p, rk_err *err);
    /* Appends rows [row0, row0 + n_rows) (row0 = kv->n_past) from a payload made by
     * export_rows; checks all of it first: on failure nothing changed (RK_E_FORMAT).
     * Sets kv->n_past = row0 + n_rows. */
    rk_status (*import_rows)(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err);
    /* Frees kv->impl (any state, half-built included); not kv itself. */
    void (*destroy)(rk_kv *kv);
    /* The memory tiers' counters (kv_tier.c); NULL for the other policies (zeros). */
    void (*tier_stats)(const rk_kv *kv, rk_kv_tier_stats *out);
    /* Staged prefill: for an eval that will end at n_past rows, the layer boundaries (at most
     * max, increasing, each in (0, n_layer)) after which the policy wants layers_done; 0: run
     * the eval chunk-major as usual. NULL: never. (LowRAM: the eval that fits compresses its
     * layer groups as the prefill finishes them, so the exact prompt of every layer never
     * coexists with its compressed form.) */
    int (*stages)(const rk_kv *kv, int64_t n_past, int *ends, int max);
    /* Staged prefill: every layer below l_end holds rows [0, n_past) of the eval that began at
     * n_before; the policy may compress them now. On failure the eval fails (truncate). */
    rk_status (*layers_done)(rk_kv *kv, int l_end, int64_t n_past, int64_t n_before, rk_err *err);
    /* End of an eval's layer passes, before commit: rows the cache kept aside during the eval
     * (a fused device step's K / V, kv_stage.c) reach its store. NULL: nothing kept aside.
     * On failure the eval fails (truncate). */
    rk_status (*flush)(rk_kv *kv, rk_err *err);
} rk_kv_ops;

/* Attention calls of a cache with a fused device path (LowRAM behind kv_stage.c): those
 * the fused op ran, and those staged through host memory; zeros for other caches. */
typedef struct rk_kv_counters {
    uint64_t fused_attn, staged_attn;
} rk_kv_counters;

struct rk_kv {
    const rk_kv_ops *ops;
    rk_kv_kind kind;
    int n_layer, n_head, n_head_kv, head_dim, kv_dim, n_rot, rope_mode;
    float rope_base;
    double *rope_freq;   /* (n_rot/2) angle per position of the RoPE in effect (rk_rope_freqs) */
    double rope_mscale;  /* its factor on cos/sin (YaRN); rk_kv_unrope divides it out */
    rk_rope_params rope; /* the model's RoPE in effect at position 0 (scaling included) */
    int64_t n_ctx;
    int64_t n_past;   /* committed rows: set by commit, truncate, reset, import_rows */
    size_t row_bytes; /* one stored K (or V) row of one layer (LowRAM: an exact row) */
    rk_backend *be;   /* borrowed, the session's: attention and row conversion run on it */
    /* set by the layer loop around one attend call (NULL otherwise): the block-sparse layout
     * rk_kv_attn_args hands the backend's ATTN (host backends; rk_attn_sparse.h) */
    const struct rk_attn_sparse *attn_sparse;
    rk_kv_counters counters;
    void *impl;
};

/* ---- kv.c ------------------------------------------------------------------------------ */
/* Creates the cache of policy p for model m (borrowed, outlives the cache) with room for
 * n_ctx rows, on backend be (borrowed): LowRAM's unset options take the values for that
 * backend, and on a backend with its own memory the cache returned always takes its rows
 * there (ops->mem RK_KV_MEM_BACKEND: a host cache comes behind kv_stage.c). n_threads: the
 * session's (LowRAM's pool). warning (cap bytes): a note such as a predictor file fitted on
 * another quantisation, "" otherwise. */
rk_status rk_kv_create(const rk_model *m, const rk_kv_params *p, int64_t n_ctx, rk_backend *be, int n_threads,
                       char *warning, size_t warning_cap, rk_kv **out, rk_err *err);
void rk_kv_destroy(rk_kv *kv); /* accepts NULL and half-built caches */

/* The codec's thread pool: the backend's own (borrowed, *owned false) when it has
 * n_threads threads (0: all cores), else a pool of its own (*owned true), or none for one
 * thread. Pool jobs never run backend ops (rk_pool_run does not nest). */
rk_status rk_kv_pool_create(rk_backend *be, int n_threads, rk_pool **pool, bool *owned, int *n_out, rk_err *err);

/* Undoes RoPE in place on key row x (n_head_kv heads) at position p: the angles
 * p * rope_freq[i] of the RoPE in effect rotated back (double precision) and YaRN's mscale
 * divided out. */
void rk_kv_unrope(const rk_kv *kv, float *x, int64_t p);
/* Converts n rows of kv_dim between a plain type (F16, F32) and f32. */
void rk_kv_rows_to_f32(uint32_t type, const void *src, int64_t n, int64_t kv_dim, float *dst);
void rk_kv_rows_from_f32(uint32_t type, const float *src, int64_t n, int64_t kv_dim, void *dst);
/* Fields every policy shares: n_tokens, f16_equiv. */
void rk_kv_bytes_base(const rk_kv *kv, rk_kv_bytes *out);
/* Checks layer and row range [row0, row0 + n) against held rows; RK_E_INVALID_ARG otherwise. */
rk_status rk_kv_check_rows(const rk_kv *kv, int layer, int64_t row0, int64_t n, int64_t held, rk_err *err);

/* Policies: fill kv->ops, kv->impl, kv->row_bytes (kv's shape fields are set). */
/* ---- shared by the row caches (plain, q8): K and V rows per layer, (n_ctx, row_bytes) ---- */
/* commit / truncate / reset of a cache whose rows are simply overwritten */
rk_status rk_kv_rows_commit(rk_kv *kv, int64_t n_past, rk_err *err);
void rk_kv_rows_truncate(rk_kv *kv, int64_t n);
void rk_kv_rows_reset(rk_kv *kv);
/* ATTN args for q rows at pos0 (K/V views left for the caller). */
rk_op_args rk_kv_attn_args(const rk_kv *kv, const float *q, int64_t n_q, int64_t pos0, float *out);
/* Payload of rows [row0, row1): per layer its K rows then its V rows, as stored. */
void rk_kv_rows_export(const rk_kv *kv, uint8_t *const *k, uint8_t *const *v, int64_t row0, int64_t row1,
                       rk_kv_buf *out);
/* Its size: 2 n_layer (row1 - row0) row_bytes (rk_kv_ops.export_bytes of the rows policies). */
uint64_t rk_kv_rows_export_bytes(const rk_kv *kv, int64_t row0, int64_t row1);
/* The reverse at row0 after the size check (RK_E_FORMAT naming `what`); check (may be NULL)
 * vets the payload first. Sets kv->n_past = row0 + n_rows. */
rk_status rk_kv_rows_import(rk_kv *kv, uint8_t *const *k, uint8_t *const *v, int64_t row0, int64_t n_rows,
                            const uint8_t *p, size_t n, const char *what,
                            rk_status (*check)(const uint8_t *p, size_t n, rk_err *err), rk_err *err);

rk_status rk_kv_plain_init(rk_kv *kv, uint32_t type, rk_err *err);
/* kv_tier.c: f16 / f32 / q8_0 rows under p->budget (rk_kv_params), the rest spilled. */
rk_status rk_kv_tier_init(rk_kv *kv, uint32_t type, const rk_kv_params *p, rk_err *err);
rk_status rk_kv_q8_init(rk_kv *kv, rk_err *err);
rk_status rk_kv_q4_init(rk_kv *kv, rk_err *err);
/* kv_dev.c: the GPU KV tiers, f16 / f32 rows under p->budget on a backend with its
 * own memory (whole layers resident, the others in pinned host blocks moved on the copy
 * lane). takes: such a backend and a budget of at least two layers (else the host tier). */
bool rk_kv_dev_takes(const rk_kv *kv, uint32_t type, const rk_kv_params *p);
rk_status rk_kv_dev_init(rk_kv *kv, uint32_t type, const rk_kv_params *p, rk_err *err);
/* lowram_tier.c: lowram under p->budget (rk_kv_params): cold coefficient / residual rows spilled. */
rk_status rk_kv_lowram_tier_init(rk_kv *kv, const rk_model *m, const rk_kv_params *p, int n_threads, char *warning,
                                 size_t warning_cap, rk_err *err);
rk_status rk_kv_lowram_init(rk_kv *kv, const rk_model *m, const rk_lowram_params *p, int n_threads, char *warning,
                            size_t warning_cap, rk_err *err);

/* kv_stage.c: puts the host-memory cache *kv (ops->mem RK_KV_MEM_HOST) behind its backend's
 * own memory: *kv becomes a cache of RK_KV_MEM_BACKEND that downloads K, V and q, runs the
 * inner cache on the host and uploads the attention output; everything else goes to the
 * inner cache unchanged. lowram: the inner cache is LowRAM's, whose decode steps take the
 * fused device op where it applies (lowram_dev.c). On failure *kv is unchanged. */
rk_status rk_kv_stage_wrap(rk_kv **kv, bool lowram, rk_err *err);

/* lowram_dev.c: LowRAM's decode-time state in device memory and the fused LR_ATTN over it,
 * for the LowRAM cache kv (borrowed, outlives it) on kv->be. changed: after a commit
 * (rows_dropped false) or a truncation / reset / import (true). takes: the fused path can
 * run this attention (codec fitted, options the op has, at most 4 rows). append: a fused
 * step's K / V rows (device memory) into the device ring and a pending buffer; flush (after
 * the step, before the commit): one download of them appended to kv. attend: the fused op,
 * q / out device memory. */
typedef struct rk_lrdev rk_lrdev;
rk_status rk_lrdev_create(rk_kv *kv, rk_lrdev **out, rk_err *err);
void rk_lrdev_destroy(rk_lrdev *d);
void rk_lrdev_changed(rk_lrdev *d, bool rows_dropped);
bool rk_lrdev_takes(const rk_lrdev *d, int64_t n_q, int64_t pos0);
rk_status rk_lrdev_append(rk_lrdev *d, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err);
rk_status rk_lrdev_flush(rk_lrdev *d, rk_err *err);
rk_status rk_lrdev_attend(rk_lrdev *d, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err);

/* ---- kv_q8.c: the q8_0 block (llama.cpp's block_q8_0) --------------------------------- */
enum { RK_Q8_BLOCK = 32, RK_Q8_BLOCK_BYTES = 2 + RK_Q8_BLOCK };
/* Quantises n values (a multiple of 32) as llama.cpp's quantize_row_q8_0_ref does:
 * per block d = max|x| / 127 stored f16, q = round(x / d) (d from the unrounded scale). */
void rk_q8_quantize(const float *x, int64_t n, uint8_t *dst);
void rk_q8_dequantize(const uint8_t *src, int64_t n, float *dst);
/* q4_0 (llama.cpp's block_q4_0: f16 d, 16 bytes of codes; value j of a block in the low
 * nibble of byte j, value j + 16 in the high one, x = (code - 8) d). Quantised as
 * quantize_row_q4_0_ref: m = the value of largest magnitude, d = m / -8, code =
 * min(15, trunc(x / d + 8.5)). */
enum { RK_Q4_BLOCK = 32, RK_Q4_BLOCK_BYTES = 2 + RK_Q4_BLOCK / 2 };
void rk_q4_quantize(const float *x, int64_t n, uint8_t *dst);
void rk_q4_dequantize(const uint8_t *src, int64_t n, float *dst);
/* True when a q8 or q4 cache attends through the backend's own ATTN on its blocks (else: f32
 * ATTN over dequantised rows). */
bool rk_kv_quant_direct(const rk_kv *kv);

/* ---- kv_block.c ------------------------------------------------------------------------- */
/* Block = header (magic "RKKV", version, policy kind and parameters, model fingerprint,
 * n_layer, kv_dim, row range, checksum) + token ids of the rows + the policy's payload. */
rk_status rk_kv_block_export(const rk_kv *kv, const rk_model *m, const int32_t *tokens, int64_t row0, int64_t row1,
                             void **blk, size_t *n, rk_err *err);
/* Checks the whole block, then appends its rows at kv->n_past (= the block's row0) and
 * writes its token ids into tokens[row0..] (tokens: n_ctx entries). Nothing changes on
 * failure. */
rk_status rk_kv_block_import(rk_kv *kv, const rk_model *m, const void *blk, size_t n, int32_t *tokens, rk_err *err);
/* The same block, streamed: its bytes in order go to put(ctx, p, n) in pieces of at most
 * 1 MiB, the payload never whole in memory (a policy without export_bytes is exported
 * twice, the first time only counted). The block's checksum (bytes [16, 24), put as zero)
 * is known only at the end: *checksum gets it, little-endian, for the caller to write
 * there. */
typedef void (*rk_kv_sink)(void *ctx, const uint8_t *p, size_t n);
rk_status rk_kv_block_export_stream(const rk_kv *kv, const rk_model *m, const int32_t *tokens, int64_t row0,
                                    int64_t row1, rk_kv_sink put, void *ctx, uint8_t checksum[8], rk_err *err);
/* rk_kv_block_import of a block of n bytes read in order through pull(ctx, dst, len) (which
 * fills dst with the block's next len bytes, or fails naming why). A policy with
 * import_part takes its payload in pieces of at most 4 MiB into place; the others whole.
 * The checksum is compared at the end, before the rows are held: nothing changes on
 * failure. */
typedef rk_status (*rk_kv_pull)(void *ctx, uint8_t *dst, size_t len, rk_err *err);
rk_status rk_kv_block_import_stream(rk_kv *kv, const rk_model *m, uint64_t n, rk_kv_pull pull, void *ctx,
                                    int32_t *tokens, rk_err *err);
