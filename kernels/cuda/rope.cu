/* ROPE x -> y (y may be x): one thread per (row, pair), plus, out of place,
 * one per unrotated dim to copy. The angle pos * base^(-2i/n_rot) is formed
 * and rotated through in double, like the CPU backends, so large positions
 * keep their precision. */
#include "cuda_impl.h"

__global__ static void rope_kernel(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows, int64_t n_head,
                                   int64_t hd, int n_rot, bool neox, double base, int64_t pos0) {
    int half = n_rot / 2;
    int64_t per = half + (x != y ? hd - n_rot : 0); /* items per row */
    int64_t n = rows * per;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / per, i = k % per;
        const float *xr = x + r * ldx;
        float *yr = y + r * ldy;
        if (i >= half) { /* a dim past n_rot, out of place */
            yr[n_rot + (i - half)] = xr[n_rot + (i - half)];
            continue;
        }
        double theta = (double)(pos0 + r / n_head) * pow(base, -2.0 * (double)i / n_rot), sn, cs;
        sincos(theta, &sn, &cs);
        int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float x0 = xr[i0], x1 = xr[i1], c = (float)cs, s = (float)sn;
        yr[i0] = x0 * c - x1 * s;
        yr[i1] = x0 * s + x1 * c;
    }
}

cudaError_t rk_cuda_rope(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows, int64_t n_head,
                         int64_t hd, int n_rot, bool neox, float freq_base, int64_t pos0, cudaStream_t s) {
    int64_t per = n_rot / 2 + (x != y ? hd - n_rot : 0);
    if (rows <= 0 || per <= 0) return cudaSuccess;
    rope_kernel<<<rk_cuda_blocks(rows * per, 256), 256, 0, s>>>(x, ldx, y, ldy, rows, n_head, hd, n_rot, neox,
                                                               (double)freq_base, pos0);
    return cudaGetLastError();
}
