/* ATTN on the device: causal attention of n_q query rows over a KV cache,
 * flash-style (tiles of keys through shared memory with an online softmax; the
 * n_q x n_kv score matrix never exists), GQA by KV head, and split-K over the
 * keys when there are too few (query, head) pairs to fill the GPU (decode, and
 * short prefill chunks over a long cache): each split keeps its own (max, sum,
 * accumulator) and a second kernel combines them.
 *
 * Block = 16 warps over one KV head; warp w owns the pair p = 16*blockIdx.x + w
 * of the flattened (token t = p / group, head h = hk*group + p % group) list,
 * so the warps of a block share the KV head and the tile they load (16 / group
 * query tokens per tile load: the more, the fewer times a long cache is read). A tile of
 * RK_ATTN_TK keys is dequantised (f32 / f16 / q8_0, as quant_ref.c) into
 * shared memory; lane i scores key i of the tile, the lanes then take the
 * head dimensions for the P.V update. Keys at or past pos0 + t + 1 are never
 * used by that warp, and rows at or past the block's last visible key are never
 * read. */
#include <math.h>

#include "cuda_dequant.cuh"

#define TK RK_ATTN_TK
#define WARPS 16
#define DPL (RK_ATTN_MAX_HD / 32) /* head dims per lane */

template <uint32_t T>
__global__ static __launch_bounds__(32 * WARPS) void attn_kernel(rk_cuda_attn_args a) {
    extern __shared__ float smem[];
    const int hd = a.hd;
    float *ks = smem;                     /* TK x (hd + 1): padded, lane i reads row i */
    float *vs = ks + TK * (hd + 1);       /* TK x hd */
    float *qs = vs + TK * hd;             /* WARPS x hd */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int hk = blockIdx.y, split = blockIdx.z;
    const int64_t n_pairs = a.n_q * a.group;
    const int64_t p = (int64_t)blockIdx.x * WARPS + warp;
    const bool active = p < n_pairs;
    const int64_t t = active ? p / a.group : 0;
    const int h = hk * a.group + (active ? (int)(p % a.group) : 0);
    int64_t p_last = (int64_t)blockIdx.x * WARPS + WARPS - 1;
    if (p_last > n_pairs - 1) p_last = n_pairs - 1;
    const int64_t lim_blk = a.pos0 + p_last / a.group + 1, lim = active ? a.pos0 + t + 1 : 0;
    const int64_t k_begin = (int64_t)split * a.split_len;
    const int64_t k_end = lim_blk < k_begin + a.split_len ? lim_blk : k_begin + a.split_len;

    const float *q = (const float *)(a.q + t * a.q_tok + h * a.q_head);
    for (int d = lane; d < hd; d += 32) qs[warp * hd + d] = active ? q[d] : 0.0f;
    float m = -INFINITY, l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;

    for (int64_t tile0 = k_begin; tile0 < k_end; tile0 += TK) {
        const int nt = k_end - tile0 < TK ? (int)(k_end - tile0) : TK;
        __syncthreads(); /* the previous tile is consumed (and qs written) */
        for (int e = threadIdx.x; e < nt * hd; e += blockDim.x) {
            const int i = e / hd, d = e % hd;
            const int64_t row = tile0 + i;
            ks[i * (hd + 1) + d] = rk_dq<T>((const uint8_t *)a.k + row * a.k_tok + hk * a.k_head, d);
            vs[i * hd + d] = rk_dq<T>((const uint8_t *)a.v + row * a.v_tok + hk * a.v_head, d);
        }
        __syncthreads();
        if (!active || tile0 >= lim) continue;
        const int nv = lim - tile0 < nt ? (int)(lim - tile0) : nt; /* keys this warp sees */
        float s = -INFINITY;
        if (lane < nv) {
            float dot = 0.0f;
            const float *kr = ks + lane * (hd + 1), *qr = qs + warp * hd;
            for (int d = 0; d < hd; d++) dot = fmaf(qr[d], kr[d], dot);
            s = dot * a.scale;
        }
        float mt = s;
        for (int o = 16; o > 0; o >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, o));
        const float m_new = fmaxf(m, mt);
        const float alpha = expf(m - m_new);
        const float pj = lane < nv ? expf(s - m_new) : 0.0f;
        float ps = pj;
        for (int o = 16; o > 0; o >>= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
        l = l * alpha + ps;
#pragma unroll
        for (int i = 0; i < DPL; i++) acc[i] *= alpha;
        for (int j = 0; j < nv; j++) {
            const float pb = __shfl_sync(0xffffffffu, pj, j);
#pragma unroll
            for (int i = 0; i < DPL; i++) {
                const int d = lane + 32 * i;
                if (d < hd) acc[i] = fmaf(pb, vs[j * hd + d], acc[i]);
            }
        }
        m = m_new;
    }
    if (!active) return;
    if (a.n_split == 1) {
        float *o = (float *)(a.o + t * a.o_tok + h * a.o_head);
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < hd) o[d] = acc[i] / l;
        }
        return;
    }
    float *part = a.part + ((size_t)split * a.n_head_kv * n_pairs + (size_t)hk * n_pairs + p) * (size_t)(hd + 2);
    if (lane == 0) part[0] = m, part[1] = l;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hd) part[2 + d] = acc[i];
    }
}

