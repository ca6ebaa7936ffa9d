/* rk_synth: random-weight GGUF files of real model shapes (see rk_synth.h).
 * Each tensor's bytes come from its own splitmix64 stream (seed mixed with a
 * hash of the tensor name), so a file is reproducible from (params, seed) and
 * one tensor does not depend on the order the others were made in. Quantised
 * tensors are made block by block: random codes with scales chosen so the
 * dequantised values have mean ~0 and the target standard deviation (no f32
 * matrix is built and quantised, which keeps a 1.5B-parameter file to seconds). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gguf.h"
#include "rk_io.h"
#include "rk_synth.h"

/* Published configurations (config.json of each model). */
static const rk_synth_shape shapes[] = {
    {"smollm2-135m", "llama", 576, 30, 9, 3, 64, 1536, 49152, 8192, 100000.0f, 1e-5f},
    {"qwen2.5-1.5b", "qwen2", 1536, 28, 12, 2, 128, 8960, 151936, 32768, 1000000.0f, 1e-6f},
    {"qwen3-0.6b", "qwen3", 1024, 28, 16, 8, 128, 3072, 151936, 40960, 1000000.0f, 1e-6f},
    {"llama-3.2-1b", "llama", 2048, 16, 32, 8, 64, 8192, 128256, 131072, 500000.0f, 1e-5f},
    {NULL, NULL, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
};

const rk_synth_shape *rk_synth_shapes(void) { return shapes; }
const char *rk_synth_shape_names(void) { return "smollm2-135m, qwen2.5-1.5b, qwen3-0.6b, llama-3.2-1b"; }
const char *rk_synth_type_names(void) { return "f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q6_k, q4_k_m"; }

static const struct {
    const char *name;
    uint32_t type;
} type_names[] = {
    {"f32", RK_DT_F32},   {"f16", RK_DT_F16},   {"bf16", RK_DT_BF16}, {"q8_0", RK_DT_Q8_0},   {"q4_0", RK_DT_Q4_0},
    {"q4_1", RK_DT_Q4_1}, {"q4_k", RK_DT_Q4_K}, {"q6_k", RK_DT_Q6_K}, {"q4_k_m", RK_DT_Q4_K},
};

/* llama.cpp's use_more_bits: the first and last eighth of the layers and every third in between. */
static bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

bool rk_synth_tensor_type(const char *type, const char *tensor, int layer, int n_layer, int64_t ne0, uint32_t *out) {
    int k = -1;
    for (size_t i = 0; i < sizeof type_names / sizeof type_names[0]; i++)
        if (type && !strcmp(type, type_names[i].name)) k = (int)i;
    if (k < 0) return false;
    uint32_t t = type_names[k].type;
    if (!strcmp(type, "q4_k_m")) {
        bool six = !strcmp(tensor, "token_embd.weight") || !strcmp(tensor, "output.weight") ||
                   ((strstr(tensor, "attn_v.weight") || strstr(tensor, "ffn_down.weight")) && layer >= 0 &&
                    more_bits(layer, n_layer));
        t = six ? RK_DT_Q6_K : RK_DT_Q4_K;
    }
    if ((t == RK_DT_Q4_K || t == RK_DT_Q6_K) && ne0 % 256) t = t == RK_DT_Q4_K ? RK_DT_Q4_1 : RK_DT_Q8_0;
    *out = t;
    return true;
}

/* ---- random blocks ---------------------------------------------------------- */
static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static double unif(uint64_t *s) { return (double)(rk_splitmix64(s) >> 11) * (1.0 / 9007199254740992.0); }

static float normal(uint64_t *s) {
    double u = unif(s), v = unif(s);
    return (float)(sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v));
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void rand_bytes(uint8_t *p, size_t n, uint64_t *s) {
    while (n) {
        uint64_t r = rk_splitmix64(s);
        size_t k = n < 8 ? n : 8;
        memcpy(p, &r, k);
        p += k;
        n -= k;
    }
}

/* Standard deviations of the dequantised codes per unit scale. */
#define SD_U4 4.6098    /* uniform 0..15 */
#define SD_U4_15 4.3205 /* uniform -7..7 */
#define SD_U6 18.473    /* uniform 0..63 */
#define SD_I8 73.9      /* uniform -128..127 */

/* n elements (whole blocks) of type with mean ~0 and standard deviation sd. */
static void fill(uint32_t type, uint8_t *p, int64_t n, float sd, float mean, uint64_t *s) {
    switch (type) {
    case RK_DT_F32:
        for (int64_t i = 0; i < n; i++) {
            float v = mean + sd * normal(s);
            memcpy(p + 4 * i, &v, 4);
        }
        break;
    case RK_DT_F16:
        for (int64_t i = 0; i < n; i++) put16(p + 2 * i, rk_f32_to_f16(mean + sd * normal(s)));
        break;
    case RK_DT_BF16:
        for (int64_t i = 0; i < n; i++) put16(p + 2 * i, rk_f32_to_bf16(mean + sd * normal(s)));
        break;
    case RK_DT_Q8_0: /* d, 32 int8 */
        for (int64_t b = 0; b < n / 32; b++, p += 34) {
            put16(p, rk_f32_to_f16(sd / (float)SD_I8));
            rand_bytes(p + 2, 32, s);
        }
        break;
    case RK_DT_Q4_0: /* d, 16 bytes of nibbles: (q - 8) d with q in 1..15, symmetric about 0 */
        for (int64_t b = 0; b < n / 32; b++, p += 18) {
            put16(p, rk_f32_to_f16(sd / (float)SD_U4_15));
            for (int j = 0; j < 16; j++) {
                uint64_t r = rk_splitmix64(s);
                p[2 + j] = (uint8_t)((1 + r % 15) | ((1 + (r >> 32) % 15) << 4));
            }
        }
        break;
    case RK_DT_Q4_1: { /* d, m, nibbles: q d + m, m = -7.5 d centres them */
        uint16_t d = rk_f32_to_f16(sd / (float)SD_U4);
        uint16_t m = rk_f32_to_f16(-7.5f * rk_f16_to_f32(d));
        for (int64_t b = 0; b < n / 32; b++, p += 20) {
            put16(p, d);
            put16(p + 2, m);
            rand_bytes(p + 4, 16, s);
        }
        break;
    }
    case RK_DT_Q4_K: { /* d, dmin = d, 6-bit sc in 4..8 and m = round(7.5 sc): d sc q - d m has mean ~0 */
        uint16_t d = rk_f32_to_f16(sd / (float)(SD_U4 * 6.0));
        for (int64_t b = 0; b < n / 256; b++, p += 144) {
            put16(p, d);
            put16(p + 2, d);
            uint8_t sc[8], m[8], *q = p + 4;
            for (int j = 0; j < 8; j++) {
                sc[j] = (uint8_t)(4 + rk_splitmix64(s) % 5);
                m[j] = (uint8_t)lrintf(7.5f * sc[j]);
            }
            for (int j = 0; j < 4; j++) {
                q[j] = (uint8_t)(sc[j] | ((sc[j + 4] >> 4) << 6));
                q[j + 4] = (uint8_t)(m[j] | ((m[j + 4] >> 4) << 6));
                q[j + 8] = (uint8_t)((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
            }
            rand_bytes(p + 16, 128, s);
        }
        break;
    }
    case RK_DT_Q6_K: { /* ql[128] qh[64] int8 scales[16] d: d sc (q - 32) */
        uint16_t d = rk_f32_to_f16(sd / (float)(SD_U6 * 16.0));
        for (int64_t b = 0; b < n / 256; b++, p += 210) {
            rand_bytes(p, 192, s);
            for (int j = 0; j < 16; j++) p[192 + j] = (uint8_t)(int8_t)(8 + rk_splitmix64(s) % 17);
            put16(p + 208, d);
        }
        break;
    }
    default: break;
    }
}

/* ---- the tokenizer ------------------------------------------------------------ */
/* <unk> <s> </s>, the 256 byte tokens, then pieces: "▁", digits, punctuation,
 * then words a, b, .., z, aa, .. each with and without the "▁" word prefix. */
static rk_status add_vocab(rk_gguf_writer *w, int64_t n, rk_err *err) {
    char **tok = calloc((size_t)n, sizeof *tok);
    float *score = calloc((size_t)n, sizeof *score);
    int32_t *type = calloc((size_t)n, sizeof *type);
    rk_status st = RK_OK;
    if (!tok || !score || !type) {
        st = rk_err_set(err, RK_E_NOMEM, "synth: vocabulary of %lld tokens", (long long)n);
        goto out;
    }
    const char *fixed[] = {"<unk>", "<s>", "</s>"};
    const int32_t fixed_type[] = {2, 3, 3};
    const char *punct = "\xe2\x96\x81"
                        "0123456789.,!?'\"-:;()";
    int64_t i = 0, word = 0;
    char buf[32];
    for (; i < n; i++) {
        if (i < 3) {
            snprintf(buf, sizeof buf, "%s", fixed[i]);
            type[i] = fixed_type[i];
        } else if (i < 259) {
            snprintf(buf, sizeof buf, "<0x%02X>", (unsigned)(i - 3));
            type[i] = 6;
        } else if (i == 259) {
            snprintf(buf, sizeof buf, "\xe2\x96\x81");
            type[i] = 1;
        } else if (i < 259 + (int64_t)strlen(punct) - 2) {
            snprintf(buf, sizeof buf, "%c", punct[3 + (i - 260)]);
            type[i] = 1;
        } else { /* word k (bijective base 26), odd slots with the word prefix */
            int64_t k = word / 2;
            char wd[16];
            int len = 0;
            for (int64_t x = k + 1; x > 0 && len < 15; x = (x - 1) / 26) wd[len++] = (char)('a' + (x - 1) % 26);
            wd[len] = 0;
            for (int a = 0, b = len - 1; a < b; a++, b--) {
                char c = wd[a];
                wd[a] = wd[b];
                wd[b] = c;
            }
            snprintf(buf, sizeof buf, "%s%s", word % 2 ? "\xe2\x96\x81" : "", wd);
            type[i] = 1;
            word++;
        }
        score[i] = i < 259 ? 0.0f : -(float)(i - 259);
        if (!(tok[i] = strdup(buf))) {
            st = rk_err_set(err, RK_E_NOMEM, "synth: vocabulary of %lld tokens", (long long)n);
            goto out;
        }
    }
    if ((st = rk_gguf_writer_set_str(w, "tokenizer.ggml.model", "llama", err)) ||
        (st = rk_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)tok, (uint64_t)n, err)) ||
        (st = rk_gguf_writer_set_arr(w, "tokenizer.ggml.scores", RK_GGUF_F32, score, (uint64_t)n, err)) ||
        (st = rk_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", RK_GGUF_I32, type, (uint64_t)n, err)) ||
        (st = rk_gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1, err)) ||
        (st = rk_gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2, err)) ||
        (st = rk_gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0, err)) ||
        (st = rk_gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true, err)))
        goto out;
