/* RMSNORM: one block per row; sum of squares reduced in the block. */
#include "cuda_impl.h"

__global__ static void rmsnorm_kernel(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy,
                                      int64_t rows, int64_t d, float eps) {
    __shared__ float part[32];
    for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
        const float *xr = x + r * ldx;
        float s = 0;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) s += xr[i] * xr[i];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = s;
        __syncthreads();
        if (threadIdx.x < 32) {
            s = threadIdx.x < (blockDim.x >> 5) ? part[threadIdx.x] : 0.0f;
            for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
            if (threadIdx.x == 0) part[0] = (float)(1.0 / sqrt((double)s / (double)d + (double)eps));
        }
        __syncthreads();
        float scale = part[0];
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x)
            y[r * ldy + i] = xr[i] * scale * (w ? w[i] : 1.0f);
        __syncthreads(); /* part[] is reused by the next row */
    }
}

cudaError_t rk_cuda_rmsnorm(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy, int64_t rows,
                            int64_t d, float eps, cudaStream_t s) {
    if (rows <= 0 || d <= 0) return cudaSuccess;
    rmsnorm_kernel<<<rk_cuda_blocks(rows, 1), 256, 0, s>>>(x, ldx, w, y, ldy, rows, d, eps);
    return cudaGetLastError();
}
