/* LR_ATTN: LowRAM's sparse decode attention, fused (rk_kernels.h RK_OP_LR_ATTN; the
 * cpu_ref twin is kernels/ops_lowram_ref.c). Three kernels on the stream, nothing on the
 * host in between:
 * 1. select (one block per KV head): every chunk's score max_j q_j . landmark, its stable
 *    rank by a count over all chunks, then the chosen chunks (rank < n_sel) and the others,
 *    each in index order, into ord (the summary rows' order);
 * 2. units (grid: units x KV heads), split-K style: a unit is one chosen chunk (its keys
 *    rebuilt from the int8 coefficients into shared memory, f16-rounded as the codec's key
 *    cache holds them, never written to global memory), 32 summary rows, or 32 exact rows
 *    (sinks or window, causal); each writes its partial softmax state (max, sum, compressed
 *    mass, Σ a.c over r, Σ a.v over head_dim) per state row;
 * 3. combine (one block per state row and KV head): the partials merged, then
 *    out = (Σ a.v + (Σ a.c) W + (Σ_compressed a) b) / Σ a.
 * Shapes within cuda_supports: head_dim <= 128, state rows x head_dim <= 4096 floats. */
#include <math.h>

#include "cuda_dequant.cuh"

#define LR_TK 32      /* rows per unit */
#define LR_THREADS 128

struct lr_dev_args {
    rk_lr_attn_args L;
    const float *q; int64_t ldq;   /* (n_q, n_head*hd) */
    float *o; int64_t ldo;
    int n_kv, grp, hd, ns;
    int64_t n_q, pos0, n_ch;
    float scale;
    int n_sel;                     /* min(L.n_sel, n_ch) */
    int n_sum_u, n_sink_u, n_win_u, n_units;
    int64_t sink_end, last;
    float *csc;                    /* (n_kv, n_ch) */
    int32_t *ord;                  /* (n_kv, n_ch) */
    float *part;                   /* (n_kv, n_units, ns, 3 + r + hd) */
};

__device__ __forceinline__ float lr_h(const void *p, size_t i) {
    return __half2float(((const __half *)p)[i]);
}

__device__ __forceinline__ const float *lr_q(const lr_dev_args &x, int h, int j) {
    return x.q + (int64_t)(j / x.grp) * x.ldq + (int64_t)(h * x.grp + j % x.grp) * x.hd;
}

__global__ static void lr_select_kernel(lr_dev_args x) {
    const int h = blockIdx.x;
    const int kvd = x.n_kv * x.hd;
    float *csc = x.csc + (size_t)h * x.n_ch;
    for (int64_t ch = threadIdx.x; ch < x.n_ch; ch += blockDim.x) {
        const __half *lm = (const __half *)x.L.lmk + (size_t)ch * kvd + (size_t)h * x.hd;
        float best = -INFINITY;
        for (int j = 0; j < x.ns; j++) {
            const float *qv = lr_q(x, h, j);
            float d = 0.0f;
            for (int e = 0; e < x.hd; e++) d = fmaf(qv[e], __half2float(lm[e]), d);
            best = d > best ? d : best;
        }
        csc[ch] = best;
    }
    __syncthreads();
    int32_t *ord = x.ord + (size_t)h * x.n_ch;
    /* flags in ord first (1: chosen by rank), then thread 0 compacts in index order */
    for (int64_t ch = threadIdx.x; ch < x.n_ch; ch += blockDim.x) {
        const float v = csc[ch];
        int64_t rank = 0;
        for (int64_t o = 0; o < x.n_ch && rank < x.n_sel; o++) {
            const float w = csc[o];
            rank += w > v || (w == v && o < ch);
        }
        ord[ch] = rank < x.n_sel;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int64_t n = 0, m = x.n_sel;
        /* two passes over the flags: chosen (capped at n_sel, as the reference), the rest after */
        for (int64_t ch = 0; ch < x.n_ch; ch++) {
            const bool pick = ord[ch] && n < x.n_sel;
            ord[ch] = pick ? (int32_t)(-1 - ch) : (int32_t)ch; /* chosen marked negative, in place */
            n += pick;
        }
        /* chosen first, then the others, each in index order (csc is free now: a copy) */
        int32_t *tmp = (int32_t *)csc;
        n = 0;
        for (int64_t ch = 0; ch < x.n_ch; ch++)
            if (ord[ch] < 0) tmp[n++] = -1 - ord[ch];
        for (int64_t ch = 0; ch < x.n_ch; ch++)
            if (ord[ch] >= 0) tmp[m++] = ord[ch];
        for (int64_t i = 0; i < x.n_ch; i++) ord[i] = tmp[i];
    }
}