out:
    if (tok)
        for (int64_t j = 0; j < n; j++) free(tok[j]);
    free(tok);
    free(score);
    free(type);
    return st;
}

/* ---- tensors ------------------------------------------------------------------ */
typedef struct gen {
    rk_gguf_writer *w;
    const rk_synth_params *p;
    int n_layer;
    rk_err *err;
} gen;

/* One tensor [ne0, ne1] (ne1 = 0: a vector) of the file type (vectors: f32),
 * values mean + sd * noise. */
static rk_status tensor(gen *g, const char *name, int layer, int64_t ne0, int64_t ne1, float sd, float mean) {
    uint32_t type = RK_DT_F32;
    if (ne1 && !rk_synth_tensor_type(g->p->type, name, layer, g->n_layer, ne0, &type))
        return rk_err_set(g->err, RK_E_INVALID_ARG, "synth: unknown type \"%s\" (%s)", g->p->type,
                          rk_synth_type_names());
    uint64_t rb = 0;
    if (!rk_dtype_row_bytes(type, (uint64_t)ne0, &rb))
        return rk_err_set(g->err, RK_E_INTERNAL, "synth: %s: row of %lld is not whole %s blocks", name, (long long)ne0,
                          rk_dtype_name(type));
    size_t bytes = (size_t)rb * (size_t)(ne1 ? ne1 : 1);
    uint8_t *buf = malloc(bytes ? bytes : 1);
    if (!buf) return rk_err_set(g->err, RK_E_NOMEM, "synth: %s: %zu bytes", name, bytes);
    uint64_t s = g->p->seed ^ name_hash(name);
    rk_splitmix64(&s);
    fill(type, buf, ne0 * (ne1 ? ne1 : 1), sd, mean, &s);
    int64_t ne[2] = {ne0, ne1};
    rk_status st = rk_gguf_writer_add_tensor(g->w, name, type, ne1 ? 2 : 1, ne, buf, bytes, g->err);
    free(buf);
    return st;
}

