/* Internal to kernels/cuda: the CUDA backend instance and one launcher per op
 * file. Only .cu files include this (C never sees a CUDA header). */
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

/* rk_kernels.h is C11; C++ spells its static assertion differently. */
#ifndef _Static_assert
#define _Static_assert static_assert
#endif
extern "C" {
#include "rk_kernels.h"
}

/* Everything mutable lives here: stream, cuBLAS handle, device scratch. The op
 * table is per instance too (C++ has no array designators for a const one). */
typedef struct rk_cuda rk_cuda;
struct rk_cuda {
    rk_backend be;
    rk_backend_ops ops;
    int device;
    cudaStream_t stream;
    bool stream_ok;
    cublasHandle_t blas;
    bool blas_ok;
    char *dbuf; /* device scratch for one op's inputs and outputs; grows rarely */
    size_t dcap;
};

/* Launchers (kernels/cuda/<op>.cu). Dense device arrays: rows of d floats. */
cudaError_t rk_cuda_rmsnorm(const float *x, const float *w, float *y, int64_t rows, int64_t d,
                            float eps, cudaStream_t s);
/* x: rows = n_tok * n_head rows of hd; row r is token r / n_head at pos0 + token. */
cudaError_t rk_cuda_rope(float *x, int64_t rows, int64_t n_head, int64_t hd, int n_rot, bool neox,
                         float freq_base, int64_t pos0, cudaStream_t s);
cudaError_t rk_cuda_silu_mul(const float *a, const float *b, float *y, int64_t n, cudaStream_t s);
/* y[r][i] += a[bcast ? i : r*d + i] */
cudaError_t rk_cuda_add(float *y, const float *a, int64_t rows, int64_t d, bool bcast, cudaStream_t s);
/* f16 / bf16 -> f32, n elements */
cudaError_t rk_cuda_to_f32(const void *src, uint32_t type, float *dst, int64_t n, cudaStream_t s);

/* Device scratch of at least bytes (contents not kept), 256-byte aligned parts
 * are the caller's business. */
rk_status rk_cuda_scratch(rk_cuda *c, size_t bytes, rk_err *err);
/* Rows of a host view <-> dense device rows (row_bytes apart), on c->stream. */
cudaError_t rk_cuda_upload(rk_cuda *c, void *dev, const rk_view *v);
cudaError_t rk_cuda_download(rk_cuda *c, const rk_view *v, const void *dev);
/* Dense bytes of a view's rows. */
size_t rk_cuda_view_bytes(const rk_view *v);
/* "cuda: <op>: <what>: <cuda name> (<cuda text>)"; status NOMEM for allocation failures. */
rk_status rk_cuda_fail(rk_err *err, const char *op, const char *what, cudaError_t e);

rk_status rk_cuda_matmul(rk_backend *be, const rk_op_args *a, rk_err *err);

static inline int64_t rk_cuda_rows(const rk_view *v) {
    return v->ne[1] * (v->ne[2] ? v->ne[2] : 1) * (v->ne[3] ? v->ne[3] : 1);
}

/* Grid for a grid-stride loop over n items. */
static inline unsigned rk_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
