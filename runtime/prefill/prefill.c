/* The prefill driver: an eval call's rows through the model in chunks of n_batch, each
 * chunk with its plan. Chunk-major (every layer of a chunk before the next chunk), or
 * layer-major when the fill settings ask for it: layers 0..S-1 over the whole prompt
 * first (the split stream of every row kept), then the late layers chunk by chunk; the
 * selection of exact rows may then use what the early layers saw (question-aware fill). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "rk_io.h"
#include "prefill_ckpt.h"
#include "sparse_impl.h"

typedef struct pass {
    rk_session *s;
    const int32_t *ids;
    size_t n;
    int64_t start, bulk_end;
    float *logits;
    bool all_rows;
    /* progress (cost.c): the work of the whole call under the cost model; the work done as it
     * ran (attention with the lines' measured share) and as the model counted it; the fit of
     * time on work; the clock and the sparse counters at the last chunk's end */
    rk_cost total, done, done_model;
    rk_cost_fit fit;
    int n_chunks;
    double t_last;
    rk_attn_sparse_stats sp_last;
    double share;     /* the lines' share of blocks, averaged over the recent chunks (-1: none yet) */
    int64_t reported; /* tokens last reported to the progress callback */
    rk_cost_ctx cost;
    /* question-aware selection: queries of rows [q_pos0, q_pos0 + q_n) at layers [q_lo, q_hi) */
    float *q_keep;
    int q_lo, q_hi;
    int64_t q_pos0, q_n, n_base; /* the first n_base of the q_n rows are the baseline */
    rk_prefill_point at;         /* the checkpoint hook's view (s->ckpt; lo = hi = -1 when unused) */
    /* the late pass's stream when shrunk (shrink_stream): rows [0, x_half_n) of the call are
     * x_half (f16), x_split holds rows [x_half_n, n); x_buf a chunk of them as f32 */
    const uint16_t *x_half;
    int64_t x_half_n;
    float *x_buf;
} pass;

/* Chunk boundaries: n_batch rows, never straddling bulk_end (each chunk is all bulk or
 * all exact rows). */
static size_t chunk_len(const pass *q, size_t done) {
    size_t c = q->n - done < (size_t)q->s->p.n_batch ? q->n - done : (size_t)q->s->p.n_batch;
    const int64_t pos = q->start + (int64_t)done;
    if (pos < q->bulk_end && pos + (int64_t)c > q->bulk_end) c = (size_t)(q->bulk_end - pos);
    return c;
}

/* eval splice: exact K/V of layers [lo, hi) over the bulk rows before any tail row reads them */
static rk_status splice(rk_session *s, int64_t start, int64_t bulk_end, rk_err *err) {
    return rk_session_splice_rows(s, s->pf->splice_src, s->pf->splice_lo, s->pf->splice_hi, s->pf->splice_k,
                                  s->pf->splice_v, start, bulk_end, err);
}

/* The share of the sparse rows' non-forced blocks that the estimated lines selected between
 * two readings of the counters (dflt when none ran). */
static double lines_share(const rk_attn_sparse_stats *now, const rk_attn_sparse_stats *then, double dflt) {
    const double num =
        (double)(now->blocks_done - then->blocks_done) - (double)(now->blocks_forced - then->blocks_forced);
    const double den =
        (double)(now->blocks_causal - then->blocks_causal) - (double)(now->blocks_forced - then->blocks_forced);
    return den > 0 && num >= 0 ? num / den : dflt;
}

#define RK_COST_LINES_PRIOR 0.3 /* the lines' share before any sparse call of the call ran */

/* After plan p ran: the call's tokens in proportion to the predicted time of the work done
 * (monotone; all of them only after the last chunk, since the total is estimated before the
 * selection of exact rows is known). */
static rk_status progress(pass *q, const rk_chunk_plan *p, bool last, rk_err *err) {
    rk_session *s = q->s;
    if (!s->progress) return RK_OK;
    const rk_cost c = rk_cost_chunk(s, &q->cost, p);
    const rk_attn_sparse_stats *st = &s->pf->sparse_stats;
    const double here = lines_share(st, &q->sp_last, -1.0);
    /* the share for the rows still to read: the recent chunks' (it falls as the keys grow) */
    if (here >= 0) q->share = q->share < 0 ? here : q->share + 0.2 * (here - q->share);
    const double share = q->share >= 0 ? q->share : RK_COST_LINES_PRIOR;
    const double x2 = c.attn + (here >= 0 ? here : share) * c.lines, t = rk_time_now();
    if (q->n_chunks++ > 0) rk_cost_fit_add(&q->fit, c.mat, x2, t - q->t_last); /* the first pays for cold pages */
    q->t_last = t, q->sp_last = *st;
    q->done.mat += c.mat, q->done.attn += x2;
    q->done_model.mat += c.mat, q->done_model.attn += c.attn, q->done_model.lines += c.lines;
    const double r = rk_cost_fit_ratio(&q->fit);
    const double t_done = q->done.mat + r * q->done.attn;
    double t_left = q->total.mat - q->done_model.mat;
    t_left = (t_left > 0 ? t_left : 0) +
             r * ((q->total.attn > q->done_model.attn ? q->total.attn - q->done_model.attn : 0) +
                  share * (q->total.lines > q->done_model.lines ? q->total.lines - q->done_model.lines : 0));
    const int64_t n = (int64_t)q->n;
    int64_t done = last ? n : t_done + t_left > 0 ? (int64_t)((double)n * t_done / (t_done + t_left) + 0.5) : 0;
    if (!last && done > n - 1) done = n - 1;
    if (done < q->reported) done = q->reported;
    q->reported = done;
    if (!s->progress(s->progress_ud, done, n) && !last)
        return rk_err_set(err, RK_E_CANCELLED, "session: cancelled after %lld of %zu tokens", (long long)done, q->n);
    return RK_OK;
}