static rk_status build_tensors(gen *g, const rk_synth_shape *sh, int64_t n_vocab) {
    const int64_t d = sh->n_embd, qd = (int64_t)sh->n_head * sh->head_dim, kvd = (int64_t)sh->n_head_kv * sh->head_dim;
    const bool qwen2 = !strcmp(sh->arch, "qwen2"), qwen3 = !strcmp(sh->arch, "qwen3");
    rk_status st;
    /* tied output: logits = norm(x) . embd rows, std ~ 3 for unit-rms inputs */
    if ((st = tensor(g, "token_embd.weight", -1, d, n_vocab, 3.0f / sqrtf((float)d), 0.0f)) ||
        (st = tensor(g, "output_norm.weight", -1, d, 0, 0.05f, 1.0f)))
        return st;
    for (int l = 0; l < g->n_layer; l++) {
        char nm[96];
#define T(suffix, ne0, ne1, sd, mean)                               \
    do {                                                            \
        snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);            \
        if ((st = tensor(g, nm, l, ne0, ne1, sd, mean))) return st; \
    } while (0)
        T("attn_norm.weight", d, 0, 0.05f, 1.0f);
        T("attn_q.weight", d, qd, 1.0f / sqrtf((float)d), 0.0f);
        T("attn_k.weight", d, kvd, 1.0f / sqrtf((float)d), 0.0f);
        T("attn_v.weight", d, kvd, 1.0f / sqrtf((float)d), 0.0f);
        T("attn_output.weight", qd, d, 1.0f / sqrtf((float)qd), 0.0f);
        if (qwen2) {
            T("attn_q.bias", qd, 0, 0.1f, 0.0f);
            T("attn_k.bias", kvd, 0, 0.1f, 0.0f);
            T("attn_v.bias", kvd, 0, 0.1f, 0.0f);
        }
        if (qwen3) {
            T("attn_q_norm.weight", sh->head_dim, 0, 0.05f, 1.0f);
            T("attn_k_norm.weight", sh->head_dim, 0, 0.05f, 1.0f);
        }
        T("ffn_norm.weight", d, 0, 0.05f, 1.0f);
        T("ffn_gate.weight", d, sh->n_ff, 1.0f / sqrtf((float)d), 0.0f);
        T("ffn_up.weight", d, sh->n_ff, 1.0f / sqrtf((float)d), 0.0f);
        T("ffn_down.weight", sh->n_ff, d, 1.0f / sqrtf((float)sh->n_ff), 0.0f);
#undef T
    }
    return RK_OK;
}

