/* rk_linalg products (the fit's and the dense evals' GEMMs): against fp64 sums on shapes
 * with row, column and k remainders and strided operands; fp32 Gram blocks against fp64. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "rk_linalg.h"
#include "tb.h"

/* |y - exact| <= 4 k eps Σ|x||b| (fp32 sums of k products, any order) */
static void check(int64_t n, int m, int k, bool nt) {
    uint64_t rng = 7 + (uint64_t)(n * 131 + m * 17 + k);
    const int ldx = k + 3, ldb = nt ? k + 5 : m + 2, ldy = m + 1;
    float *x = malloc((size_t)n * ldx * sizeof(float)), *B = malloc((size_t)(nt ? m : k) * ldb * sizeof(float));
    float *y = malloc((size_t)n * ldy * sizeof(float));
    for (int64_t i = 0; i < n * ldx; i++) x[i] = (float)tb_rand_normal(&rng);
    for (int64_t i = 0; i < (int64_t)(nt ? m : k) * ldb; i++) B[i] = (float)tb_rand_normal(&rng);
    if (nt) rk_linalg_matmul_nt(n, m, k, x, ldx, B, ldb, y, ldy);
    else rk_linalg_matmul(n, m, k, x, ldx, B, ldb, y, ldy);
    double worst = 0;
    for (int64_t i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double e = 0, a = 0;
            for (int p = 0; p < k; p++) {
                const double b = nt ? B[(size_t)j * ldb + p] : B[(size_t)p * ldb + j];
                e += (double)x[i * ldx + p] * b, a += fabs((double)x[i * ldx + p] * b);
            }
            const double err = fabs(y[i * ldy + j] - e), tol = 4.0 * k * 6e-8 * a + 1e-30;
            worst = fmax(worst, err / tol);
        }
    cr_expect(worst <= 1.0, "%s n=%lld m=%d k=%d: error %.3g of the bound", nt ? "nt" : "nn", (long long)n, m, k, worst);
    free(x), free(B), free(y);
}

Test(linalg, products_match_fp64_sums) {
    const int64_t ns[] = {1, 3, 4, 7, 64};
    const int ms[] = {1, 5, 16, 33, 192};
    const int ks[] = {1, 7, 8, 64, 361};
    for (int a = 0; a < 5; a++)
        for (int b = 0; b < 5; b++)
            for (int c = 0; c < 5; c++) check(ns[a], ms[b], ks[c], false), check(ns[a], ms[b], ks[c], true);
}

/* f32 block Gram: the upper triangle equals the fp64 accumulator's to f32 rounding of sums
 * of n products (4 n eps Σ|x_i x_j|); the lower triangle is left alone. */
Test(linalg, f32_gram_matches_fp64) {
    const int D = 37, n = 61;
    uint64_t rng = 21;
    float *x = malloc((size_t)n * D * sizeof(float)), *work = malloc(((size_t)n * D + (size_t)D * D) * sizeof(float));
    double *G = calloc((size_t)D * D, sizeof(double)), *G64 = calloc((size_t)D * D, sizeof(double));
    for (int i = 0; i < n * D; i++) x[i] = (float)tb_rand_normal(&rng);
    for (int i = 0; i < D * D; i++) G[i] = G64[i] = 1.5; /* accumulates on top of what is there */
    rk_linalg_gram_add_f32(D, n, x, work, G);
    rk_linalg_gram_add(D, n, x, G64);
    for (int i = 0; i < D; i++)
        for (int j = 0; j < D; j++) {
            double a = 0;
            for (int p = 0; p < n; p++) a += fabs((double)x[p * D + i] * x[p * D + j]);
            if (j < i) cr_expect(G[(size_t)i * D + j] == 1.5, "lower triangle touched at %d,%d", i, j);
            else
                cr_expect(fabs(G[(size_t)i * D + j] - G64[(size_t)i * D + j]) <= 4.0 * n * 6e-8 * a, "(%d,%d): %.9g vs %.9g", i, j,
                          G[(size_t)i * D + j], G64[(size_t)i * D + j]);
        }
    free(x), free(work), free(G), free(G64);
}
