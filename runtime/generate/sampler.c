/* Token sampling: repetition penalty, then temperature / top-k / top-p / min-p
 * (llama.cpp's order), or greedy argmax. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct rk_sampler {
    rk_sampler_params p;
    int32_t n_vocab;
    uint64_t rng;
    cand *c;     /* (n_vocab) scratch, planned at create: no malloc while sampling */
    float *prob; /* (n_vocab) */
};

rk_sampler_params rk_sampler_params_default(void) {
    rk_sampler_params p = {0.8f, 40, 0.95f, 0.05f, 1.0f, 64, 0};
    return p;
}

rk_status rk_sampler_create(const rk_sampler_params *p, int32_t n_vocab, rk_sampler **out, rk_err *err) {
    if (n_vocab <= 0) return rk_err_set(err, RK_E_INVALID_ARG, "sampler: n_vocab %d", n_vocab);
    if (!(p->repeat_penalty > 0.0f))
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: repeat penalty must be > 0 (got %g)",
                          (double)p->repeat_penalty);
    rk_sampler *s = calloc(1, sizeof *s);
    if (!s) return rk_err_set(err, RK_E_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ^ 0x853c49e6748fea9bull;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    if (!s->c || !s->prob) {
        rk_sampler_destroy(s);
        return rk_err_set(err, RK_E_NOMEM, "sampler: out of memory");
    }
    *out = s;
    return RK_OK;
}

void rk_sampler_destroy(rk_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->prob);
    free(s);
}

static double next_uniform(uint64_t *st) { /* [0, 1) */
    return (double)(rk_splitmix64(st) >> 11) * (1.0 / 9007199254740992.0);
}

static int cmp_desc(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit > y->logit) return -1;
    if (x->logit < y->logit) return 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int32_t rk_sampler_sample(rk_sampler *s, float *logits, const int32_t *history, size_t n_history) {
    const int32_t nv = s->n_vocab;
    if (s->p.repeat_penalty != 1.0f && history) {
        size_t from = n_history > (size_t)s->p.repeat_last_n ? n_history - (size_t)s->p.repeat_last_n : 0;
        /* each distinct id is penalised once, as llama.cpp does: mark with NaN-free flag array */
        for (size_t i = from; i < n_history; i++) {
            int32_t id = history[i];
            if (id < 0 || id >= nv) continue;
            bool seen = false;
            for (size_t j = from; j < i; j++)
                if (history[j] == id) {
                    seen = true;
                    break;
                }
            if (seen) continue;
            logits[id] = logits[id] > 0 ? logits[id] / s->p.repeat_penalty : logits[id] * s->p.repeat_penalty;
        }
    }
    if (s->p.temp <= 0.0f) {
        /* argmax over the non-NaN logits (filled RidgeFill rows carry NaN), ties to the lowest id */
        int32_t best = -1;
        for (int32_t i = 0; i < nv; i++)
            if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
        return best < 0 ? 0 : best;
    }
    int32_t n = 0;
    for (int32_t i = 0; i < nv; i++)
        if (!isnan(logits[i])) s->c[n++] = (cand){logits[i], i};
    if (n == 0) return 0;
    /* top-k first keeps the sort small */
    int32_t k = s->p.top_k > 0 && s->p.top_k < n ? s->p.top_k : n;
    if (k < n) {
        /* partial selection: move the k largest to the front, then sort them */
        for (int32_t i = 0; i < k; i++) {
            int32_t best = i;
            for (int32_t j = i + 1; j < n; j++)
                if (cmp_desc(&s->c[j], &s->c[best]) < 0) best = j;
            cand t = s->c[i];
            s->c[i] = s->c[best];
            s->c[best] = t;
            if (i > 256) { /* large k: fall back to a full sort */
                qsort(s->c, (size_t)n, sizeof *s->c, cmp_desc);
                break;
            }
        }
    } else {
        qsort(s->c, (size_t)n, sizeof *s->c, cmp_desc);
    }
    n = k;
    /* llama.cpp's chain: top-k, top-p and min-p on the raw logits (temperature 1), the
     * temperature last, on the kept set */
    double sum = 0.0;
    const float mx = s->c[0].logit;
    for (int32_t i = 0; i < n; i++) {
        s->prob[i] = expf(s->c[i].logit - mx);
        sum += s->prob[i];
    }
    if (s->p.top_p < 1.0f) {
        double acc = 0.0;
        for (int32_t i = 0; i < n; i++) {
            acc += s->prob[i] / sum;
            if (acc >= s->p.top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (s->p.min_p > 0.0f) {
        const float floor_p = s->p.min_p * s->prob[0];
        int32_t keep = 1;
        while (keep < n && s->prob[keep] >= floor_p) keep++;
        n = keep;
    }
    if (s->p.temp != 1.0f)
        for (int32_t i = 0; i < n; i++) s->prob[i] = expf((s->c[i].logit - mx) / s->p.temp);
    sum = 0.0;
    for (int32_t i = 0; i < n; i++) sum += s->prob[i];
    double r = next_uniform(&s->rng) * sum, acc = 0.0;
    for (int32_t i = 0; i < n; i++) {
        acc += s->prob[i];
        if (r < acc) return s->c[i].id;
    }
    return s->c[n - 1].id;
}