/* The cost of the whole call under the cost model, chunk by chunk over every layer, with
 * the expected share of exact bulk rows in late layers (the selection comes later). */
static rk_cost total_cost(const pass *q) {
    rk_session *s = q->s;
    const int n_layer = s->m->hp.n_layer, split = rk_plan_split(s);
    const rk_fill_mode mode = s->fill.mode;
    rk_cost t = {0};
    for (size_t done = 0; done < q->n;) {
        const size_t c = chunk_len(q, done);
        const int64_t pos = q->start + (int64_t)done;
        rk_chunk_plan p = {.pos0 = pos, .n = (int64_t)c, .layer_lo = 0, .layer_hi = n_layer, .split = n_layer};
        p.src = mode == RK_FILL_PLUMB ? RK_SRC_EXACT : mode == RK_FILL_IDENTITY ? RK_SRC_IDENTITY : RK_SRC_RIDGE;
        p.n_ex = (int64_t)c;
        if (mode != RK_FILL_OFF && pos < q->bulk_end) {
            p.split = split;
            p.n_fill = (int64_t)c;
            p.n_ex = mode == RK_FILL_PLUMB ? (int64_t)c : llround((double)c * q->cost.share);
            if (mode != RK_FILL_PLUMB) p.n_fill -= p.n_ex;
        }
        const rk_cost k = rk_cost_chunk(s, &q->cost, &p);
        t.mat += k.mat, t.attn += k.attn, t.lines += k.lines;
        done += c;
    }
    return t;
}

/* The cost model's view of the call (after bulk_end is known). */
static void cost_setup(pass *q, bool selects) {
    rk_session *s = q->s;
    const int64_t nb = q->bulk_end - q->start;
    double share = 0;
    if (selects && nb > 0) { /* select_rows: the sinks, then keep_share of the rest */
        const int64_t sinks = s->fill.n_sink < nb ? (s->fill.n_sink > 0 ? s->fill.n_sink : 0) : nb;
        share = ((double)sinks + (double)rk_fill_keep_count(&s->fill, nb - sinks)) / (double)nb;
    }
    q->cost = (rk_cost_ctx){.start = q->start,
                            .bulk_end = q->bulk_end,
                            .end = q->start + (int64_t)q->n,
                            .share = share,
                            .group = s->pf->fg ? s->fill.group : 0,
                            .logits = q->logits != NULL,
                            .all_rows = q->all_rows};
    rk_sparse_params sp;
    rk_sparse_resolve(&s->fill.sparse, &sp);
    if (s->fill.sparse.on && !s->dev) {
        q->cost.sp_on = true;
        q->cost.sp_min_kv = sp.min_kv, q->cost.sp_dense_from = s->pf->sparse_end - sp.tail;
        q->cost.sp_block = sp.block, q->cost.sp_sink_b = (sp.n_sink + sp.block - 1) / sp.block;
        q->cost.sp_window = sp.window, q->cost.sp_n_est = sp.n_est;
    }
    if (!s->progress) return;
    q->total = total_cost(q);
    q->t_last = rk_time_now();
    q->sp_last = s->pf->sparse_stats;
    q->share = -1.0;
    q->fit = (rk_cost_fit){.prior = rk_cost_attn_prior(&s->m->hp)};
}

/* Rows [done, done + c) of the split stream as f32 (chunks never straddle bulk_end = x_half_n,
 * so a chunk is all f16 rows or all f32 ones). */
static const float *stream_rows(pass *q, const float *x_split, size_t done, size_t c) {
    const size_t d = (size_t)q->s->m->hp.n_embd;
    if ((int64_t)done >= q->x_half_n) return x_split + (done - (size_t)q->x_half_n) * d;
    const uint16_t *h = q->x_half + done * d;
    for (size_t i = 0; i < c * d; i++) q->x_buf[i] = rk_f16_to_f32(h[i]);
    rk_prefill_xs_release(q->s, (int64_t)(done + c));
    return q->x_buf;
}

/* Before the late pass: a kept stream of stream_file KiB or more moves into a file
 * (plan_impl.h), so that the late pass, the document cache and a later question hold only
 * the rows they read at a time (0.30 GiB at 106K rows on a 1.5B model, at the read's peak).
 * The rows are the same bytes; without a file (a full or read-only spill directory) the
 * stream stays in memory, with the same result; so it does when the directory is itself in
 * memory (tmpfs), where a file would save nothing. */