static rk_status meta(rk_gguf_writer *w, const rk_synth_shape *sh, const rk_synth_params *p, int n_layer, rk_err *err) {
    char key[96], name[160];
    const char *a = sh->arch;
    rk_status st;
    snprintf(name, sizeof name, "synthetic %s %s seed %llu", sh->name, p->type, (unsigned long long)p->seed);
#define U32(k, v)                                                                 \
    do {                                                                          \
        snprintf(key, sizeof key, "%s.%s", a, k);                                 \
        if ((st = rk_gguf_writer_set_u32(w, key, (uint32_t)(v), err))) return st; \
    } while (0)
#define F32(k, v)                                                     \
    do {                                                              \
        snprintf(key, sizeof key, "%s.%s", a, k);                     \
        if ((st = rk_gguf_writer_set_f32(w, key, v, err))) return st; \
    } while (0)
    if ((st = rk_gguf_writer_set_str(w, "general.architecture", a, err)) ||
        (st = rk_gguf_writer_set_str(w, "general.name", name, err)) ||
        (st = rk_gguf_writer_set_str(w, "general.type", "model", err)) ||
        (st = rk_gguf_writer_set_str(w, "ridgekv.synth.shape", sh->name, err)) ||
        (st = rk_gguf_writer_set_str(w, "ridgekv.synth.type", p->type, err)) ||
        (st = rk_gguf_writer_set_u64(w, "ridgekv.synth.seed", p->seed, err)))
        return st;
    U32("context_length", sh->n_ctx);
    U32("embedding_length", sh->n_embd);
    U32("block_count", n_layer);
    U32("feed_forward_length", sh->n_ff);
    U32("attention.head_count", sh->n_head);
    U32("attention.head_count_kv", sh->n_head_kv);
    U32("attention.key_length", sh->head_dim);
    U32("attention.value_length", sh->head_dim);
    U32("rope.dimension_count", sh->head_dim);
    F32("rope.freq_base", sh->rope_base);
    F32("attention.layer_norm_rms_epsilon", sh->rms_eps);
#undef U32
#undef F32
    return RK_OK;
}

