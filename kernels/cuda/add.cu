/* ADD (y += a) and ADD_ROW (y[r] += a, a bias row broadcast). */
#include "cuda_impl.h"

__global__ static void add_kernel(float *y, const float *a, int64_t rows, int64_t d, bool bcast) {
    int64_t n = rows * d;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] += a[bcast ? i % d : i];
}

cudaError_t rk_cuda_add(float *y, const float *a, int64_t rows, int64_t d, bool bcast, cudaStream_t s) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    add_kernel<<<rk_cuda_blocks(rows * d, 256), 256, 0, s>>>(y, a, rows, d, bcast);
    return cudaGetLastError();
}
