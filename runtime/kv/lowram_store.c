/* LowRAM storage: the exact rows the codec owns, RoPE, the coefficient / residual row
 * formats, appending stored rows (with their chunk landmarks), compressing later blocks
 * with the fitted basis and predictors, truncation. The fit itself is in lowram_fit.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "lowram_impl.h"
#include "rk_kernels.h"

/* ---- exact rows --------------------------------------------------------------------
 * Unfitted: xk / xv hold positions [0, x_hi[l]) (x0 = 0). Fitted: sk / sv hold the sinks
 * [0, n_sink), xk / xv hold [x0 = comp_end, x_hi[l]); the compressed rows have no exact
 * copy anywhere. */

void lr_plain_row(const rk_kv_codec *c, int l, bool values, int64_t p, float *dst) {
    rk_kv_rows_to_f32(c->exact_type, lr_exact_ptr(c, l, values, p), 1, c->kvd, dst);
}

/* every buffer reallocated to cap rows; on failure the rest keep their size (growing: the
 * ones done are larger, harmless) */
static bool exact_resize(rk_kv_codec *c, int64_t cap) {
    for (int l = 0; l < c->n_layer; l++)
        for (int kv = 0; kv < 2; kv++) {
            uint8_t **b = kv ? &c->xv[l] : &c->xk[l];
            uint8_t *nb = realloc(*b, (size_t)(cap > 0 ? cap : 1) * c->xrow);
            if (!nb) return false;
            *b = nb;
        }
    return true;
}

bool lr_exact_reserve(rk_kv_codec *c, int64_t end) {
    const int64_t need = end - c->x0;
    if (need <= c->x_cap) return true;
    int64_t cap = c->x_cap * 2 > need ? c->x_cap * 2 : need;
    if (cap < 64) cap = 64;
    if (cap > c->n_ctx - c->x0) cap = c->n_ctx - c->x0 > need ? c->n_ctx - c->x0 : need;
    if (!exact_resize(c, cap)) return false;
    c->x_cap = cap;
    return true;
}

bool lr_exact_sinks(rk_kv_codec *c) {
    const int64_t sink = c->p.n_sink;
    uint8_t **sk = calloc((size_t)c->n_layer, sizeof *sk), **sv = calloc((size_t)c->n_layer, sizeof *sv);
    bool ok = sk && sv;
    for (int l = 0; ok && l < c->n_layer; l++) {
        sk[l] = malloc((size_t)(sink > 0 ? sink : 1) * c->xrow);
        sv[l] = malloc((size_t)(sink > 0 ? sink : 1) * c->xrow);
        ok = sk[l] && sv[l];
    }
    if (!ok) {
        for (int l = 0; l < c->n_layer; l++) {
            if (sk) free(sk[l]);
            if (sv) free(sv[l]);
        }
        free(sk), free(sv);
        return false;
    }
    c->sk = sk, c->sv = sv;
    return true;
}

bool lr_exact_compact(rk_kv_codec *c, bool shrink) {
    const int64_t sink = c->p.n_sink;
    if (!c->sk) { /* first compaction: the sinks get buffers of their own */
        if (!lr_exact_sinks(c)) return false;
        for (int l = 0; l < c->n_layer; l++) { /* x0 == 0 here: the sinks are rows [0, sink) of xk / xv */
            memcpy(c->sk[l], c->xk[l], (size_t)sink * c->xrow);
            memcpy(c->sv[l], c->xv[l], (size_t)sink * c->xrow);
        }
    }
    const int64_t drop = c->comp_end - c->x0;
    int64_t held = 0;
    for (int l = 0; l < c->n_layer; l++) {
        const int64_t keep = c->x_hi[l] - c->comp_end;
        memmove(c->xk[l], c->xk[l] + (size_t)drop * c->xrow, (size_t)keep * c->xrow);
        memmove(c->xv[l], c->xv[l] + (size_t)drop * c->xrow, (size_t)keep * c->xrow);
        held = keep > held ? keep : held;
    }
    c->x0 = c->comp_end;
    if (shrink) {
        /* room for the window's growth until the next block is compressed, and for the
         * sinks should a truncation unfit the codec */
        int64_t cap = held + c->p.window + 2 * (int64_t)c->p.chunk;
        if (cap < sink) cap = sink;
        if (cap < c->x_cap) {
            (void)exact_resize(c, cap); /* a failed shrink keeps the larger block: every buffer holds >= cap */
            c->x_cap = cap;
        }
    }
    return true;
}