rk_status rk_synth_build(const rk_synth_params *p, void **bytes, size_t *len, rk_err *err) {
    if (!p || !bytes || !len) return rk_err_set(err, RK_E_INVALID_ARG, "synth: NULL argument");
    const rk_synth_shape *sh = NULL;
    for (const rk_synth_shape *s = shapes; s->name; s++)
        if (p->shape && !strcmp(p->shape, s->name)) sh = s;
    if (!sh)
        return rk_err_set(err, RK_E_INVALID_ARG, "synth: unknown shape \"%s\" (%s)", p->shape ? p->shape : "(none)",
                          rk_synth_shape_names());
    uint32_t t;
    if (!rk_synth_tensor_type(p->type, "x", 0, 1, 256, &t))
        return rk_err_set(err, RK_E_INVALID_ARG, "synth: unknown type \"%s\" (%s)", p->type ? p->type : "(none)",
                          rk_synth_type_names());
    int64_t n_vocab = p->n_vocab ? p->n_vocab : sh->n_vocab;
    if (n_vocab < RK_SYNTH_MIN_VOCAB || n_vocab > (int64_t)1 << 24)
        return rk_err_set(err, RK_E_INVALID_ARG, "synth: vocab %lld out of range (%d .. %d)", (long long)n_vocab,
                          RK_SYNTH_MIN_VOCAB, 1 << 24);
    int n_layer = p->n_layer ? p->n_layer : sh->n_layer;
    if (n_layer < 1 || n_layer > sh->n_layer)
        return rk_err_set(err, RK_E_INVALID_ARG, "synth: layers %d out of range (1 .. %d for %s)", n_layer, sh->n_layer,
                          sh->name);
    rk_gguf_writer *w = NULL;
    rk_status st = rk_gguf_writer_create(32, &w, err);
    if (st) return st;
    gen g = {w, p, n_layer, err};
    if (!(st = meta(w, sh, p, n_layer, err)) && !(st = add_vocab(w, n_vocab, err)) &&
        !(st = build_tensors(&g, sh, n_vocab)))
        st = rk_gguf_writer_finish(w, bytes, len, err);
    rk_gguf_writer_destroy(w);
    return st;
}

rk_status rk_synth_write(const rk_synth_params *p, const char *path, rk_err *err) {
    if (!path || !*path) return rk_err_set(err, RK_E_INVALID_ARG, "synth: no output path");
    void *bytes = NULL;
    size_t len = 0;
    rk_status st = rk_synth_build(p, &bytes, &len, err);
    if (st) return st;
    st = rk_io_write_file_atomic(path, bytes, len, err);
    free(bytes);
    return st;
}
