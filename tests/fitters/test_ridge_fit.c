/* The fitters' ridge solve (rk_ridge_fit_rows): a known linear map recovered from noisy
 * rows, λ's shrinkage. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "rk_fitters.h"
#include "tb.h"

/* ---- the solve -------------------------------------------------------------- */

/* Y = X W* + b* + noise with a known W*: the ridge solution with a tiny λ recovers W*
 * to within the noise level (error ~ σ/sqrt(n) per entry for well-conditioned X). */
Test(fitters, ridge_solve_recovers_known_linear_map) {
    const int d = 16, m = 32; /* two "layers" of 16 */
    const int64_t n = 4000;
    uint64_t rng = 7;
    double *X = malloc((size_t)n * d * sizeof(double)), *Y = malloc((size_t)n * m * sizeof(double));
    double Wt[16 * 32], bt[32], W[16 * 32], b[32];
    for (int i = 0; i < d * m; i++) Wt[i] = tb_rand_normal(&rng);
    for (int j = 0; j < m; j++) bt[j] = 3.0 * tb_rand_normal(&rng);
    for (int64_t r = 0; r < n; r++) {
        for (int i = 0; i < d; i++) X[r * d + i] = 5.0 + tb_rand_normal(&rng); /* non-zero mean: bias must absorb it */
        for (int j = 0; j < m; j++) {
            double y = bt[j] + 1e-3 * tb_rand_normal(&rng);
            for (int i = 0; i < d; i++) y += X[r * d + i] * Wt[i * m + j];
            Y[r * m + j] = y;
        }
    }
    cr_assert(rk_ridge_fit_rows(d, m, n, X, Y, 1e-9, W, b));
    double max_w = 0, max_b = 0;
    for (int i = 0; i < d * m; i++) max_w = fmax(max_w, fabs(W[i] - Wt[i]));
    for (int j = 0; j < m; j++) max_b = fmax(max_b, fabs(b[j] - bt[j]));
    /* noise 1e-3 over 4000 unit-variance rows: ~1e-3/sqrt(4000) = 1.6e-5 per entry; the bias
     * carries the mean (5) times that again: allow 1e-4 / 1e-3 */
    cr_expect(max_w < 1e-4, "max |W - W*| = %g", max_w);
    cr_expect(max_b < 1e-3, "max |b - b*| = %g", max_b);
    /* a large λ shrinks W towards 0 (and the bias towards the mean of Y) */
    cr_assert(rk_ridge_fit_rows(d, m, n, X, Y, 1e3, W, b));
    double norm = 0, norm_t = 0;
    for (int i = 0; i < d * m; i++) norm += W[i] * W[i], norm_t += Wt[i] * Wt[i];
    cr_expect(norm < 0.01 * norm_t, "λ=1e3 should shrink W: %g vs %g", norm, norm_t);
    free(X);
    free(Y);
}