/* unit partial: m, l, a, acc_c[r], acc_v[hd] per state row */
__device__ __forceinline__ float *lr_part(const lr_dev_args &x, int h, int u, int j) {
    const size_t w = 3 + (size_t)x.L.r + x.hd;
    return x.part + (((size_t)h * x.n_units + u) * x.ns + j) * w;
}

__global__ static void lr_unit_kernel(lr_dev_args x) {
    extern __shared__ float sm[];
    const int u = blockIdx.x, h = blockIdx.y, hd = x.hd, ns = x.ns, r = x.L.r, C = x.L.chunk;
    const int kvd = x.n_kv * hd;
    float *qs = sm;                       /* (ns, hd) */
    float *kb = qs + (size_t)ns * hd;     /* (LR_TK, hd) keys */
    float *sc = kb + (size_t)LR_TK * hd;  /* (ns, LR_TK) scores, then weights */
    float *cs = sc + (size_t)ns * LR_TK;  /* (LR_TK) coefficient scale / summary bias */
    __shared__ int32_t rowid[LR_TK];      /* stored row (chosen), chunk (summary) or position (exact) */
    __shared__ float ksc[LR_TK];          /* key_int8: each rebuilt row's int8 scale */
    __shared__ int nb_s, kind_s;          /* kind: 0 chosen, 1 summary, 2 sinks, 3 window */
    __shared__ int64_t b0_s;
    for (int i = threadIdx.x; i < ns * hd; i += blockDim.x) qs[i] = lr_q(x, h, i / hd)[i % hd];
    if (threadIdx.x == 0) {
        const int32_t *ord = x.ord + (size_t)h * x.n_ch;
        int kind, nb = 0;
        int64_t b0 = 0;
        if (u < x.n_sel) {
            kind = 0;
            const int64_t ch = ord[u], r0 = ch * C;
            nb = x.L.n_rows - r0 < C ? (int)(x.L.n_rows - r0) : C;
            b0 = ch;
            for (int k = 0; k < nb; k++) rowid[k] = (int32_t)(r0 + k);
        } else if (u < x.n_sel + x.n_sum_u) {
            kind = 1;
            const int64_t i0 = x.n_sel + (int64_t)(u - x.n_sel) * LR_TK;
            nb = x.n_ch - i0 < LR_TK ? (int)(x.n_ch - i0) : LR_TK;
            for (int k = 0; k < nb; k++) rowid[k] = ord[i0 + k];
        } else if (u < x.n_sel + x.n_sum_u + x.n_sink_u) {
            kind = 2;
            b0 = (int64_t)(u - x.n_sel - x.n_sum_u) * LR_TK;
            nb = x.sink_end - b0 < LR_TK ? (int)(x.sink_end - b0) : LR_TK;
        } else {
            kind = 3;
            b0 = x.L.x_lo + (int64_t)(u - x.n_sel - x.n_sum_u - x.n_sink_u) * LR_TK;
            nb = x.last - b0 < LR_TK ? (int)(x.last - b0) : LR_TK;
        }
        nb_s = nb, kind_s = kind, b0_s = b0;
    }
    __syncthreads();
    const int nb = nb_s, kind = kind_s;
    const int64_t b0 = b0_s;
    /* keys of the unit */
    if (kind == 0) {
        for (int k = threadIdx.x; k < nb; k += blockDim.x)
            cs[k] = rk_dq_f16(x.L.coef + (size_t)rowid[k] * x.L.coef_bytes);
        __syncthreads();
        for (int i = threadIdx.x; i < nb * hd; i += blockDim.x) {
            const int k = i / hd, d = i % hd;
            const int8_t *cq = (const int8_t *)(x.L.coef + (size_t)rowid[k] * x.L.coef_bytes + 2);
            const __half *bc = (const __half *)x.L.basis + (size_t)h * hd + d;
            float s = 0.0f;
            for (int t = 0; t < r; t++) s = fmaf((float)cq[t] * cs[k], __half2float(bc[(size_t)t * x.L.ldb]), s);
            kb[i] = s * x.L.winv[h * hd + d] + x.L.mean[h * hd + d];
        }
        __syncthreads();
        const int half = x.L.n_rot / 2;
        const bool neox = x.L.rope_mode == RK_ROPE_NEOX;
        for (int i = threadIdx.x; i < nb * half; i += blockDim.x) {
            const int k = i / half, e = i % half;
            const double p = (double)x.L.pos[rowid[k]];
            double sn, cn;
            sincos(p * x.L.freq[e], &sn, &cn);
            const float co = (float)cn, si = (float)sn;
            const int i0 = neox ? e : 2 * e, i1 = neox ? e + half : 2 * e + 1;
            float *kr = kb + (size_t)k * hd;
            const float x0 = kr[i0], x1 = kr[i1];
            kr[i0] = x0 * co - x1 * si;
            kr[i1] = x0 * si + x1 * co;
        }
        __syncthreads();
        if (x.L.key_int8) { /* as the codec's int8 key cache holds them (lr_encode_row), in its operations */
            for (int k = threadIdx.x; k < nb; k += blockDim.x) {
                const float *kr = kb + (size_t)k * hd;
                float mx = 0.0f;
                for (int d = 0; d < hd; d++) mx = fmaxf(mx, fabsf(kr[d]));
                ksc[k] = __half2float(__float2half_rn(__fdiv_rn(mx, 127.0f)));
            }
            __syncthreads();
            for (int i = threadIdx.x; i < nb * hd; i += blockDim.x) {
                const float ks = ksc[i / hd], inv = ks > 0.0f ? __fdiv_rn(1.0f, ks) : 0.0f;
                const float q = fminf(fmaxf(rintf(__fmul_rn(kb[i], inv)), -127.0f), 127.0f);
                kb[i] = __fmul_rn(q, ks);
            }
        } else {
            for (int i = threadIdx.x; i < nb * hd; i += blockDim.x) kb[i] = __half2float(__float2half_rn(kb[i]));
        }
    } else {
        for (int i = threadIdx.x; i < nb * hd; i += blockDim.x) {
            const int k = i / hd, d = i % hd;
            if (kind == 1) {
                kb[i] = lr_h(x.L.lmk, (size_t)rowid[k] * kvd + (size_t)h * hd + d);
            } else {
                const int64_t p = b0 + k;
                const void *src = kind == 2 ? x.L.sk : x.L.xk;
                const int64_t row = kind == 2 ? p : p % x.L.x_cap;
                kb[i] = lr_h(src, (size_t)row * kvd + (size_t)h * hd + d);
            }
        }
        if (kind == 1)
            for (int k = threadIdx.x; k < nb; k += blockDim.x) {
                const int64_t ch = rowid[k];
                const int64_t rows = x.L.n_rows - ch * C < C ? x.L.n_rows - ch * C : C;
                cs[k] = logf((float)rows);
            }
    }
    __syncthreads();
    /* scores: warp w takes state rows j = w, w + 4, ...; lane k one key */
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = warp; j < ns; j += nw) {
        float *out = lr_part(x, h, u, j);
        int nv = nb;
        if (kind >= 2) {
            const int64_t lim = x.pos0 + j / x.grp - b0 + 1;
            nv = lim < 0 ? 0 : lim < nb ? (int)lim : nb;
        }
        float s = -INFINITY;
        if (lane < nv) {
            const float *qv = qs + (size_t)j * hd, *kr = kb + (size_t)lane * hd;
            float d = 0.0f;
            for (int e = 0; e < hd; e++) d = fmaf(qv[e], kr[e], d);
            s = d * x.scale + (kind == 1 ? cs[lane] : 0.0f);
        }
        float m = s;
        for (int o = 16; o; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
        const float w = lane < nv ? expf(s - m) : 0.0f;
        float l = w;
        for (int o = 16; o; o >>= 1) l += __shfl_xor_sync(0xffffffffu, l, o);
        sc[(size_t)j * LR_TK + lane] = w;
        if (lane == 0) {
            out[0] = nv ? m : -INFINITY;
            out[1] = nv ? l : 0.0f;
            out[2] = kind <= 1 ? l : 0.0f;
        }
    }
    __syncthreads();
    /* Σ a.c (chosen: int8 codes times their scale; summaries: f16 mean coefficients) */
    for (int i = threadIdx.x; i < ns * r; i += blockDim.x) {
        const int j = i / r, t = i % r;
        float acc = 0.0f;
        if (kind == 0) {
            for (int k = 0; k < nb; k++) {
                const int8_t *cq = (const int8_t *)(x.L.coef + (size_t)rowid[k] * x.L.coef_bytes + 2);
                acc = fmaf(sc[(size_t)j * LR_TK + k], (float)cq[t] * cs[k], acc);
            }
        } else if (kind == 1) {
            for (int k = 0; k < nb; k++)
                acc = fmaf(sc[(size_t)j * LR_TK + k], lr_h(x.L.cmean, (size_t)rowid[k] * r + t), acc);
        }
        lr_part(x, h, u, j)[3 + t] = acc;
    }
    /* Σ a.v: residuals of the chosen rows, plain values of exact rows; none for summaries */
    uint32_t mask = 0;
    int64_t slot0 = 0;
    if (kind == 0) {
        mask = x.L.mask[(size_t)h * x.L.mb_hstride + b0];
        slot0 = x.L.base[(size_t)h * x.L.mb_hstride + b0];
    }
    const uint8_t *res = x.L.res + (size_t)h * x.L.res_hstride;
    for (int i = threadIdx.x; i < ns * hd; i += blockDim.x) {
        const int j = i / hd, d = i % hd;
        float acc = 0.0f;
        if (kind == 0) {
            int64_t slot = slot0;
            for (int k = 0; k < nb; k++)
                if ((mask >> k) & 1u) {
                    const uint8_t *rr = res + (size_t)slot++ * x.L.res_bytes;
                    acc = fmaf(sc[(size_t)j * LR_TK + k], (float)((const int8_t *)(rr + 2))[d] * rk_dq_f16(rr), acc);
                }
        } else if (kind >= 2) {
            const void *src = kind == 2 ? x.L.sv : x.L.xv;
            for (int k = 0; k < nb; k++) {
                const int64_t p = b0 + k, row = kind == 2 ? p : p % x.L.x_cap;
                const float w = sc[(size_t)j * LR_TK + k];
                if (w != 0.0f) acc = fmaf(w, lr_h(src, (size_t)row * kvd + (size_t)h * hd + d), acc);
            }
        }
        lr_part(x, h, u, j)[3 + r + d] = acc;
    }
}