static void xs_to_file(rk_session *s) {
    rk_prefill_state *f = s->pf;
    const int64_t kib = s->fill.stream_file > 0 ? s->fill.stream_file : s->fill.stream_file == 0 ? 65536 : -1;
    const size_t bytes = (size_t)(f->xs_hi - f->xs_lo) * (size_t)s->m->hp.n_embd * sizeof(uint16_t);
    if (!f->xs_keep || f->xs_map || kib < 0 || bytes < (size_t)kib * 1024) return;
    const void *m = NULL;
    if (rk_io_map_copy(f->spill_dir, f->xs_keep, bytes, &m, &(rk_err){0})) return;
    free(f->xs_keep);
    f->xs_keep = (uint16_t *)m, f->xs_map_base = m, f->xs_map = bytes;
}

/* Before the late pass: the bulk rows' stream is kept as f16 beside the selection
 * (keep_stream, whose rounding x_split already holds), so the late pass reads those rows from
 * there and x_split shrinks to the rows after them. On a 1.5B model at 100K rows that is
 * 0.6 GiB of f32 gone while the late layers' KV grows. Without memory for the small copy the
 * stream stays whole (the same result). */
static void shrink_stream(pass *q, float **x_split) {
    const rk_prefill_state *f = q->s->pf;
    const int64_t nb = q->bulk_end - q->start;
    if (!f->xs_keep || f->xs_lo != q->start || f->xs_hi != q->bulk_end || nb <= 0 || q->x_half) return;
    const size_t d = (size_t)q->s->m->hp.n_embd, tail = q->n - (size_t)nb;
    float *t = malloc((tail ? tail : 1) * d * sizeof(float));
    float *buf = malloc((size_t)q->s->p.n_batch * d * sizeof(float));
    if (!t || !buf) {
        free(t), free(buf);
        return;
    }
    memcpy(t, *x_split + (size_t)nb * d, tail * d * sizeof(float));
    free(*x_split);
    *x_split = t;
    q->x_half = f->xs_keep, q->x_half_n = nb, q->x_buf = buf;
}

/* Layers [lo, hi) over every chunk; x_split (n, n_embd): where a pass ending before the
 * last layer leaves each row's stream, and where a pass starting after layer 0 reads it. */
static rk_status run_layers(pass *q, int lo, int hi, float *x_split, rk_err *err) {
    rk_session *s = q->s;
    const rk_hparams *hp = &s->m->hp;
    const size_t d = (size_t)hp->n_embd;
    size_t done = q->at.lo == lo && q->at.hi == hi ? (size_t)q->at.done : 0; /* resumed mid-pass */
    while (done < q->n) {
        const size_t c = chunk_len(q, done);
        const int64_t pos = q->start + (int64_t)done;
        rk_status st;
        if (hi == hp->n_layer && s->pf->splice_src && pos == q->bulk_end && q->bulk_end > q->start &&
            (st = splice(s, q->start, q->bulk_end, err)))
            return st;
        rk_chunk_plan p;
        rk_plan_chunk(s, pos, (int64_t)c, q->bulk_end, lo, hi, &p);
        if (q->q_keep && lo < q->q_hi && hi > q->q_lo && pos + (int64_t)c > q->q_pos0) {
            p.q_keep = q->q_keep, p.q_lo = q->q_lo, p.q_hi = q->q_hi, p.q_pos0 = q->q_pos0, p.q_n = q->q_n;
        }
        if (lo > 0) p.x_in = stream_rows(q, x_split, done, c);
        if (hi < hp->n_layer) p.x_out = x_split + done * d; /* a first pass: never shrunk */
        float *lg = NULL;
        if (hi == hp->n_layer && q->logits) {
            if (q->all_rows) lg = q->logits + done * (size_t)hp->n_vocab;
            else if (done + c == q->n) lg = q->logits;
        }
        if ((st = rk_forward_chunk(s, &p, q->ids + done, lg, q->all_rows, err))) return st;
        done += c;
        if (q->s->ckpt && q->at.ids) {
            q->at.lo = lo, q->at.hi = hi, q->at.done = (int64_t)done, q->at.x_split = x_split;
            q->at.x_half = q->x_half, q->at.x_half_n = q->x_half_n;
            q->s->ckpt->at(q->s->ckpt, q->s, &q->at);
        }
        if ((st = progress(q, &p, hi == hp->n_layer && done == q->n, err))) return st;
    }
    return RK_OK;
}

/* Keeps the bulk rows' split stream (f16) and the baseline attention for re-scoring. */
static rk_status keep_stream(pass *q, float *x_split, const float *base, int64_t r0, rk_err *err) {
    rk_session *s = q->s;
    const int64_t nb = q->bulk_end - q->start, d = s->m->hp.n_embd;
    rk_prefill_xs_drop(s->pf);
    if (s->fill.keep_selection) return RK_OK; /* no re-scoring: nothing kept, the stream stays f32 */
    s->pf->xs_keep = malloc((size_t)(nb * d) * sizeof(uint16_t));
    s->pf->xs_base = calloc((size_t)nb, sizeof(float));
    s->pf->xs_lo = s->pf->xs_hi = 0;
    if (!s->pf->xs_keep || !s->pf->xs_base) {
        free(s->pf->xs_keep), free(s->pf->xs_base);
        s->pf->xs_keep = NULL, s->pf->xs_base = NULL;
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory to keep the split stream of %lld rows", (long long)nb);
    }
    /* the late layers of this call read the rounded stream too, so that rows a later
     * question recomputes or refills from the kept copy match rows it leaves alone */
    for (int64_t i = 0; i < nb * d; i++) {
        s->pf->xs_keep[i] = rk_f32_to_f16(x_split[i]);
        x_split[i] = rk_f16_to_f32(s->pf->xs_keep[i]);
    }
    if (base && q->n_base > 0)
        for (int64_t j = r0; j < q->bulk_end; j++) s->pf->xs_base[j - q->start] = base[j - r0] / (float)q->n_base;
    s->pf->xs_lo = q->start, s->pf->xs_hi = q->bulk_end, s->pf->xs_split = rk_plan_split(s);
    return RK_OK;
}

