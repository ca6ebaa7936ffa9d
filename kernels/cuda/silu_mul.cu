/* SILU_MUL: y = a / (1 + exp(-a)) * b, elementwise (y may be a or b). */
#include "cuda_impl.h"

__global__ static void silu_mul_kernel(const float *a, int64_t lda, const float *b, int64_t ldb, float *y,
                                       int64_t ldy, int64_t rows, int64_t d) {
    int64_t n = rows * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / d, j = i % d;
        float v = a[r * lda + j];
        y[r * ldy + j] = v / (1.0f + expf(-v)) * b[r * ldb + j];
    }
}

cudaError_t rk_cuda_silu_mul(const float *a, int64_t lda, const float *b, int64_t ldb, float *y, int64_t ldy,
                             int64_t rows, int64_t d, cudaStream_t s) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    silu_mul_kernel<<<rk_cuda_blocks(rows * d, 256), 256, 0, s>>>(a, lda, b, ldb, y, ldy, rows, d);
    return cudaGetLastError();
}
