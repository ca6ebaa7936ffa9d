/* The textbook llama / qwen2 / qwen3 forward pass in double precision (see tb.h): an
 * oracle for tiny models that shares no code with the runtime or the kernels. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gguf.h"
#include "tb.h"

static double f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return rk_f16_to_f32(h);
}

bool tb_dequant_row(uint32_t type, const void *src, double *y, int64_t n) {
    const uint8_t *b = src;
    switch (type) {
    case RK_DT_F32:
        for (int64_t i = 0; i < n; i++) {
            float f;
            memcpy(&f, b + 4 * i, 4);
            y[i] = f;
        }
        return true;
    case RK_DT_F16:
        for (int64_t i = 0; i < n; i++) y[i] = f16(b + 2 * i);
        return true;
    case RK_DT_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + 2 * i, 2);
            y[i] = rk_bf16_to_f32(h);
        }
        return true;
    case RK_DT_Q8_0: /* f16 d, 32 x int8 */
        for (int64_t k = 0; k < n / 32; k++, b += 34)
            for (int j = 0; j < 32; j++) y[32 * k + j] = (float)((double)(int8_t)b[2 + j] * f16(b));
        return n % 32 == 0;
    case RK_DT_Q4_0: /* f16 d, 16 bytes: low nibbles elements 0..15, high nibbles 16..31, offset 8 */
        for (int64_t k = 0; k < n / 32; k++, b += 18)
            for (int j = 0; j < 16; j++) {
                y[32 * k + j] = (float)(((b[2 + j] & 15) - 8) * f16(b));
                y[32 * k + 16 + j] = (float)(((b[2 + j] >> 4) - 8) * f16(b));
            }
        return n % 32 == 0;
    case RK_DT_Q4_1: /* f16 d, f16 m, 16 nibble bytes: x = q d + m */
        for (int64_t k = 0; k < n / 32; k++, b += 20)
            for (int j = 0; j < 16; j++) {
                y[32 * k + j] = (float)((float)((b[4 + j] & 15) * f16(b)) + (float)f16(b + 2));
                y[32 * k + 16 + j] = (float)((float)((b[4 + j] >> 4) * f16(b)) + (float)f16(b + 2));
            }
        return n % 32 == 0;
    default: return false;
    }
}

typedef struct ref_layer {
    double *an, *wq, *wk, *wv, *wo, *bq, *bk, *bv, *qn, *kn, *fn, *wg, *wu, *wd;
} ref_layer;

typedef struct ref {
    const rk_gguf *g;
    int arch; /* 0 llama, 1 qwen2, 2 qwen3 */
    int64_t L, d, nh, nkv, hd, ff, nv, nrot;
    double base, eps;
    double *inv_freq, mscale; /* (nrot/2) per-pair angle per position, RoPE scaling included */
    double *tok, *onorm, *out;
    ref_layer *l;
    char *why;
    size_t why_cap;
    bool bad;
} ref;

static void fail(ref *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void fail(ref *r, const char *fmt, ...) {
    if (r->bad) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why, r->why_cap, fmt, ap);
    va_end(ap);
    r->bad = true;
}

/* rows x cols doubles of tensor `name` (NULL when absent and optional). */
static double *load(ref *r, const char *name, int64_t cols, int64_t rows, bool required) {
    const rk_gguf_tensor *t = rk_gguf_find_tensor(r->g, name);
    if (!t) {
        if (required) fail(r, "tb_ref: tensor %s missing", name);
        return NULL;
    }
    if (t->ne[0] != cols || (t->n_dims > 1 ? t->ne[1] : 1) != rows) {
        fail(r, "tb_ref: tensor %s is [%lld, %lld], expected [%lld, %lld]", name, (long long)t->ne[0],
             (long long)t->ne[1], (long long)cols, (long long)rows);
        return NULL;
    }
    uint64_t rb;
    double *m = malloc((size_t)(cols * rows) * sizeof *m);
    if (!m || !rk_dtype_row_bytes(t->type, (uint64_t)cols, &rb)) {
        free(m);
        fail(r, "tb_ref: tensor %s: no memory or bad type %u", name, t->type);
        return NULL;
    }
    for (int64_t i = 0; i < rows; i++)
        if (!tb_dequant_row(t->type, (const uint8_t *)t->data + (size_t)i * rb, m + i * cols, cols)) {
            free(m);
            fail(r, "tb_ref: tensor %s: type %s not handled", name, rk_dtype_name(t->type));
            return NULL;
        }
    return m;
}

static int64_t key_u(ref *r, const char *arch, const char *suffix, int64_t dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint64_t v;
    if (rk_gguf_get_u64(r->g, key, &v, NULL) == RK_OK) return (int64_t)v;
    if (dflt < 0) fail(r, "tb_ref: key %s missing", key);
    return dflt;
}

