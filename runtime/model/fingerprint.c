/* Model fingerprint: what a ridge-map or predictor file records about the model it
 * was fitted on, so that loading it on another model is refused by name. Computed,
 * written and checked here only. */
#include <stdio.h>
#include <string.h>

#include "model_impl.h"
#include "rk_ext.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void rk_model_fingerprint(const rk_model *m, rk_fingerprint *fp) {
    const rk_hparams *hp = &m->hp;
    memset(fp, 0, sizeof *fp);
    memcpy(fp->arch, hp->arch_name, sizeof fp->arch);
    fp->n_layer = hp->n_layer;
    fp->n_embd = hp->n_embd;
    fp->n_head = hp->n_head;
    fp->n_head_kv = hp->n_head_kv;
    fp->head_dim = hp->head_dim;
    fp->n_ff = hp->n_ff;
    fp->n_vocab = hp->n_vocab;
    fp->tokenizer_hash = rk_tokenizer_hash(m->tok);
    /* Norm weights stay f32 under every llama.cpp quantisation: they identify the
     * weights independently of how the matrices were quantised. */
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, m->output_norm.data, (size_t)hp->n_embd * sizeof(float));
    for (int l = 0; l < hp->n_layer; l++) {
        h = fnv1a(h, m->layers[l].attn_norm.data, (size_t)hp->n_embd * sizeof(float));
        h = fnv1a(h, m->layers[l].ffn_norm.data, (size_t)hp->n_embd * sizeof(float));
    }
    fp->weights_hash = h;
    /* The raw bytes of the first and last layers' K projections: changes with quantisation. */
    uint64_t q = 0xcbf29ce484222325ull;
    const rk_view *k0 = &m->layers[0].wk, *kl = &m->layers[hp->n_layer - 1].wk;
    q = fnv1a(q, &k0->type, sizeof k0->type);
    q = fnv1a(q, k0->data, k0->nb1 * (size_t)k0->ne[1]);
    q = fnv1a(q, kl->data, kl->nb1 * (size_t)kl->ne[1]);
    fp->quant_hash = q;
}

/* ---- the keys "<prefix>.*" in map and predictor files --------------------------- */

rk_status rk_fingerprint_write(rk_gguf_writer *w, const char *prefix, const rk_model *m, rk_err *err) {
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    char k[128];
    rk_status st;
#define KEY(s) (snprintf(k, sizeof k, "%s.%s", prefix, s), k)
    if ((st = rk_gguf_writer_set_str(w, KEY("arch"), fp.arch, err)) ||
        (st = rk_gguf_writer_set_str(w, KEY("model_name"), rk_model_name(m), err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("n_layer"), (uint32_t)fp.n_layer, err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("n_embd"), (uint32_t)fp.n_embd, err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("n_head"), (uint32_t)fp.n_head, err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("n_head_kv"), (uint32_t)fp.n_head_kv, err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("head_dim"), (uint32_t)fp.head_dim, err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("n_ff"), (uint32_t)fp.n_ff, err)) ||
        (st = rk_gguf_writer_set_u32(w, KEY("n_vocab"), (uint32_t)fp.n_vocab, err)) ||
        (st = rk_gguf_writer_set_u64(w, KEY("tokenizer_hash"), fp.tokenizer_hash, err)) ||
        (st = rk_gguf_writer_set_u64(w, KEY("weights_hash"), fp.weights_hash, err)) ||
        (st = rk_gguf_writer_set_u64(w, KEY("quant_hash"), fp.quant_hash, err)))
        return st;
#undef KEY
    return RK_OK;
}

rk_status rk_fingerprint_check(const rk_gguf *g, const char *prefix, const rk_model *m, const char *what, char *warning,
                               size_t cap, rk_err *err) {
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    char key[128];
    rk_str arch;
    snprintf(key, sizeof key, "%s.arch", prefix);
    if (rk_gguf_get_str(g, key, &arch, err))
        return rk_err_set(err, RK_E_MISMATCH, "%s: no model fingerprint (key '%s')", what, key);
    struct {
        const char *k;
        int64_t want;
    } dims[] = {{"n_layer", fp.n_layer},   {"n_embd", fp.n_embd}, {"n_head", fp.n_head},  {"n_head_kv", fp.n_head_kv},
                {"head_dim", fp.head_dim}, {"n_ff", fp.n_ff},     {"n_vocab", fp.n_vocab}};
    char name[128] = "";
    rk_str nm;
    snprintf(key, sizeof key, "%s.model_name", prefix);
    if (rk_gguf_get_str(g, key, &nm, NULL) == RK_OK)
        snprintf(name, sizeof name, "%.*s", (int)(nm.len > 100 ? 100 : nm.len), nm.ptr);
    if (!rk_str_eq(arch, fp.arch))
        return rk_err_set(err, RK_E_MISMATCH, "%s: fitted on '%s' (%.*s) but the model is '%s' (%s)", what, name,
                          (int)(arch.len > 15 ? 15 : arch.len), arch.ptr, rk_model_name(m), fp.arch);
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        int64_t v;
        snprintf(key, sizeof key, "%s.%s", prefix, dims[i].k);
        rk_status st = rk_gguf_get_i64(g, key, &v, err);
        if (st) return rk_err_set(err, RK_E_MISMATCH, "%s: fingerprint key '%s' missing or bad", what, key);
        if (v != dims[i].want)
            return rk_err_set(err, RK_E_MISMATCH, "%s: fitted on '%s' with %s %lld but the model '%s' has %lld", what,
                              name, dims[i].k, (long long)v, rk_model_name(m), (long long)dims[i].want);
    }
    uint64_t tok, wh, qh;
    snprintf(key, sizeof key, "%s.tokenizer_hash", prefix);
    if (rk_gguf_get_u64(g, key, &tok, err)) return rk_err_set(err, RK_E_MISMATCH, "%s: '%s' missing", what, key);
    snprintf(key, sizeof key, "%s.weights_hash", prefix);
    if (rk_gguf_get_u64(g, key, &wh, err)) return rk_err_set(err, RK_E_MISMATCH, "%s: '%s' missing", what, key);
    snprintf(key, sizeof key, "%s.quant_hash", prefix);
    if (rk_gguf_get_u64(g, key, &qh, err)) return rk_err_set(err, RK_E_MISMATCH, "%s: '%s' missing", what, key);
    if (tok != fp.tokenizer_hash)
        return rk_err_set(err, RK_E_MISMATCH, "%s: fitted on '%s' whose tokenizer differs from '%s'", what, name,
                          rk_model_name(m));
    if (wh != fp.weights_hash)
        return rk_err_set(err, RK_E_MISMATCH,
                          "%s: fitted on '%s', whose weights differ from '%s' (same shapes, other model)", what, name,
                          rk_model_name(m));
    if (warning && cap) {
        warning[0] = '\0';
        if (qh != fp.quant_hash)
            snprintf(warning, cap,
                     "%s: fitted on another quantisation of these weights ('%s'); expect slightly larger error", what,
                     name);
    }
    return RK_OK;
}