__global__ static void lr_combine_kernel(lr_dev_args x) {
    extern __shared__ float sm[];
    const int j = blockIdx.x, h = blockIdx.y, hd = x.hd, r = x.L.r, kvd = x.n_kv * hd;
    float *f = sm;                /* (n_units) factors */
    float *cc = sm + x.n_units;   /* (r) Σ a.c */
    __shared__ float Ls, As;
    if (threadIdx.x == 0) {
        float m = -INFINITY;
        for (int u = 0; u < x.n_units; u++) m = fmaxf(m, lr_part(x, h, u, j)[0]);
        float l = 0.0f, a = 0.0f;
        for (int u = 0; u < x.n_units; u++) {
            const float *p = lr_part(x, h, u, j);
            const float e = p[1] > 0.0f ? expf(p[0] - m) : 0.0f;
            f[u] = e;
            l = fmaf(e, p[1], l);
            a = fmaf(e, p[2], a);
        }
        Ls = l, As = a;
    }
    __syncthreads();
    const int n_cu = x.n_sel + x.n_sum_u;
    for (int t = threadIdx.x; t < r; t += blockDim.x) {
        float acc = 0.0f;
        for (int u = 0; u < n_cu; u++)
            if (f[u] != 0.0f) acc = fmaf(f[u], lr_part(x, h, u, j)[3 + t], acc);
        cc[t] = acc;
    }
    __syncthreads();
    float *o = x.o + (int64_t)(j / x.grp) * x.ldo + (int64_t)(h * x.grp + j % x.grp) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = 0.0f;
        for (int u = 0; u < x.n_units; u++)
            if (f[u] != 0.0f) v = fmaf(f[u], lr_part(x, h, u, j)[3 + r + d], v);
        const __half *wc = (const __half *)x.L.W + (size_t)h * hd + d;
        for (int t = 0; t < r; t++) v = fmaf(cc[t], __half2float(wc[(size_t)t * kvd]), v);
        v = fmaf(As, x.L.b[h * hd + d], v);
        o[d] = v / Ls;
    }
}

