/* Memory tiers for the row caches (f16, f32, q8_0) under a byte budget
 * (rk_kv_params.budget; docs/TIERS.md).
 *
 * Rows live where the plain cache keeps them: per layer one K and one V array of n_ctx
 * rows, here anonymous mappings, cut into chunks of R = 256 rows. A chunk's pages are
 * either present or released (madvise DONTNEED of the pages wholly inside it: the memory
 * really goes back) while a zstd frame of the chunk sits in the block store
 * (io/include/rk_blockstore.h; an unlinked file in spill_dir, so nothing is left behind).
 * - Hot chunks never spill: the first (attention sinks) and the last two of each layer
 *   (the recent window, the chunk being filled).
 * - When a chunk leaves the window it is decided once: kept in memory while the budget
 *   (less the hot chunks' share) has room, else spilled. A spill keeps the pages until
 *   its write completed: a failed write (disk full) leaves the chunk in memory, counted.
 * - Attention of a layer needs every row: the spilled chunks of the layer are read back
 *   into their places (issued together, decompressed by the store), the backend's ATTN
 *   runs on the same arrays as the plain cache's (bit-identical results), then their
 *   pages are released again. After a layer's attention the next layer's spilled chunks
 *   are read ahead (up to the queue depth) so the reads overlap the rest of the layer.
 * With full attention every step reads every spilled chunk: the tier trades decode speed
 * for memory. A policy that selects chunks (LowRAM's) can hand the tier its compressed
 * chunks with the same put/get/release cycle and read only the selected ones; that
 * hand-off is not wired yet (docs/TIERS.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kv_impl.h"
#include "rk_blockstore.h"

enum { WINDOW_CHUNKS = 2, PAGE = 4096, QD = 32 };

typedef struct chunk {
    uint8_t present;  /* the pages hold the rows */
    uint8_t in_store; /* a frame in the store holds the rows */
    uint8_t keep;     /* decided to stay in memory */
    uint8_t decided;  /* the keep / spill decision is made */
    uint8_t put_pending, get_pending;
    uint8_t fetched;    /* present because it was read back */
    uint8_t prefetched; /* its read was issued ahead of its layer */
} chunk;

typedef struct tier {
    uint32_t type; /* RK_DT_F16, RK_DT_F32, RK_DT_Q8_0 */
    int64_t R, n_chunks;
    size_t chunk_bytes, map_bytes;
    uint8_t **k, **v; /* (n_layer) mappings of n_chunks * chunk_bytes */
    chunk *ch;        /* [n_layer][2][n_chunks] */
    int64_t *held;    /* rows held per layer */
    uint64_t budget, cold_budget, kept_bytes;
    int64_t n_present; /* chunks present now */
    int64_t n_put;     /* chunks being written (their pages held until the write completes) */
    rk_bs *bs;
    int pin_layer;
    bool q8_direct;
    float *sk, *sv; /* q8 fallback scratch */
    int64_t cap;
    char spill_dir[3072]; /* where the spill file is made (and remade on reset) */
    rk_bs_params bp;
    rk_bs_stats acc; /* of the spill files closed by resets */
    rk_status io_st; /* a failed read back (reported by the next attend) */
    char io_msg[240];
    rk_kv_tier_stats st;
} tier;

static chunk *CH(const tier *t, int l, int w, int64_t c) {
    return &t->ch[((size_t)l * 2 + (size_t)w) * (size_t)t->n_chunks + (size_t)c];
}
static uint8_t *DATA(const tier *t, int l, int w, int64_t c) {
    return (w ? t->v[l] : t->k[l]) + (size_t)c * t->chunk_bytes;
}
static uint64_t ID(const tier *t, int l, int w, int64_t c) {
    return ((uint64_t)l * 2 + (uint64_t)w) * (uint64_t)t->n_chunks + (uint64_t)c;
}

static void release(tier *t, int l, int w, int64_t c) {
    chunk *h = CH(t, l, w, c);
    if (!h->present) return;
    /* the pages wholly inside the chunk (a page shared with a neighbour stays) */
    const uintptr_t a = (uintptr_t)DATA(t, l, w, c), b = a + t->chunk_bytes;
    const uintptr_t a2 = (a + PAGE - 1) / PAGE * PAGE, b2 = b / PAGE * PAGE;
    if (b2 > a2) madvise((void *)a2, b2 - a2, MADV_DONTNEED);
    h->present = 0, h->fetched = 0, h->prefetched = 0;
    t->n_present--;
}

