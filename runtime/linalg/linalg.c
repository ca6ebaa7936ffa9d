/* Linear algebra (rk_linalg.h): symmetric eigensolver, Cholesky, Gram accumulation and
 * small matrix products. fp64 wherever a result feeds a decomposition. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk_kernels.h"
#include "rk_linalg.h"
#ifdef RK_HAVE_BLAS
#include <cblas.h>
#endif
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

/* ---- symmetric eigensolver ------------------------------------------------------
 * A = Q T Qᵀ by Householder reflections (T tridiagonal: diagonal a, off-diagonal b),
 * eigenvalues of T by implicit QR steps with Wilkinson shifts (bulge chasing with Givens
 * rotations, no vectors), eigenvectors of T for the wanted eigenvalues by inverse
 * iteration (re-orthogonalised), mapped back through the stored reflections. Only the
 * r vectors a caller wants are ever formed: O(n³) for the reduction, O(n² r) after. */

#define LR_AI static inline __attribute__((always_inline))

LR_AI double ddot(const double *restrict x, const double *restrict y, int n) {
    double acc[4] = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int u = 0; u < 4; u++) acc[u] += x[i + u] * y[i + u];
    double t = 0;
    for (; i < n; i++) t += x[i] * y[i];
    return t + (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

/* Reduces A (n x n, full symmetric storage) to tridiagonal form. Reflection k (k < n-2)
 * is H_k = I - beta[k] v vᵀ on coordinates k+1..n-1; v is kept in row k of Hv. */
LR_AI void tridiag_impl(int n, double *A, double *a, double *b, double *Hv, double *beta, double *p) {
    for (int k = 0; k + 2 < n; k++) {
        const int m = n - k - 1;
        double *v = Hv + (size_t)k * n;
        double tail = 0, x0 = A[(size_t)(k + 1) * n + k];
        for (int i = 1; i < m; i++) {
            double xi = A[(size_t)(k + 1 + i) * n + k];
            tail += xi * xi;
        }
        a[k] = A[(size_t)k * n + k];
        if (tail == 0) {
            b[k] = x0, beta[k] = 0;
            continue;
        }
        double norm = sqrt(x0 * x0 + tail), alpha = x0 > 0 ? -norm : norm;
        for (int i = 0; i < m; i++) v[i] = A[(size_t)(k + 1 + i) * n + k];
        v[0] -= alpha;
        const double bt = 2.0 / (v[0] * v[0] + tail);
        /* A22 <- H A22 H: p = bt A22 v, w = p - (bt/2)(pᵀv) v, A22 -= v wᵀ + w vᵀ */
        double pv = 0;
        for (int i = 0; i < m; i++) {
            p[i] = bt * ddot(A + (size_t)(k + 1 + i) * n + k + 1, v, m);
            pv += p[i] * v[i];
        }
        const double K = 0.5 * bt * pv;
        for (int i = 0; i < m; i++) p[i] -= K * v[i];
        for (int i = 0; i < m; i++) {
            double *restrict row = A + (size_t)(k + 1 + i) * n + k + 1;
            const double vi = v[i], wi = p[i];
            for (int j = 0; j < m; j++) row[j] -= vi * p[j] + wi * v[j];
        }
        b[k] = alpha, beta[k] = bt;
    }
    if (n >= 2) {
        a[n - 2] = A[(size_t)(n - 2) * n + n - 2];
        b[n - 2] = A[(size_t)(n - 1) * n + n - 2];
    }
    a[n - 1] = A[(size_t)(n - 1) * n + n - 1];
}

static void tridiag_plain(int n, double *A, double *a, double *b, double *Hv, double *beta, double *p) {
    tridiag_impl(n, A, a, b, Hv, beta, p);
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static void tridiag_avx2(int n, double *A, double *a, double *b, double *Hv,
                                                             double *beta, double *p) {
    tridiag_impl(n, A, a, b, Hv, beta, p);
}
#define LR_HAVE_AVX2_CLONES 1
#endif

/* One implicit QR step on the unreduced block [lo, hi] of (a, b). With the rotation R on
 * coordinates (k, k+1) whose new basis vectors are u_k = c e_k + s e_{k+1} and
 * u_{k+1} = -s e_k + c e_{k+1}, T' = Rᵀ T R; the first (c, s) follows the first column
 * of T - μI, the later ones zero the bulge left at (k-1, k+1). */
static void qr_step(double *a, double *b, int lo, int hi) {
    double d = 0.5 * (a[hi - 1] - a[hi]), e = b[hi - 1];
    double den = d + (d >= 0 ? 1.0 : -1.0) * hypot(d, e);
    double mu = den != 0 ? a[hi] - e * e / den : a[hi];
    double x = a[lo] - mu, z = b[lo];
    for (int k = lo; k < hi; k++) {
        double r = hypot(x, z), c = 1, s = 0;
        if (r > 0) c = x / r, s = z / r;
        if (k > lo) b[k - 1] = r;
        double a0 = a[k], a1 = a[k + 1], b0 = b[k];
        a[k] = c * c * a0 + 2 * c * s * b0 + s * s * a1;
        a[k + 1] = s * s * a0 - 2 * c * s * b0 + c * c * a1;
        b[k] = c * s * (a1 - a0) + (c * c - s * s) * b0;
        if (k + 1 < hi) {
            z = s * b[k + 1]; /* new bulge at (k, k+2) */
            b[k + 1] *= c;
            x = b[k];
        }
    }
}

static bool tridiag_eigenvalues(int n, double *a, double *b) {
    const double eps = 2.220446049250313e-16;
    for (int hi = n - 1, iters = 0; hi > 0;) {
        if (fabs(b[hi - 1]) <= eps * (fabs(a[hi - 1]) + fabs(a[hi])) || fabs(b[hi - 1]) < 1e-300) {
            b[hi - 1] = 0;
            hi--;
            continue;
        }
        int lo = hi - 1;
        while (lo > 0 && fabs(b[lo - 1]) > eps * (fabs(a[lo - 1]) + fabs(a[lo]))) lo--;
        if (lo > 0) b[lo - 1] = 0;
        if (++iters > 60 * n) return false;
        qr_step(a, b, lo, hi);
    }
    return true;
}

/* Solves (T - mu I) x = y in place by Gaussian elimination with partial pivoting; zero
 * pivots become tiny (inverse iteration wants the near-singular solve). w: 5n doubles. */
static void tridiag_solve(int n, const double *a, const double *b, double mu, double tiny, double *y, double *w) {
    double *u0 = w, *u1 = w + n, *u2 = w + 2 * n, *l = w + 3 * n, *sw = w + 4 * n;
    for (int i = 0; i < n; i++) u0[i] = a[i] - mu, u1[i] = i + 1 < n ? b[i] : 0, u2[i] = 0;
    for (int i = 0; i + 1 < n; i++) {
        const double sub = b[i];
        if (fabs(sub) > fabs(u0[i])) {
            /* swap rows i and i+1: row i = (sub, u0[i+1], u1[i+1]); row i+1 = (u0[i], u1[i], 0) */
            const double r0 = u0[i], r1 = u1[i];
            u0[i] = sub, u1[i] = u0[i + 1], u2[i] = u1[i + 1];
            l[i] = r0 / sub, sw[i] = 1;
            u0[i + 1] = r1 - l[i] * u1[i];
            u1[i + 1] = -l[i] * u2[i];
        } else {
            if (u0[i] == 0) u0[i] = tiny;
            l[i] = sub / u0[i], sw[i] = 0;
            u0[i + 1] -= l[i] * u1[i];
        }
    }
    if (u0[n - 1] == 0) u0[n - 1] = tiny;
    for (int i = 0; i + 1 < n; i++) {
        if (sw[i] != 0) {
            double t = y[i];
            y[i] = y[i + 1], y[i + 1] = t;
        }
        y[i + 1] -= l[i] * y[i];
    }
    for (int i = n - 1; i >= 0; i--) {
        double v = y[i];
        if (i + 1 < n) v -= u1[i] * y[i + 1];
        if (i + 2 < n) v -= u2[i] * y[i + 2];
        y[i] = v / u0[i];
    }
}

bool rk_linalg_eig_values(rk_eig *e, int n, double *A) {
    memset(e, 0, sizeof *e);
    e->n = n;
    e->a = malloc((size_t)n * sizeof(double)), e->b = calloc((size_t)n, sizeof(double));
    e->w = malloc((size_t)n * sizeof(double)), e->beta = calloc((size_t)n, sizeof(double));
    e->Hv = malloc((size_t)n * n * sizeof(double));
    double *p = malloc((size_t)n * sizeof(double)), *ta = malloc((size_t)n * sizeof(double));
    double *tb = malloc((size_t)n * sizeof(double));
    bool ok = n > 0 && e->a && e->b && e->w && e->beta && e->Hv && p && ta && tb;
    if (ok) {
#ifdef LR_HAVE_AVX2_CLONES
        if (rk_cpu_has_avx2()) tridiag_avx2(n, A, e->a, e->b, e->Hv, e->beta, p);
        else
#endif
            tridiag_plain(n, A, e->a, e->b, e->Hv, e->beta, p);
        memcpy(ta, e->a, (size_t)n * sizeof(double));
        memcpy(tb, e->b, (size_t)n * sizeof(double));
        ok = tridiag_eigenvalues(n, ta, tb);
    }
    if (ok) {
        /* decreasing order (insertion sort: n is a few hundred) */
        for (int i = 0; i < n; i++) {
            double v = ta[i];
            int j = i;
            while (j > 0 && e->w[j - 1] < v) e->w[j] = e->w[j - 1], j--;
            e->w[j] = v;
        }
    }
    free(p), free(ta), free(tb);
    if (!ok) rk_linalg_eig_free(e);
    return ok;
}

LR_AI bool eig_vectors_impl(const rk_eig *e, int r, double *V) {
    const int n = e->n;
    double *w = malloc((size_t)5 * n * sizeof(double));
    if (!w) return false;
    double norm = 0;
    for (int i = 0; i < n; i++) norm = fmax(norm, fabs(e->a[i]) + fabs(e->b[i]) + (i ? fabs(e->b[i - 1]) : 0));
    const double tiny = (norm > 0 ? norm : 1.0) * 1e-15;
    const double gap = 1e-3 * fmax(fabs(e->w[0]), fabs(e->w[n - 1]));
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    for (int k = 0; k < r; k++) {
        double *z = V + (size_t)k * n;
        for (int i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            z[i] = (double)(rng >> 11) / 9007199254740992.0 - 0.5;
        }
        /* a slightly shifted eigenvalue keeps the solve finite; 3 rounds reach working accuracy */
        const double mu = e->w[k] + tiny;
        for (int it = 0; it < 3; it++) {
            tridiag_solve(n, e->a, e->b, mu, tiny, z, w);
            /* vectors of well separated eigenvalues come out orthogonal; within a cluster
             * (gap under 1e-3 of the spectral radius) they are orthogonalised, twice */
            for (int rep = 0; rep < 2; rep++)
                for (int j = k - 1; j >= 0 && e->w[j] - e->w[k] <= gap; j--) {
                    const double *zj = V + (size_t)j * n, d = ddot(z, zj, n);
                    for (int i = 0; i < n; i++) z[i] -= d * zj[i];
                }
            const double nz = sqrt(ddot(z, z, n));
            if (!(nz > 0) || !isfinite(nz)) {
                free(w);
                return false;
            }
            for (int i = 0; i < n; i++) z[i] /= nz;
        }
    }
    /* x = H_0 H_1 ... H_{n-3} z, for blocks of 16 vectors at a time so that each reflector
     * is read once per block, not once per vector (the same operations per vector) */
    for (int k0 = 0; k0 < r; k0 += 16)
        for (int j = n - 3; j >= 0; j--) {
            if (e->beta[j] == 0) continue;
            const double *v = e->Hv + (size_t)j * n;
            for (int k = k0; k < r && k < k0 + 16; k++) {
                double *x = V + (size_t)k * n;
                const double f = e->beta[j] * ddot(v, x + j + 1, n - j - 1);
                for (int i = 0; i < n - j - 1; i++) x[j + 1 + i] -= f * v[i];
            }
        }
    free(w);
    return true;
}

/* the inverse iteration's re-orthogonalisation and the back-transformation are dot
 * products and updates over n: an AVX2 copy (no FMA contraction in ISO C: the same sums) */
static bool eig_vectors_plain(const rk_eig *e, int r, double *V) { return eig_vectors_impl(e, r, V); }
#ifdef LR_HAVE_AVX2_CLONES
__attribute__((target("avx2,fma"))) static bool eig_vectors_avx2(const rk_eig *e, int r, double *V) {
    return eig_vectors_impl(e, r, V);
}
#endif

bool rk_linalg_eig_vectors(const rk_eig *e, int r, double *V) {
#ifdef LR_HAVE_AVX2_CLONES
    if (rk_cpu_has_avx2()) return eig_vectors_avx2(e, r, V);
#endif
    return eig_vectors_plain(e, r, V);
}

void rk_linalg_eig_free(rk_eig *e) {
    free(e->a), free(e->b), free(e->w), free(e->beta), free(e->Hv);
    memset(e, 0, sizeof *e);
}

bool rk_linalg_eigh(int n, double *A, double *w, double *V) {
    rk_eig e;
    if (!rk_linalg_eig_values(&e, n, A)) return false;
    memcpy(w, e.w, (size_t)n * sizeof(double));
    bool ok = rk_linalg_eig_vectors(&e, n, V);
    rk_linalg_eig_free(&e);
    return ok;
}

/* ---- Cholesky and dense fp64 products ---------------------------------------- */
/* C (m x n) += A^T (k x m)ᵀ B (k x n): all row-major, fp64. */
void rk_linalg_dgemm_atb_acc(int m, int n, int k, const double *A, const double *B, double *C) {
#ifdef RK_HAVE_BLAS
    cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, m, n, k, 1.0, A, m, B, n, 1.0, C, n);
#else
    for (int p = 0; p < k; p++)
        for (int i = 0; i < m; i++) {
            double a = A[(size_t)p * m + i];
            const double *b = B + (size_t)p * n;
            double *c = C + (size_t)i * n;
            for (int j = 0; j < n; j++) c[j] += a * b[j];
        }
#endif
}

/* C (m x n) = A (m x k) B (k x n), row-major fp64. */
void rk_linalg_dgemm(int m, int n, int k, const double *A, const double *B, double *C) {
#ifdef RK_HAVE_BLAS
    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, k, 1.0, A, k, B, n, 0.0, C, n);
#else
    memset(C, 0, (size_t)m * n * sizeof(double));
    for (int i = 0; i < m; i++)
        for (int p = 0; p < k; p++) {
            double a = A[(size_t)i * k + p];
            for (int j = 0; j < n; j++) C[(size_t)i * n + j] += a * B[(size_t)p * n + j];
        }
#endif
}

