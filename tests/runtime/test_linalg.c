/* rk_linalg: products (the fit's and the dense evals' GEMMs) against fp64 sums on shapes
 * with row, column and k remainders and strided operands; fp32 Gram blocks against fp64; the
 * symmetric eigensolver, the rank-r error and Cholesky (moved here from test_lowram.c). */
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
    cr_expect(worst <= 1.0, "%s n=%lld m=%d k=%d: error %.3g of the bound", nt ? "nt" : "nn", (long long)n, m, k,
              worst);
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
                cr_expect(fabs(G[(size_t)i * D + j] - G64[(size_t)i * D + j]) <= 4.0 * n * 6e-8 * a,
                          "(%d,%d): %.9g vs %.9g", i, j, G[(size_t)i * D + j], G64[(size_t)i * D + j]);
        }
    free(x), free(work), free(G), free(G64);
}

/* ---- eigensolver ------------------------------------------------------------------- */

/* Random symmetric matrices with a clustered spectrum: A V = V Λ and VᵀV = I to a few
 * hundred ulps of ||A|| (Householder + QR + inverse iteration are backward stable). */
Test(linalg, eigensolver_decomposes_symmetric_matrices) {
    const int sizes[] = {1, 2, 3, 7, 40, 97};
    uint64_t rng = 11;
    for (size_t t = 0; t < sizeof sizes / sizeof sizes[0]; t++) {
        const int n = sizes[t];
        double *A = malloc((size_t)n * n * sizeof(double)), *A0 = malloc((size_t)n * n * sizeof(double));
        double *w = malloc((size_t)n * sizeof(double)), *V = malloc((size_t)n * n * sizeof(double));
        for (int i = 0; i < n; i++)
            for (int j = 0; j <= i; j++) {
                double v = tb_rand_normal(&rng);
                if (i == j) v += (i % 3 == 0) ? 5.0 : 0.0; /* repeated shifts: clusters */
                A0[(size_t)i * n + j] = A0[(size_t)j * n + i] = v;
            }
        memcpy(A, A0, (size_t)n * n * sizeof(double));
        cr_assert(rk_linalg_eigh(n, A, w, V), "n=%d", n);
        double anorm = 0, res = 0, orth = 0;
        for (int i = 0; i < n * n; i++) anorm = fmax(anorm, fabs(A0[i]));
        for (int k = 0; k < n; k++) {
            if (k) cr_expect(w[k] <= w[k - 1], "eigenvalues not decreasing at %d", k);
            for (int i = 0; i < n; i++) {
                double av = 0;
                for (int j = 0; j < n; j++) av += A0[(size_t)i * n + j] * V[(size_t)k * n + j];
                res = fmax(res, fabs(av - w[k] * V[(size_t)k * n + i]));
            }
            for (int l = 0; l <= k; l++) {
                double d = 0;
                for (int i = 0; i < n; i++) d += V[(size_t)k * n + i] * V[(size_t)l * n + i];
                orth = fmax(orth, fabs(d - (k == l)));
            }
        }
        cr_expect(res < 1e-10 * anorm * n, "n=%d: max |Av - λv| = %g", n, res);
        cr_expect(orth < 1e-10 * n, "n=%d: max |VᵀV - I| = %g", n, orth);
        free(A), free(A0), free(w), free(V);
    }
}

/* Keys with a known low-rank structure plus noise: projecting the centred rows on the
 * leading r eigenvectors of their Gram matrix leaves exactly Σ_{i>r} λ_i (Eckart–Young;
 * the identity holds for any orthonormal eigenbasis, so only rounding separates them). */
Test(linalg, rank_r_error_equals_discarded_eigenvalues) {
    const int D = 48, n = 600;
    uint64_t rng = 5;
    float *x = malloc((size_t)n * D * sizeof(float));
    double *G = calloc((size_t)D * D, sizeof(double)), mean[48] = {0};
    double *w = malloc(D * sizeof(double)), *V = malloc((size_t)D * D * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) {
            double f0 = tb_rand_normal(&rng), f1 = tb_rand_normal(&rng);
            x[(size_t)i * D + d] = (float)(3.0 + f0 * sin(d) * 4 + f1 * cos(0.3 * d) * 2 + 0.1 * tb_rand_normal(&rng));
        }
    for (int i = 0; i < n; i++)
        for (int d = 0; d < D; d++) mean[d] += x[(size_t)i * D + d] / (double)n;
    /* centred rows, Gram by the library's accumulator (upper triangle) */
    float *xc = malloc((size_t)n * D * sizeof(float));
    for (int i = 0; i < n * D; i++) xc[i] = (float)(x[i] - mean[i % D]);
    rk_linalg_gram_add(D, n, xc, G);
    for (int i = 0; i < D; i++)
        for (int j = 0; j < i; j++) G[(size_t)i * D + j] = G[(size_t)j * D + i];
    cr_assert(rk_linalg_eigh(D, G, w, V));
    for (int r = 1; r <= D; r += 7) {
        double err = 0, disc = 0;
        for (int k = r; k < D; k++) disc += w[k];
        for (int i = 0; i < n; i++) {
            double rec[48] = {0};
            for (int k = 0; k < r; k++) {
                double c = 0;
                for (int d = 0; d < D; d++) c += xc[(size_t)i * D + d] * V[(size_t)k * D + d];
                for (int d = 0; d < D; d++) rec[d] += c * V[(size_t)k * D + d];
            }
            for (int d = 0; d < D; d++) err += (xc[(size_t)i * D + d] - rec[d]) * (xc[(size_t)i * D + d] - rec[d]);
        }
        /* f32 rows, fp64 sums: relative rounding ~1e-7 of the total energy */
        double tot = 0;
        for (int k = 0; k < D; k++) tot += w[k];
        cr_expect(fabs(err - disc) < 1e-6 * tot, "r=%d: error %.9g vs discarded %.9g (total %g)", r, err, disc, tot);
    }
    free(x), free(xc), free(G), free(w), free(V);
}

/* Cholesky solve against a known solution. */
Test(linalg, cholesky_solves_spd_systems) {
    const int n = 30, m = 3;
    uint64_t rng = 3;
    double *M = malloc((size_t)n * n * sizeof(double)), *A = malloc((size_t)n * n * sizeof(double));
    double X[30 * 3], B[30 * 3];
    for (int i = 0; i < n * n; i++) M[i] = tb_rand_normal(&rng);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            double v = i == j ? n : 0;
            for (int k = 0; k < n; k++) v += M[(size_t)k * n + i] * M[(size_t)k * n + j];
            A[(size_t)i * n + j] = v;
        }
    for (int i = 0; i < n * m; i++) X[i] = tb_rand_normal(&rng);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < m; j++) {
            double v = 0;
            for (int k = 0; k < n; k++) v += A[(size_t)i * n + k] * X[k * m + j];
            B[i * m + j] = v;
        }
    cr_assert(rk_linalg_spd_solve(n, A, B, m));
    for (int i = 0; i < n * m; i++) cr_expect(fabs(B[i] - X[i]) < 1e-9, "x[%d] %g vs %g", i, B[i], X[i]);
    for (int i = 0; i < n * n; i++) A[i] = -(i % (n + 1) == 0);
    cr_expect(!rk_linalg_spd_solve(n, A, B, m), "a negative definite matrix must be refused");
    free(M), free(A);
}
