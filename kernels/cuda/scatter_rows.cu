/* SCATTER_ROWS: dst row ids[i] = src0 row i, f32 rows (RidgeFill's plan puts compacted
 * rows back in chunk order with it). One block per source row; the ids are copied to the
 * device first (host memory by contract). Plain loads and stores: bit-exact copies. */
#include "cuda_impl.h"

__global__ static void scatter_rows_kernel(const float *__restrict__ x, int64_t ldx, const int32_t *__restrict__ ids,
                                           float *__restrict__ y, int64_t ldy, int64_t n, int64_t d) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const float *src = x + r * ldx;
        float *dst = y + (int64_t)ids[r] * ldy;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[i] = src[i];
    }
}

cudaError_t rk_cuda_scatter_rows(const float *x, int64_t ldx, const int32_t *ids_dev, float *y, int64_t ldy, int64_t n,
                                 int64_t d, cudaStream_t s) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    unsigned nb = (unsigned)(n < 65535 ? n : 65535);
    scatter_rows_kernel<<<nb, 256, 0, s>>>(x, ldx, ids_dev, y, ldy, n, d);
    return cudaGetLastError();
}
