/* Internals shared by the kernel backends: view helpers, the shape check every
 * backend runs, and the table of CPU vector kernels (AVX2 in ops_cpu_avx2.c,
 * portable C in ops_cpu.c). */
#pragma once
#include "rk_kernels.h"

/* ---- views ----------------------------------------------------------- */
/* Outer dims left at 0 read as 1, so {d, n} initialisers are 2-D views. */
static inline int64_t rk_view_dim(const rk_view *v, int i) { return i >= 2 && v->ne[i] == 0 ? 1 : v->ne[i]; }
/* Rows of ne[0] elements: ne[1]*ne[2]*ne[3]; row r at data + r*nb1. */
static inline int64_t rk_view_rows(const rk_view *v) { return v->ne[1] * rk_view_dim(v, 2) * rk_view_dim(v, 3); }
static inline float *rk_row_f32(const rk_view *v, int64_t r) { return (float *)((char *)v->data + (size_t)r * v->nb1); }

/* A (tokens, heads, head_dim) tensor (q, K/V cache, attention output) given
 * either as 2-D {heads*head_dim, tokens} (token rows nb1 apart) or as 3-D
 * {head_dim, heads, tokens} (head rows nb1 apart, tokens heads*nb1 apart). */
typedef struct rk_heads {
    char *data;
    size_t tok_nb, head_nb; /* bytes between tokens, between heads of one token */
    int64_t n_tok;
} rk_heads;
/* False when the view is neither form (or its strides are too small). */
bool rk_heads_of(const rk_view *v, int n_heads, int head_dim, rk_heads *out);

/* Shape consistency every backend requires (dtypes are supports()' business):
 * RK_E_INVALID_ARG with "kernels: <OP>: <what> (<expected> vs <got>)". */
rk_status rk_op_check(const rk_op_args *a, rk_err *err);

/* Dtype and shape limits of the two CPU backends; fns gives the row functions
 * (rk_quant_ref or rk_quant_fast). */
bool rk_cpu_supports_common(const rk_op_args *a, const rk_quant_fns *(*fns)(uint32_t));

/* rk_rope_freqs / rk_rope_mscale: rk_kernels.h (backend.c) */

/* ---- CPU vector kernels ---------------------------------------------- */
typedef struct rk_cpu_kern {
    const char *name;
    float (*dot)(const float *a, const float *b, int64_t n);
    /* y[i*ldy + j] = sum_p x[i*ldx + p] * w[j*ldw + p], i < n, j < m, p < k */
    void (*gemm_nt)(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw, float *y,
                    int64_t ldy);
    void (*f16_to_f32)(const uint16_t *src, float *dst, int64_t n);
    void (*f32_to_f16)(const float *src, uint16_t *dst, int64_t n);
    float (*sumsq)(const float *x, int64_t n);
    /* dst = x * s * w (w NULL: 1); dst may be x */
    void (*scale_mul)(float *dst, const float *x, float s, const float *w, int64_t n);
    /* dst = a / (1 + exp(-a)) * b; dst may be a or b */
    void (*silu_mul)(float *dst, const float *a, const float *b, int64_t n);
    void (*add)(float *dst, const float *a, int64_t n); /* dst += a */
    /* s[i] = exp(s[i] - m); returns the sum */
    float (*exp_sub)(float *s, int64_t n, float m);
    /* acc[d] = acc[d]*alpha + sum_j p[j] * v[j*ldv + d], j < n, d < hd */
    void (*pv)(float *acc, float alpha, const float *p, const float *v, int64_t ldv, int64_t n, int64_t hd);
    /* The decode shape: nr query rows of one KV head against cache rows as stored, row j
     * of the head at k + j * nb, type f32, f16 or q8_0, hd a multiple of 32 (rows are
     * converted in registers, never written out); pf > 0 prefetches each row's head pf rows
     * ahead (a cache streaming from memory; 0 for rows already in cache). NULL: none (the
     * caller converts tiles). qk_rows: s[r * lds + j] = sum_d q[r * ldq + d] * k_j[d],
     * r < nr, j < n. */
    void (*qk_rows)(uint32_t type, int nr, const float *q, int64_t ldq, const char *k, size_t nb, int64_t n, int64_t hd,
                    float *s, int64_t lds, int64_t pf);
    /* pv_rows: acc[r * ldacc + d] = acc[..] * alpha[r] + sum_j p[r * ldp + j] * v_j[d], r < nr, j < n
     * (per element: the product with alpha, then the terms in j order, as pv). */
    void (*pv_rows)(uint32_t type, int nr, float *acc, int64_t ldacc, const float *alpha, const float *p, int64_t ldp,
                    const char *v, size_t nb, int64_t n, int64_t hd, int64_t pf);
} rk_cpu_kern;

#if defined(RK_HAVE_AVX2)
extern const rk_cpu_kern rk_cpu_kern_avx2;
#endif

/* ---- what ops in other files (ops_lowram_cpu.c) use of the cpu backend ---- */
/* The largest of s[0..n) (-inf for n = 0; NaNs are passed over), four chains at a time so
 * that the loop pipelines: a softmax row's max. */
float rk_cpu_row_max(const float *s, int64_t n);
/* The instance's vector kernels. */
const rk_cpu_kern *rk_cpu_kern_of(const rk_backend *be);
/* fn over rows [0, n) in chunks of `chunk` on the instance's pool (inline when one chunk). */
void rk_cpu_par_for(rk_backend *be, int64_t n, int64_t chunk, void (*fn)(void *ctx, int64_t i0, int64_t i1, int tid),
                    void *ctx);
/* Grows the instance's scratch: per_thread floats for each thread (*tls, indexed by tid)
 * and shared floats (*shared). */
rk_status rk_cpu_scratch(rk_backend *be, size_t per_thread, size_t shared, float *const **tls, float **shared_out,
                         rk_err *err);
/* LR_KEYS kernels (ops_lowram_ref.c, ops_lowram_cpu.c). */
rk_status rk_ref_lr_keys(rk_backend *be, const rk_op_args *a, rk_err *err);
rk_status rk_cpu_lr_keys(rk_backend *be, const rk_op_args *a, rk_err *err);
/* LR_ATTN (ops_lowram_ref.c): the one host kernel of both CPU backends. */
rk_status rk_ref_lr_attn(rk_backend *be, const rk_op_args *a, rk_err *err);
/* SCATTER_ROWS (ops_rows_ref.c): row copies, the one kernel of both CPU backends. */
rk_status rk_ref_scatter_rows(rk_backend *be, const rk_op_args *a, rk_err *err);
/* ATTN with attn_sparse (attn_sparse.c): the block-sparse kernel of both CPU backends, ref
 * in double (the oracle), else the cpu backend's tiles and pool; dense runs the rows and
 * calls that stay dense (args without attn_sparse). */
rk_status rk_attn_sparse_run(rk_backend *be, const rk_op_args *a, bool ref, rk_op_fn dense, rk_err *err);