void lr_exact_unfit(rk_kv_codec *c, int64_t n) {
    if (c->sk) {
        /* x_cap >= n_sink >= n (kept so by lr_exact_compact): no allocation */
        for (int l = 0; l < c->n_layer; l++) {
            memcpy(c->xk[l], c->sk[l], (size_t)n * c->xrow);
            memcpy(c->xv[l], c->sv[l], (size_t)n * c->xrow);
            free(c->sk[l]), free(c->sv[l]);
        }
        free(c->sk), free(c->sv);
        c->sk = c->sv = NULL;
    }
    c->x0 = 0;
    for (int l = 0; l < c->n_layer; l++) c->x_hi[l] = c->x_hi[l] < n ? c->x_hi[l] : n;
}

void lr_exact_free(rk_kv_codec *c) {
    for (int l = 0; l < c->n_layer; l++) {
        if (c->xk) free(c->xk[l]), c->xk[l] = NULL;
        if (c->xv) free(c->xv[l]), c->xv[l] = NULL;
        if (c->sk) free(c->sk[l]);
        if (c->sv) free(c->sv[l]);
    }
    free(c->sk), free(c->sv);
    c->sk = c->sv = NULL;
    c->x_cap = 0;
}

/* ---- RoPE, storage formats ---------------------------------------------------------- */

void lr_rope_fill(rk_kv_codec *c, int64_t n) {
    if (n > c->n_ctx) n = c->n_ctx;
    if (n > c->rope_filled) c->rope_filled = n;
}

void lr_rope_row(const rk_kv_codec *c, float *x, int n_heads, int64_t p, bool inverse) {
    const int half = c->n_rot / 2;
    float cs[LR_ROPE_MAX];
    lr_rope_cs(c, p, cs);
    const float sg = inverse ? -1.0f : 1.0f;
    for (int h = 0; h < n_heads; h++) {
        float *y = x + (size_t)h * c->hd;
        for (int i = 0; i < half; i++) {
            const int i0 = c->rope_mode == RK_ROPE_NEOX ? i : 2 * i;
            const int i1 = c->rope_mode == RK_ROPE_NEOX ? i + half : 2 * i + 1;
            const float co = cs[2 * i], si = sg * cs[2 * i + 1], x0 = y[i0], x1 = y[i1];
            y[i0] = x0 * co - x1 * si;
            y[i1] = x0 * si + x1 * co;
        }
    }
}

static float f16r(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rk_f16_to_f32(h);
}
static void f16w(uint8_t *p, float v) {
    uint16_t h = rk_f32_to_f16(v);
    memcpy(p, &h, 2);
}