/* One warp per (KV head, pair): the splits' partial softmaxes rescaled to the
 * common maximum and added. A split that saw no key has m = -inf, l = 0. */
__global__ static void attn_combine_kernel(rk_cuda_attn_args a) {
    const int64_t n_pairs = a.n_q * a.group, total = (int64_t)a.n_head_kv * n_pairs;
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31, hd = a.hd;
    if (w >= total) return;
    const int hk = (int)(w / n_pairs);
    const int64_t p = w % n_pairs, t = p / a.group;
    const int h = hk * a.group + (int)(p % a.group);
    const size_t stride = (size_t)total * (hd + 2);
    const float *base = a.part + (size_t)w * (hd + 2);
    float mx = -INFINITY;
    for (int s = 0; s < a.n_split; s++) mx = fmaxf(mx, base[s * stride]);
    float l = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;
    for (int s = 0; s < a.n_split; s++) {
        const float *ps = base + s * stride;
        if (ps[1] == 0.0f && ps[0] == -INFINITY) continue; /* no key in this split */
        const float f = expf(ps[0] - mx);
        l += ps[1] * f;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            const int d = lane + 32 * i;
            if (d < hd) acc[i] += ps[2 + d] * f;
        }
    }
    float *o = (float *)(a.o + t * a.o_tok + h * a.o_head);
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const int d = lane + 32 * i;
        if (d < hd) o[d] = acc[i] / l;
    }
}

size_t rk_cuda_attn_smem(int hd) { return (size_t)(TK * (hd + 1) + TK * hd + WARPS * hd) * sizeof(float); }

int rk_cuda_attn_splits(int64_t n_q, int group, int n_head_kv, int64_t n_kv, int n_sm, int64_t *split_len) {
    int64_t blocks = (n_q * group + WARPS - 1) / WARPS * n_head_kv, target = 2 * (int64_t)(n_sm > 0 ? n_sm : 1);
    int64_t n_split = 1;
    if (blocks < target) {
        n_split = (target + blocks - 1) / blocks;
        int64_t most = (n_kv + RK_ATTN_SPLIT_MIN - 1) / RK_ATTN_SPLIT_MIN; /* splits of >= SPLIT_MIN keys */
        if (n_split > most) n_split = most;
        if (n_split > 1024) n_split = 1024;
        if (n_split < 1) n_split = 1;
    }
    int64_t len = (n_kv + n_split - 1) / n_split;
    len = (len + TK - 1) / TK * TK;
    if (len < TK) len = TK;
    *split_len = len;
    return (int)((n_kv + len - 1) / len);
}

cudaError_t rk_cuda_attn(const rk_cuda_attn_args *args, uint32_t type, cudaStream_t s) {
    const rk_cuda_attn_args &a = *args;
    if (a.n_q <= 0) return cudaSuccess;
    if (a.hd <= 0 || a.hd > RK_ATTN_MAX_HD || a.n_split < 1 || (a.n_split > 1 && !a.part)) return cudaErrorInvalidValue;
    const int64_t n_pairs = a.n_q * a.group;
    dim3 grid((unsigned)((n_pairs + WARPS - 1) / WARPS), (unsigned)a.n_head_kv, (unsigned)a.n_split);
    const size_t sm = rk_cuda_attn_smem(a.hd);
    switch (type) {
    case RK_DT_F32: attn_kernel<RK_DT_F32><<<grid, 32 * WARPS, sm, s>>>(a); break;
    case RK_DT_F16: attn_kernel<RK_DT_F16><<<grid, 32 * WARPS, sm, s>>>(a); break;
    case RK_DT_Q8_0: attn_kernel<RK_DT_Q8_0><<<grid, 32 * WARPS, sm, s>>>(a); break;
    default: return cudaErrorInvalidValue;
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess || a.n_split == 1) return e;
    const int64_t warps = (int64_t)a.n_head_kv * n_pairs;
    attn_combine_kernel<<<(unsigned)((warps * 32 + 127) / 128), 128, 0, s>>>(a); /* splits only when pairs are few */
    return cudaGetLastError();
}
