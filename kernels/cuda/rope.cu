/* ROPE x -> y (y may be x): one thread per (row, pair), plus, out of place,
 * one per unrotated dim to copy. The angle pos * freq_i is formed and rotated
 * through in double, like the CPU backends, so large positions keep their
 * precision. freq_i includes RoPE scaling (linear, YaRN) exactly as
 * rk_rope_freqs computes it on the host: base^(-2i/n_rot) * (fs (1 - r_i) + r_i),
 * r_i = ext * ramp_i over the host's correction dims; cos and sin carry mscale. */
#include "cuda_impl.h"

typedef struct rope_dev {
    int n_rot;
    bool neox;
    double base, fs, ext, lo, hi, mscale;
    int64_t pos0;
} rope_dev;

__global__ static void rope_kernel(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows, int64_t n_head,
                                   int64_t hd, rope_dev p) {
    int n_rot = p.n_rot, half = n_rot / 2;
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
        double mix = p.fs;
        if (p.ext != 0.0) {
            double t = ((double)i - p.lo) / fmax(0.001, p.hi - p.lo);
            double ramp = (1.0 - fmin(1.0, fmax(0.0, t))) * p.ext;
            mix = p.fs * (1.0 - ramp) + ramp;
        }
        double theta = (double)(p.pos0 + r / n_head) * (pow(p.base, -2.0 * (double)i / n_rot) * mix), sn, cs;
        sincos(theta, &sn, &cs);
        int64_t i0 = p.neox ? i : 2 * i, i1 = p.neox ? i + half : 2 * i + 1;
        float x0 = xr[i0], x1 = xr[i1], c = (float)(cs * p.mscale), s = (float)(sn * p.mscale);
        yr[i0] = x0 * c - x1 * s;
        yr[i1] = x0 * s + x1 * c;
    }
}

cudaError_t rk_cuda_rope(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows, int64_t n_head,
                         int64_t hd, const rk_rope_params *rp, cudaStream_t s) {
    int64_t per = rp->n_rot / 2 + (x != y ? hd - rp->n_rot : 0);
    if (rows <= 0 || per <= 0) return cudaSuccess;
    rope_dev p;
    p.n_rot = rp->n_rot;
    p.neox = rp->mode == RK_ROPE_NEOX;
    p.base = (double)rp->freq_base;
    p.fs = rp->freq_scale > 0 ? (double)rp->freq_scale : 1.0;
    p.ext = (double)rp->ext_factor;
    double dims[2] = {0, 0};
    if (rp->ext_factor != 0) rk_rope_yarn_corr_dims(rp, dims);
    p.lo = dims[0];
    p.hi = dims[1];
    p.mscale = rk_rope_mscale(rp);
    p.pos0 = rp->pos0;
    rope_kernel<<<rk_cuda_blocks(rows * per, 256), 256, 0, s>>>(x, ldx, y, ldy, rows, n_head, hd, p);
    return cudaGetLastError();
}
