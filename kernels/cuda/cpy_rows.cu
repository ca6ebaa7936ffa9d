/* CPY_ROWS: f32 rows into a cache at row0 as f32, f16 (round to nearest even)
 * or q8_0 blocks made exactly as rk_quant_q8_0_from_f32 makes them (d =
 * amax/127 in f32, stored as f16; q = roundf(x * (1/d)); a block with a NaN or
 * Inf, or whose scale overflows f16, gets d = NaN and q = 0), so the bytes
 * equal the CPU backends'. */
#include "cuda_dequant.cuh"

__global__ static void cpy_f32_kernel(const float *__restrict__ x, int64_t ldx, uint8_t *__restrict__ dst, size_t nb1,
                                      int64_t n, int64_t d, bool f16) {
    int64_t total = n * d;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / d, i = k % d;
        float v = x[r * ldx + i];
        uint8_t *row = dst + (size_t)r * nb1;
        if (f16)
            ((__half *)row)[i] = __float2half_rn(v);
        else
            ((float *)row)[i] = v;
    }
}

__global__ static void cpy_q8_0_kernel(const float *__restrict__ x, int64_t ldx, uint8_t *__restrict__ dst,
                                       size_t nb1, int64_t n, int64_t nblk) {
    int64_t total = n * nblk;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < total; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / nblk, b = k % nblk;
        const float *src = x + r * ldx + 32 * b;
        uint8_t *blk = dst + (size_t)r * nb1 + 34 * (size_t)b;
        float amax = 0.0f;
        bool finite = true;
        for (int j = 0; j < 32; j++) {
            float a = fabsf(src[j]);
            finite = finite && isfinite(a);
            amax = a > amax ? a : amax;
        }
        float dd = __fdiv_rn(amax, 127.0f);
        unsigned short dh = __half_as_ushort(__float2half_rn(dd));
        if (!finite || (dh & 0x7c00u) == 0x7c00u) {
            dh = 0x7e00u;
            for (int j = 0; j < 32; j++) blk[2 + j] = 0;
        } else {
            float id = dd != 0.0f ? __fdiv_rn(1.0f, dd) : 0.0f;
            for (int j = 0; j < 32; j++) blk[2 + j] = (uint8_t)(int8_t)roundf(__fmul_rn(src[j], id));
        }
        blk[0] = (uint8_t)dh;
        blk[1] = (uint8_t)(dh >> 8);
    }
}

cudaError_t rk_cuda_cpy_rows(const float *x, int64_t ldx, void *dst_row0, uint32_t type, size_t nb1, int64_t n,
                             int64_t d, cudaStream_t s) {
    if (n <= 0 || d <= 0) return cudaSuccess;
    if (type == RK_DT_Q8_0) {
        if (d % 32) return cudaErrorInvalidValue;
        cpy_q8_0_kernel<<<rk_cuda_blocks(n * (d / 32), 128), 128, 0, s>>>(x, ldx, (uint8_t *)dst_row0, nb1, n, d / 32);
    } else if (type == RK_DT_F16 || type == RK_DT_F32) {
        cpy_f32_kernel<<<rk_cuda_blocks(n * d, 256), 256, 0, s>>>(x, ldx, (uint8_t *)dst_row0, nb1, n, d,
                                                                 type == RK_DT_F16);
    } else {
        return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}