static void on_done(tier *t, const rk_bs_done *d) {
    const uint64_t per_layer = 2u * (uint64_t)t->n_chunks;
    const int l = (int)(d->id / per_layer), w = (int)((d->id % per_layer) / (uint64_t)t->n_chunks);
    const int64_t c = (int64_t)(d->id % (uint64_t)t->n_chunks);
    chunk *h = CH(t, l, w, c);
    if (d->is_put) {
        h->put_pending = 0;
        t->n_put--;
        if (d->status) {
            /* the rows are still in memory: keep them there */
            if (!t->st.spill_errors++)
                snprintf(t->st.spill_error, sizeof t->st.spill_error, "writing to %.50s: %.90s", t->spill_dir, d->msg);
            h->keep = 1;
            t->kept_bytes += t->chunk_bytes;
            return;
        }
        h->in_store = 1;
        t->st.bytes_spilled += t->chunk_bytes;
        if (l != t->pin_layer) release(t, l, w, c);
    } else {
        h->get_pending = 0;
        if (d->status) {
            if (!t->io_st) {
                t->io_st = d->status;
                snprintf(t->io_msg, sizeof t->io_msg, "%.200s", d->msg);
            }
            return;
        }
        if (!h->present) t->n_present++;
        h->present = 1, h->fetched = 1;
        t->st.bytes_read += t->chunk_bytes;
    }
}

/* Handles completions: all that are ready (block: at least one). */
static void pump(tier *t, bool block) {
    rk_bs_done d[32];
    int n = rk_bs_wait(t->bs, block ? 1 : 0, d, 32);
    for (int i = 0; i < n; i++) on_done(t, &d[i]);
}

static void drain(tier *t) {
    while (rk_bs_in_flight(t->bs)) pump(t, true);
}

static rk_status take_io_error(tier *t, rk_err *err) {
    if (!t->io_st) return RK_OK;
    rk_status st = t->io_st;
    t->io_st = RK_OK;
    return rk_err_set(err, st, "kv tier: cannot read spilled rows back (%s)", t->io_msg);
}

/* Reads chunks [c0, c1) of layer l (K and V) back where released; waits for them. Pins
 * layer l (a spill completing meanwhile keeps its pages) until the caller unpins. */
static rk_status ensure(tier *t, int l, int64_t c0, int64_t c1, bool count, rk_err *err) {
    rk_status st = RK_OK;
    t->pin_layer = l;
    pump(t, false);
    rk_bs_batch(t->bs, true); /* one submission for the layer's reads */
    for (int64_t c = c0; c < c1; c++)
        for (int w = 0; w < 2; w++) {
            chunk *h = CH(t, l, w, c);
            if (count) {
                if (h->present && !h->fetched) t->st.hits++;
                else {
                    t->st.misses++;
                    if (h->prefetched) t->st.prefetched++;
                }
            }
            if (h->present || h->get_pending || !h->in_store) continue;
            if ((st = rk_bs_get(t->bs, ID(t, l, w, c), DATA(t, l, w, c), t->chunk_bytes, NULL, err))) {
                rk_bs_batch(t->bs, false);
                return st;
            }
            h->get_pending = 1;
        }
    rk_bs_batch(t->bs, false);
    const double t0 = rk_time_now();
    for (;;) {
        bool wait = false;
        for (int64_t c = c0; c < c1 && !wait; c++) wait = CH(t, l, 0, c)->get_pending || CH(t, l, 1, c)->get_pending;
        if (!wait) break;
        pump(t, true);
    }
    if (count) t->st.stall_s += rk_time_now() - t0;
    return take_io_error(t, err);
}

/* Releases layer l's read-back chunks (the spilled ones stay in the store). */
static void release_cold(tier *t, int l) {
    for (int64_t c = 0; c < t->n_chunks; c++)
        for (int w = 0; w < 2; w++) {
            chunk *h = CH(t, l, w, c);
            if (h->present && h->in_store && !h->keep && !h->put_pending) release(t, l, w, c);
        }
}