/* In-place Cholesky A = L Lᵀ (lower). false when A is not positive definite. */
bool rk_linalg_cholesky(int n, double *A) {
    for (int j = 0; j < n; j++) {
        double s = A[(size_t)j * n + j];
        for (int k = 0; k < j; k++) s -= A[(size_t)j * n + k] * A[(size_t)j * n + k];
        if (!(s > 0)) return false;
        double ljj = sqrt(s);
        A[(size_t)j * n + j] = ljj;
        for (int i = j + 1; i < n; i++) {
            double t = A[(size_t)i * n + j];
            for (int k = 0; k < j; k++) t -= A[(size_t)i * n + k] * A[(size_t)j * n + k];
            A[(size_t)i * n + j] = t / ljj;
        }
    }
    return true;
}

/* Solves L Lᵀ X = B for X (n x m, row-major, in place in B). */
void rk_linalg_chol_solve(int n, const double *L, double *B, int m) {
#ifdef RK_HAVE_BLAS
    cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasNoTrans, CblasNonUnit, n, m, 1.0, L, n, B, m);
    cblas_dtrsm(CblasRowMajor, CblasLeft, CblasLower, CblasTrans, CblasNonUnit, n, m, 1.0, L, n, B, m);
#else
    for (int i = 0; i < n; i++) { /* forward: L Z = B */
        double *bi = B + (size_t)i * m;
        for (int k = 0; k < i; k++) {
            double l = L[(size_t)i * n + k];
            const double *bk = B + (size_t)k * m;
            for (int j = 0; j < m; j++) bi[j] -= l * bk[j];
        }
        for (int j = 0; j < m; j++) bi[j] /= L[(size_t)i * n + i];
    }
    for (int i = n - 1; i >= 0; i--) { /* backward: Lᵀ X = Z */
        double *bi = B + (size_t)i * m;
        for (int k = i + 1; k < n; k++) {
            double l = L[(size_t)k * n + i];
            const double *bk = B + (size_t)k * m;
            for (int j = 0; j < m; j++) bi[j] -= l * bk[j];
        }
        for (int j = 0; j < m; j++) bi[j] /= L[(size_t)i * n + i];
    }