/* The document's own selection: a copy of s->pf->keep as it is now. */
static rk_status save_keep0(rk_session *s, rk_err *err) {
    const int64_t nb = s->pf->keep_hi - s->pf->keep_lo;
    free(s->pf->keep0);
    s->pf->keep0 = malloc(nb > 0 ? (size_t)nb : 1);
    if (!s->pf->keep0)
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for a selection of %lld rows", (long long)nb);
    if (nb > 0) memcpy(s->pf->keep0, s->pf->keep, (size_t)nb);
    return RK_OK;
}

/* After the early layers: scores the bulk rows by the question's attention at the layers
 * [q_lo, q_hi) and fills s->pf->keep (sinks + the keep_share of the other bulk rows: the
 * recency band, then the top scores). */
static rk_status select_rows(pass *q, float *x_split, rk_err *err) {
    rk_session *s = q->s;
    const rk_fill_params *f = &s->fill;
    const int64_t nb = q->bulk_end - q->start;
    free(s->pf->keep), free(s->pf->keep0);
    s->pf->keep0 = NULL; /* made again below once this selection is complete */
    s->pf->keep = calloc((size_t)nb, 1);
    if (!s->pf->keep)
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for the selection of %lld rows", (long long)nb);
    s->pf->keep_lo = q->start, s->pf->keep_hi = q->bulk_end;
    int64_t r0 = q->start;
    for (; r0 < q->bulk_end && r0 < f->n_sink; r0++) s->pf->keep[r0 - q->start] = 1;
    const int64_t n_sc = q->bulk_end - r0;
    const int64_t n_keep = rk_fill_keep_count(f, n_sc);
    if (n_sc <= 0 || n_keep <= 0) {
        rk_status st0 = keep_stream(q, x_split, NULL, r0, err);
        return st0 ? st0 : save_keep0(s, err);
    }
    float *score = calloc((size_t)n_sc, sizeof(float));
    if (!score) return rk_err_set(err, RK_E_NOMEM, "prefill: no memory to score %lld rows", (long long)n_sc);
    const int64_t qd = (int64_t)s->m->hp.n_head * s->m->hp.head_dim;
    rk_status st = RK_OK;
    const int64_t nq = q->q_n - q->n_base;
    float *base = q->n_base ? calloc((size_t)n_sc, sizeof(float)) : NULL;
    if (q->n_base && !base) st = rk_err_set(err, RK_E_NOMEM, "prefill: no memory to score %lld rows", (long long)n_sc);
    for (int l = q->q_lo; l < q->q_hi && !st; l++) {
        const float *ql = q->q_keep + (int64_t)(l - q->q_lo) * q->q_n * qd;
        st = rk_select_score(s, l, ql + q->n_base * qd, nq, q->q_pos0 + q->n_base, r0, q->bulk_end, score, err);
        if (!st && base) st = rk_select_score(s, l, ql, q->n_base, q->q_pos0, r0, q->bulk_end, base, err);
    }
    if (!st) st = keep_stream(q, x_split, base, r0, err);
    /* what the question pays a row beyond what any text row pays it */
    if (!st && base)
        for (int64_t j = 0; j < n_sc; j++) {
            const float c = score[j] - (float)nq / (float)q->n_base * base[j];
            score[j] = c > 0.0f ? c : 0.0f;
        }
    free(base);
    if (!st) st = rk_select_rows(score, n_sc, f->pool, n_keep, f->band, s->pf->keep + (r0 - q->start), err);
    free(score);
    if (!st) st = save_keep0(s, err);
    return st;
}

/* Whether this call re-scores the kept rows: a question-aware session whose last selecting
 * call kept a stream wholly before this call, this call has no bulk rows of its own and
 * is not a decode step, the cache can take rewritten rows. */
static bool can_rescore(const rk_session *s, const pass *q, int split) {
    const rk_fill_params *f = &s->fill;
    if (s->pf->xs_keep && s->pf->xs_hi > q->start) /* truncated below the kept rows: the stream is stale */
        rk_prefill_xs_drop(s->pf);
    return s->pf->xs_keep && f->question_aware && f->layer_major && !f->keep_selection && f->mode != RK_FILL_OFF &&
           q->bulk_end == q->start && q->n >= 2 && split > 0 && split < s->m->hp.n_layer && split == s->pf->xs_split &&
           s->pf->keep && s->pf->keep0 && s->pf->keep_lo == s->pf->xs_lo && s->pf->keep_hi == s->pf->xs_hi &&
           s->pf->xs_hi > s->pf->xs_lo && s->kv->ops->writable && !s->pf->splice_src;
}

