/* f16 / bf16 weight rows to dense f32 on the device, ahead of an SGEMM. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_impl.h"

__device__ static float to_f(__half h) { return __half2float(h); }
__device__ static float to_f(__nv_bfloat16 h) { return __bfloat162float(h); }

template <typename T>
__global__ static void widen_kernel(const T *src, int64_t ld, float *dst, int64_t rows, int64_t k) {
    int64_t n = rows * k;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = to_f(src[i / k * ld + i % k]);
}

cudaError_t rk_cuda_to_f32(const void *src, uint32_t type, int64_t ld, float *dst, int64_t rows, int64_t k,
                           cudaStream_t s) {
    if (rows <= 0 || k <= 0) return cudaSuccess;
    unsigned nb = rk_cuda_blocks(rows * k, 256);
    if (type == RK_DT_F16)
        widen_kernel<__half><<<nb, 256, 0, s>>>((const __half *)src, ld, dst, rows, k);
    else if (type == RK_DT_BF16)
        widen_kernel<__nv_bfloat16><<<nb, 256, 0, s>>>((const __nv_bfloat16 *)src, ld, dst, rows, k);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