size_t rk_cuda_lr_attn_smem(int ns, int hd) {
    return ((size_t)ns * hd + (size_t)LR_TK * hd + (size_t)ns * LR_TK + LR_TK) * sizeof(float);
}

/* Units of one call, the scratch it needs (bytes), and the launch. */
size_t rk_cuda_lr_attn_scratch(const rk_op_args *a, int *n_units) {
    const rk_lr_attn_args *L = a->lr;
    const int grp = a->attn.n_head / a->attn.n_head_kv;
    const int64_t n_q = rk_cuda_rows(&a->src0), last = a->attn.pos0 + n_q;
    const int64_t n_ch = (L->n_rows + L->chunk - 1) / L->chunk;
    const int64_t n_sel = L->n_sel < n_ch ? L->n_sel : n_ch;
    const int64_t n_sum = L->summaries ? (n_ch - n_sel + LR_TK - 1) / LR_TK : 0;
    const int64_t sink_end = L->n_sink < last ? L->n_sink : last;
    const int64_t nu = n_sel + n_sum + (sink_end + LR_TK - 1) / LR_TK + (last - L->x_lo + LR_TK - 1) / LR_TK;
    *n_units = (int)nu;
    const size_t ns = (size_t)(n_q * grp);
    return rk_cuda_up256((size_t)a->attn.n_head_kv * (size_t)(n_ch ? n_ch : 1) * 4) * 2 +
           (size_t)a->attn.n_head_kv * (size_t)nu * ns * (3 + (size_t)L->r + (size_t)a->attn.head_dim) * 4;
}