#endif
}

bool rk_linalg_spd_solve(int n, double *A, double *B, int m) {
    if (!rk_linalg_cholesky(n, A)) return false;
    rk_linalg_chol_solve(n, A, B, m);
    return true;
}

/* ---- Gram and product kernels ----------------------------------------------------
 * Written as plain loops; on x86-64 a copy compiled for AVX2/FMA is picked at run time
 * (the compiler vectorises the inner loops of both). */
#define LR_GRAM_BODY                                                                                \
    for (int64_t r = 0; r < n; r += 4) {                                                            \
        const int nr = n - r < 4 ? (int)(n - r) : 4;                                                \
        const float *x0 = x + r * D, *x1 = nr > 1 ? x0 + D : x0, *x2 = nr > 2 ? x0 + 2 * D : x0,    \
                    *x3 = nr > 3 ? x0 + 3 * D : x0;                                                 \
        const double f1 = nr > 1, f2 = nr > 2, f3 = nr > 3;                                         \
        for (int i = 0; i < D; i++) {                                                               \
            const double c0 = x0[i], c1 = f1 * x1[i], c2 = f2 * x2[i], c3 = f3 * x3[i];             \
            double *restrict gi = G + (size_t)i * D;                                                \
            for (int j = i; j < D; j++) gi[j] += c0 * x0[j] + c1 * x1[j] + c2 * x2[j] + c3 * x3[j]; \
        }                                                                                           \
    }