/* Encodes r values as one stored row of `type`, then writes back what decoding gives. */
void lr_encode_row(uint32_t type, float *v, int n, uint8_t *dst) {
    if (type == RK_DT_F32) {
        memcpy(dst, v, (size_t)n * sizeof(float));
    } else if (type == RK_DT_F16) {
        for (int i = 0; i < n; i++) {
            uint16_t h = rk_f32_to_f16(v[i]);
            memcpy(dst + 2 * i, &h, 2);
            v[i] = rk_f16_to_f32(h);
        }
    } else if (type == RK_DT_Q4_0) { /* f16 scale, then n/2 bytes of two 4-bit values in -7..7 (+8) */
        float mx = 0;
        for (int i = 0; i < n; i++) {
            const float a = fabsf(v[i]);
            mx = a > mx ? a : mx;
        }
        f16w(dst, mx / 7.0f);
        const float sc = f16r(dst), inv = sc > 0 ? 1.0f / sc : 0;
        for (int i = 0; i < n; i += 2) {
            long q0 = lrintf(v[i] * inv), q1 = lrintf(v[i + 1] * inv);
            q0 = q0 > 7 ? 7 : q0 < -7 ? -7 : q0;
            q1 = q1 > 7 ? 7 : q1 < -7 ? -7 : q1;
            dst[2 + i / 2] = (uint8_t)((q0 + 8) | ((q1 + 8) << 4));
            v[i] = (float)q0 * sc, v[i + 1] = (float)q1 * sc;
        }
    } else { /* Q8: f16 scale, then n int8 */
        float mx = 0;
        for (int i = 0; i < n; i++) {
            const float a = fabsf(v[i]);
            mx = a > mx ? a : mx;
        }
        f16w(dst, mx / 127.0f);
        const float sc = f16r(dst), inv = sc > 0 ? 1.0f / sc : 0;
        int8_t *qv = (int8_t *)(dst + 2);
        for (int i = 0; i < n; i++) {
            /* lrintf's value without the libm call: clamped (NaN to -127, as lrintf's
             * LONG_MIN clamps), then rounded to nearest even by adding and removing 1.5·2^23 */
            float t = v[i] * inv;
            t = t > 127.0f ? 127.0f : !(t >= -127.0f) ? -127.0f : t;
            const float q = (t + 12582912.0f) - 12582912.0f;
            qv[i] = (int8_t)q;
            v[i] = q * sc;
        }
    }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
/* int8 (q8: f16 scale, n values) and q4_0-style (f16 scale, n/2 bytes of two nibbles, low
 * first, offset 8) rows into f32, 8 values a step; the products equal the scalar loop's
 * (one rounding each). */
__attribute__((target("avx2,fma,f16c"))) static void decode_q_avx2(bool q4, const uint8_t *src, int n, float *dst) {
    const float sc = f16r(src);
    const __m256 vs = _mm256_set1_ps(sc);
    int i = 0;
    if (q4) {
        const __m128i lo4 = _mm_set1_epi8(15), e8 = _mm_set1_epi8(8);
        for (; i + 32 <= n; i += 32) {
            const __m128i b = _mm_loadu_si128((const __m128i *)(src + 2 + i / 2));
            const __m128i lo = _mm_sub_epi8(_mm_and_si128(b, lo4), e8);
            const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(b, 4), lo4), e8);
            const __m128i v0 = _mm_unpacklo_epi8(lo, hi), v1 = _mm_unpackhi_epi8(lo, hi); /* lo0 hi0 lo1 hi1 ... */
            _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v0)), vs));
            _mm256_storeu_ps(dst + i + 8,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v0, 8))), vs));
            _mm256_storeu_ps(dst + i + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v1)), vs));
            _mm256_storeu_ps(dst + i + 24,
                             _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(v1, 8))), vs));
        }
        for (; i < n; i += 2) {
            const uint8_t b = src[2 + i / 2];
            dst[i] = (float)((int)(b & 15) - 8) * sc;
            dst[i + 1] = (float)((int)(b >> 4) - 8) * sc;
        }
        return;
    }
    const int8_t *qv = (const int8_t *)(src + 2);
    for (; i + 8 <= n; i += 8) {
        const __m128i b = _mm_loadl_epi64((const __m128i *)(qv + i));
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), vs));
    }
    for (; i < n; i++) dst[i] = (float)qv[i] * sc;
}
#define LR_HAVE_DECODE_AVX2 1
#endif

