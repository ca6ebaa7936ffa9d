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
 *   u64 bytes; the fill group lists (fill_group.c; f16 rows, q8 rows for a q8 or q4 cache)
 * The file is written as it is made (doc_cache_impl.h's writer): only a block of rows and a
 * piece are held besides the session's own state. It is read back as a stream too: once when
 * the read opens (every frame's checksum, the sections adding up), then into the session's
 * own arrays when the call resumes, so a resumed read needs no more memory than the read.
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

enum { CK_VERSION = 2 };

struct rk_doc_ckpt {
    rk_prefill_ckpt hook; /* first: the session's pointer is to it */
    rk_doc_cache *c;
    rk_session *s;
    const int32_t *tokens; /* borrowed: the documents' ids */
    char key[65], path[4096], old[4200];
    size_t n;
    rk_doc_ckpt_params p;
    char held[4200]; /* the checkpoint file to resume from ("": none) */
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

static void put(rk_doc_cache_writer *b, const void *p, size_t n) { rk_doc_cache_writer_put(b, p, n); }
static void w_put(void *b, const void *p, size_t n) { rk_doc_cache_writer_put(b, p, n); }
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
        for (int64_t r = 0; r < f->xs_hi - f->xs_lo; r += 256) { /* the stream's pages held a block at a time */
            const int64_t k = f->xs_hi - f->xs_lo - r < 256 ? f->xs_hi - f->xs_lo - r : 256;
            put(b, f->xs_keep + (size_t)r * d, (size_t)k * d * 2);
            rk_prefill_xs_release(s, r + k);
        }
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
        if (pt->x_half == f->xs_keep && (r + 1) % 256 == 0) rk_prefill_xs_release(s, r + 1);
    }
    if (pt->x_half == f->xs_keep) rk_prefill_xs_release(s, x1);
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
    PUT(b, uint64_t, rk_fill_group_bytes(s));
    rk_fill_group_write(s, w_put, b);
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

/* ---- reading a checkpoint back: one pass over the stream ------------------------------ */

/* The stream and the first failure (why). */
typedef struct src {
    rk_doc_cache_reader *r;
    bool fail;
    char *why;
    size_t cap;
} src;

/* n bytes into dst (NULL: skipped); n beyond what is left fails as sections that do not add up */
static bool pull(src *in, void *dst, uint64_t n) {
    if (in->fail) return false;
    const uint64_t left = rk_doc_cache_reader_left(in->r);
    if (n > left) {
        snprintf(in->why, in->cap, "its sections do not add up (%llu bytes wanted, %llu left)", (unsigned long long)n,
                 (unsigned long long)left);
        in->fail = true;
        return false;
    }
    rk_err e = {0};
    if (rk_doc_cache_reader_pull(in->r, dst, (size_t)n, &e)) {
        snprintf(in->why, in->cap, "%s", e.msg);
        in->fail = true;
        return false;
    }
    return true;
}
#define GET(in, lv) pull((in), &(lv), sizeof(lv))

static bool bad(src *in, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool bad(src *in, const char *fmt, ...) {
    if (in->fail) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(in->why, in->cap, fmt, ap);
    va_end(ap);
    in->fail = true;
    return false;
}

static bool parse_head(src *in, head *h) {
    char m[4] = {0};
    uint32_t v = 0;
    pull(in, m, 4), GET(in, v);
    GET(in, h->n_layer), GET(in, h->n_embd), GET(in, h->kv_dim), GET(in, h->kind);
    GET(in, h->n), GET(in, h->bulk_end);
    GET(in, h->lo), GET(in, h->hi), GET(in, h->split);
    GET(in, h->done);
    if (in->fail) return false;
    if (memcmp(m, "RKCP", 4) || v != CK_VERSION || h->n <= 0 || h->lo < 0 || h->lo >= h->hi ||
        h->hi > (int32_t)h->n_layer || h->done < 0 || h->done > h->n || !h->n_embd || h->n_embd > (1u << 20))
        return bad(in, "not a checkpoint of this format, or impossible positions");
    return true;
}

/* What a resume takes before it lands in the session (owned). */
typedef struct taken {
    float *q;
    uint64_t *rows;
    uint8_t *keep;
    uint16_t *xs;
    float *xs_base;
    int64_t keep_lo, keep_hi, xs_lo, xs_hi;
    int32_t xs_split;
    bool imported; /* KV rows went in: undo on failure */
} taken;

static void taken_free(taken *t) { free(t->q), free(t->rows), free(t->keep), free(t->xs), free(t->xs_base); }

/* Walks the checkpoint's sections in order, every size checked against what is left, into h.
 * pt NULL: a check only (each piece's checksum as it arrives, the sections adding up to the
 * payload), the data skipped. Else the resume of the call pt: the shape checked against it
 * first, then the question's queries, the selection and the kept stream into new arrays, the
 * stream rows still to be read into pt->x_split and the KV rows into the cache (in order,
 * not committed), the fill group lists restored; the new arrays land only when all of it
 * read. false: why says what did not fit or read (a resume then left no rows). */
static bool walk(rk_doc_ckpt *ck, rk_doc_cache_reader *r, rk_prefill_point *pt, head *h, char *why, size_t cap) {
    rk_session *s = ck->s;
    const rk_hparams *hp = &s->m->hp;
    src in = {r, false, why, cap};
    taken t = {0};
    if (!parse_head(&in, h)) return false;
    const uint64_t d = h->n_embd;
    const bool layer_major = pt && pt->x_split != NULL;
    uint64_t n_q = 0;
    GET(&in, n_q);
    if (pt && !in.fail &&
        (h->n_layer != (uint32_t)hp->n_layer || h->n_embd != (uint32_t)hp->n_embd ||
         h->kv_dim != (uint32_t)s->kv->kv_dim || h->kind != (uint32_t)s->kv->kind || h->n != pt->n ||
         h->bulk_end != pt->bulk_end || h->split != pt->split || n_q != (pt->q_keep ? pt->n_q : 0)))
        bad(&in, "it was made by a read of another shape (%lld rows, split %d, %u layers)", (long long)h->n, h->split,
            h->n_layer);
    if (n_q > UINT64_MAX / 4) bad(&in, "impossible sizes");
    if (pt && n_q && !in.fail && !(t.q = malloc((size_t)n_q * 4))) bad(&in, "out of memory");
    pull(&in, t.q, n_q * 4);
    if (pt && !in.fail && !(t.rows = malloc((size_t)h->n_layer * 16))) bad(&in, "out of memory");
    pull(&in, t.rows, 16ull * h->n_layer);
    uint8_t has_keep = 0, has_xs = 0;
    GET(&in, has_keep);
    if (has_keep) {
        GET(&in, t.keep_lo), GET(&in, t.keep_hi);
        if (!in.fail && (t.keep_lo < 0 || t.keep_hi < t.keep_lo || t.keep_hi > h->n)) bad(&in, "impossible selection");
        if (pt && !in.fail && !(t.keep = malloc((size_t)(t.keep_hi - t.keep_lo) + 1))) bad(&in, "out of memory");
        pull(&in, t.keep, in.fail ? 0 : (uint64_t)(t.keep_hi - t.keep_lo));
    }
    GET(&in, has_xs);
    if (has_xs) {
        GET(&in, t.xs_lo), GET(&in, t.xs_hi), GET(&in, t.xs_split);
        if (!in.fail && (t.xs_lo < 0 || t.xs_hi < t.xs_lo || t.xs_hi > h->n)) bad(&in, "impossible stream rows");
        if (pt && !in.fail && (t.xs_split < 1 || t.xs_split >= hp->n_layer))
            bad(&in, "its stream's split %d does not fit %d layers", t.xs_split, hp->n_layer);
        const uint64_t rows = in.fail ? 0 : (uint64_t)(t.xs_hi - t.xs_lo);
        if (pt && !in.fail &&
            (!(t.xs = malloc((size_t)(rows * d) * 2 + 2)) || !(t.xs_base = malloc((size_t)rows * 4 + 4))))
            bad(&in, "out of memory");
        pull(&in, t.xs, rows * d * 2), pull(&in, t.xs_base, rows * 4);
    }
    int64_t x0 = 0, x1 = 0, kv_rows = 0;
    uint32_t kv_block = 0;
    GET(&in, x0), GET(&in, x1);
    if (!in.fail && (x0 < 0 || x1 < x0 || x1 > h->n)) bad(&in, "impossible stream rows");
    if (pt && !in.fail) {
        const bool pass_ok = layer_major
                                 ? (h->lo == 0 && h->hi == pt->split) || (h->lo == pt->split && h->hi == hp->n_layer)
                                 : h->lo == 0 && h->hi == hp->n_layer;
        const int64_t w0 = !layer_major ? 0 : h->lo == 0 ? 0 : h->done;
        const int64_t w1 = !layer_major ? 0 : h->lo == 0 ? h->done : h->n;
        if (!pass_ok || x0 != w0 || x1 != w1 || (h->lo > 0 && has_keep != (pt->q_keep != NULL)))
            bad(&in, "its pass [%d, %d) at row %lld does not fit this read", h->lo, h->hi, (long long)h->done);
    }
    /* the rows still to be read straight into the call's stream */
    pull(&in, pt && !in.fail ? pt->x_split + (size_t)x0 * d : NULL, in.fail ? 0 : (uint64_t)(x1 - x0) * d * 4);
    GET(&in, kv_rows), GET(&in, kv_block);
    if (!in.fail && (kv_rows < 0 || kv_rows > h->n || (kv_rows && !kv_block))) bad(&in, "impossible KV rows");
    if (pt && !in.fail && kv_rows != (h->lo > 0 ? h->n : h->done))
        bad(&in, "its pass [%d, %d) at row %lld does not fit this read", h->lo, h->hi, (long long)h->done);
    /* the KV blocks in order, each import starting at the rows held so far */
    uint8_t *blk = NULL;
    size_t blk_cap = 0;
    for (int64_t row = 0; !in.fail && row < kv_rows; row += kv_block) {
        uint64_t bytes = 0;
        GET(&in, bytes);
        if (in.fail || !pt) {
            pull(&in, NULL, bytes);
            continue;
        }
        if (bytes > rk_doc_cache_reader_left(r)) {
            pull(&in, NULL, bytes); /* names the shortfall */
            break;
        }
        if (bytes > blk_cap) {
            uint8_t *nb = realloc(blk, (size_t)bytes);
            if (!nb) {
                bad(&in, "out of memory");
                break;
            }
            blk = nb, blk_cap = (size_t)bytes;
        }
        if (!pull(&in, blk, bytes)) break;
        const int64_t nr = kv_rows - row < kv_block ? kv_rows - row : kv_block;
        rk_err e = {0};
        t.imported = true;
        if (s->kv->ops->import_rows(s->kv, row, nr, blk, (size_t)bytes, &e)) bad(&in, "%s", e.msg);
    }
    free(blk);
    uint64_t fg_bytes = 0;
    GET(&in, fg_bytes);
    if (!in.fail && fg_bytes > rk_doc_cache_reader_left(r)) pull(&in, NULL, fg_bytes); /* names the shortfall */
    rk_err e = {0};
    if (pt && !in.fail && rk_fill_group_read(s, fg_bytes, rk_doc_cache_reader_pull, r, &e)) bad(&in, "%s", e.msg);
    else if (!pt) pull(&in, NULL, fg_bytes);
    if (!in.fail && rk_doc_cache_reader_left(r))
        bad(&in, "its sections do not add up to its payload (%llu bytes after the last)",
            (unsigned long long)rk_doc_cache_reader_left(r));
    if (in.fail || !pt) {
        if (t.imported || (pt && in.fail)) {
            s->kv->ops->truncate(s->kv, 0);
            rk_fill_group_begin(s, 0, pt->split, &(rk_err){0}); /* back to empty lists */
        }
        taken_free(&t);
        return !in.fail;
    }
    s->kv->ops->truncate(s->kv, 0); /* the rows stay where they are; none is committed before the call ends */
    if (n_q) memcpy(pt->q_keep, t.q, (size_t)n_q * 4);
    for (int i = 0; i < 2 * hp->n_layer; i++) s->layer_rows[i] = ck->rows0[i] + t.rows[i];
    rk_prefill_state *f = s->pf;
    if (t.keep) {
        free(f->keep);
        f->keep = t.keep, f->keep_lo = t.keep_lo, f->keep_hi = t.keep_hi;
        t.keep = NULL;
    }
    if (t.xs) {
        rk_prefill_xs_drop(f);
        f->xs_keep = t.xs, f->xs_base = t.xs_base, f->xs_lo = t.xs_lo, f->xs_hi = t.xs_hi, f->xs_split = t.xs_split;
        t.xs = NULL, t.xs_base = NULL;
    }
    pt->lo = h->lo, pt->hi = h->hi, pt->done = h->done;
    taken_free(&t);
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
    if (!ck->held[0]) return RK_OK;
    char why[640] = "";
    rk_doc_cache_reader *r = NULL;
    head h;
    bool ok = rk_doc_cache_reader_open(ck->c, ck->held, ck->key, &r, NULL, NULL, why, sizeof why) == RK_OK &&
              walk(ck, r, pt, &h, why, sizeof why);
    rk_doc_cache_reader_close(r);
    if (!ok)
        note(ck, "document cache: the checkpoint of entry %.12s does not resume this read (%s); reading from the start",
             ck->key, why);
    else ck->resumed = true;
    ck->held[0] = '\0';
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

/* The newest checkpoint file of the key that reads through (its path into ck->held): each
 * piece checked as it streams past, the sections adding up, nothing kept in memory. */
static void find(rk_doc_ckpt *ck) {
    const char *paths[2] = {ck->path, ck->old};
    for (int i = 0; i < 2 && !ck->held[0]; i++) {
        if (access(paths[i], F_OK) != 0) continue;
        char msg[640] = "";
        rk_doc_cache_reader *r = NULL;
        head h = {0};
        rk_status st = rk_doc_cache_reader_open(ck->c, paths[i], ck->key, &r, NULL, NULL, msg, sizeof msg);
        if (!st && !walk(ck, r, NULL, &h, msg, sizeof msg)) st = RK_E_FORMAT;
        if (!st && (h.n != (int64_t)ck->n || h.n_layer != (uint32_t)ck->s->m->hp.n_layer)) {
            st = RK_E_FORMAT;
            snprintf(msg, sizeof msg, "not a checkpoint of these %zu tokens", ck->n);
        }
        rk_doc_cache_reader_close(r);
        if (st) {
            note(ck, "document cache: checkpoint %s is unusable (%s); ignored and removed", paths[i], msg);
            unlink(paths[i]);
            continue;
        }
        snprintf(ck->held, sizeof ck->held, "%s", paths[i]);
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
    free(ck->rows0), free(ck);
}