static double key_f(ref *r, const char *arch, const char *suffix, double dflt) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    float v;
    return rk_gguf_get_f32(r->g, key, &v, NULL) == RK_OK ? v : dflt;
}

/* inv_freq and mscale from the GGUF's rope keys, written from the YaRN paper as Hugging
 * Face's _compute_yarn_parameters states it (plain: base^(-2i/n); linear: divided by the
 * factor; yarn: interpolation 1/(factor base^(2i/n)) and extrapolation 1/base^(2i/n)
 * blended by 1 - ramp over the correction range of beta 32..1 rotations, attention
 * factor 0.1 ln(factor) + 1). */
static void rope_setup(ref *r, const char *an) {
    const int64_t half = r->nrot / 2;
    r->inv_freq = calloc((size_t)(half > 0 ? half : 1), sizeof(double));
    r->mscale = 1.0;
    if (!r->inv_freq) {
        fail(r, "tb_ref: out of memory");
        return;
    }
    char key[128];
    rk_str t = {0};
    snprintf(key, sizeof key, "%s.rope.scaling.type", an);
    const bool has = rk_gguf_get_str(r->g, key, &t, NULL) == RK_OK;
    const bool linear = has && t.len == 6 && !memcmp(t.ptr, "linear", 6);
    const bool yarn = has && t.len == 4 && !memcmp(t.ptr, "yarn", 4);
    const double factor = (linear || yarn) ? key_f(r, an, "rope.scaling.factor", 1.0) : 1.0;
    const double orig =
        (double)key_u(r, an, "rope.scaling.original_context_length", key_u(r, an, "context_length", 2048));
    const double dim = (double)r->nrot;
    double lo = 0, hi = 0;
    if (yarn) {
        lo = floor(dim * log(orig / (32.0 * 2 * M_PI)) / (2 * log(r->base)));
        hi = ceil(dim * log(orig / (1.0 * 2 * M_PI)) / (2 * log(r->base)));
        if (lo < 0) lo = 0;
        if (hi > dim - 1) hi = dim - 1;
        if (lo == hi) hi += 0.001;
        r->mscale = 0.1 * log(factor) + 1.0;
    }
    for (int64_t i = 0; i < half; i++) {
        const double pf = pow(r->base, 2.0 * (double)i / dim);
        if (yarn) {
            double ramp = ((double)i - lo) / (hi - lo);
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            const double extra = 1.0 - ramp;
            r->inv_freq[i] = (1.0 / (factor * pf)) * (1.0 - extra) + (1.0 / pf) * extra;
        } else {
            r->inv_freq[i] = 1.0 / (factor * pf);
        }
    }
}

static void ref_free(ref *r) {
    free(r->tok), free(r->onorm), free(r->out), free(r->inv_freq);
    for (int64_t i = 0; r->l && i < r->L; i++) {
        ref_layer *y = &r->l[i];
        free(y->an), free(y->wq), free(y->wk), free(y->wv), free(y->wo), free(y->bq), free(y->bk);
        free(y->bv), free(y->qn), free(y->kn), free(y->fn), free(y->wg), free(y->wu), free(y->wd);
    }
    free(r->l);
}