void lr_decode_row(uint32_t type, const uint8_t *src, int n, float *dst) {
#ifdef LR_HAVE_DECODE_AVX2
    if ((type == RK_DT_Q4_0 || (type != RK_DT_F32 && type != RK_DT_F16)) && rk_cpu_has_avx2()) {
        decode_q_avx2(type == RK_DT_Q4_0, src, n, dst);
        return;
    }
#endif
    if (type == RK_DT_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else if (type == RK_DT_F16) {
        rk_quant_fast(RK_DT_F16)->to_f32(src, dst, n);
    } else if (type == RK_DT_Q4_0) {
        const float sc = f16r(src);
        for (int i = 0; i < n; i += 2) {
            const uint8_t b = src[2 + i / 2];
            dst[i] = (float)((int)(b & 15) - 8) * sc;
            dst[i + 1] = (float)((int)(b >> 4) - 8) * sc;
        }
    } else {
        const float sc = f16r(src);
        const int8_t *qv = (const int8_t *)(src + 2);
        for (int i = 0; i < n; i++) dst[i] = (float)qv[i] * sc;
    }
}

void lr_mat_f32(const rk_kv_codec *c, const void *m, size_t ld, int r0, int nr, int c0, int nc, float *dst) {
    for (int i = 0; i < nr; i++) {
        const size_t off = (size_t)(r0 + i) * ld + (size_t)c0;
        if (c->wide) memcpy(dst + (size_t)i * nc, (const float *)m + off, (size_t)nc * sizeof(float));
        else rk_quant_fast(RK_DT_F16)->to_f32((const uint16_t *)m + off, dst + (size_t)i * nc, nc);
    }
}

void lr_mat_store(const rk_kv_codec *c, void *m, size_t n, const float *src) {
    if (c->wide) memcpy(m, src, n * sizeof(float));
    else
        for (size_t i = 0; i < n; i++) ((uint16_t *)m)[i] = rk_f32_to_f16(src[i]);
}

void lr_coef_rows(const rk_kv_codec *c, const lr_group *g, int64_t i0, int64_t n, float *dst) {
    for (int64_t i = 0; i < n; i++)
        lr_decode_row(c->p.coef_type, g->coef + (size_t)(i0 + i) * g->coef_bytes, g->r, dst + i * g->r);
}

void lr_res_row(const rk_kv_codec *c, const lr_head *h, int64_t j, float *dst) {
    lr_decode_row(c->p.resid_type, h->res + (size_t)j * c->res_bytes, c->hd, dst);
}

/* Stacked pre-RoPE keys of group g at position p: x (D). */
void lr_stacked_key(const rk_kv_codec *c, const lr_group *g, int64_t p, float *x) {
    for (int li = 0; li < g->n_l; li++) {
        float *xl = x + (size_t)li * c->kvd;
        lr_plain_row(c, g->l0 + li, false, p, xl);
        lr_rope_row(c, xl, c->n_head_kv, p, true);
    }
}

/* ---- appending one stored row ----------------------------------------------------
 * cq: its dequantised coefficients (r); res: per layer of the group and head, the
 * encoded residual row or NULL for none. Landmarks take the exact post-RoPE keys. The
 * chunk's f16 means (coefficients, landmarks, bounds) are written from the open sums when
 * the chunk fills or at lr_append_close, not at every row. */
static void write_chunk_means(rk_kv_codec *c, lr_group *g) {
    const int64_t C = c->p.chunk, ch = (g->n_rows - 1) / C;
    const float inv = 1.0f / (float)(g->n_rows - ch * C);
    const float n = (float)(g->n_rows - ch * C);
    for (int k = 0; c->cmean_on && k < g->r; k++) g->cmean[(size_t)ch * g->r + k] = rk_f32_to_f16(g->open_c[k] / n);
    for (int li = 0; li < g->n_l; li++) {
        lr_layer *L = &c->ly[g->l0 + li];
        for (int j = 0; j < c->kvd; j++) L->lmk[(size_t)ch * c->kvd + j] = rk_f32_to_f16(L->open_sum[j] * inv);
        if (L->lmin)
            for (int j = 0; j < c->kvd; j++) {
                L->lmin[(size_t)ch * c->kvd + j] = rk_f32_to_f16(L->open_min[j]);
                L->lmax[(size_t)ch * c->kvd + j] = rk_f32_to_f16(L->open_max[j]);
            }
    }
}

rk_status lr_cmean_fill(const rk_kv_codec *c, const lr_group *g, uint16_t *dst, rk_err *err) {
    const int64_t C = c->p.chunk;
    float *cf = malloc((size_t)g->r * sizeof(float)), *acc = malloc((size_t)g->r * sizeof(float));
    if (!cf || !acc) {
        free(cf), free(acc);
        return rk_err_set(err, RK_E_NOMEM, "lowram: out of memory rebuilding chunk mean coefficients");
    }
    for (int64_t ch = 0; ch * C < g->n_rows; ch++) {
        const int64_t i0 = ch * C, n = g->n_rows - i0 < C ? g->n_rows - i0 : C;
        memset(acc, 0, (size_t)g->r * sizeof(float));
        for (int64_t i = i0; i < i0 + n; i++) {
            lr_coef_rows(c, g, i, 1, cf);
            for (int k = 0; k < g->r; k++) acc[k] += cf[k];
        }
        for (int k = 0; k < g->r; k++) dst[(size_t)ch * g->r + k] = rk_f32_to_f16(acc[k] / (float)n);
    }
    free(cf), free(acc);
    return RK_OK;
}

rk_status lr_cmean_need(rk_kv_codec *c, rk_err *err) {
    if (c->cmean_on) return RK_OK;
    for (int gi = 0; c->fitted && gi < c->n_group; gi++) {
        rk_status st = lr_cmean_fill(c, &c->g[gi], c->g[gi].cmean, err);
        if (st) return st;
    }
    c->cmean_on = true;
    return RK_OK;
}

void lr_append_close(rk_kv_codec *c, lr_group *g) {
    if (g->n_rows % c->p.chunk) write_chunk_means(c, g);
}

void lr_append_row(rk_kv_codec *c, lr_group *g, int64_t p, const uint8_t *coef_row, const float *cq,
                   const uint8_t *const *res, float *tmp) {
    const int64_t i = g->n_rows, C = c->p.chunk, ch = i / C;
    const int bit = (int)(i % C);
    g->pos[i] = (int32_t)p;
    memcpy(g->coef + (size_t)i * g->coef_bytes, coef_row, g->coef_bytes);
    if (bit == 0) memset(g->open_c, 0, (size_t)g->r * sizeof(float));
    for (int k = 0; k < g->r; k++) g->open_c[k] += cq[k];
    for (int li = 0; li < g->n_l; li++) {
        lr_layer *L = &c->ly[g->l0 + li];
        for (int h = 0; h < c->n_head_kv; h++) {
            lr_head *H = &L->h[h];
            if (bit == 0) H->mask[ch] = 0, H->base[ch] = (int32_t)H->n_res;
            const uint8_t *rr = res[li * c->n_head_kv + h];
            if (rr) {
                memcpy(H->res + (size_t)H->n_res * c->res_bytes, rr, c->res_bytes);
                H->n_res++;
                H->mask[ch] |= 1u << bit;
            }
        }
        lr_plain_row(c, g->l0 + li, false, p, tmp);
        if (bit == 0) memset(L->open_sum, 0, (size_t)c->kvd * sizeof(float));
        for (int j = 0; j < c->kvd; j++) L->open_sum[j] += tmp[j];
        if (L->lmin)
            for (int j = 0; j < c->kvd; j++) {
                L->open_min[j] = bit == 0 || tmp[j] < L->open_min[j] ? tmp[j] : L->open_min[j];
                L->open_max[j] = bit == 0 || tmp[j] > L->open_max[j] ? tmp[j] : L->open_max[j];
            }
    }
    g->n_rows++;
    if (bit == C - 1) write_chunk_means(c, g);
}

/* Coefficients of the stacked key x (D, destroyed: centred) on group g's basis B (r, D). */
void lr_project(const lr_group *g, const float *B, int n, float *x, float *cf) {
    for (int i = 0; i < n; i++)
        for (int d = 0; d < g->D; d++) x[(size_t)i * g->D + d] = (x[(size_t)i * g->D + d] - g->mean[d]) * g->wdim[d];
    rk_linalg_matmul_nt(n, g->r, g->D, x, g->D, B, g->D, cf, g->r);
}

bool lr_working_copies(const rk_kv_codec *c, const lr_group *g, float **B, float **W) {
    *B = malloc((size_t)g->r * g->D * sizeof(float));
    *W = malloc((size_t)g->n_l * g->r * c->kvd * sizeof(float));
    if (!*B || !*W) return false;
    lr_mat_f32(c, g->basis, (size_t)g->D, 0, g->r, 0, g->D, *B);
    for (int li = 0; li < g->n_l; li++)
        lr_mat_f32(c, c->ly[g->l0 + li].W, (size_t)c->kvd, 0, lr_vr(c, g), 0, c->kvd, *W + (size_t)li * g->r * c->kvd);
    return true;
}

void lr_residuals(const rk_kv_codec *c, const lr_group *g, const float *W, int li, int n, const int64_t *pos,
                  const float *cq, float *v, float *vh, uint8_t *enc, size_t enc_stride, float *e2, size_t e2_stride) {
    const lr_layer *L = &c->ly[g->l0 + li];
    const int kvd = c->kvd;
    /* rows of W past the value rank are 0: only the first lr_vr coefficients contribute */
    rk_linalg_matmul(n, kvd, lr_vr(c, g), cq, g->r, W + (size_t)li * g->r * kvd, kvd, vh, kvd);
    for (int a = 0; a < n; a++) {
        float *va = v + (size_t)a * kvd;
        const float *ha = vh + (size_t)a * kvd;
        lr_plain_row(c, g->l0 + li, true, pos[a], va);
        for (int j = 0; j < kvd; j++) va[j] -= ha[j] + L->b[j];
        for (int h = 0; h < c->n_head_kv; h++) {
            float *d = va + (size_t)h * c->hd;
            double acc = 0;
            for (int j = 0; j < c->hd; j++) acc += (double)d[j] * d[j];
            e2[(size_t)a * e2_stride + h] = (float)acc;
            if (enc) lr_encode_row(c->p.resid_type, d, c->hd, enc + (size_t)a * enc_stride + (size_t)h * c->res_bytes);
        }
    }
}

/* ---- later blocks ---------------------------------------------------------------- */

typedef struct comp_job {
    rk_kv_codec *c;
    int64_t p0, p1;
} comp_job;

static void compress_group(rk_kv_codec *c, lr_group *g, int64_t p0, int64_t p1, lr_cwork *w) {
    const int nh = c->n_head_kv, n_lh = g->n_l * nh;
    const size_t enc_row = (size_t)n_lh * c->res_bytes;
    lr_mat_f32(c, g->basis, (size_t)g->D, 0, g->r, 0, g->D, w->B);
    for (int li = 0; li < g->n_l; li++)
        lr_mat_f32(c, c->ly[g->l0 + li].W, (size_t)c->kvd, 0, lr_vr(c, g), 0, c->kvd,
                   w->W + (size_t)li * g->r * c->kvd);
    for (int64_t b0 = p0; b0 < p1; b0 += LR_BLOCK) {
        const int nb = p1 - b0 < LR_BLOCK ? (int)(p1 - b0) : LR_BLOCK;
        int64_t pos[LR_BLOCK];
        for (int a = 0; a < nb; a++) {
            pos[a] = b0 + a;
            lr_stacked_key(c, g, b0 + a, w->x + (size_t)a * g->D);
        }
        lr_project(g, w->B, nb, w->x, w->cf);
        for (int a = 0; a < nb; a++)
            lr_encode_row(c->p.coef_type, w->cf + (size_t)a * g->r, g->r, w->crow + (size_t)a * g->coef_bytes);
        for (int li = 0; li < g->n_l; li++)
            lr_residuals(c, g, w->W, li, nb, pos, w->cf, w->v, w->vh, w->enc + (size_t)li * nh * c->res_bytes, enc_row,
                         w->e2 + (size_t)li * nh, (size_t)n_lh);
        for (int a = 0; a < nb; a++) {
            for (int q = 0; q < n_lh; q++) {
                const lr_head *H = &c->ly[g->l0 + q / nh].h[q % nh];
                w->res[q] =
                    w->e2[(size_t)a * n_lh + q] >= H->tau ? w->enc + a * enc_row + (size_t)q * c->res_bytes : NULL;
            }
            lr_append_row(c, g, b0 + a, w->crow + (size_t)a * g->coef_bytes, w->cf + (size_t)a * g->r, w->res, w->v);
        }
    }
    lr_append_close(c, g);
}

static void compress_worker(void *vp, int t, int nt) {
    comp_job *j = vp;
    for (int gi = t; gi < j->c->n_group; gi += nt) compress_group(j->c, &j->c->g[gi], j->p0, j->p1, &j->c->cw[t]);
}

rk_status lr_compress(rk_kv_codec *c, int64_t end, rk_err *err) {
    if (end <= c->comp_end) return RK_OK;
    double t0 = rk_time_now();
    if (!c->cw) return rk_err_set(err, RK_E_INTERNAL, "lowram: compression before the scratch exists");
    comp_job j = {c, c->comp_end, end};
    if (c->pool) rk_pool_run(c->pool, compress_worker, &j);
    else compress_worker(&j, 0, 1);
    c->comp_end = end;
    (void)lr_exact_compact(c, false); /* the sinks have their buffers already: only moves rows */
    c->stats.seconds_compress += rk_time_now() - t0;
    return RK_OK;
}

/* ---- truncation -------------------------------------------------------------------- */

void lr_truncate(rk_kv_codec *c, int64_t pos) {
    c->epoch++; /* cached rebuilt keys may hold dropped rows */
    const int64_t C = c->p.chunk;
    float *tmp = malloc((size_t)(c->kvd + c->r_max) * sizeof(float));
    float *Bl = malloc((size_t)c->r_max * c->kvd * sizeof(float));
    for (int gi = 0; gi < c->n_group; gi++) {
        lr_group *g = &c->g[gi];
        int64_t lo = 0, hi = g->n_rows; /* first stored row with pos >= pos */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (g->pos[mid] < pos) lo = mid + 1;
            else hi = mid;
        }
        if (lo == g->n_rows) continue;
        g->n_rows = lo;
        for (int li = 0; li < g->n_l; li++) {
            lr_layer *L = &c->ly[g->l0 + li];
            const int64_t ch = lo > 0 ? (lo - 1) / C : 0;
            const int nb = (int)(lo - ch * C);
            for (int h = 0; h < c->n_head_kv; h++) {
                lr_head *H = &L->h[h];
                if (lo == 0) {
                    H->n_res = 0;
                    continue;
                }
                if (nb < 32) H->mask[ch] &= (1u << nb) - 1u;
                H->n_res = H->base[ch] + __builtin_popcount(H->mask[ch]);
            }
            /* the last chunk is open again: its key sum from rebuilt keys (the plain rows
             * are gone) */
            memset(L->open_sum, 0, (size_t)c->kvd * sizeof(float));
            if (lo == 0 || nb == C || !tmp || !Bl) continue;
            float *cf = tmp + c->kvd;
            lr_mat_f32(c, g->basis, (size_t)g->D, 0, g->r, li * c->kvd, c->kvd, Bl);
            if (li == 0) memset(g->open_c, 0, (size_t)g->r * sizeof(float));
            for (int64_t i = ch * C; i < lo; i++) {
                const size_t off = (size_t)li * c->kvd;
                lr_coef_rows(c, g, i, 1, cf);
                if (li == 0)
                    for (int k = 0; k < g->r; k++) g->open_c[k] += cf[k];
                rk_linalg_matmul(1, c->kvd, g->r, cf, g->r, Bl, c->kvd, tmp, c->kvd);
                for (int j = 0; j < c->kvd; j++) tmp[j] = tmp[j] * g->winv[off + j] + g->mean[off + j];
                lr_rope_row(c, tmp, c->n_head_kv, g->pos[i], false);
                for (int j = 0; j < c->kvd; j++) L->open_sum[j] += tmp[j];
                for (int j = 0; L->lmin && j < c->kvd; j++) {
                    L->open_min[j] = i == ch * C || tmp[j] < L->open_min[j] ? tmp[j] : L->open_min[j];
                    L->open_max[j] = i == ch * C || tmp[j] > L->open_max[j] ? tmp[j] : L->open_max[j];
                    L->lmin[(size_t)ch * c->kvd + j] = rk_f32_to_f16(L->open_min[j]);
                    L->lmax[(size_t)ch * c->kvd + j] = rk_f32_to_f16(L->open_max[j]);
                }
            }
            for (int j = 0; j < c->kvd; j++)
                L->lmk[(size_t)ch * c->kvd + j] = rk_f32_to_f16(L->open_sum[j] / (float)nb);
            if (li == 0)
                for (int k = 0; c->cmean_on && k < g->r; k++)
                    g->cmean[(size_t)ch * g->r + k] = rk_f32_to_f16(g->open_c[k] / (float)nb);
        }
    }
    free(tmp), free(Bl);
    if (c->comp_end > pos) c->comp_end = pos > c->p.n_sink ? pos : c->p.n_sink;
}