/* y (n, m) = x (n, k) B (k, m): rows in blocks of 8, so each row of B is read once per
 * block (B is the basis or a predictor: far larger than a block of y) */
#define LR_MATMUL_BODY                                             \
    for (int64_t i0 = 0; i0 < n; i0 += 8) {                        \
        const int nr = n - i0 < 8 ? (int)(n - i0) : 8;             \
        for (int i = 0; i < nr; i++)                               \
            for (int j = 0; j < m; j++) y[(i0 + i) * ldy + j] = 0; \
        for (int p = 0; p < k; p++) {                              \
            const float *restrict bp = B + (size_t)p * ldb;        \
            for (int i = 0; i < nr; i++) {                         \
                const float xp = x[(i0 + i) * ldx + p];            \
                float *restrict yi = y + (i0 + i) * ldy;           \
                for (int j = 0; j < m; j++) yi[j] += xp * bp[j];   \
            }                                                      \
        }                                                          \
    }

/* y[i][j] = Σ_p x[i][p] B[j][p]: rows of B contiguous (a dot per output); rows of x in
 * blocks of 8 so that each row of B is read once per block */
#define LR_MATMUL_NT_BODY                                                                                  \
    for (int64_t i0 = 0; i0 < n; i0 += 8) {                                                                \
        const int nr = n - i0 < 8 ? (int)(n - i0) : 8;                                                     \
        for (int j = 0; j < m; j++) {                                                                      \
            const float *restrict bj = B + (size_t)j * ldb;                                                \
            for (int i = 0; i < nr; i++) {                                                                 \
                const float *restrict xi = x + (i0 + i) * ldx;                                             \
                float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                   \
                int p = 0;                                                                                 \
                for (; p + 8 <= k; p += 8)                                                                 \
                    for (int u = 0; u < 8; u++) acc[u] += xi[p + u] * bj[p + u];                           \
                float t = 0;                                                                               \
                for (; p < k; p++) t += xi[p] * bj[p];                                                     \
                y[(i0 + i) * ldy + j] =                                                                    \
                    t + ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])); \
            }                                                                                              \
        }                                                                                                  \
    }

