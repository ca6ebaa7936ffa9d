/* Dense linear algebra shared by the runtime and the fitters: one symmetric eigensolver,
 * one Cholesky, fp64 Gram accumulation and small f32/f64 products. fp64 wherever a result
 * feeds a decomposition. No allocation except where a function says so; nothing prints. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* Eigendecomposition of the symmetric n x n matrix A (row-major, destroyed): eigenvalues
 * w (n) in decreasing order, eigenvectors as the rows of V (n, n). Householder
 * tridiagonalisation, then implicit QR steps with Wilkinson shifts. false: no convergence
 * or out of memory. */
bool rk_linalg_eigh(int n, double *A, double *w, double *V);
/* The same in two steps, for when only the leading r vectors are wanted. */
typedef struct rk_eig {
    int n;
    double *a, *b;     /* tridiagonal form */
    double *Hv, *beta; /* (n, n) reflection vectors, (n) their betas */
    double *w;         /* (n) eigenvalues, decreasing */
} rk_eig;
bool rk_linalg_eig_values(rk_eig *e, int n, double *A); /* A destroyed; e freed on failure */
/* Rows of V (r, n): eigenvectors of the r largest eigenvalues. */
bool rk_linalg_eig_vectors(const rk_eig *e, int r, double *V);
void rk_linalg_eig_free(rk_eig *e);
/* Solves A X = B for symmetric positive definite A (n x n, destroyed: its Cholesky factor)
 * and B (n, m) overwritten by X. false when A is not positive definite. */
bool rk_linalg_spd_solve(int n, double *A, double *B, int m);
/* G (D x D, upper triangle, row-major) += Σ_rows x xᵀ over n rows of x (n, D) f32. */
void rk_linalg_gram_add(int D, int64_t n, const float *x, double *G);
/* The same with the block's products summed in f32 by rk_linalg_matmul (then added to G in
 * fp64): for n up to a few hundred rows of centred (or nearly centred) data. work: n·D + D·D
 * floats. */
void rk_linalg_gram_add_f32(int D, int n, const float *x, float *work, double *G);
/* y (n, m) = x (n, k) B (k, m), f32, B row-major with row stride ldb; y may not alias. */
void rk_linalg_matmul(int64_t n, int m, int k, const float *x, int ldx, const float *B, int ldb, float *y, int ldy);
/* y (n, m) = x (n, k) Bᵀ with B (m, k) row-major, row stride ldb. */
void rk_linalg_matmul_nt(int64_t n, int m, int k, const float *x, int ldx, const float *B, int ldb, float *y, int ldy);

/* In-place Cholesky A = L Lᵀ of the symmetric n x n matrix A (row-major; L in the lower
 * triangle, the strict upper triangle is left as it was). false when A is not positive
 * definite (a pivot <= 0 or NaN). */
bool rk_linalg_cholesky(int n, double *A);
/* Solves L Lᵀ X = B in place (B (n, m) row-major) with the factor from rk_linalg_cholesky. */
void rk_linalg_chol_solve(int n, const double *L, double *B, int m);
/* C (m x n) += Aᵀ B with A (k x m), B (k x n), all row-major fp64. */
void rk_linalg_dgemm_atb_acc(int m, int n, int k, const double *A, const double *B, double *C);
/* C (m x n) = A (m x k) B (k x n), row-major fp64. */
void rk_linalg_dgemm(int m, int n, int k, const double *A, const double *B, double *C);
