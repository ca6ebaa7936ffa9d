/* ROPE in place: one thread per (row, pair). The angle pos * base^(-2i/n_rot)
 * is formed and rotated through in double, like the CPU backends, so large
 * positions keep their precision. */
#include "cuda_impl.h"

__global__ static void rope_kernel(float *x, int64_t rows, int64_t n_head, int64_t hd, int n_rot,
                                   bool neox, double base, int64_t pos0) {
    int half = n_rot / 2;
    int64_t n = rows * half;
    for (int64_t k = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; k < n; k += (int64_t)gridDim.x * blockDim.x) {
        int64_t r = k / half;
        int i = (int)(k % half);
        double theta = (double)(pos0 + r / n_head) * pow(base, -2.0 * i / n_rot), sn, cs;
        sincos(theta, &sn, &cs);
        float *row = x + r * hd;
        int64_t i0 = neox ? i : 2 * i, i1 = neox ? i + half : 2 * i + 1;
        float x0 = row[i0], x1 = row[i1], c = (float)cs, s = (float)sn;
        row[i0] = x0 * c - x1 * s;
        row[i1] = x0 * s + x1 * c;
    }
}

cudaError_t rk_cuda_rope(float *x, int64_t rows, int64_t n_head, int64_t hd, int n_rot, bool neox,
                         float freq_base, int64_t pos0, cudaStream_t s) {
    int64_t n = rows * (n_rot / 2);
    if (n <= 0) return cudaSuccess;
    rope_kernel<<<rk_cuda_blocks(n, 256), 256, 0, s>>>(x, rows, n_head, hd, n_rot, neox, (double)freq_base, pos0);
    return cudaGetLastError();
}