static void gram_plain(int D, int64_t n, const float *x, double *G) { LR_GRAM_BODY }
static void matmul_nt_plain(int64_t n, int m, int k, const float *x, int ldx, const float *B, int ldb, float *y,
                            int ldy) {
    LR_MATMUL_NT_BODY
}
static void matmul_plain(int64_t n, int m, int k, const float *x, int ldx, const float *B, int ldb, float *y, int ldy) {
    LR_MATMUL_BODY
}
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx2,fma"))) static void gram_avx2(int D, int64_t n, const float *x, double *G) { LR_GRAM_BODY }
/* Register-blocked AVX2 products (FMA: the sums round differently from the plain loops, by
 * float rounding). nt: 4 rows of x by 3 rows of B, 8 lanes of k per step, one horizontal sum
 * per output. nn: 4 rows by 16 columns of y held over all of k (B read in 16-column panels). */
__attribute__((target("avx2,fma"))) static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    return _mm_cvtss_f32(s);
}
__attribute__((target("avx2,fma"))) static void matmul_nt_avx2(int64_t n, int m, int k, const float *x, int ldx,
                                                               const float *B, int ldb, float *y, int ldy) {
    const int k8 = k & ~7;
    for (int j0 = 0; j0 < m; j0 += 3) {
        const int nj = m - j0 < 3 ? m - j0 : 3;
        const float *b[3];
        for (int u = 0; u < 3; u++) b[u] = B + (size_t)(j0 + (u < nj ? u : 0)) * ldb;
        for (int64_t i0 = 0; i0 < n; i0 += 4) {
            const int nr = n - i0 < 4 ? (int)(n - i0) : 4;
            const float *xr[4];
            for (int u = 0; u < 4; u++) xr[u] = x + (i0 + (u < nr ? u : 0)) * ldx;
            __m256 acc[4][3];
            for (int u = 0; u < 4; u++)
                for (int v = 0; v < 3; v++) acc[u][v] = _mm256_setzero_ps();
            for (int p = 0; p < k8; p += 8) {
                const __m256 b0 = _mm256_loadu_ps(b[0] + p), b1 = _mm256_loadu_ps(b[1] + p),
                             b2 = _mm256_loadu_ps(b[2] + p);
                for (int u = 0; u < 4; u++) {
                    const __m256 xv = _mm256_loadu_ps(xr[u] + p);
                    acc[u][0] = _mm256_fmadd_ps(xv, b0, acc[u][0]);
                    acc[u][1] = _mm256_fmadd_ps(xv, b1, acc[u][1]);
                    acc[u][2] = _mm256_fmadd_ps(xv, b2, acc[u][2]);
                }
            }
            for (int u = 0; u < nr; u++)
                for (int v = 0; v < nj; v++) {
                    float t = hsum8(acc[u][v]);
                    for (int p = k8; p < k; p++) t += xr[u][p] * b[v][p];
                    y[(i0 + u) * ldy + j0 + v] = t;
                }
        }
    }
}
__attribute__((target("avx2,fma"))) static void matmul_avx2(int64_t n, int m, int k, const float *x, int ldx,
                                                            const float *B, int ldb, float *y, int ldy) {
    /* 6 rows by 16 columns: 12 accumulators, per k 2 loads of B and 6 broadcasts feed 12 FMAs;
     * every output sums its k products in order, so the tile shape does not change a bit */
    const int m16 = m & ~15;
    for (int j0 = 0; j0 < m16; j0 += 16)
        for (int64_t i0 = 0; i0 < n; i0 += 6) {
            const int nr = n - i0 < 6 ? (int)(n - i0) : 6;
            const float *xr[6];
            for (int u = 0; u < 6; u++) xr[u] = x + (i0 + (u < nr ? u : 0)) * ldx;
            __m256 a[6][2];
            for (int u = 0; u < 6; u++) a[u][0] = a[u][1] = _mm256_setzero_ps();
            const float *bp = B + j0;
            for (int p = 0; p < k; p++, bp += ldb) {
                const __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8);
                for (int u = 0; u < 6; u++) {
                    const __m256 xv = _mm256_broadcast_ss(xr[u] + p);
                    a[u][0] = _mm256_fmadd_ps(xv, b0, a[u][0]);
                    a[u][1] = _mm256_fmadd_ps(xv, b1, a[u][1]);
                }
            }
            for (int u = 0; u < nr; u++) {
                _mm256_storeu_ps(y + (i0 + u) * ldy + j0, a[u][0]);
                _mm256_storeu_ps(y + (i0 + u) * ldy + j0 + 8, a[u][1]);
            }
        }
    for (int64_t i = 0; i < n && m16 < m; i++)
        for (int j = m16; j < m; j++) {
            float t = 0;
            for (int p = 0; p < k; p++) t += x[i * ldx + p] * B[(size_t)p * ldb + j];
            y[i * ldy + j] = t;
        }
}
#endif

