/* The statistics of the eval drivers (pure functions): see rk_eval.h. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk_eval.h"

uint64_t ev_rand(uint64_t *state) { return rk_splitmix64(state); }

uint64_t ev_rand_below(uint64_t *state, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t lim = UINT64_MAX - UINT64_MAX % n; /* reject the partial last block */
    uint64_t r;
    do r = ev_rand(state);
    while (r >= lim);
    return r % n;
}

double ev_nll_row(const float *row, int32_t n_vocab, int32_t target) {
    if (target < 0 || target >= n_vocab) return NAN;
    double mx = -INFINITY;
    for (int32_t v = 0; v < n_vocab; v++) {
        if (isnan(row[v])) return NAN;
        if (row[v] > mx) mx = row[v];
    }
    double sum = 0;
    for (int32_t v = 0; v < n_vocab; v++) sum += exp((double)row[v] - mx);
    return log(sum) + mx - (double)row[target];
}

bool ev_nll_rows(const float *logits, int32_t n_vocab, const int32_t *ids, int64_t row0, int64_t n_rows, double *out) {
    for (int64_t j = 0; j < n_rows; j++) {
        out[j] = ev_nll_row(logits + (size_t)(row0 + j) * (size_t)n_vocab, n_vocab, ids[row0 + j + 1]);
        if (isnan(out[j])) return false;
    }
    return true;
}

double ev_mcnemar_p(int64_t b, int64_t c) {
    int64_t n = b + c, k = b < c ? b : c;
    if (n <= 0) return 1.0;
    /* P(X <= k) for X ~ Bin(n, 1/2), summed in log space so large n cannot overflow */
    double lp0 = -(double)n * log(2.0), acc = 0;
    for (int64_t i = 0; i <= k; i++) {
        double lc = lgamma((double)n + 1) - lgamma((double)i + 1) - lgamma((double)(n - i) + 1);
        acc += exp(lc + lp0);
    }
    double p = 2 * acc;
    return p > 1.0 ? 1.0 : p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ev_quantile(double *v, size_t n, double q) {
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= n) return v[n - 1];
    double f = pos - (double)i;
    return v[i] * (1 - f) + v[i + 1] * f;
}

ev_ci ev_bootstrap_ratio(const double *num, const double *den, int n, int n_boot, uint64_t seed, double level) {
    ev_ci ci = {NAN, NAN, NAN};
    double sn = 0, sd = 0;
    for (int i = 0; i < n; i++) sn += num[i], sd += den ? den[i] : 1.0;
    if (n <= 0 || sd == 0) return ci;
    ci.est = sn / sd;
    double *stat = n_boot > 0 ? malloc((size_t)n_boot * sizeof *stat) : NULL;
    if (!stat) return ci;
    size_t k = 0;
    uint64_t rng = seed;
    for (int b = 0; b < n_boot; b++) {
        double a = 0, d = 0;
        for (int i = 0; i < n; i++) {
            int j = (int)ev_rand_below(&rng, (uint64_t)n);
            a += num[j], d += den ? den[j] : 1.0;
        }
        if (d != 0) stat[k++] = a / d;
    }
    if (k > 0) {
        double alpha = (1 - level) / 2;
        ci.lo = ev_quantile(stat, k, alpha);
        ci.hi = ev_quantile(stat, k, 1 - alpha);
    }
    free(stat);
    return ci;
}

size_t ev_gain_select(const double *gain, size_t n, double thr, bool strict, unsigned char *sel) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        sel[i] = strict ? gain[i] > thr : gain[i] >= thr;
        k += sel[i];
    }
    return k;
}

double ev_top_threshold(const double *gain, size_t n, double share) {
    if (n == 0) return NAN;
    double *tmp = malloc(n * sizeof *tmp);
    if (!tmp) return NAN;
    memcpy(tmp, gain, n * sizeof *tmp);
    double t = ev_quantile(tmp, n, 1.0 - share);
    free(tmp);
    return t;
}

void ev_set_sums(const unsigned char *sel, const double *const *nll, int n_modes, int n_win, int64_t score, double *den,
                 double *const *sum, double *const *num) {
    for (int w = 0; w < n_win; w++)
        for (int64_t j = 0; j < score; j++) {
            size_t k = (size_t)w * (size_t)score + (size_t)j;
            if (!sel[k]) continue;
            den[w] += 1;
            for (int mi = 0; mi < n_modes; mi++) {
                sum[mi][w] += nll[mi][k];
                num[mi][w] += nll[mi][k] - nll[0][k];
            }
        }
}
