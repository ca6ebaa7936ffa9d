/* LR_KEYS: LowRAM's key rebuild, row k of dst = RoPE at position ids[k] of
 * (coef[k] . basis) * winv + mean (rk_kernels.h). One block per row: the row's r
 * coefficients go to shared memory, thread d sums r products in f32 (fmaf) down basis
 * column d (coalesced across the block), scales and adds the mean into a shared row,
 * then each rotated pair turns by the angle pos * freq[i], formed in double from the
 * host's rk_rope_freqs (like every backend; a caller's cos/sin table holds the same
 * angles rounded to f32, so the device forms them itself and never uploads it). */
#include "cuda_dequant.cuh"

template <bool F16>
__global__ static void lr_keys_kernel(const float *__restrict__ cf, int64_t ldc, const uint8_t *__restrict__ basis,
                                      size_t nbb, const float *__restrict__ mw, int64_t ldm, const int32_t *__restrict__ ids,
                                      const double *__restrict__ freq, float *__restrict__ y, int64_t ldy, int64_t n,
                                      int r, int hd, int n_rot, bool neox) {
    extern __shared__ float sm[]; /* r coefficients, then hd rebuilt values */
    float *c = sm, *acc = sm + r;
    const int half = n_rot / 2;
    for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
        __syncthreads(); /* the previous row's readers are done */
        for (int j = threadIdx.x; j < r; j += blockDim.x) c[j] = cf[k * ldc + j];
        __syncthreads();
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float s = 0.0f;
            for (int j = 0; j < r; j++) {
                const uint8_t *row = basis + (size_t)j * nbb;
                const float b = F16 ? __half2float(((const __half *)row)[d]) : ((const float *)row)[d];
                s = fmaf(c[j], b, s);
            }
            acc[d] = s * mw[ldm + d] + mw[d];
        }
        __syncthreads();
        float *out = y + k * ldy;
        const double pos = (double)ids[k];
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            double sn, cs;
            sincos(pos * freq[i], &sn, &cs);
            const float co = (float)cs, si = (float)sn;
            const int i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
            const float x0 = acc[i0], x1 = acc[i1];
            out[i0] = x0 * co - x1 * si;
            out[i1] = x0 * si + x1 * co;
        }
        for (int d = n_rot + threadIdx.x; d < hd; d += blockDim.x) out[d] = acc[d];
    }
}

size_t rk_cuda_lr_keys_smem(int r, int hd) { return (size_t)(r + hd) * sizeof(float); }

cudaError_t rk_cuda_lr_keys(const float *cf, int64_t ldc, const void *basis, bool f16, size_t nbb, const float *mw,
                            int64_t ldm, const int32_t *ids_dev, const double *freq_dev, float *y, int64_t ldy,
                            int64_t n, int r, int hd, int n_rot, bool neox, cudaStream_t s) {
    if (n <= 0 || hd <= 0) return cudaSuccess;
    const size_t smem = rk_cuda_lr_keys_smem(r, hd);
    if (smem > 48 * 1024) return cudaErrorInvalidValue; /* supports() keeps r + hd within it */
    const unsigned nb = (unsigned)(n < 65535 ? n : 65535);
    const int threads = hd <= 64 ? 64 : 128;
    if (f16)
        lr_keys_kernel<true><<<nb, threads, smem, s>>>(cf, ldc, (const uint8_t *)basis, nbb, mw, ldm, ids_dev, freq_dev, y,
                                                       ldy, n, r, hd, n_rot, neox);
    else
        lr_keys_kernel<false><<<nb, threads, smem, s>>>(cf, ldc, (const uint8_t *)basis, nbb, mw, ldm, ids_dev, freq_dev,
                                                        y, ldy, n, r, hd, n_rot, neox);
    return cudaGetLastError();
}
