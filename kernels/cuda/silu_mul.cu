/* SILU_MUL: y = a / (1 + exp(-a)) * b, elementwise (y may be a or b). */
#include "cuda_impl.h"

__global__ static void silu_mul_kernel(const float *a, const float *b, float *y, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        float v = a[i];
        y[i] = v / (1.0f + expf(-v)) * b[i];
    }
}

cudaError_t rk_cuda_silu_mul(const float *a, const float *b, float *y, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    silu_mul_kernel<<<rk_cuda_blocks(n, 256), 256, 0, s>>>(a, b, y, n);
    return cudaGetLastError();
}