/* The default number of rows a question may add (rescore_rows 0): as many as make the work
 * of RK_RESCORE_ROWS rows that attend to RK_RESCORE_KEYS keys. A row's late-layer work is its
 * matrices plus attention over the rows before it (half the document's n_keys on average),
 * so a longer document gets fewer rows: on Qwen2.5-1.5B 711 at 16K keys, 247 at 104K. */
#define RK_RESCORE_ROWS 1024
#define RK_RESCORE_KEYS 2048
static int64_t rescore_default(const rk_hparams *hp, int64_t n_keys) {
    const double q = (double)hp->n_head * hp->head_dim, mat = rk_cost_full_row(hp);
    const double ref = mat + 4.0 * q * 0.5 * RK_RESCORE_KEYS, w = mat + 4.0 * q * 0.5 * (double)n_keys;
    const double rows = w > ref ? RK_RESCORE_ROWS * ref / w : RK_RESCORE_ROWS;
    return rows >= 1.0 ? (int64_t)rows : 1;
}

/* The kept rows again, for this call's question: score them by its last obs rows (queries
 * in q->q_keep) and make exact, beside the document's own selection (keep0), the rows it
 * pays most for, at most rescore_rows of them (rescore_default when 0). Rows of keep0 keep the K/V of the document's
 * eval; rows an earlier question added and this one does not get predicted K/V again; from
 * the first row whose status changes, the rows this question adds run through the late
 * layers in position order, so each attends to the keys the new selection gives its prefix.
 * So the rows run are at most twice rescore_rows whatever the document's length, and the
 * state left does not depend on the questions before. */
static rk_status rescore(pass *q, int split, rk_err *err) {
    rk_session *s = q->s;
    const rk_fill_params *f = &s->fill;
    const rk_hparams *hp = &s->m->hp;
    const int64_t d = hp->n_embd, lo = s->pf->xs_lo, hi = s->pf->xs_hi, nb = hi - lo;
    const double t0 = rk_time_now();
    int64_t r0 = lo < f->n_sink ? f->n_sink : lo;
    if (r0 > hi) r0 = hi;
    const int64_t n_sc = hi - r0, n_keep = rk_fill_keep_count(f, n_sc);
    const int64_t budget = f->rescore_rows > 0 ? f->rescore_rows : rescore_default(hp, hi);
    /* the default budget is also held to the document's own share; a count given is taken */
    const int64_t max_new = f->rescore_rows > 0 || n_keep > budget ? budget : n_keep;
    uint8_t *nk = malloc((size_t)nb);
    float *score = calloc((size_t)(n_sc > 0 ? n_sc : 1), sizeof(float));
    float *xin = malloc((size_t)s->p.n_batch * (size_t)d * sizeof(float));
    rk_status st = RK_OK;
    if (!nk || !score || !xin)
        st = rk_err_set(err, RK_E_NOMEM, "prefill: no memory to re-score %lld rows", (long long)nb);
    if (!st) memcpy(nk, s->pf->keep0, (size_t)nb);
    const int64_t qd = (int64_t)hp->n_head * hp->head_dim;
    for (int l = q->q_lo; l < q->q_hi && !st && n_sc > 0 && max_new > 0; l++)
        st = rk_select_score(s, l, q->q_keep + (int64_t)(l - q->q_lo) * q->q_n * qd, q->q_n, q->q_pos0, r0, hi, score,
                             err);
    int64_t n_new = 0;
    if (!st && n_sc > 0 && max_new > 0) {
        for (int64_t j = 0; j < n_sc; j++) {
            const float c = score[j] - (float)q->q_n * s->pf->xs_base[r0 - lo + j];
            score[j] = c > 0.0f ? c : 0.0f;
        }
        st = rk_select_extra(score, n_sc, f->pool, f->pool_after, s->pf->keep0 + (r0 - lo), max_new, nk + (r0 - lo),
                             &n_new, err);
    }
    int64_t first = nb, changed = 0, recomputed = 0, refilled = 0;
    for (int64_t j = 0; j < nb && !st; j++)
        if (nk[j] != s->pf->keep[j]) {
            changed++;
            if (first == nb) first = j;
        }
    /* the old selection, then the new one in its place (plan.c reads s->pf->keep) */
    uint8_t *old = s->pf->keep;
    if (!st) s->pf->keep = nk, nk = old;
    s->pf->selecting = !st;
    const uint8_t *k0 = s->pf->keep0;
    for (int64_t j = first; j < nb && !st;) {
        /* the document's own rows and rows filled before and after keep their K/V */
        const bool run = (s->pf->keep[j] && !k0[j]) || (!s->pf->keep[j] && nk[j]);
        if (!run) {
            j++;
            continue;
        }
        int64_t c = 0;
        while (j + c < nb && c < s->p.n_batch &&
               ((s->pf->keep[j + c] && !k0[j + c]) || (!s->pf->keep[j + c] && nk[j + c])))
            c++;
        for (int64_t i = 0; i < c * d; i++) xin[i] = rk_f16_to_f32(s->pf->xs_keep[(j * d) + i]);
        for (int64_t i = 0; i < c; i++) s->pf->keep[j + i] ? recomputed++ : refilled++;
        rk_chunk_plan p;
        rk_plan_chunk(s, lo + j, c, hi, split, hp->n_layer, &p);
        p.x_in = xin;
        st = rk_forward_chunk(s, &p, s->tokens + lo + j, NULL, false, err);
        rk_prefill_xs_release(s, j + c);
        j += c;
    }
    s->pf->selecting = false;
    free(nk), free(score), free(xin);
    if (st) return rk_err_wrap(err, "prefill: re-scoring %lld kept rows for the question", (long long)nb);
    s->pf->rescore =
        (rk_fill_rescore_stats){s->pf->rescore.calls + 1, n_sc, changed, recomputed, refilled, rk_time_now() - t0};
    return RK_OK;
}

