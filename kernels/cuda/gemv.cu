/* Decode GEMV on the weights as stored: y (n, m) = x (n, k) W^T for n <= 8,
 * every weight type, no dequantised copy of the matrix. One warp per output
 * column j (weight row j); the row is cut into 32-element groups (a q8_0 /
 * q4_0 / q4_1 block, a q4_K sub-block, a q6_K quarter-half, 32 plain values)
 * that the warp takes one after another, lane e dequantising element e of the
 * group: every load of the warp falls in one block (its scale a broadcast, its
 * codes and the activations contiguous), so a warp streams its weight row once,
 * coalesced, for all n activation rows (up to 8, in 1 / 2 / 4 / 8
 * accumulators). (Until the first lent GPU, 2026-12-04, lane e walked group e
 * element by element: 32 blocks per load instruction, 0.02-0.10 of the copy
 * bandwidth on an H200, docs/GPU.md.) f32 accumulation; the lanes' partial sums
 * are added with a butterfly at the end. Plain-float rows of any length (tails
 * masked). */
#include <type_traits>

#include "cuda_dequant.cuh"

#define GEMV_WARPS 4

template <uint32_t T, int N>
__global__ static __launch_bounds__(32 * GEMV_WARPS) void gemv_kernel(const uint8_t *__restrict__ w, size_t nbw,
                                                                      const float *__restrict__ x, int64_t ldx,
                                                                      float *__restrict__ y, int64_t ldy, int64_t m,
                                                                      int64_t k, int n) {
    const int lane = threadIdx.x & 31;
    const int64_t j = (int64_t)blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    if (j >= m) return;
    const uint8_t *row = w + (size_t)j * nbw;
    float acc[N];
#pragma unroll
    for (int t = 0; t < N; t++) acc[t] = 0.0f;
#pragma unroll 4
    for (int64_t i = lane; i < k; i += 32) {
        const float wv = rk_dq<T>(row, i);
#pragma unroll
        for (int t = 0; t < N; t++)
            if (t < n) acc[t] = fmaf(wv, x[t * ldx + i], acc[t]);
    }
#pragma unroll
    for (int t = 0; t < N; t++) {
        float v = acc[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        if (lane == 0 && t < n) y[t * ldy + j] = v;
    }
}

template <uint32_t T>
static cudaError_t gemv_n(const void *w, size_t nbw, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n,
                          int64_t m, int64_t k, cudaStream_t s) {
    dim3 grid((unsigned)((m + GEMV_WARPS - 1) / GEMV_WARPS)), block(32 * GEMV_WARPS);
    const uint8_t *wp = (const uint8_t *)w;
    /* n rounded up to 1, 2, 4 or 8 accumulators (rows past n masked): half the instantiations */
    const int ni = (int)n;
    switch (n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : n <= 8 ? 8 : 0) {
    case 1: gemv_kernel<T, 1><<<grid, block, 0, s>>>(wp, nbw, x, ldx, y, ldy, m, k, ni); break;
    case 2: gemv_kernel<T, 2><<<grid, block, 0, s>>>(wp, nbw, x, ldx, y, ldy, m, k, ni); break;
    case 4: gemv_kernel<T, 4><<<grid, block, 0, s>>>(wp, nbw, x, ldx, y, ldy, m, k, ni); break;
    case 8: gemv_kernel<T, 8><<<grid, block, 0, s>>>(wp, nbw, x, ldx, y, ldy, m, k, ni); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

cudaError_t rk_cuda_gemv(const void *w, uint32_t type, size_t nbw, const float *x, int64_t ldx, float *y, int64_t ldy,
                         int64_t n, int64_t m, int64_t k, cudaStream_t s) {
    if (n <= 0 || m <= 0) return cudaSuccess;
    if (m > (int64_t)GEMV_WARPS * 0x7fffffff) return cudaErrorInvalidValue;
#define GV(T) return gemv_n<T>(w, nbw, x, ldx, y, ldy, n, m, k, s)
    RK_CUDA_DISPATCH_TYPE(type, GV)
#undef GV
    return cudaErrorInvalidValue;
}

/* ---- dense copies for the cuBLAS GEMM path ---------------------------------- */
template <uint32_t T, typename O>
__global__ static void to_dense_kernel(const uint8_t *__restrict__ w, size_t nbw, O *__restrict__ out, int64_t m,
                                       int64_t k) {
    int64_t total = m * k;
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < total; q += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = q / k, i = q % k;
        float v = rk_dq<T>(w + (size_t)r * nbw, i);
        if constexpr (std::is_same<O, __nv_bfloat16>::value)
            out[q] = __float2bfloat16_rn(v);
        else
            out[q] = __float2half_rn(v);
    }
}

cudaError_t rk_cuda_to_half(const void *w, uint32_t type, size_t nbw, void *out, int64_t m, int64_t k,
                            cudaStream_t s) {
    if (m <= 0 || k <= 0) return cudaSuccess;
    unsigned nb = rk_cuda_blocks(m * k, 256);
    const uint8_t *wp = (const uint8_t *)w;
    if (type == RK_DT_BF16) {
        to_dense_kernel<RK_DT_BF16, __nv_bfloat16><<<nb, 256, 0, s>>>(wp, nbw, (__nv_bfloat16 *)out, m, k);
        return cudaGetLastError();
    }
#define TH(T) to_dense_kernel<T, __half><<<nb, 256, 0, s>>>(wp, nbw, (__half *)out, m, k)
    RK_CUDA_DISPATCH_TYPE(type, TH)
#undef TH
    return cudaGetLastError();
}

/* f32 activations (rows ld apart) -> dense f16 or bf16 (rows, k). */
__global__ static void act_kernel(const float *__restrict__ x, int64_t ldx, void *out, bool bf16, int64_t rows,
                                  int64_t k) {
    int64_t total = rows * k;
    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < total; q += (int64_t)gridDim.x * blockDim.x) {
        float v = x[q / k * ldx + q % k];
        if (bf16)
            ((__nv_bfloat16 *)out)[q] = __float2bfloat16_rn(v);
        else
            ((__half *)out)[q] = __float2half_rn(v);
    }
}

cudaError_t rk_cuda_act_to_half(const float *x, int64_t ldx, void *out, bool bf16, int64_t rows, int64_t k,
                                cudaStream_t s) {
    if (rows <= 0 || k <= 0) return cudaSuccess;
    act_kernel<<<rk_cuda_blocks(rows * k, 256), 256, 0, s>>>(x, ldx, out, bf16, rows, k);
    return cudaGetLastError();
}