/* ---- value-space chunk summaries ---------------------------------------------------
 * Sparse decode's summary of each chunk (its mean coefficients through the value
 * predictor, int8 per KV head), built lazily and extended as chunks are added. */

bool lr_vsum_update(rk_kv_codec *c, int l) {
    lr_layer *L = &c->ly[l];
    const lr_group *g = &c->g[L->grp];
    const int C = c->p.chunk, hd = c->hd, kvd = c->kvd, r = g->r;
    const int64_t n_ch = (g->n_rows + C - 1) / C;
    const int last = (int)(g->n_rows % C);
    const size_t vrow = (size_t)c->n_head_kv * (2u + (size_t)hd);
    if (!L->vsm) {
        L->vsm = malloc((size_t)c->cap_chunks * vrow);
        if (!L->vsm) return false;
        L->vs_n = 0, L->vs_last = 0, L->vs_epoch = c->epoch;
    }
    if (L->vs_epoch != c->epoch || L->vs_n > n_ch) L->vs_n = 0, L->vs_last = 0, L->vs_epoch = c->epoch;
    if (L->vs_n == n_ch && L->vs_last == last) return true;
    const int64_t from = L->vs_last ? L->vs_n - 1 : L->vs_n; /* a partial chunk may have grown */
    enum { NB = 32 };
    float *Wf = malloc(((size_t)r * kvd + (size_t)NB * r + (size_t)NB * kvd) * sizeof(float));
    if (!Wf) return false;
    float *cm = Wf + (size_t)r * kvd, *v = cm + (size_t)NB * r;
    const int rv = lr_vr(c, g);
    lr_mat_f32(c, L->W, (size_t)kvd, 0, rv, 0, kvd, Wf);
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    for (int64_t ch0 = from; ch0 < n_ch; ch0 += NB) {
        const int nb = n_ch - ch0 < NB ? (int)(n_ch - ch0) : NB;
        f16->to_f32(g->cmean + (size_t)ch0 * r, cm, (int64_t)nb * r);
        rk_linalg_matmul(nb, kvd, rv, cm, r, Wf, kvd, v, kvd);
        for (int k = 0; k < nb; k++)
            for (int h = 0; h < c->n_head_kv; h++)
                lr_encode_row(RK_DT_Q8_0, v + (size_t)k * kvd + (size_t)h * hd, hd,
                              L->vsm + (size_t)(ch0 + k) * vrow + (size_t)h * (2u + (size_t)hd));
    }
    free(Wf);
    L->vs_n = n_ch, L->vs_last = last;
    return true;
}