/* This call's rows through layers 0..S-1, the kept rows re-scored by its question, then
 * its rows through the late layers (all exact: the call has no bulk rows). */
static rk_status rescore_run(pass *q, int split, rk_err *err) {
    rk_session *s = q->s;
    const rk_hparams *hp = &s->m->hp;
    float *x_split = malloc(q->n * (size_t)hp->n_embd * sizeof(float));
    q->q_n = s->fill.obs < (int64_t)q->n ? s->fill.obs : (int64_t)q->n;
    q->n_base = 0; /* the text rows' attention was kept with the stream */
    q->q_pos0 = q->start + (int64_t)q->n - q->q_n;
    q->q_hi = split - s->fill.score_skip;
    q->q_lo = q->q_hi - s->fill.score_layers;
    q->q_keep = malloc((size_t)(q->q_hi - q->q_lo) * (size_t)q->q_n * (size_t)hp->n_head * (size_t)hp->head_dim *
                       sizeof(float));
    rk_status st = RK_OK;
    if (!x_split || !q->q_keep) st = rk_err_set(err, RK_E_NOMEM, "prefill: no memory to re-score for %zu rows", q->n);
    if (!st) st = run_layers(q, 0, split, x_split, err);
    if (!st) st = rescore(q, split, err);
    free(q->q_keep);
    q->q_keep = NULL;
    if (!st) st = run_layers(q, split, hp->n_layer, x_split, err);
    free(x_split);
    return st;
}

/* Staged prefill (the KV policy asked for it, rk_kv_ops.stages): layers [0, ends[0]) over every
 * chunk, then the policy's layers_done, then the next stage; the stream between stages is
 * x_split, as in the layer-major fill phase. */
static rk_status staged_run(pass *q, const int *ends, int n_end, rk_err *err) {
    rk_session *s = q->s;
    const rk_hparams *hp = &s->m->hp;
    float *x_split = malloc(q->n * (size_t)hp->n_embd * sizeof(float));
    if (!x_split)
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for the stream of %zu rows (staged prefill)", q->n);
    rk_status st = RK_OK;
    for (int i = 0, lo = 0; i <= n_end && !st; i++) {
        const int hi = i < n_end ? ends[i] : hp->n_layer;
        st = run_layers(q, lo, hi, x_split, err);
        if (!st && i < n_end) st = s->kv->ops->layers_done(s->kv, hi, q->start + (int64_t)q->n, q->start, err);
        lo = hi;
    }
    free(x_split);
    return st;
}

/* The layer boundaries of a staged prefill, or 0: the policy has none for this eval, or the
 * eval is not a plain one (fill, splice, a device backend, a single row) */
static int stages(rk_session *s, const pass *q, int *ends, int max) {
    if (s->fill.mode != RK_FILL_OFF || s->pf->splice_src || s->dev || q->n < 2 || !s->kv->ops->stages ||
        !s->kv->ops->layers_done)
        return 0;
    const int n = s->kv->ops->stages(s->kv, q->start + (int64_t)q->n, ends, max);
    for (int i = 0; i < n; i++) /* increasing, inside (0, n_layer) */
        if (ends[i] <= (i ? ends[i - 1] : 0) || ends[i] >= s->m->hp.n_layer) return 0;
    return n;
}

static rk_status prefill_run(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err);

/* A checkpointed call from row 0: the hook restores what a checkpoint of it holds, and the
 * progress counts the work restored as done. */
static rk_status resume(pass *q, float *x_split, int split, rk_err *err) {
    if (!q->at.ids) return RK_OK;
    const size_t qd = (size_t)q->s->m->hp.n_head * (size_t)q->s->m->hp.head_dim;
    q->at.bulk_end = q->bulk_end, q->at.split = split, q->at.x_split = x_split, q->at.q_keep = q->q_keep;
    q->at.n_q = q->q_keep ? (size_t)(q->q_hi - q->q_lo) * (size_t)q->q_n * qd : 0;
    rk_status st = q->s->ckpt->resume(q->s->ckpt, q->s, &q->at, err);
    /* the restored share of rows x layers, as a share of the cost model's total */
    if (!st && q->at.lo >= 0) {
        const double f = ((double)q->n * q->at.lo + (double)q->at.done * (q->at.hi - q->at.lo)) /
                         ((double)q->n * q->s->m->hp.n_layer);
        q->done_model = (rk_cost){f * q->total.mat, f * q->total.attn, f * q->total.lines};
        q->done = (rk_cost){f * q->total.mat, f * (q->total.attn + RK_COST_LINES_PRIOR * q->total.lines), 0};
    }
    return st;
}

