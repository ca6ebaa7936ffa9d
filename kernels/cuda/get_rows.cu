/* GET_ROWS: dst row i = dequantised row ids[i] of src0, every weight type.
 * One block per output row; the ids are copied to the device first (they are
 * host memory by contract). */
#include "cuda_dequant.cuh"

template <uint32_t T>
__global__ static void get_rows_kernel(const uint8_t *__restrict__ src, size_t nb1, const int32_t *__restrict__ ids,
                                       float *__restrict__ dst, int64_t ldd, int64_t n, int64_t d) {
    for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
        const uint8_t *row = src + (size_t)ids[r] * nb1;
        for (int64_t i = threadIdx.x; i < d; i += blockDim.x) dst[r * ldd + i] = rk_dq<T>(row, i);
    }
}

cudaError_t rk_cuda_get_rows(const void *src, uint32_t type, size_t nb1, const int32_t *ids_dev, float *dst,
                             int64_t ldd, int64_t n, int64_t d, cudaStream_t s) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    unsigned nb = (unsigned)(n < 65535 ? n : 65535);
#define GR(T) get_rows_kernel<T><<<nb, 256, 0, s>>>((const uint8_t *)src, nb1, ids_dev, dst, ldd, n, d)
    RK_CUDA_DISPATCH_TYPE(type, GR)
#undef GR
    return cudaGetLastError();
}