void rk_linalg_gram_add(int D, int64_t n, const float *x, double *G) {
#ifdef LR_HAVE_AVX2_CLONES
    if (rk_cpu_has_avx2()) {
        gram_avx2(D, n, x, G);
        return;
    }
#endif
    gram_plain(D, n, x, G);
}

void rk_linalg_gram_add_f32(int D, int n, const float *x, float *work, double *G) {
    float *xt = work, *y = work + (size_t)n * D;
    for (int a = 0; a < n; a++)
        for (int d = 0; d < D; d++) xt[(size_t)d * n + a] = x[(size_t)a * D + d];
    /* only the blocks on or above the diagonal: rows [i0, i0 + 24) from column i0 rounded
     * down to 16 on (whole 6 x 16 tiles of rk_linalg_matmul where D is a multiple of 16) */
    for (int i0 = 0; i0 < D; i0 += 24) {
        const int ni = D - i0 < 24 ? D - i0 : 24, j0 = i0 & ~15;
        rk_linalg_matmul(ni, D - j0, n, xt + (size_t)i0 * n, n, x + j0, D, y + (size_t)i0 * D + j0, D);
    }
    for (int i = 0; i < D; i++)
        for (int j = i; j < D; j++) G[(size_t)i * D + j] += y[(size_t)i * D + j];
}

void rk_linalg_matmul(int64_t n, int m, int k, const float *x, int ldx, const float *B, int ldb, float *y, int ldy) {
#ifdef LR_HAVE_AVX2_CLONES
    if (rk_cpu_has_avx2()) {
        matmul_avx2(n, m, k, x, ldx, B, ldb, y, ldy);
        return;
    }
#endif
    matmul_plain(n, m, k, x, ldx, B, ldb, y, ldy);
}

void rk_linalg_matmul_nt(int64_t n, int m, int k, const float *x, int ldx, const float *B, int ldb, float *y, int ldy) {
#ifdef LR_HAVE_AVX2_CLONES
    if (rk_cpu_has_avx2()) {
        matmul_nt_avx2(n, m, k, x, ldx, B, ldb, y, ldy);
        return;
    }
#endif
    matmul_nt_plain(n, m, k, x, ldx, B, ldb, y, ldy);
}
