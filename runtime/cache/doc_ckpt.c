/* Checkpoints of a long read (rk_cache.h), through the prefill's hook (session/prefill_ckpt.h).
 * A checkpoint is an entry-format file <key>.rkck (doc_cache.c: the header frame naming the
 * key, the payload in checksummed zstd frames); the one before it is kept as <key>.rkck.old.
 * Payload, host byte order (a checkpoint is read back only by the cache that made it):
 *   "RKCP" u32 version | u32 n_layer, n_embd, kv_dim, KV kind | i64 n, bulk_end |
 *   i32 lo, hi, split | i64 done                                  (the call and the pass)
 *   u64 n_q, n_q f32                                               the question's queries
 *   2 n_layer u64                                                  layer_rows since the call began
 *   u8 has; i64 lo, hi; (hi - lo) u8                               the selection (s->pf->keep)
 *   u8 has; i64 lo, hi; i32 split; (hi - lo) n_embd u16; (hi - lo) f32   the kept stream
 *   i64 r0, r1; (r1 - r0) n_embd f32                              the rows of x_split still to be read
 *   i64 rows; u32 block rows R; then per block of R rows (the last one shorter): u64 bytes,
 *     the policy's export_rows payload of those rows of every layer
 *   u64 bytes; the fill group lists (fill_group.c)
 * The file is written as it is made (doc_cache_impl.h's writer): only a block of rows and a
 * piece are held besides the session's own state. Resuming reads the whole file into memory
 * first (every frame checked) and frees it once its state is in the session.
 * A layer that holds fewer rows than `rows` (the late layers during a pass) exports whatever its
 * buffer holds past them: the resumed pass writes those rows before any attention reads them. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_cache_impl.h"
#include "plan_impl.h"
#include "prefill_ckpt.h"

enum { CK_VERSION = 1 };

struct rk_doc_ckpt {
    rk_prefill_ckpt hook; /* first: the session's pointer is to it */
    rk_doc_cache *c;
    rk_session *s;
    const int32_t *tokens; /* borrowed: the documents' ids */
    char key[65], path[4096], old[4200];
    size_t n;
    rk_doc_ckpt_params p;
    uint8_t *held; /* the payload to resume from (NULL: none) */
    size_t held_len;
    int64_t resume_at;
    bool armed; /* the session's call is this read (resume saw its tokens) */
    bool resumed, off;
    int written, chunks;
    double t_last, write_s;
    uint64_t *rows0; /* (2 n_layer) s->layer_rows when the call began */
};

rk_doc_ckpt_params rk_doc_ckpt_params_default(void) { return (rk_doc_ckpt_params){.every_s = 60.0}; }
int64_t rk_doc_ckpt_resume_at(const rk_doc_ckpt *ck) { return ck ? ck->resume_at : 0; }
bool rk_doc_ckpt_resumed(const rk_doc_ckpt *ck) { return ck && ck->resumed; }
int rk_doc_ckpt_written(const rk_doc_ckpt *ck) { return ck ? ck->written : 0; }

