/* Internal: the checkpoint hook of a prefill (rk_session.ckpt). prefill.c tells the hook where
 * an eval call stands after every chunk of a pass and asks it, once at the start of the call,
 * where to resume; the hook (runtime/cache/doc_ckpt.c) saves and restores the state that a
 * call carries between chunks. Only an eval call from row 0 through the plain passes
 * (chunk-major, or the layer-major fill phase and its late pass) reaches the hook. */
#pragma once
#include "session_impl.h"

/* Where a call stands: pass [lo, hi) of the call's n rows has finished rows [0, done) (the
 * passes before it every row). x_split (n, n_embd) is the pass's stream (NULL in a
 * chunk-major call); in a late pass it may be shrunk: rows [0, x_half_n) are then x_half
 * (f16) and x_split holds rows [x_half_n, n) (x_half_n 0: whole). q_keep (n_q floats) the
 * queries the question-aware selection collects during the first layer-major pass (NULL
 * otherwise). */
typedef struct rk_prefill_point {
    const int32_t *ids;
    int64_t n, bulk_end;
    int lo, hi, split;
    int64_t done;
    float *x_split;
    const uint16_t *x_half;
    int64_t x_half_n;
    float *q_keep;
    size_t n_q;
} rk_prefill_point;

typedef struct rk_prefill_ckpt {
    /* Start of a call from row 0 (pt: lo = hi = -1, done = 0, the buffers): when the hook holds
     * a checkpoint of this very call it restores the session's rows and prefill state and
     * the buffers, and sets lo, hi and done. An error fails the call. */
    rk_status (*resume)(struct rk_prefill_ckpt *ck, rk_session *s, rk_prefill_point *pt, rk_err *err);
    /* After a chunk: the hook may save a checkpoint; its failures are its own (never the call's). */
    void (*at)(struct rk_prefill_ckpt *ck, rk_session *s, const rk_prefill_point *pt);
} rk_prefill_ckpt;

/* fill_group.c: the grouped lists of a running fill prefill as a byte stream: its size, the
 * bytes in order to put(ctx, p, n), and back from n such bytes read in order through pull
 * into the session's lists (which rk_fill_group_begin made for the same call); RK_E_FORMAT
 * when the bytes do not fit them. Never a copy of the lists in memory. */
uint64_t rk_fill_group_bytes(const rk_session *s);
void rk_fill_group_write(const rk_session *s, void (*put)(void *ctx, const void *p, size_t n), void *ctx);
rk_status rk_fill_group_read(rk_session *s, uint64_t n,
                             rk_status (*pull)(void *ctx, uint8_t *dst, size_t len, rk_err *err), void *ctx,
                             rk_err *err);