/* ---- coarse landmarks (two-level selection) -----------------------------------------
 * Group k of G chunks: Σ rows_i · lmk_i / Σ rows_i over its chunks (the f16 landmarks as
 * stored, so a state decodes the same whether the groups were built before or after an
 * export), int8 with an f16 scale per KV head: the coarse score only chooses which chunks
 * are scored. Groups whose chunks are all full never change until a truncation (epoch). */
bool lr_coarse_update(rk_kv_codec *c, int l) {
    lr_layer *L = &c->ly[l];
    const lr_group *g = &c->g[L->grp];
    const int C = c->p.chunk, G = c->p.coarse, kvd = c->kvd, hd = c->hd;
    const int64_t n_ch = (g->n_rows + C - 1) / C, n_cg = (n_ch + G - 1) / G, n_final = g->n_rows / ((int64_t)C * G);
    const size_t crow = (size_t)c->n_head_kv * (2u + (size_t)hd);
    enum { NJ = 1024 }; /* stack buffers: no allocation per decode step */
    if (hd > NJ) return false;
    if (!L->clmk) {
        L->clmk = malloc(((size_t)(c->cap_chunks / G) + 1) * crow);
        if (!L->clmk) return false;
        L->cl_n = 0, L->cl_epoch = c->epoch;
    }
    if (L->cl_epoch != c->epoch || L->cl_n > n_final) L->cl_n = 0, L->cl_epoch = c->epoch;
    if (L->cl_n == n_cg) return true;
    float s[NJ], t[NJ];
    const rk_quant_fns *f16 = rk_quant_fast(RK_DT_F16);
    for (int64_t k = L->cl_n; k < n_cg; k++)
        for (int h = 0; h < c->n_head_kv; h++) {
            memset(s, 0, (size_t)hd * sizeof(float));
            int64_t rows = 0;
            for (int64_t ch = k * G; ch < (k + 1) * G && ch < n_ch; ch++) {
                const int64_t nb = g->n_rows - ch * C < C ? g->n_rows - ch * C : C;
                f16->to_f32(L->lmk + (size_t)ch * kvd + (size_t)h * hd, t, hd);
                for (int j = 0; j < hd; j++) s[j] += (float)nb * t[j];
                rows += nb;
            }
            const float inv = 1.0f / (float)rows;
            for (int j = 0; j < hd; j++) s[j] *= inv;
            lr_encode_row(RK_DT_Q8_0, s, hd, L->clmk + (size_t)k * crow + (size_t)h * (2u + (size_t)hd));
        }
    L->cl_n = n_final; /* a partial last group is rebuilt next time */
    return true;
}