/* An eval call; with fill grouping (rk_fill_params.group) its late layers attend to the
 * grouped list that fill_group.c builds during the call. */
rk_status rk_prefill_run(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err) {
    rk_status st = RK_OK;
    s->pf->sparse_end = s->n_past + (int64_t)n; /* sparse.c: the call's last rows attend densely */
    if (s->fill.group > 0 && n > 1) st = rk_fill_group_begin(s, s->n_past, rk_plan_split(s), err);
    if (!st) st = prefill_run(s, ids, n, logits, all_rows, err);
    rk_fill_group_end(s);
    return st;
}

static rk_status prefill_run(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    pass q = {
        .s = s, .ids = ids, .n = n, .start = s->n_past, .bulk_end = s->n_past, .logits = logits, .all_rows = all_rows};
    /* bulk rows: at least `tail` tokens of this call after them */
    if (s->fill.mode != RK_FILL_OFF) q.bulk_end = q.start + (int64_t)n - s->fill.tail;
    if (q.bulk_end < q.start) q.bulk_end = q.start;
    const int split = rk_plan_split(s);
    const bool layer_major = s->fill.layer_major && q.bulk_end > q.start && split > 0 && split < hp->n_layer;
    cost_setup(&q, layer_major && s->fill.question_aware);
    if (can_rescore(s, &q, split)) return rescore_run(&q, split, err);
    int ends[64];
    const int n_st = stages(s, &q, ends, 64);
    if (n_st > 0) return staged_run(&q, ends, n_st, err);
    q.at = (rk_prefill_point){.ids = s->ckpt && q.start == 0 ? ids : NULL, .n = (int64_t)n, .lo = -1, .hi = -1};
    if (!layer_major) {
        rk_status st = resume(&q, NULL, split, err);
        return st ? st : run_layers(&q, 0, hp->n_layer, NULL, err);
    }
    /* (n, n_embd) split stream of every row: the price of the layer-major phase */
    float *x_split = malloc(n * (size_t)hp->n_embd * sizeof(float));
    if (!x_split)
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for the split stream of %zu rows (layer-major phase)",
                          n);
    rk_status st = RK_OK;
    if (s->fill.question_aware) {
        /* the question: the last obs rows of the call (never bulk rows) */
        const int64_t after = q.start + (int64_t)n - q.bulk_end;
        q.q_n = s->fill.obs < after ? s->fill.obs : after;
        q.n_base = s->fill.baseline < after - q.q_n ? s->fill.baseline : after - q.q_n;
        q.q_n += q.n_base; /* the baseline rows first, then the question */
        q.q_pos0 = q.start + (int64_t)n - q.q_n;
        q.q_hi = split - s->fill.score_skip;
        q.q_lo = q.q_hi - s->fill.score_layers;
        q.q_keep = malloc((size_t)(q.q_hi - q.q_lo) * (size_t)q.q_n * (size_t)hp->n_head * (size_t)hp->head_dim *
                          sizeof(float));
        if (!q.q_keep) st = rk_err_set(err, RK_E_NOMEM, "prefill: no memory for the question's queries");
    }
    if (!st) st = resume(&q, x_split, split, err);
    const bool late = q.at.lo == split; /* resumed in the late pass: the selection is restored */
    if (!st && !late) st = run_layers(&q, 0, split, x_split, err);
    if (!st && q.q_keep && !late) st = select_rows(&q, x_split, err);
    /* a restored selection is the document's own, as select_rows would have left it */
    if (!st && q.q_keep && late && s->pf->keep) st = save_keep0(s, err);
    s->pf->selecting = !st && q.q_keep;
    if (!st) xs_to_file(s);
    if (!st) shrink_stream(&q, &x_split);
    if (!st) st = run_layers(&q, split, hp->n_layer, x_split, err);
    s->pf->selecting = false; /* the selection stays readable: rk_session_fill_kept */
    free(q.q_keep);
    free(x_split), free(q.x_buf);
    return st;
}

rk_status rk_prefill_init(rk_session *s, rk_err *err) {
    s->pf = calloc(1, sizeof *s->pf);
    if (!s->pf) return rk_err_set(err, RK_E_NOMEM, "prefill: out of memory");
    const char *dir = s->p.kv.spill_dir && *s->p.kv.spill_dir ? s->p.kv.spill_dir : "/tmp";
    snprintf(s->pf->spill_dir, sizeof s->pf->spill_dir, "%s", dir);
    return RK_OK;
}

void rk_prefill_deinit(rk_session *s) {
    if (!s->pf) return;
    rk_fill_group_end(s);
    rk_prefill_xs_drop(s->pf);
    free(s->pf->keep), free(s->pf->keep0);
    free(s->pf);
    s->pf = NULL;
}

/* The kept split stream is stale once its rows leave the session. */
void rk_prefill_forget(rk_session *s, int64_t n) {
    rk_prefill_state *f = s->pf;
    if (f->xs_keep && n < f->xs_hi) rk_prefill_xs_drop(f);
}