/* Forgets the stored copy of a chunk whose rows change. */
static void invalidate(tier *t, int l, int w, int64_t c) {
    chunk *h = CH(t, l, w, c);
    if (h->put_pending) drain(t);
    if (h->in_store) rk_bs_drop(t->bs, ID(t, l, w, c));
    h->in_store = 0;
    if (h->keep) t->kept_bytes -= t->chunk_bytes;
    h->keep = 0, h->decided = 0, h->fetched = 0;
}

static bool hot(const tier *t, int l, int64_t c) {
    const int64_t last = t->held[l] > 0 ? (t->held[l] - 1) / t->R : 0;
    return c == 0 || c > last - WINDOW_CHUNKS;
}

/* Decides the chunks of layer l that left the window: keep within the budget, else spill. */
static rk_status decide(tier *t, int l, rk_err *err) {
    const int64_t full = t->held[l] / t->R; /* chunks below this are complete */
    for (int64_t c = 1; c < full; c++) {
        if (hot(t, l, c)) break;
        for (int w = 0; w < 2; w++) {
            chunk *h = CH(t, l, w, c);
            if (h->decided || !h->present) continue;
            h->decided = 1;
            /* kept chunks leave an eighth of the cold budget (at most 8 chunks) to writes in flight */
            const uint64_t slack = t->cold_budget / 8 < 8 * t->chunk_bytes ? t->cold_budget / 8 : 8 * t->chunk_bytes;
            if (t->kept_bytes + t->chunk_bytes + slack <= t->cold_budget) {
                h->keep = 1;
                t->kept_bytes += t->chunk_bytes;
                continue;
            }
            rk_status st = rk_bs_put(t->bs, ID(t, l, w, c), DATA(t, l, w, c), t->chunk_bytes, NULL, err);
            if (st) return st;
            h->put_pending = 1;
            t->n_put++;
            /* a chunk being written still holds its pages: writes in flight stay within the room
             * the kept chunks leave, so the rows held never pass the budget (hot chunks aside) */
            while (t->n_put > 0 && t->kept_bytes + (uint64_t)t->n_put * t->chunk_bytes > t->cold_budget) pump(t, true);
        }
    }
    pump(t, false);
    return RK_OK;
}

/* Makes rows [row0, row0 + n) of layer l writable: their chunks present, stored copies
 * dropped; held becomes row0 + n at least. */
static rk_status open_rows(tier *t, int l, int64_t row0, int64_t n, rk_err *err) {
    if (n <= 0) return RK_OK;
    const int64_t c0 = row0 / t->R, c1 = (row0 + n - 1) / t->R + 1;
    for (int64_t c = c0; c < c1; c++)
        if (CH(t, l, 0, c)->put_pending || CH(t, l, 1, c)->put_pending) {
            drain(t);
            break;
        }
    rk_status st = ensure(t, l, c0, c1, false, err);
    t->pin_layer = -1;
    if (st) return st;
    for (int64_t c = c0; c < c1; c++)
        for (int w = 0; w < 2; w++) {
            invalidate(t, l, w, c);
            chunk *h = CH(t, l, w, c);
            if (!h->present) t->n_present++;
            h->present = 1;
        }
    return RK_OK;
}

static void rows_from_f32(const tier *t, const float *src, int64_t n, uint8_t *dst) {
    if (t->type == RK_DT_Q8_0) rk_q8_quantize(src, n, dst);
    else rk_kv_rows_from_f32(t->type, src, 1, n, dst);
}

static void rows_to_f32(const tier *t, const uint8_t *src, int64_t n, float *dst) {
    if (t->type == RK_DT_Q8_0) rk_q8_dequantize(src, n, dst);
    else rk_kv_rows_to_f32(t->type, src, 1, n, dst);
}

