/* Block-sparse causal attention (RK_OP_ATTN with rk_op_args.attn_sparse set; host backends).
 *
 * Keys and queries are cut into blocks of `block` positions (block j covers positions
 * [j*block, (j+1)*block)). A query block attends only to the key blocks its mask selects; the
 * first n_sink key rows' blocks and the blocks within `window` positions before the query
 * block's start (its own block included) are always selected. The mask is either given
 * (`mask`, tests and tools) or estimated from the call itself, per query head:
 *   1. the last n_est query rows of the sparse part attend exactly over every visible key;
 *   2. their probabilities are summed per key column (vertical lines: the same key for every
 *      query) and per diagonal offset pos(q) - pos(k) (slash lines: the same distance);
 *   3. a lazy greedy picks the column or diagonal with the largest not-yet-covered mass
 *      until the estimating rows' covered mass (sinks and window count as covered) reaches
 *      `mass` (head_mass[h] when given) of their total;
 *   4. columns select their key block in every query block; a diagonal offset d selects the
 *      one or two key blocks its line crosses in each query block.
 * Query rows at positions >= dense_from, and whole calls that are short (the sparse part's
 * last row sees fewer than min_kv keys, or it has no more than n_est rows), run the dense
 * kernel unchanged (bit for bit). Calls with positioned rows (attn_kv_pos) run dense. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* Counters a sparse call adds to (host memory; the caller zeroes them). A query block's
 * causal key blocks are those at or before it. */
typedef struct rk_attn_sparse_stats {
    uint64_t calls_sparse, calls_dense; /* calls (or their parts) run sparse, run dense */
    uint64_t blocks_done;               /* (query block, head, key block) triples computed */
    uint64_t blocks_causal;             /* ... of the causal triples of the sparse parts */
    uint64_t blocks_forced;             /* ... of those, the sinks' and the window's */
} rk_attn_sparse_stats;

/* Calibration (host memory, optional): per head, for each kept-mass threshold tau[t]
 * (increasing), the exact attention mass that the mask built at that threshold covers,
 * summed over every `stride`-th query row of the sparse part: cover[h * n_tau + t]; rows[h]
 * counts the rows. Computing it costs about one dense attention of those rows. */
#define RK_SPARSE_MAX_TAU 16
typedef struct rk_attn_sparse_cal {
    int n_tau;
    const float *tau;
    int stride;
    double *cover; /* (n_head, n_tau) */
    double *rows;  /* (n_head) */
} rk_attn_sparse_cal;

typedef struct rk_attn_sparse {
    int32_t block;          /* rows of a query or key block (> 0) */
    int64_t min_kv;         /* sparse only when the sparse part's last row sees >= min_kv keys */
    int64_t dense_from;     /* query rows at positions >= dense_from run dense (INT64_MAX: none) */
    int32_t n_sink;         /* first key rows every query sees */
    int32_t window;         /* key rows within this distance before a query block always seen */
    int32_t n_est;          /* last rows of the sparse part that estimate the pattern (> 0) */
    float mass;             /* kept attention mass of the estimating rows, in (0, 1] */
    const float *head_mass; /* (n_head) per-head mass, or NULL: mass for every head */
    /* (n_qb, n_head, n_kb) given mask, or NULL: estimated. Query block b of the sparse part
     * is the b-th block from pos0 / block; n_kb = (last sparse position) / block + 1;
     * nonzero selects (sinks, window and causality are applied on top). */
    const uint8_t *mask;
    rk_attn_sparse_stats *stats;   /* NULL: none */
    const rk_attn_sparse_cal *cal; /* NULL: none */
} rk_attn_sparse;
