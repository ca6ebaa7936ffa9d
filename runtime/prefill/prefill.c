/* The prefill driver: an eval call's rows through the model in chunks of n_batch, each
 * chunk with its plan. Chunk-major (every layer of a chunk before the next chunk), or
 * layer-major when the fill settings ask for it: layers 0..S-1 over the whole prompt
 * first (the split stream of every row kept), then the late layers chunk by chunk; the
 * selection of exact rows may then use what the early layers saw (question-aware fill). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"

typedef struct pass {
    rk_session *s;
    const int32_t *ids;
    size_t n;
    int64_t start, bulk_end;
    float *logits;
    bool all_rows;
    double done_work, total_work; /* in rows x layers, for progress */
    /* question-aware selection: queries of rows [q_pos0, q_pos0 + q_n) at layers [q_lo, q_hi) */
    float *q_keep;
    int q_lo, q_hi;
    int64_t q_pos0, q_n, n_base; /* the first n_base of the q_n rows are the baseline */
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
    return rk_session_splice_rows(s, s->splice_src, s->splice_lo, s->splice_hi, s->splice_k, s->splice_v, start,
                                  bulk_end, err);
}

static rk_status progress(pass *q, double work, rk_err *err) {
    rk_session *s = q->s;
    q->done_work += work;
    if (!s->progress) return RK_OK;
    const int64_t done = (int64_t)((double)q->n * q->done_work / q->total_work + 0.5);
    if (!s->progress(s->progress_ud, done, (int64_t)q->n) && q->done_work < q->total_work)
        return rk_err_set(err, RK_E_CANCELLED, "session: cancelled after %lld of %zu tokens", (long long)done, q->n);
    return RK_OK;
}

/* Layers [lo, hi) over every chunk; x_split (n, n_embd): where a pass ending before the
 * last layer leaves each row's stream, and where a pass starting after layer 0 reads it. */
static rk_status run_layers(pass *q, int lo, int hi, float *x_split, rk_err *err) {
    rk_session *s = q->s;
    const rk_hparams *hp = &s->m->hp;
    const size_t d = (size_t)hp->n_embd;
    for (size_t done = 0; done < q->n;) {
        const size_t c = chunk_len(q, done);
        const int64_t pos = q->start + (int64_t)done;
        rk_status st;
        if (hi == hp->n_layer && s->splice_src && pos == q->bulk_end && q->bulk_end > q->start &&
            (st = splice(s, q->start, q->bulk_end, err)))
            return st;
        rk_chunk_plan p;
        rk_plan_chunk(s, pos, (int64_t)c, q->bulk_end, lo, hi, &p);
        if (q->q_keep && lo < q->q_hi && hi > q->q_lo && pos + (int64_t)c > q->q_pos0) {
            p.q_keep = q->q_keep, p.q_lo = q->q_lo, p.q_hi = q->q_hi, p.q_pos0 = q->q_pos0, p.q_n = q->q_n;
        }
        if (lo > 0) p.x_in = x_split + done * d;
        if (hi < hp->n_layer) p.x_out = x_split + done * d;
        float *lg = NULL;
        if (hi == hp->n_layer && q->logits) {
            if (q->all_rows) lg = q->logits + done * (size_t)hp->n_vocab;
            else if (done + c == q->n) lg = q->logits;
        }
        if ((st = rk_forward_chunk(s, &p, q->ids + done, lg, q->all_rows, err))) return st;
        done += c;
        if ((st = progress(q, (double)c * (hi - lo), err))) return st;
    }
    return RK_OK;
}

/* After the early layers: scores the bulk rows by the question's attention at the layers
 * [q_lo, q_hi) and fills s->keep (sinks + the top keep_share of the other bulk rows). */
static rk_status select_rows(pass *q, rk_err *err) {
    rk_session *s = q->s;
    const rk_fill_params *f = &s->fill;
    const int64_t nb = q->bulk_end - q->start;
    free(s->keep);
    s->keep = calloc((size_t)nb, 1);
    if (!s->keep) return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for the selection of %lld rows", (long long)nb);
    s->keep_lo = q->start, s->keep_hi = q->bulk_end;
    int64_t r0 = q->start;
    for (; r0 < q->bulk_end && r0 < f->n_sink; r0++) s->keep[r0 - q->start] = 1;
    const int64_t n_sc = q->bulk_end - r0;
    const int64_t n_keep = (int64_t)llround((double)f->keep_share * (double)n_sc);
    if (n_sc <= 0 || n_keep <= 0) return RK_OK;
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
    /* what the question pays a row beyond what any text row pays it */
    if (!st && base)
        for (int64_t j = 0; j < n_sc; j++) {
            const float c = score[j] - (float)nq / (float)q->n_base * base[j];
            score[j] = c > 0.0f ? c : 0.0f;
        }
    free(base);
    if (!st) st = rk_select_top(score, n_sc, f->pool, n_keep, s->keep + (r0 - q->start), err);
    free(score);
    return st;
}

rk_status rk_prefill_run(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    pass q = {.s = s, .ids = ids, .n = n, .start = s->n_past, .bulk_end = s->n_past, .logits = logits,
              .all_rows = all_rows, .total_work = (double)n * hp->n_layer};
    /* bulk rows: at least `tail` tokens of this call after them */
    if (s->fill.mode != RK_FILL_OFF) q.bulk_end = q.start + (int64_t)n - s->fill.tail;
    if (q.bulk_end < q.start) q.bulk_end = q.start;
    const int split = rk_plan_split(s);
    if (!s->fill.layer_major || q.bulk_end == q.start || split <= 0 || split >= hp->n_layer)
        return run_layers(&q, 0, hp->n_layer, NULL, err);
    /* (n, n_embd) split stream of every row: the price of the layer-major phase */
    float *x_split = malloc(n * (size_t)hp->n_embd * sizeof(float));
    if (!x_split)
        return rk_err_set(err, RK_E_NOMEM, "prefill: no memory for the split stream of %zu rows (layer-major phase)", n);
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
    if (!st) st = run_layers(&q, 0, split, x_split, err);
    if (!st && q.q_keep) st = select_rows(&q, err);
    s->selecting = !st && q.q_keep;
    if (!st) st = run_layers(&q, split, hp->n_layer, x_split, err);
    s->selecting = false; /* the selection stays readable: rk_session_fill_kept */
    free(q.q_keep);
    free(x_split);
    return st;
}

int64_t rk_session_fill_kept(const rk_session *s, int64_t row0, int64_t n) {
    if (!s->keep) return -1;
    int64_t k = 0;
    for (int64_t r = row0 < s->keep_lo ? s->keep_lo : row0; r < row0 + n && r < s->keep_hi; r++) k += s->keep[r - s->keep_lo];
    return k;
}