static void ref_open(ref *r) {
    rk_str a;
    if (rk_gguf_get_str(r->g, "general.architecture", &a, NULL) != RK_OK) {
        fail(r, "tb_ref: no architecture");
        return;
    }
    const char *names[] = {"llama", "qwen2", "qwen3"};
    r->arch = -1;
    for (int i = 0; i < 3; i++)
        if (rk_str_eq(a, names[i])) r->arch = i;
    if (r->arch < 0) {
        fail(r, "tb_ref: architecture %.*s", (int)a.len, a.ptr);
        return;
    }
    const char *an = names[r->arch];
    r->d = key_u(r, an, "embedding_length", -1);
    r->L = key_u(r, an, "block_count", -1);
    r->ff = key_u(r, an, "feed_forward_length", -1);
    r->nh = key_u(r, an, "attention.head_count", -1);
    if (r->bad || r->nh <= 0 || r->L <= 0 || r->d <= 0) {
        fail(r, "tb_ref: bad shapes");
        return;
    }
    r->nkv = key_u(r, an, "attention.head_count_kv", r->nh);
    r->hd = key_u(r, an, "attention.key_length", r->d / r->nh);
    r->nrot = key_u(r, an, "rope.dimension_count", r->hd);
    r->base = key_f(r, an, "rope.freq_base", 10000.0);
    r->eps = key_f(r, an, "attention.layer_norm_rms_epsilon", 1e-5);
    rope_setup(r, an);
    const rk_gguf_tensor *te = rk_gguf_find_tensor(r->g, "token_embd.weight");
    if (!te) {
        fail(r, "tb_ref: no token_embd.weight");
        return;
    }
    r->nv = te->ne[1];
    const int64_t d = r->d, qd = r->nh * r->hd, kvd = r->nkv * r->hd;
    r->tok = load(r, "token_embd.weight", d, r->nv, true);
    r->onorm = load(r, "output_norm.weight", d, 1, true);
    r->out = load(r, "output.weight", d, r->nv, false);
    r->l = calloc((size_t)r->L, sizeof *r->l);
    if (!r->l) {
        fail(r, "tb_ref: no memory");
        return;
    }
    for (int64_t i = 0; i < r->L && !r->bad; i++) {
        ref_layer *y = &r->l[i];
        char nm[96];
#define LD(field, suffix, cols, rows, req)                            \
    do {                                                              \
        snprintf(nm, sizeof nm, "blk.%lld.%s", (long long)i, suffix); \
        y->field = load(r, nm, cols, rows, req);                      \
    } while (0)
        LD(an, "attn_norm.weight", d, 1, true);
        LD(wq, "attn_q.weight", d, qd, true);
        LD(wk, "attn_k.weight", d, kvd, true);
        LD(wv, "attn_v.weight", d, kvd, true);
        LD(wo, "attn_output.weight", qd, d, true);
        LD(bq, "attn_q.bias", qd, 1, false);
        LD(bk, "attn_k.bias", kvd, 1, false);
        LD(bv, "attn_v.bias", kvd, 1, false);
        LD(qn, "attn_q_norm.weight", r->hd, 1, r->arch == 2);
        LD(kn, "attn_k_norm.weight", r->hd, 1, r->arch == 2);
        LD(fn, "ffn_norm.weight", d, 1, true);
        LD(wg, "ffn_gate.weight", d, r->ff, true);
        LD(wu, "ffn_up.weight", d, r->ff, true);
        LD(wd, "ffn_down.weight", r->ff, d, true);
#undef LD
    }
}

/* y (rows) = W (rows, cols) x (cols) + b */
static void mv(const double *w, const double *b, const double *x, int64_t cols, int64_t rows, double *y) {
    for (int64_t i = 0; i < rows; i++) {
        double s = b ? b[i] : 0.0;
        for (int64_t j = 0; j < cols; j++) s += w[i * cols + j] * x[j];
        y[i] = s;
    }
}

static void rmsnorm(const double *x, const double *w, int64_t n, double eps, double *y) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double s = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) y[i] = x[i] * s * (w ? w[i] : 1.0);
}

/* One head of hd values at position pos: llama rotates pairs (2i, 2i+1), qwen pairs
 * (i, i + n_rot/2); angle pos * inv_freq[i], magnitude mscale. */
static void rope(const ref *r, double *x, int64_t pos) {
    const int64_t half = r->nrot / 2;
    for (int64_t i = 0; i < half; i++) {
        const double th = (double)pos * r->inv_freq[i];
        const int64_t i0 = r->arch == 0 ? 2 * i : i, i1 = r->arch == 0 ? 2 * i + 1 : i + half;
        const double a = x[i0], b = x[i1], c = cos(th) * r->mscale, s = sin(th) * r->mscale;
        x[i0] = a * c - b * s;
        x[i1] = a * s + b * c;
    }
}