static rk_status tier_append(rk_kv *kv, int l, int64_t pos0, const float *k, const float *v, int64_t n, rk_err *err) {
    tier *t = kv->impl;
    if (pos0 < 0 || n < 0 || pos0 > kv->n_ctx - n || pos0 > t->held[l])
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: tier rows %lld..%lld of layer %d (held %lld, n_ctx %lld)",
                          (long long)pos0, (long long)(pos0 + n), l, (long long)t->held[l], (long long)kv->n_ctx);
    rk_status st = open_rows(t, l, pos0, n, err);
    if (st) return st;
    rows_from_f32(t, k, n * kv->kv_dim, t->k[l] + (size_t)pos0 * kv->row_bytes);
    rows_from_f32(t, v, n * kv->kv_dim, t->v[l] + (size_t)pos0 * kv->row_bytes);
    if (pos0 + n > t->held[l]) t->held[l] = pos0 + n; /* rows below the held ones are rewritten in place */
    st = decide(t, l, err);
    if (!st && l == kv->n_layer - 1) { /* the eval's rows of every layer are in: the bytes held now */
        uint64_t held = 0;
        for (size_t i = 0; i < (size_t)kv->n_layer * 2 * (size_t)t->n_chunks; i++)
            held += t->ch[i].present && !t->ch[i].fetched; /* read-back chunks go after their attention */
        if (held * t->chunk_bytes > t->st.resident_peak) t->st.resident_peak = held * t->chunk_bytes;
    }
    return st;
}

/* Reads ahead the spilled chunks of layer l for rows [0, rows), up to the queue depth. */
static void prefetch(tier *t, int l, int64_t rows) {
    const int64_t nc = (rows + t->R - 1) / t->R;
    rk_bs_batch(t->bs, true);
    for (int64_t c = 0; c < nc && rk_bs_in_flight(t->bs) < QD; c++)
        for (int w = 0; w < 2; w++) {
            chunk *h = CH(t, l, w, c);
            if (h->present || h->get_pending || !h->in_store) continue;
            rk_err e = {0};
            if (rk_bs_get(t->bs, ID(t, l, w, c), DATA(t, l, w, c), t->chunk_bytes, NULL, &e)) goto out;
            h->get_pending = 1, h->prefetched = 1;
        }
out:
    rk_bs_batch(t->bs, false);
}

static rk_status tier_attend(rk_kv *kv, int l, const float *q, int64_t n_q, int64_t pos0, float *out, rk_err *err) {
    tier *t = kv->impl;
    const int64_t rows = pos0 + n_q, nc = (rows + t->R - 1) / t->R;
    t->pin_layer = l;
    rk_status st = ensure(t, l, 0, nc, true, err);
    if (st) {
        t->pin_layer = -1;
        return st;
    }
    rk_op_args at = rk_kv_attn_args(kv, q, n_q, pos0, out);
    const int64_t kvd = kv->kv_dim;
    if (t->type != RK_DT_Q8_0 || t->q8_direct) {
        at.src1 = (rk_view){t->type, {kvd, rows, 1, 1}, kv->row_bytes, t->k[l]};
        at.src2 = (rk_view){t->type, {kvd, rows, 1, 1}, kv->row_bytes, t->v[l]};
    } else {
        if (rows > t->cap) {
            float *sk = realloc(t->sk, (size_t)(rows * kvd) * sizeof(float));
            if (sk) t->sk = sk;
            float *sv = sk ? realloc(t->sv, (size_t)(rows * kvd) * sizeof(float)) : NULL;
            if (sv) t->sv = sv;
            if (!sk || !sv) {
                t->pin_layer = -1;
                return rk_err_set(err, RK_E_NOMEM, "kv: no memory for tier attention scratch of %lld rows",
                                  (long long)rows);
            }
            t->cap = rows;
        }
        rk_q8_dequantize(t->k[l], rows * kvd, t->sk);
        rk_q8_dequantize(t->v[l], rows * kvd, t->sv);
        at.src1 = (rk_view){RK_DT_F32, {kvd, rows, 1, 1}, (size_t)kvd * sizeof(float), t->sk};
        at.src2 = (rk_view){RK_DT_F32, {kvd, rows, 1, 1}, (size_t)kvd * sizeof(float), t->sv};
    }
    st = rk_backend_run(kv->be, &at, err);
    t->pin_layer = -1;
    if (kv->n_layer > 1) {
        const int nl = (l + 1) % kv->n_layer;
        prefetch(t, nl, nl ? rows : rows + 1);
    }
    release_cold(t, l);
    return st;
}

