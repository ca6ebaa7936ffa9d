/* Token sampling: penalties (repeat / frequency / presence over a window, then DRY), then
 * temperature / top-k / top-p / min-p (llama.cpp's order), or greedy argmax. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gen.h"

typedef struct cand {
    float logit;
    int32_t id;
} cand;

struct rk_sampler {
    rk_sampler_params p;
    int32_t n_vocab;
    uint64_t rng;
    cand *c;          /* (n_vocab) scratch, planned at create: no malloc while sampling */
    float *prob;      /* (n_vocab) */
    int32_t *count;   /* (n_vocab) occurrences in the penalty window; all 0 between calls */
    int32_t *rep;     /* (n_vocab) DRY: longest repeat each id would extend; all 0 between calls */
    int32_t *touched; /* (n_vocab) ids whose rep is set */
    uint8_t *breaker; /* (n_vocab) DRY sequence breakers; NULL: none */
};

rk_sampler_params rk_sampler_params_default(void) {
    rk_sampler_params p = {
        .temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f, .repeat_penalty = 1.0f, .repeat_last_n = 64};
    p.dry_multiplier = 0.8f;
    p.dry_base = 1.75f;
    p.dry_allowed_length = 2;
    p.dry_penalty_last_n = -1;
    return p;
}

rk_status rk_sampler_create(const rk_sampler_params *p, int32_t n_vocab, rk_sampler **out, rk_err *err) {
    if (n_vocab <= 0) return rk_err_set(err, RK_E_INVALID_ARG, "sampler: n_vocab %d", n_vocab);
    if (!(p->repeat_penalty > 0.0f))
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: repeat penalty must be > 0 (got %g)",
                          (double)p->repeat_penalty);
    if (!isfinite(p->frequency_penalty) || !isfinite(p->presence_penalty))
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: frequency / presence penalties must be finite (got %g, %g)",
                          (double)p->frequency_penalty, (double)p->presence_penalty);
    if (!(p->dry_multiplier >= 0.0f) || !isfinite(p->dry_multiplier))
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: DRY multiplier must be >= 0 (got %g)",
                          (double)p->dry_multiplier);
    if (p->dry_multiplier > 0.0f && !(p->dry_base > 1.0f && isfinite(p->dry_base)))
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: DRY base must be > 1 (got %g)", (double)p->dry_base);
    if (p->dry_multiplier > 0.0f && p->dry_allowed_length < 1)
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: DRY allowed length must be >= 1 (got %d)",
                          (int)p->dry_allowed_length);
    if (p->dry_penalty_last_n < -1 || p->repeat_last_n < 0)
        return rk_err_set(err, RK_E_INVALID_ARG, "sampler: penalty windows must be >= 0 (DRY: or -1) (got %d, %d)",
                          (int)p->repeat_last_n, (int)p->dry_penalty_last_n);
    rk_sampler *s = calloc(1, sizeof *s);
    if (!s) return rk_err_set(err, RK_E_NOMEM, "sampler: out of memory");
    s->p = *p;
    s->n_vocab = n_vocab;
    s->rng = p->seed ^ 0x853c49e6748fea9bull;
    s->c = malloc((size_t)n_vocab * sizeof *s->c);
    s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
    s->count = calloc((size_t)n_vocab, sizeof *s->count);
    s->rep = calloc((size_t)n_vocab, sizeof *s->rep);
    s->touched = malloc((size_t)n_vocab * sizeof *s->touched);
    if (!s->c || !s->prob || !s->count || !s->rep || !s->touched) {
        rk_sampler_destroy(s);
        return rk_err_set(err, RK_E_NOMEM, "sampler: out of memory");
    }
    *out = s;
    return RK_OK;
}

rk_status rk_sampler_set_dry_breakers(rk_sampler *s, const int32_t *ids, size_t n, rk_err *err) {
    if (!s->breaker && !(s->breaker = malloc((size_t)s->n_vocab)))
        return rk_err_set(err, RK_E_NOMEM, "sampler: out of memory");
    memset(s->breaker, 0, (size_t)s->n_vocab);
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= s->n_vocab)
            return rk_err_set(err, RK_E_INVALID_ARG, "sampler: breaker token %d outside the vocabulary (%d)",
                              (int)ids[i], (int)s->n_vocab);
        s->breaker[ids[i]] = 1;
    }
    return RK_OK;
}