float *tb_ref_logits(const char *path, const int32_t *ids, size_t n, int32_t *n_vocab, char *why, size_t why_cap) {
    size_t len;
    void *bytes = tb_read_file(path, &len);
    rk_gguf *g = NULL;
    rk_err e = {0};
    ref r = {.why = why, .why_cap = why_cap};
    float *logits = NULL;
    double *x = NULL, *h = NULL, *q = NULL, *k = NULL, *v = NULL, *att = NULL, *t = NULL, *gt = NULL, *up = NULL,
           *sc = NULL;
    if (!bytes) {
        fail(&r, "tb_ref: cannot read %s", path);
        goto done;
    }
    if (rk_gguf_parse(bytes, len, &g, &e) != RK_OK) {
        fail(&r, "tb_ref: %s", e.msg);
        goto done;
    }
    r.g = g;
    ref_open(&r);
    if (r.bad) goto done;
    const int64_t d = r.d, hd = r.hd, qd = r.nh * hd, kvd = r.nkv * hd, N = (int64_t)n, grp = r.nh / r.nkv;
    const int64_t wide = qd > d ? qd : d;
    x = malloc((size_t)(N * d) * sizeof *x); /* (n, d) residual stream */
    h = malloc((size_t)wide * sizeof *h);
    q = malloc((size_t)(N * qd) * sizeof *q);  /* (n, qd) */
    k = malloc((size_t)(N * kvd) * sizeof *k); /* (n, kvd): this layer's keys */
    v = malloc((size_t)(N * kvd) * sizeof *v);
    att = malloc((size_t)(N * qd) * sizeof *att);
    t = malloc((size_t)wide * sizeof *t);
    gt = malloc((size_t)r.ff * sizeof *gt);
    up = malloc((size_t)r.ff * sizeof *up);
    sc = malloc((size_t)N * sizeof *sc);
    logits = malloc((size_t)(N * r.nv) * sizeof *logits);
    if (!x || !h || !q || !k || !v || !att || !t || !gt || !up || !sc || !logits) {
        fail(&r, "tb_ref: no memory");
        goto done;
    }
    for (int64_t i = 0; i < N; i++) {
        if (ids[i] < 0 || ids[i] >= r.nv) {
            fail(&r, "tb_ref: id %d out of range", ids[i]);
            goto done;
        }
        memcpy(x + i * d, r.tok + (int64_t)ids[i] * d, (size_t)d * sizeof *x);
    }
    for (int64_t l = 0; l < r.L; l++) {
        const ref_layer *y = &r.l[l];
        for (int64_t i = 0; i < N; i++) {
            rmsnorm(x + i * d, y->an, d, r.eps, h);
            mv(y->wq, y->bq, h, d, qd, q + i * qd);
            mv(y->wk, y->bk, h, d, kvd, k + i * kvd);
            mv(y->wv, y->bv, h, d, kvd, v + i * kvd);
            for (int64_t hh = 0; hh < r.nh; hh++) {
                if (y->qn) rmsnorm(q + i * qd + hh * hd, y->qn, hd, r.eps, q + i * qd + hh * hd);
                rope(&r, q + i * qd + hh * hd, i);
            }
            for (int64_t hh = 0; hh < r.nkv; hh++) {
                if (y->kn) rmsnorm(k + i * kvd + hh * hd, y->kn, hd, r.eps, k + i * kvd + hh * hd);
                rope(&r, k + i * kvd + hh * hd, i);
            }
        }
        /* causal softmax attention; query head hh reads KV head hh / (n_head / n_head_kv) */
        for (int64_t i = 0; i < N; i++)
            for (int64_t hh = 0; hh < r.nh; hh++) {
                const double *qi = q + i * qd + hh * hd;
                const int64_t kh = hh / grp;
                double mx = -INFINITY, z = 0;
                for (int64_t j = 0; j <= i; j++) {
                    double s = 0;
                    for (int64_t c = 0; c < hd; c++) s += qi[c] * k[j * kvd + kh * hd + c];
                    sc[j] = s / sqrt((double)hd);
                    mx = fmax(mx, sc[j]);
                }
                for (int64_t j = 0; j <= i; j++) z += (sc[j] = exp(sc[j] - mx));
                double *o = att + i * qd + hh * hd;
                for (int64_t c = 0; c < hd; c++) o[c] = 0;
                for (int64_t j = 0; j <= i; j++)
                    for (int64_t c = 0; c < hd; c++) o[c] += sc[j] / z * v[j * kvd + kh * hd + c];
            }
        for (int64_t i = 0; i < N; i++) {
            double *xi = x + i * d;
            mv(y->wo, NULL, att + i * qd, qd, d, t);
            for (int64_t c = 0; c < d; c++) xi[c] += t[c];
            rmsnorm(xi, y->fn, d, r.eps, h);
            mv(y->wg, NULL, h, d, r.ff, gt);
            mv(y->wu, NULL, h, d, r.ff, up);
            for (int64_t c = 0; c < r.ff; c++) gt[c] = gt[c] / (1.0 + exp(-gt[c])) * up[c];
            mv(y->wd, NULL, gt, r.ff, d, t);
            for (int64_t c = 0; c < d; c++) xi[c] += t[c];
        }
    }
    double *row = malloc((size_t)r.nv * sizeof *row);
    if (!row) {
        fail(&r, "tb_ref: no memory");
        goto done;
    }
    for (int64_t i = 0; i < N; i++) {
        rmsnorm(x + i * d, r.onorm, d, r.eps, h);
        mv(r.out ? r.out : r.tok, NULL, h, d, r.nv, row);
        for (int64_t c = 0; c < r.nv; c++) logits[i * r.nv + c] = (float)row[c];
    }
    free(row);
    *n_vocab = (int32_t)r.nv;
done:
    free(x), free(h), free(q), free(k), free(v), free(att), free(t), free(gt), free(up), free(sc);
    ref_free(&r);
    rk_gguf_destroy(g);
    free(bytes);
    if (r.bad) {
        free(logits);
        return NULL;
    }
    return logits;
}