static void tier_truncate(rk_kv *kv, int64_t n) {
    tier *t = kv->impl;
    drain(t); /* no read or spill of a chunk about to change is left in flight */
    for (int l = 0; l < kv->n_layer; l++) {
        if (t->held[l] <= n) continue;
        const int64_t cut = n / t->R; /* the chunk holding row n, if n is not on a boundary */
        for (int64_t c = t->n_chunks - 1; c >= cut; c--)
            for (int w = 0; w < 2; w++) {
                chunk *h = CH(t, l, w, c);
                if (c * t->R >= n) {
                    invalidate(t, l, w, c);
                    release(t, l, w, c);
                } else if (h->in_store || h->keep || h->decided) {
                    rk_err e = {0};
                    if (h->put_pending) drain(t);
                    const bool bad = !h->present && ensure(t, l, c, c + 1, false, &e);
                    t->pin_layer = -1;
                    if (bad) continue; /* unreadable: the next attend reports it */
                    invalidate(t, l, w, c);
                }
            }
        t->held[l] = n;
    }
    rk_kv_rows_truncate(kv, n);
}

/* A new, empty spill file: made in spill_dir, unlinked at once (it goes with the process). */
static rk_status open_store(tier *t, rk_err *err) {
    rk_status st = rk_bs_renew_spill(&t->bs, t->spill_dir, &t->bp, &t->acc, err);
    if (st) rk_err_wrap(err, "kv: the KV budget cannot be kept without a spill file (spill_dir, TMPDIR)");
    return st;
}

static void tier_reset(rk_kv *kv) {
    tier *t = kv->impl;
    tier_truncate(kv, 0);
    kv->n_past = 0;
    /* every frame is dead now: start a new file so that serve's requests do not grow it */
    drain(t);
    rk_err e = {0};
    open_store(t, &e); /* on failure the old store stays in use */
}

static rk_status tier_read(const rk_kv *kv, int l, bool values, bool pre_rope, int64_t row0, int64_t n, float *dst,
                           rk_err *err) {
    tier *t = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, t->held[l], err);
    if (st || n == 0) return st;
    st = ensure(t, l, row0 / t->R, (row0 + n - 1) / t->R + 1, false, err);
    if (!st) {
        const uint8_t *src = (values ? t->v[l] : t->k[l]) + (size_t)row0 * kv->row_bytes;
        rows_to_f32(t, src, n * kv->kv_dim, dst);
        if (!values && pre_rope)
            for (int64_t i = 0; i < n; i++) rk_kv_unrope(kv, dst + i * kv->kv_dim, row0 + i);
    }
    t->pin_layer = -1;
    release_cold(t, l);
    return st;
}

static rk_status tier_write(rk_kv *kv, int l, bool values, int64_t row0, int64_t n, const float *src, rk_err *err) {
    tier *t = kv->impl;
    rk_status st = rk_kv_check_rows(kv, l, row0, n, t->held[l], err);
    if (st || n == 0) return st;
    if ((st = open_rows(t, l, row0, n, err))) return st;
    rows_from_f32(t, src, n * kv->kv_dim, (values ? t->v[l] : t->k[l]) + (size_t)row0 * kv->row_bytes);
    return decide(t, l, err);
}

static void tier_bytes(const rk_kv *kv, rk_kv_bytes *o) {
    const tier *t = kv->impl;
    rk_kv_bytes_base(kv, o);
    o->n_exact_rows = kv->n_past;
    o->exact = (uint64_t)t->n_present * t->chunk_bytes;
    o->total = o->exact;
    o->scratch = 2ull * (uint64_t)t->cap * (uint64_t)kv->kv_dim * sizeof(float);
}

static int tier_params(const rk_kv *kv, rk_kv_param *out) {
    const tier *t = kv->impl;
    out[0] = (rk_kv_param){"dtype", (double)t->type};
    if (t->type != RK_DT_Q8_0) return 1;
    out[1] = (rk_kv_param){"block", (double)RK_Q8_BLOCK};
    return 2;
}

