/* ADD (y += a) and ADD_ROW (y[r] += a, a bias row broadcast). */
#include "cuda_impl.h"

__global__ static void add_kernel(float *y, int64_t ldy, const float *a, int64_t lda, int64_t rows, int64_t d,
                                  bool bcast) {
    int64_t n = rows * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = i / d, j = i % d;
        y[r * ldy + j] += a[bcast ? j : r * lda + j];
    }
}

cudaError_t rk_cuda_add(float *y, int64_t ldy, const float *a, int64_t lda, int64_t rows, int64_t d, bool bcast,
                        cudaStream_t s) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    add_kernel<<<rk_cuda_blocks(rows * d, 256), 256, 0, s>>>(y, ldy, a, lda, rows, d, bcast);
    return cudaGetLastError();
}
