/* The prefill driver: an eval call's rows through the model in chunks of n_batch, each
 * chunk with its plan. Chunk-major (every layer of a chunk before the next chunk), or
 * layer-major when the fill settings ask for it: layers 0..S-1 over the whole prompt
 * first (the split stream of every row kept), then the late layers chunk by chunk; the
 * selection of exact rows may then use what the early layers saw (question-aware fill). */
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
        rk_plan_chunk(s, q->ids + done, pos, (int64_t)c, q->bulk_end, lo, hi, &p);
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

rk_status rk_prefill_run(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows, rk_err *err) {
    const rk_hparams *hp = &s->m->hp;
    pass q = {s, ids, n, s->n_past, s->n_past, logits, all_rows, 0, (double)n * hp->n_layer};
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
    rk_status st = run_layers(&q, 0, split, x_split, err);
    if (!st) st = run_layers(&q, split, hp->n_layer, x_split, err);
    free(x_split);
    return st;
}