/* the plain / q8 payload: per layer its K rows, then its V rows */
static rk_status tier_export(const rk_kv *kv, int64_t row0, int64_t row1, rk_kv_buf *out, rk_err *err) {
    tier *t = kv->impl;
    const size_t off = (size_t)row0 * kv->row_bytes, len = (size_t)(row1 - row0) * kv->row_bytes;
    for (int l = 0; l < kv->n_layer; l++) {
        if (row1 > row0) {
            rk_status st = ensure(t, l, row0 / t->R, (row1 - 1) / t->R + 1, false, err);
            if (st) {
                t->pin_layer = -1;
                return st;
            }
        }
        rk_kv_put(out, t->k[l] + off, len);
        rk_kv_put(out, t->v[l] + off, len);
        t->pin_layer = -1;
        release_cold(t, l);
    }
    return RK_OK;
}

static rk_status tier_import(rk_kv *kv, int64_t row0, int64_t n_rows, const uint8_t *p, size_t n, rk_err *err) {
    tier *t = kv->impl;
    uint64_t want;
    if (!rk_mul_u64((uint64_t)n_rows, kv->row_bytes, &want) || !rk_mul_u64(want, 2ull * (uint64_t)kv->n_layer, &want) ||
        want != n)
        return rk_err_set(err, RK_E_FORMAT, "kv: %s payload of %zu bytes for %lld rows (expected %llu)",
                          rk_kv_kind_name(kv->kind), n, (long long)n_rows, (unsigned long long)want);
    if (t->type == RK_DT_Q8_0)
        for (size_t b = 0; b < n; b += RK_Q8_BLOCK_BYTES) {
            uint16_t h;
            memcpy(&h, p + b, 2);
            if ((h & 0x7c00u) == 0x7c00u)
                return rk_err_set(err, RK_E_FORMAT, "kv: q8 payload block %zu has a non-finite scale",
                                  b / RK_Q8_BLOCK_BYTES);
        }
    const size_t off = (size_t)row0 * kv->row_bytes, len = (size_t)n_rows * kv->row_bytes;
    for (int l = 0; l < kv->n_layer; l++) {
        rk_status st = open_rows(t, l, row0, n_rows, err);
        if (st) return st;
        memcpy(t->k[l] + off, p + (size_t)(2 * l) * len, len);
        memcpy(t->v[l] + off, p + (size_t)(2 * l + 1) * len, len);
        t->held[l] = row0 + n_rows;
        if ((st = decide(t, l, err))) return st;
    }
    kv->n_past = row0 + n_rows;
    return RK_OK;
}

static void tier_stats(const rk_kv *kv, rk_kv_tier_stats *o) {
    const tier *t = kv->impl;
    *o = t->st;
    o->on = true;
    o->budget = t->budget;
    o->chunk_rows = (int32_t)t->R;
    uint64_t spilled = 0, resident = 0;
    for (size_t i = 0; i < (size_t)kv->n_layer * 2 * (size_t)t->n_chunks; i++) {
        /* a chunk being written (at most the queue depth) counts as spilled; read-back
         * chunks are transient (released after their attention) */
        spilled += t->ch[i].in_store || t->ch[i].put_pending;
        resident += t->ch[i].present && !t->ch[i].fetched && !t->ch[i].put_pending;
    }
    o->spilled_bytes = spilled * t->chunk_bytes;
    o->resident_bytes = resident * t->chunk_bytes;
    rk_bs_stats bs;
    rk_bs_get_stats(t->bs, &bs);
    o->bytes_read_stored = t->acc.stored_read + bs.stored_read;
    o->bytes_spilled_stored = t->acc.stored_written + bs.stored_written;
    o->io_wait_s = t->acc.wait_s + bs.wait_s;
    snprintf(o->backend, sizeof o->backend, "%s", rk_bs_backend_name(rk_bs_backend_used(t->bs)));
}

static void tier_destroy(rk_kv *kv) {
    tier *t = kv->impl;
    if (!t) return;
    rk_bs_close(t->bs);
    for (int l = 0; l < kv->n_layer; l++) {
        if (t->k && t->k[l]) munmap(t->k[l], t->map_bytes);
        if (t->v && t->v[l]) munmap(t->v[l], t->map_bytes);
    }
    free(t->k), free(t->v), free(t->ch), free(t->held), free(t->sk), free(t->sv), free(t);
    kv->impl = NULL;
}