void rk_sampler_destroy(rk_sampler *s) {
    if (!s) return;
    free(s->c);
    free(s->prob);
    free(s->count);
    free(s->rep);
    free(s->touched);
    free(s->breaker);
    free(s);
}

static bool valid_id(const rk_sampler *s, int32_t id) { return id >= 0 && id < s->n_vocab; }

/* repeat (llama.cpp: each distinct id once, a positive logit divided, a non-positive one
 * multiplied), then frequency and presence (OpenAI: minus count * f + [count > 0] * p). */
static void penalize_window(rk_sampler *s, float *logits, const int32_t *h, size_t n) {
    const rk_sampler_params *p = &s->p;
    if ((p->repeat_penalty == 1.0f && p->frequency_penalty == 0.0f && p->presence_penalty == 0.0f) ||
        p->repeat_last_n == 0)
        return;
    const size_t from = n > (size_t)p->repeat_last_n ? n - (size_t)p->repeat_last_n : 0;
    for (size_t i = from; i < n; i++)
        if (valid_id(s, h[i])) s->count[h[i]]++;
    for (size_t i = from; i < n; i++) {
        const int32_t id = h[i];
        if (!valid_id(s, id) || s->count[id] == 0) continue; /* 0: already done */
        float l = logits[id];
        if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
        logits[id] = l - (float)s->count[id] * p->frequency_penalty - p->presence_penalty;
        s->count[id] = 0;
    }
}

/* DRY over the last dry_penalty_last_n tokens. rep[t] = the longest suffix of the history
 * that also ends just before an earlier t; the suffix stops at the last breaker. */
static void penalize_dry(rk_sampler *s, float *logits, const int32_t *h, size_t n) {
    const rk_sampler_params *p = &s->p;
    if (p->dry_multiplier <= 0.0f || n < 2 || p->dry_penalty_last_n == 0) return;
    const size_t from =
        p->dry_penalty_last_n < 0 || n <= (size_t)p->dry_penalty_last_n ? 0 : n - (size_t)p->dry_penalty_last_n;
    size_t limit = 0; /* tokens at the end before a breaker (or an id outside the vocabulary) */
    while (limit < n - from) {
        const int32_t t = h[n - 1 - limit];
        if (!valid_id(s, t) || (s->breaker && s->breaker[t])) break;
        limit++;
    }
    if (limit < (size_t)p->dry_allowed_length) return;
    const int32_t last = h[n - 1];
    size_t n_touched = 0;
    for (size_t j = from; j + 1 < n; j++) {
        if (h[j] != last) continue;
        size_t k = 1;
        while (k < limit && j >= from + k && h[j - k] == h[n - 1 - k]) k++;
        if (k < (size_t)p->dry_allowed_length) continue;
        const int32_t next = h[j + 1];
        if (!valid_id(s, next)) continue;
        if (s->rep[next] == 0) s->touched[n_touched++] = next;
        if ((int32_t)k > s->rep[next]) s->rep[next] = (int32_t)k;
    }
    /* the exponent stops where the penalty would overflow a float */
    const double max_exp = log(FLT_MAX / p->dry_multiplier) / log(p->dry_base) - 1.0;
    for (size_t i = 0; i < n_touched; i++) {
        const int32_t t = s->touched[i];
        double e = (double)(s->rep[t] - p->dry_allowed_length);
        if (e > max_exp) e = max_exp;
        s->rep[t] = 0;
        if (s->breaker && s->breaker[t]) continue; /* a breaker would end the repeat */
        logits[t] -= (float)((double)p->dry_multiplier * pow((double)p->dry_base, e));
    }
}

void rk_sampler_penalize(rk_sampler *s, float *logits, const int32_t *history, size_t n_history) {
    if (!history || n_history == 0) return;
    penalize_window(s, logits, history, n_history);
    penalize_dry(s, logits, history, n_history);
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
    rk_sampler_penalize(s, logits, history, n_history);
    return rk_sampler_pick(s, logits);
}

int32_t rk_sampler_pick(rk_sampler *s, float *logits) {
    const int32_t nv = s->n_vocab;
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