void rk_prefill_xs_drop(rk_prefill_state *f) {
    if (f->xs_map) rk_io_map_free(f->xs_map_base, f->xs_map);
    else free(f->xs_keep);
    free(f->xs_base);
    f->xs_keep = NULL, f->xs_base = NULL, f->xs_map_base = NULL, f->xs_map = 0, f->xs_lo = f->xs_hi = 0;
}

void rk_prefill_xs_release(const rk_session *s, int64_t r) {
    const rk_prefill_state *f = s->pf;
    const size_t row = (size_t)s->m->hp.n_embd * sizeof(uint16_t);
    if (r > f->xs_hi - f->xs_lo) r = f->xs_hi - f->xs_lo;
    const size_t at = f->xs_map ? (size_t)((const uint8_t *)f->xs_keep - (const uint8_t *)f->xs_map_base) : 0;
    if (f->xs_map && r > 0) rk_io_map_release(f->xs_map_base, 0, at + (size_t)r * row, f->xs_map);
}

int64_t rk_session_fill_kept(const rk_session *s, int64_t row0, int64_t n) {
    if (!s->pf->keep) return -1;
    int64_t k = 0;
    for (int64_t r = row0 < s->pf->keep_lo ? s->pf->keep_lo : row0; r < row0 + n && r < s->pf->keep_hi; r++)
        k += s->pf->keep[r - s->pf->keep_lo];
    return k;
}

void rk_session_fill_rescore_stats(const rk_session *s, rk_fill_rescore_stats *out) { *out = s->pf->rescore; }

bool rk_session_fill_stream(const rk_session *s, rk_fill_stream *out) {
    memset(out, 0, sizeof *out);
    if (!s->pf->xs_keep || !s->pf->keep || s->pf->keep_lo != s->pf->xs_lo || s->pf->keep_hi != s->pf->xs_hi ||
        s->pf->xs_hi > s->n_past)
        return false;
    *out = (rk_fill_stream){s->pf->xs_lo,
                            s->pf->xs_hi - s->pf->xs_lo,
                            (int32_t)s->m->hp.n_embd,
                            s->pf->xs_split,
                            s->pf->xs_keep,
                            s->pf->xs_base,
                            s->pf->keep};
    return true;
}

static rk_status stream_fits(const rk_session *s, int64_t row0, int64_t n, int32_t n_embd, int32_t split, rk_err *err) {
    const int64_t d = s->m->hp.n_embd;
    if (n_embd != d || row0 < 0 || n <= 0 || row0 + n > s->n_past || split < 1 || split >= s->m->hp.n_layer)
        return rk_err_set(err, RK_E_MISMATCH,
                          "prefill: a stream of rows [%lld, %lld) x %d at split %d does not fit this session "
                          "(%lld rows, n_embd %lld, %d layers)",
                          (long long)row0, (long long)(row0 + n), n_embd, split, (long long)s->n_past, (long long)d,
                          s->m->hp.n_layer);
    return RK_OK;
}

rk_status rk_session_fill_stream_adopt(rk_session *s, int64_t row0, int64_t n, int32_t split, uint16_t *x, float *base,
                                       uint8_t *keep, const void *map, size_t map_len, rk_err *err) {
    rk_status st = stream_fits(s, row0, n, (int32_t)s->m->hp.n_embd, split, err);
    uint8_t *k0 = st ? NULL : malloc((size_t)n);
    if (!st && !k0) st = rk_err_set(err, RK_E_NOMEM, "prefill: no memory for a stream of %lld rows", (long long)n);
    if (st) {
        if (map) rk_io_map_free(map, map_len);
        else free(x);
        free(base), free(keep);
        return st;
    }
    memcpy(k0, keep, (size_t)n); /* the loaded selection is the document's own */
    rk_prefill_xs_drop(s->pf);
    free(s->pf->keep), free(s->pf->keep0);
    s->pf->xs_keep = x, s->pf->xs_base = base, s->pf->keep = keep, s->pf->keep0 = k0;
    s->pf->xs_map_base = map, s->pf->xs_map = map ? map_len : 0;
    s->pf->xs_lo = s->pf->keep_lo = row0;
    s->pf->xs_hi = s->pf->keep_hi = row0 + n;
    s->pf->xs_split = split;
    return RK_OK;
}

rk_status rk_session_fill_stream_set(rk_session *s, const rk_fill_stream *in, rk_err *err) {
    const int64_t d = s->m->hp.n_embd;
    rk_status st = stream_fits(s, in->row0, in->n, in->n_embd, in->split, err);
    if (st) return st;
    uint16_t *x = malloc((size_t)(in->n * d) * sizeof(uint16_t));
    float *b = malloc((size_t)in->n * sizeof(float));
    uint8_t *k = malloc((size_t)in->n);
    if (!x || !b || !k) {
        free(x), free(b), free(k);
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for a stream of %lld rows", (long long)in->n);
    }
    memcpy(x, in->x, (size_t)(in->n * d) * sizeof(uint16_t));
    memcpy(b, in->base, (size_t)in->n * sizeof(float));
    memcpy(k, in->keep, (size_t)in->n);
    return rk_session_fill_stream_adopt(s, in->row0, in->n, in->split, x, b, k, NULL, 0, err);
}