static const rk_kv_ops tier_ops = {
    .name = "tier",
    .mem = RK_KV_MEM_HOST,
    .writable = true, /* open_rows reads a spilled chunk back and drops its stored copy */
    .recordable = false,
    .append = tier_append,
    .attend = tier_attend,
    .commit = rk_kv_rows_commit,
    .truncate = tier_truncate,
    .reset = tier_reset,
    .read = tier_read,
    .write = tier_write,
    .bytes = tier_bytes,
    .stats = NULL,
    .params = tier_params,
    .export_rows = tier_export,
    .export_bytes = rk_kv_rows_export_bytes,
    .import_rows = tier_import,
    .destroy = tier_destroy,
    .tier_stats = tier_stats,
};

rk_status rk_kv_tier_init(rk_kv *kv, uint32_t type, const rk_kv_params *p, rk_err *err) {
    if (type == RK_DT_Q8_0 && kv->kv_dim % RK_Q8_BLOCK)
        return rk_err_set(err, RK_E_UNSUPPORTED, "kv: q8 needs kv_dim a multiple of %d (model has %d)", RK_Q8_BLOCK,
                          kv->kv_dim);
    tier *t = calloc(1, sizeof *t);
    if (!t) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory");
    kv->ops = &tier_ops;
    kv->impl = t;
    t->type = type;
    t->pin_layer = -1;
    kv->row_bytes = type == RK_DT_Q8_0 ? (size_t)(kv->kv_dim / RK_Q8_BLOCK) * RK_Q8_BLOCK_BYTES
                                       : (size_t)kv->kv_dim * (type == RK_DT_F32 ? 4 : 2);
    t->R = 256;
    t->n_chunks = (kv->n_ctx + t->R - 1) / t->R;
    t->chunk_bytes = (size_t)t->R * kv->row_bytes;
    t->map_bytes = (size_t)t->n_chunks * t->chunk_bytes;
    t->budget = p->budget;
    const uint64_t hot = (uint64_t)kv->n_layer * 2u * (1u + WINDOW_CHUNKS) * t->chunk_bytes;
    t->cold_budget = p->budget > hot ? p->budget - hot : 0;
    t->k = calloc((size_t)kv->n_layer, sizeof *t->k);
    t->v = calloc((size_t)kv->n_layer, sizeof *t->v);
    t->held = calloc((size_t)kv->n_layer, sizeof *t->held);
    t->ch = calloc((size_t)kv->n_layer * 2 * (size_t)t->n_chunks, sizeof *t->ch);
    if (!t->k || !t->v || !t->held || !t->ch) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory for the tier");
    for (int l = 0; l < kv->n_layer; l++) {
        void *a = mmap(NULL, t->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        void *b = mmap(NULL, t->map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        t->k[l] = a == MAP_FAILED ? NULL : a;
        t->v[l] = b == MAP_FAILED ? NULL : b;
        if (!t->k[l] || !t->v[l])
            return rk_err_set(err, RK_E_NOMEM, "kv: cannot map the tier's rows for n_ctx %lld", (long long)kv->n_ctx);
    }
    snprintf(t->spill_dir, sizeof t->spill_dir, "%s", p->spill_dir && *p->spill_dir ? p->spill_dir : "/tmp");
    t->bp = rk_bs_params_default();
    t->bp.max_block = t->chunk_bytes;
    t->bp.queue_depth = QD;
    t->bp.zstd_level =
        p->spill_level > 0 ? p->spill_level : -1; /* raw frames unless asked (docs/TIERS.md: zstd does not pay here) */
    t->bp.backend = (rk_bs_backend)p->spill_backend;
    t->bp.no_direct = p->spill_buffered;
    rk_status st = open_store(t, err);
    if (st) return st;
    if (type == RK_DT_Q8_0) {
        float q[1] = {0}, o[1];
        rk_op_args at = rk_kv_attn_args(kv, q, 1, 0, o);
        at.src1 = (rk_view){RK_DT_Q8_0, {kv->kv_dim, 1, 1, 1}, kv->row_bytes, t->k[0]};
        at.src2 = (rk_view){RK_DT_Q8_0, {kv->kv_dim, 1, 1, 1}, kv->row_bytes, t->v[0]};
        const rk_backend_ops *bo = kv->be->ops;
        t->q8_direct = bo->op[RK_OP_ATTN] && (!bo->supports || bo->supports(kv->be, &at));
    }
    return RK_OK;
}