cudaError_t rk_cuda_lr_attn(const rk_op_args *a, const float *q, int64_t ldq, float *o, int64_t ldo, char *scratch,
                            cudaStream_t s) {
    const rk_lr_attn_args *L = a->lr;
    lr_dev_args x;
    x.L = *L;
    x.q = q, x.ldq = ldq, x.o = o, x.ldo = ldo;
    x.n_kv = a->attn.n_head_kv, x.grp = a->attn.n_head / a->attn.n_head_kv, x.hd = a->attn.head_dim;
    x.n_q = rk_cuda_rows(&a->src0), x.pos0 = a->attn.pos0, x.ns = (int)(x.n_q * x.grp);
    x.n_ch = (L->n_rows + L->chunk - 1) / L->chunk;
    x.scale = a->attn.scale;
    x.n_sel = (int)(L->n_sel < x.n_ch ? L->n_sel : x.n_ch);
    x.n_sum_u = L->summaries ? (int)((x.n_ch - x.n_sel + LR_TK - 1) / LR_TK) : 0;
    x.last = x.pos0 + x.n_q;
    x.sink_end = L->n_sink < x.last ? L->n_sink : x.last;
    x.n_sink_u = (int)((x.sink_end + LR_TK - 1) / LR_TK);
    x.n_win_u = (int)((x.last - L->x_lo + LR_TK - 1) / LR_TK);
    x.n_units = x.n_sel + x.n_sum_u + x.n_sink_u + x.n_win_u;
    const size_t sel_bytes = rk_cuda_up256((size_t)x.n_kv * (size_t)(x.n_ch ? x.n_ch : 1) * 4);
    x.csc = (float *)scratch;
    x.ord = (int32_t *)(scratch + sel_bytes);
    x.part = (float *)(scratch + 2 * sel_bytes);
    if (x.n_ch > 0) lr_select_kernel<<<x.n_kv, 256, 0, s>>>(x);
    dim3 gu((unsigned)x.n_units, (unsigned)x.n_kv);
    lr_unit_kernel<<<gu, LR_THREADS, rk_cuda_lr_attn_smem(x.ns, x.hd), s>>>(x);
    dim3 gc((unsigned)x.ns, (unsigned)x.n_kv);
    lr_combine_kernel<<<gc, LR_THREADS, ((size_t)x.n_units + (size_t)L->r) * sizeof(float), s>>>(x);
    return cudaGetLastError();
}