static void note(rk_doc_ckpt *ck, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(rk_doc_ckpt *ck, const char *fmt, ...) {
    if (!ck->p.note) return;
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ck->p.note(ck->p.ud, msg);
}

/* ---- the payload ----------------------------------------------------------------------- */

typedef struct head {
    uint32_t n_layer, n_embd, kv_dim, kind;
    int64_t n, bulk_end, done;
    int32_t lo, hi, split;
} head;

typedef struct body {
    head h;
    uint64_t n_q;
    const uint8_t *q, *rows, *keep, *xs, *xs_base, *x, *kv, *fg;
    bool has_keep, has_xs;
    int64_t keep_lo, keep_hi, xs_lo, xs_hi, x0, x1, kv_rows;
    int32_t xs_split;
    uint32_t kv_block;
    uint64_t fg_bytes;
} body;

/* Bounds-checked reads of the payload (overflow-safe: counts are checked against what is left). */
typedef struct rd {
    const uint8_t *p;
    size_t n, off;
    bool fail;
} rd;
static const uint8_t *take(rd *r, uint64_t count, size_t size) {
    if (r->fail || (size && count > (r->n - r->off) / size)) {
        r->fail = true;
        return NULL;
    }
    const uint8_t *q = r->p + r->off;
    r->off += (size_t)count * size;
    return q;
}
static void get(rd *r, void *dst, size_t n) {
    const uint8_t *q = take(r, 1, n);
    if (q) memcpy(dst, q, n);
    else memset(dst, 0, n);
}
#define GET(r, lv) get((r), &(lv), sizeof(lv))

static bool parse_head(rd *r, head *h) {
    const uint8_t *m = take(r, 4, 1);
    uint32_t v = 0;
    GET(r, v);
    if (!m || memcmp(m, "RKCP", 4) || v != CK_VERSION) return false;
    GET(r, h->n_layer), GET(r, h->n_embd), GET(r, h->kv_dim), GET(r, h->kind);
    GET(r, h->n), GET(r, h->bulk_end);
    GET(r, h->lo), GET(r, h->hi), GET(r, h->split);
    GET(r, h->done);
    return !r->fail && h->n > 0 && h->lo >= 0 && h->lo < h->hi && h->hi <= (int32_t)h->n_layer && h->done >= 0 &&
           h->done <= h->n;
}

/* The whole payload, every size checked; why says what does not read. */
static bool parse(const uint8_t *p, size_t n, body *b, char *why, size_t cap) {
    rd r = {p, n, 0, false};
    memset(b, 0, sizeof *b);
    if (!parse_head(&r, &b->h)) {
        snprintf(why, cap, "not a checkpoint of this format, or impossible positions");
        return false;
    }
    const uint64_t d = b->h.n_embd;
    GET(&r, b->n_q);
    b->q = take(&r, b->n_q, 4);
    b->rows = take(&r, 2ull * b->h.n_layer, 8);
    uint8_t has = 0;
    GET(&r, has);
    b->has_keep = has;
    if (b->has_keep) {
        GET(&r, b->keep_lo), GET(&r, b->keep_hi);
        if (b->keep_lo < 0 || b->keep_hi < b->keep_lo || b->keep_hi > b->h.n) r.fail = true;
        b->keep = take(&r, (uint64_t)(b->keep_hi - b->keep_lo), 1);
    }
    GET(&r, has);
    b->has_xs = has;
    if (b->has_xs) {
        GET(&r, b->xs_lo), GET(&r, b->xs_hi), GET(&r, b->xs_split);
        if (b->xs_lo < 0 || b->xs_hi < b->xs_lo || b->xs_hi > b->h.n) r.fail = true;
        const uint64_t rows = r.fail ? 0 : (uint64_t)(b->xs_hi - b->xs_lo);
        b->xs = take(&r, rows * d, 2);
        b->xs_base = take(&r, rows, 4);
    }
    GET(&r, b->x0), GET(&r, b->x1);
    if (b->x0 < 0 || b->x1 < b->x0 || b->x1 > b->h.n) r.fail = true;
    b->x = take(&r, r.fail ? 0 : (uint64_t)(b->x1 - b->x0) * d, 4);
    GET(&r, b->kv_rows), GET(&r, b->kv_block);
    if (b->kv_rows < 0 || b->kv_rows > b->h.n || (b->kv_rows && !b->kv_block)) r.fail = true;
    b->kv = r.fail ? NULL : r.p + r.off;
    for (int64_t row = 0; !r.fail && row < b->kv_rows; row += b->kv_block) {
        uint64_t bytes = 0;
        GET(&r, bytes);
        take(&r, bytes, 1);
    }
    GET(&r, b->fg_bytes);
    b->fg = take(&r, b->fg_bytes, 1);
    if (r.fail || r.off != n) {
        snprintf(why, cap, "its sections do not add up to its %zu bytes", n);
        return false;
    }
    return true;
}

static void put(rk_doc_cache_writer *b, const void *p, size_t n) { rk_doc_cache_writer_put(b, p, n); }
#define PUT(b, T, v) put((b), &(T){(T)(v)}, sizeof(T))

/* Writes the checkpoint's payload into b; false (err) when out of memory or the policy's
 * export fails (the writer's own failures are its). */
static bool build(rk_doc_ckpt *ck, const rk_prefill_point *pt, rk_doc_cache_writer *b, rk_err *err) {
    rk_session *s = ck->s;
    const rk_hparams *hp = &s->m->hp;
    const rk_prefill_state *f = s->pf;
    const size_t d = (size_t)hp->n_embd;
    put(b, "RKCP", 4);
    PUT(b, uint32_t, CK_VERSION);
    PUT(b, uint32_t, hp->n_layer), PUT(b, uint32_t, hp->n_embd), PUT(b, uint32_t, s->kv->kv_dim);
    PUT(b, uint32_t, s->kv->kind);
    PUT(b, int64_t, pt->n), PUT(b, int64_t, pt->bulk_end);
    PUT(b, int32_t, pt->lo), PUT(b, int32_t, pt->hi), PUT(b, int32_t, pt->split);
    PUT(b, int64_t, pt->done);
    PUT(b, uint64_t, pt->q_keep ? pt->n_q : 0);
    if (pt->q_keep) put(b, pt->q_keep, pt->n_q * 4);
    for (int i = 0; i < 2 * hp->n_layer; i++) PUT(b, uint64_t, s->layer_rows[i] - ck->rows0[i]);
    const bool keep = f->keep && f->keep_hi <= pt->n;
    PUT(b, uint8_t, keep);
    if (keep) {
        PUT(b, int64_t, f->keep_lo), PUT(b, int64_t, f->keep_hi);
        put(b, f->keep, (size_t)(f->keep_hi - f->keep_lo));
    }
    const bool xs = f->xs_keep && f->xs_hi <= pt->n;
    PUT(b, uint8_t, xs);
    if (xs) {
        PUT(b, int64_t, f->xs_lo), PUT(b, int64_t, f->xs_hi), PUT(b, int32_t, f->xs_split);
        put(b, f->xs_keep, (size_t)(f->xs_hi - f->xs_lo) * d * 2);
        put(b, f->xs_base, (size_t)(f->xs_hi - f->xs_lo) * 4);
    }
    /* the stream: the first pass has made rows [0, done), the late pass still reads [done, n) */
    int64_t x0 = 0, x1 = 0;
    if (pt->x_split) x0 = pt->lo == 0 ? 0 : pt->done, x1 = pt->lo == 0 ? pt->done : pt->n;
    PUT(b, int64_t, x0), PUT(b, int64_t, x1);
    for (int64_t r = x0; r < x1 && r < pt->x_half_n; r++) { /* a shrunk stream's f16 rows, as f32 */
        float row[4096];
        for (size_t j0 = 0; j0 < d; j0 += 4096) {
            const size_t k = d - j0 < 4096 ? d - j0 : 4096;
            for (size_t j = 0; j < k; j++) row[j] = rk_f16_to_f32(pt->x_half[(size_t)r * d + j0 + j]);
            put(b, row, k * 4);
        }
    }
    const int64_t xf = x0 > pt->x_half_n ? x0 : pt->x_half_n;
    if (x1 > xf) put(b, pt->x_split + (size_t)(xf - pt->x_half_n) * d, (size_t)(x1 - xf) * d * 4);
    const int64_t rows = pt->lo > 0 ? pt->n : pt->done;
    /* blocks of about a piece: (2 n_layer) rows of row_bytes each a row */
    const size_t per_row = 2 * (size_t)hp->n_layer * (s->kv->row_bytes ? s->kv->row_bytes : 1);
    uint32_t blk = (uint32_t)((4u << 20) / per_row > 0 ? (4u << 20) / per_row : 1);
    if (ck->p.block_rows > 0) blk = (uint32_t)ck->p.block_rows;
    PUT(b, int64_t, rows), PUT(b, uint32_t, blk);
    for (int64_t r = 0; r < rows && !rk_doc_cache_writer_failed(b); r += blk) {
        rk_kv_buf kb = {0};
        const int64_t r1 = r + blk < rows ? r + blk : rows;
        if (s->kv->ops->export_rows(s->kv, r, r1, &kb, err)) {
            free(kb.p);
            return false;
        }
        if (kb.fail) {
            free(kb.p);
            rk_err_set(err, RK_E_NOMEM, "document cache: out of memory for a checkpoint");
            return false;
        }
        PUT(b, uint64_t, kb.n);
        put(b, kb.p, kb.n);
        free(kb.p);
    }
    uint8_t *fg = NULL;
    size_t fg_len = 0;
    if (!rk_fill_group_save(s, &fg, &fg_len)) {
        free(fg);
        rk_err_set(err, RK_E_NOMEM, "document cache: out of memory for a checkpoint");
        return false;
    }
    PUT(b, uint64_t, fg_len);
    if (fg_len) put(b, fg, fg_len);
    free(fg);
    return true;
}

/* ---- the hook ------------------------------------------------------------------------- */

static void at(rk_prefill_ckpt *hk, rk_session *s, const rk_prefill_point *pt) {
    rk_doc_ckpt *ck = (rk_doc_ckpt *)hk;
    if (ck->off || !ck->armed || s != ck->s || pt->n != (int64_t)ck->n) return;
    if (pt->hi == s->m->hp.n_layer && pt->done == pt->n) return; /* the read ends: the entry comes next */
    ck->chunks++;
    const double now = rk_time_now();
    const double gap = ck->p.every_s > 10 * ck->write_s ? ck->p.every_s : 10 * ck->write_s;
    if (ck->p.every_chunks > 0 ? ck->chunks % ck->p.every_chunks : now - ck->t_last < gap) return;
    rk_err e = {0};
    char label[256];
    const double work = (double)pt->lo * (double)pt->n + (double)pt->done * (pt->hi - pt->lo);
    snprintf(label, sizeof label, "checkpoint: %lld of %zu tokens read", (long long)(work / s->m->hp.n_layer), ck->n);
    rk_doc_cache_writer *w = NULL;
    rk_status st = rk_doc_cache_writer_open(ck->c, ck->path, &w, &e);
    if (!st) {
        const bool built = build(ck, pt, w, &e);
        /* the newest stays readable throughout: it becomes .old before the new one lands */
        if (built && !rk_doc_cache_writer_failed(w) && access(ck->path, F_OK) == 0 && rename(ck->path, ck->old) != 0)
            st = rk_err_set(&e, RK_E_IO, "document cache: cannot keep the previous checkpoint of %.12s (%s)", ck->key,
                            strerror(errno));
        const rk_status wst = rk_doc_cache_writer_close(w, built && !st, ck->key, s->m, &s->p.kv, pt->done, label, &e);
        if (!st) st = built ? wst : (e.code ? e.code : RK_E_NOMEM);
    }
    const double t1 = rk_time_now();
    if (st) {
        ck->off = true;
        note(ck, "%s; reading on without checkpoints", e.msg);
        return;
    }
    ck->written++;
    ck->write_s = t1 - now;
    ck->t_last = t1;
}

/* Puts the checkpoint's state into the session; false (why) when it does not fit this call,
 * before anything changed, or when the KV rows do not import (nothing changed either). */
static bool apply(rk_doc_ckpt *ck, const body *b, rk_prefill_point *pt, char *why, size_t cap) {
    rk_session *s = ck->s;
    const rk_hparams *hp = &s->m->hp;
    const head *h = &b->h;
    const size_t d = (size_t)hp->n_embd;
    const bool layer_major = pt->x_split != NULL;
    if (h->n_layer != (uint32_t)hp->n_layer || h->n_embd != (uint32_t)hp->n_embd ||
        h->kv_dim != (uint32_t)s->kv->kv_dim || h->kind != (uint32_t)s->kv->kind || h->n != pt->n ||
        h->bulk_end != pt->bulk_end || h->split != pt->split || b->n_q != (pt->q_keep ? pt->n_q : 0)) {
        snprintf(why, cap, "it was made by a read of another shape (%lld rows, split %d, %u layers)", (long long)h->n,
                 h->split, h->n_layer);
        return false;
    }
    const bool pass_ok = layer_major
                             ? (h->lo == 0 && h->hi == pt->split) || (h->lo == pt->split && h->hi == hp->n_layer)
                             : h->lo == 0 && h->hi == hp->n_layer;
    const int64_t x0 = !layer_major ? 0 : h->lo == 0 ? 0 : h->done, x1 = !layer_major ? 0 : h->lo == 0 ? h->done : h->n;
    if (!pass_ok || b->x0 != x0 || b->x1 != x1 || b->kv_rows != (h->lo > 0 ? h->n : h->done) ||
        (h->lo > 0 && b->has_keep != (pt->q_keep != NULL)) ||
        (b->has_xs && (b->xs_split < 1 || b->xs_split >= hp->n_layer))) {
        snprintf(why, cap, "its pass [%d, %d) at row %lld does not fit this read", h->lo, h->hi, (long long)h->done);
        return false;
    }
    uint8_t *keep = b->has_keep ? malloc((size_t)(b->keep_hi - b->keep_lo) + 1) : NULL;
    uint16_t *xs = b->has_xs ? malloc((size_t)(b->xs_hi - b->xs_lo) * d * 2 + 2) : NULL;
    float *xb = b->has_xs ? malloc((size_t)(b->xs_hi - b->xs_lo) * 4 + 4) : NULL;
    if ((b->has_keep && !keep) || (b->has_xs && (!xs || !xb))) {
        free(keep), free(xs), free(xb);
        snprintf(why, cap, "out of memory");
        return false;
    }
    rk_err e = {0};
    if (rk_fill_group_restore(s, b->fg, (size_t)b->fg_bytes, &e)) {
        rk_err e2 = {0};
        rk_fill_group_begin(s, 0, pt->split, &e2); /* back to empty lists */
        free(keep), free(xs), free(xb);
        snprintf(why, cap, "%s", e.msg);
        return false;
    }
    /* the blocks in order (each import starts at the rows held so far; parse checked the sizes) */
    rk_status ist = RK_OK;
    const uint8_t *kp = b->kv;
    for (int64_t row = 0; !ist && row < b->kv_rows; row += b->kv_block) {
        uint64_t bytes;
        memcpy(&bytes, kp, 8);
        const int64_t nr = b->kv_rows - row < b->kv_block ? b->kv_rows - row : b->kv_block;
        ist = s->kv->ops->import_rows(s->kv, row, nr, kp + 8, (size_t)bytes, &e);
        kp += 8 + bytes;
    }
    if (ist) {
        s->kv->ops->truncate(s->kv, 0);
        rk_err e2 = {0};
        rk_fill_group_begin(s, 0, pt->split, &e2);
        free(keep), free(xs), free(xb);
        snprintf(why, cap, "%s", e.msg);
        return false;
    }
    s->kv->ops->truncate(s->kv, 0); /* the rows stay where they are; none is committed before the call ends */
    if (b->n_q) memcpy(pt->q_keep, b->q, (size_t)b->n_q * 4);
    for (int i = 0; i < 2 * hp->n_layer; i++) {
        uint64_t v;
        memcpy(&v, b->rows + 8 * i, 8);
        s->layer_rows[i] = ck->rows0[i] + v;
    }
    rk_prefill_state *f = s->pf;
    if (keep) {
        memcpy(keep, b->keep, (size_t)(b->keep_hi - b->keep_lo));
        free(f->keep);
        f->keep = keep, f->keep_lo = b->keep_lo, f->keep_hi = b->keep_hi;
    }
    if (xs) {
        memcpy(xs, b->xs, (size_t)(b->xs_hi - b->xs_lo) * d * 2);
        memcpy(xb, b->xs_base, (size_t)(b->xs_hi - b->xs_lo) * 4);
        free(f->xs_keep), free(f->xs_base);
        f->xs_keep = xs, f->xs_base = xb, f->xs_lo = b->xs_lo, f->xs_hi = b->xs_hi, f->xs_split = b->xs_split;
    }
    if (b->x1 > b->x0) memcpy(pt->x_split + (size_t)b->x0 * d, b->x, (size_t)(b->x1 - b->x0) * d * 4);
    pt->lo = h->lo, pt->hi = h->hi, pt->done = h->done;
    return true;
}

static rk_status resume(rk_prefill_ckpt *hk, rk_session *s, rk_prefill_point *pt, rk_err *err) {
    rk_doc_ckpt *ck = (rk_doc_ckpt *)hk;
    (void)err;
    if (s != ck->s || pt->n != (int64_t)ck->n || memcmp(pt->ids, ck->tokens, ck->n * sizeof(int32_t))) return RK_OK;
    memcpy(ck->rows0, s->layer_rows, (size_t)(2 * s->m->hp.n_layer) * sizeof(uint64_t));
    ck->armed = true;
    ck->t_last = rk_time_now();
    ck->chunks = 0;
    if (!ck->held) return RK_OK;
    body b;
    char why[640] = "";
    if (!parse(ck->held, ck->held_len, &b, why, sizeof why) || !apply(ck, &b, pt, why, sizeof why))
        note(ck, "document cache: the checkpoint of entry %.12s does not resume this read (%s); reading from the start",
             ck->key, why);
    else ck->resumed = true;
    free(ck->held);
    ck->held = NULL;
    return RK_OK;
}

/* ---- open / close ----------------------------------------------------------------------- */

static const char *cannot(const rk_session *s) {
    if (s->dev) return "the KV rows live on the device";
    if (!s->kv->ops->writable || !s->kv->ops->export_rows || !s->kv->ops->import_rows)
        return "the KV policy keeps its rows compressed or tiered";
    if (s->pf->splice_src) return "the read splices rows of another session";
    if (s->n_past) return "the session holds rows already";
    return NULL;
}

/* The newest checkpoint file of the key that reads (its payload into ck->held). */
static void find(rk_doc_ckpt *ck) {
    const char *paths[2] = {ck->path, ck->old};
    for (int i = 0; i < 2 && !ck->held; i++) {
        if (access(paths[i], F_OK) != 0) continue;
        uint8_t *buf = NULL;
        size_t len = 0;
        int64_t nt = 0;
        char msg[640] = "";
        rk_status st = rk_doc_cache_read_file(ck->c, paths[i], ck->key, &buf, &len, &nt, msg, sizeof msg);
        rd r = {buf, len, 0, false};
        head h;
        if (!st && (!parse_head(&r, &h) || h.n != (int64_t)ck->n || h.n_layer != (uint32_t)ck->s->m->hp.n_layer)) {
            st = RK_E_FORMAT;
            snprintf(msg, sizeof msg, "not a checkpoint of these %zu tokens", ck->n);
        }
        if (st) {
            free(buf);
            note(ck, "document cache: checkpoint %s is unusable (%s); ignored and removed", paths[i], msg);
            unlink(paths[i]);
            continue;
        }
        ck->held = buf, ck->held_len = len;
        const double work = (double)h.lo * (double)h.n + (double)h.done * (h.hi - h.lo);
        ck->resume_at = (int64_t)(work / h.n_layer);
    }
}

rk_status rk_doc_ckpt_open(rk_doc_cache *c, const char *key, rk_session *s, const int32_t *tokens, size_t n,
                           const rk_doc_ckpt_params *p, rk_doc_ckpt **out, char *why, size_t why_cap, rk_err *err) {
    *out = NULL;
    if (why_cap) why[0] = '\0';
    if (!c || !s || !key || strlen(key) != 64 || strspn(key, "0123456789abcdef") != 64 || !tokens || !n)
        return rk_err_set(err, RK_E_INVALID_ARG, "document cache: checkpoints need a cache, a key and tokens");
    const char *no = cannot(s);
    if (no) {
        snprintf(why, why_cap, "%s", no);
        return RK_OK;
    }
    rk_doc_ckpt *ck = calloc(1, sizeof *ck);
    if (ck) ck->rows0 = calloc((size_t)(2 * s->m->hp.n_layer), sizeof(uint64_t));
    if (!ck || !ck->rows0) {
        if (ck) free(ck);
        return rk_err_set(err, RK_E_NOMEM, "document cache: out of memory");
    }
    ck->hook = (rk_prefill_ckpt){resume, at};
    ck->c = c, ck->s = s, ck->tokens = tokens, ck->n = n;
    ck->p = p ? *p : rk_doc_ckpt_params_default();
    if (ck->p.every_s <= 0) ck->p.every_s = 60.0;
    memcpy(ck->key, key, 65);
    snprintf(ck->path, sizeof ck->path, "%s/%s.rkck", rk_doc_cache_dir(c), key);
    snprintf(ck->old, sizeof ck->old, "%s.old", ck->path);
    find(ck);
    s->ckpt = &ck->hook;
    *out = ck;
    return RK_OK;
}

void rk_doc_ckpt_close(rk_doc_ckpt *ck, bool done) {
    if (!ck) return;
    if (ck->s->ckpt == &ck->hook) ck->s->ckpt = NULL;
    if (done) unlink(ck->path), unlink(ck->old);
    free(ck->held), free(ck->rows0), free(ck);
}
