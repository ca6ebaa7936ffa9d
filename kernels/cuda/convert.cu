/* f16 / bf16 weights to f32 on the device, ahead of an SGEMM. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "cuda_impl.h"

__global__ static void f16_kernel(const __half *src, float *dst, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __half2float(src[i]);
}

__global__ static void bf16_kernel(const __nv_bfloat16 *src, float *dst, int64_t n) {
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(src[i]);
}

cudaError_t rk_cuda_to_f32(const void *src, uint32_t type, float *dst, int64_t n, cudaStream_t s) {
    if (n <= 0) return cudaSuccess;
    if (type == RK_DT_F16)
        f16_kernel<<<rk_cuda_blocks(n, 256), 256, 0, s>>>((const __half *)src, dst, n);
    else if (type == RK_DT_BF16)
        bf16_kernel<<<rk_cuda_blocks(n, 256), 256, 0, s>>>((const __nv_bfloat16 *)src, dst, n);
    else
        return cudaErrorInvalidValue;
    return cudaGetLastError();
}
