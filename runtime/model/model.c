/* Binds a GGUF file to the llama / qwen2 / qwen3 architectures. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

typedef struct arch_desc {
    const char *name;
    rk_arch arch;
    int rope_mode;
    bool qkv_bias;
    bool qk_norm;
} arch_desc;

static const arch_desc arches[] = {
    {"llama", RK_ARCH_LLAMA, RK_ROPE_NORM, false, false},
    {"qwen2", RK_ARCH_QWEN2, RK_ROPE_NEOX, true, false},
    {"qwen3", RK_ARCH_QWEN3, RK_ROPE_NEOX, false, true},
};

static rk_status get_u32_key(const rk_gguf *g, const char *arch, const char *suffix, bool required, uint32_t dflt,
                             int32_t *out, rk_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    uint32_t v;
    rk_status st = rk_gguf_get_u32(g, key, &v, err);
    if (st == RK_E_NOT_FOUND && !required) {
        v = dflt;
    } else if (st != RK_OK) {
        return st == RK_E_NOT_FOUND ? rk_err_set(err, st, "model: required key '%s' is missing", key) : st;
    }
    if (v > INT32_MAX) return rk_err_set(err, RK_E_GGUF_TYPE, "model: key '%s' = %u is out of range", key, v);
    *out = (int32_t)v;
    return RK_OK;
}

static rk_status get_f32_key(const rk_gguf *g, const char *arch, const char *suffix, float dflt, float *out,
                             rk_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    rk_status st = rk_gguf_get_f32(g, key, out, err);
    if (st == RK_E_NOT_FOUND) {
        *out = dflt;
        return RK_OK;
    }
    return st;
}

/* Binds tensor `name` with the expected (ne0, ne1) (ne1 = 1 for vectors). Absent
 * optional tensors leave v->data NULL. */
static rk_status bind(rk_model *m, const char *name, int64_t ne0, int64_t ne1, bool required, bool vector_f32,
                      rk_view *v, rk_err *err) {
    const rk_gguf_tensor *t = rk_gguf_find_tensor(m->gguf, name);
    memset(v, 0, sizeof *v);
    if (!t) {
        if (!required) return RK_OK;
        return rk_err_set(err, RK_E_NOT_FOUND, "model: tensor '%s' is missing (architecture %s)", name,
                          m->hp.arch_name);
    }
    int64_t got1 = t->n_dims >= 2 ? t->ne[1] : 1;
    if (t->ne[0] != ne0 || got1 != ne1 || t->ne[2] != 1 || t->ne[3] != 1)
        return rk_err_set(err, RK_E_MISMATCH,
                          "model: tensor '%s' has shape [%lld, %lld, %lld, %lld] (expected [%lld, %lld])", name,
                          (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2], (long long)t->ne[3],
                          (long long)ne0, (long long)ne1);
    if (vector_f32 && t->type != RK_DT_F32)
        return rk_err_set(err, RK_E_UNSUPPORTED, "model: tensor '%s' has type %s (expected f32)", name,
                          rk_dtype_name(t->type));
    const rk_dtype_traits *tr = rk_dtype_get(t->type);
    if (!tr || !tr->weight_ok || !rk_quant_ref(t->type))
        return rk_err_set(err, RK_E_UNSUPPORTED, "model: tensor '%s' has unsupported type %s", name,
                          rk_dtype_name(t->type));
    uint64_t row_bytes;
    if (!rk_dtype_row_bytes(t->type, (uint64_t)ne0, &row_bytes))
        return rk_err_set(err, RK_E_GGUF_BLOCK, "model: tensor '%s' row of %lld not a multiple of %s blocks", name,
                          (long long)ne0, tr->name);
    /* vectors (norms, biases) are small enough to check at every load; the matrices are not scanned */
    rk_status st;
    if (vector_f32 && (st = rk_tensor_check_finite(t, "model", err))) return st;
    v->type = t->type;
    v->ne[0] = ne0;
    v->ne[1] = ne1;
    v->ne[2] = v->ne[3] = 1;
    v->nb1 = (size_t)row_bytes;
    v->data = (void *)t->data; /* weights are PROT_READ: ops never write src views */
    m->weight_bytes += t->n_bytes;
    return RK_OK;
}

static rk_status read_hparams(rk_model *m, rk_err *err) {
    rk_str arch;
    rk_status st = rk_gguf_get_str(m->gguf, "general.architecture", &arch, err);
    if (st != RK_OK)
        return rk_err_set(err, RK_E_NOT_FOUND, "model: key 'general.architecture' is missing or not a string");
    const arch_desc *ad = NULL;
    for (size_t i = 0; i < sizeof arches / sizeof arches[0]; i++)
        if (rk_str_eq(arch, arches[i].name)) ad = &arches[i];
    if (!ad)
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "model: unsupported architecture '%.*s' (supported: llama, qwen2, qwen3)",
                          (int)(arch.len > 64 ? 64 : arch.len), arch.ptr);
    rk_hparams *hp = &m->hp;
    hp->arch = ad->arch;
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", ad->name);
    hp->rope_mode = ad->rope_mode;
    hp->has_qkv_bias = ad->qkv_bias;
    hp->has_qk_norm = ad->qk_norm;
    const char *a = ad->name;
    if ((st = get_u32_key(m->gguf, a, "embedding_length", true, 0, &hp->n_embd, err)) ||
        (st = get_u32_key(m->gguf, a, "block_count", true, 0, &hp->n_layer, err)) ||
        (st = get_u32_key(m->gguf, a, "feed_forward_length", true, 0, &hp->n_ff, err)) ||
        (st = get_u32_key(m->gguf, a, "attention.head_count", true, 0, &hp->n_head, err)) ||
        (st = get_u32_key(m->gguf, a, "context_length", false, 2048, &hp->n_ctx_train, err)))
        return st;
    if ((st = get_u32_key(m->gguf, a, "attention.head_count_kv", false, (uint32_t)hp->n_head, &hp->n_head_kv, err)))
        return st;
    if (hp->n_embd <= 0 || hp->n_layer <= 0 || hp->n_ff <= 0 || hp->n_head <= 0 || hp->n_head_kv <= 0 ||
        hp->n_head % hp->n_head_kv != 0 || hp->n_layer > 4096)
        return rk_err_set(err, RK_E_MISMATCH,
                          "model: inconsistent shapes (n_embd %d, n_layer %d, n_ff %d, n_head %d, n_head_kv %d)",
                          hp->n_embd, hp->n_layer, hp->n_ff, hp->n_head, hp->n_head_kv);
    if ((st = get_u32_key(m->gguf, a, "attention.key_length", false, (uint32_t)(hp->n_embd / hp->n_head), &hp->head_dim,
                          err)))
        return st;
    int32_t v_len;
    if ((st = get_u32_key(m->gguf, a, "attention.value_length", false, (uint32_t)hp->head_dim, &v_len, err))) return st;
    if (v_len != hp->head_dim || hp->head_dim <= 0 || hp->head_dim % 2)
        return rk_err_set(err, RK_E_UNSUPPORTED, "model: head dims key %d / value %d not supported", hp->head_dim,
                          v_len);
    if ((st = get_u32_key(m->gguf, a, "rope.dimension_count", false, (uint32_t)hp->head_dim, &hp->n_rot, err)))
        return st;
    if (hp->n_rot <= 0 || hp->n_rot > hp->head_dim || hp->n_rot % 2)
        return rk_err_set(err, RK_E_UNSUPPORTED, "model: rope.dimension_count %d invalid for head_dim %d", hp->n_rot,
                          hp->head_dim);
    if ((st = get_f32_key(m->gguf, a, "rope.freq_base", 10000.0f, &hp->rope_base, err)) ||
        (st = get_f32_key(m->gguf, a, "attention.layer_norm_rms_epsilon", 1e-5f, &hp->rms_eps, err)))
        return st;
    if (!(hp->rope_base > 0.0f) || !(hp->rms_eps > 0.0f))
        return rk_err_set(err, RK_E_MISMATCH, "model: rope.freq_base %g / rms epsilon %g must be positive",
                          (double)hp->rope_base, (double)hp->rms_eps);
    return RK_OK;
}

static rk_status bind_all(rk_model *m, rk_err *err) {
    rk_hparams *hp = &m->hp;
    const rk_gguf_tensor *te = rk_gguf_find_tensor(m->gguf, "token_embd.weight");
    if (!te) return rk_err_set(err, RK_E_NOT_FOUND, "model: tensor 'token_embd.weight' is missing");
    if (te->ne[1] <= 0 || te->ne[1] > INT32_MAX)
        return rk_err_set(err, RK_E_GGUF_DIM, "model: token_embd.weight has a bad vocab dimension");
    hp->n_vocab = (int32_t)te->ne[1];
    int64_t d = hp->n_embd, qd = (int64_t)hp->n_head * hp->head_dim;
    int64_t kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    rk_status st;
    if ((st = bind(m, "token_embd.weight", d, hp->n_vocab, true, false, &m->tok_embd, err)) ||
        (st = bind(m, "output_norm.weight", d, 1, true, true, &m->output_norm, err)) ||
        (st = bind(m, "output.weight", d, hp->n_vocab, false, false, &m->output, err)))
        return st;
    hp->tied_output = m->output.data == NULL;
    if (hp->tied_output) m->output = m->tok_embd;
    m->layers = calloc((size_t)hp->n_layer, sizeof *m->layers);
    if (!m->layers) return rk_err_set(err, RK_E_NOMEM, "model: out of memory for %d layers", hp->n_layer);
    for (int l = 0; l < hp->n_layer; l++) {
        rk_layer *L = &m->layers[l];
        char nm[96];
#define B(field, suffix, ne0, ne1, req, vec)                                   \
    do {                                                                       \
        snprintf(nm, sizeof nm, "blk.%d.%s", l, suffix);                       \
        if ((st = bind(m, nm, ne0, ne1, req, vec, &L->field, err))) return st; \
    } while (0)
        B(attn_norm, "attn_norm.weight", d, 1, true, true);
        B(wq, "attn_q.weight", d, qd, true, false);
        B(wk, "attn_k.weight", d, kvd, true, false);
        B(wv, "attn_v.weight", d, kvd, true, false);
        B(wo, "attn_output.weight", qd, d, true, false);
        B(bq, "attn_q.bias", qd, 1, hp->has_qkv_bias, true);
        B(bk, "attn_k.bias", kvd, 1, hp->has_qkv_bias, true);
        B(bv, "attn_v.bias", kvd, 1, hp->has_qkv_bias, true);
        B(q_norm, "attn_q_norm.weight", hp->head_dim, 1, hp->has_qk_norm, true);
        B(k_norm, "attn_k_norm.weight", hp->head_dim, 1, hp->has_qk_norm, true);
        B(ffn_norm, "ffn_norm.weight", d, 1, true, true);
        B(w_gate, "ffn_gate.weight", d, hp->n_ff, true, false);
        B(w_up, "ffn_up.weight", d, hp->n_ff, true, false);
        B(w_down, "ffn_down.weight", hp->n_ff, d, true, false);
#undef B
    }
    return RK_OK;
}

rk_model_params rk_model_params_default(void) { return (rk_model_params){.huge_pages = true}; }

rk_status rk_model_load(const char *path, rk_model **out, rk_err *err) {
    return rk_model_load_with(path, NULL, out, err);
}

rk_status rk_model_load_with(const char *path, const rk_model_params *p, rk_model **out, rk_err *err) {
    const rk_model_params mp = p ? *p : rk_model_params_default();
    rk_model *m = calloc(1, sizeof *m);
    if (!m) return rk_err_set(err, RK_E_NOMEM, "model: out of memory");
    /* weights on huge pages: decode streams them with fewer TLB misses */
    rk_status st = mp.huge_pages ? rk_mapping_open_huge(path, &m->map, err) : rk_mapping_open(path, &m->map, err);
    if (st) goto fail;
    if ((st = rk_gguf_parse(m->map.data, m->map.len, &m->gguf, err))) goto fail;
    if ((st = read_hparams(m, err))) goto fail;
    if ((st = rk_model_read_rope_scaling(m, err))) goto fail;
    if ((st = bind_all(m, err))) goto fail;
    if ((st = rk_tokenizer_create(m->gguf, &m->tok, err))) goto fail;
    if ((st = rk_model_read_chat_rules(m, err))) goto fail;
    if (rk_tokenizer_n_vocab(m->tok) > m->hp.n_vocab) {
        st = rk_err_set(err, RK_E_MISMATCH, "model: tokenizer has %d tokens but token_embd has %d rows",
                        (int)rk_tokenizer_n_vocab(m->tok), m->hp.n_vocab);
        goto fail;
    }
    rk_str name;
    if (rk_gguf_get_str(m->gguf, "general.name", &name, NULL) == RK_OK && name.len > 0) {
        snprintf(m->name, sizeof m->name, "%.*s", (int)(name.len > 127 ? 127 : name.len), name.ptr);
    } else {
        const char *base = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", base ? base + 1 : path);
    }
    *out = m;
    return RK_OK;
fail:
    rk_err_wrap(err, "%s", path);
    rk_model_destroy(m);
    return st;
}

void rk_model_destroy(rk_model *m) {
    if (!m) return;
    rk_tokenizer_destroy(m->tok);
    free(m->chat_default_system);
    free(m->layers);
    rk_gguf_destroy(m->gguf);
    rk_mapping_close(&m->map);
    free(m);
}

const rk_hparams *rk_model_hparams(const rk_model *m) { return &m->hp; }
uint64_t rk_model_weight_bytes(const rk_model *m) { return m->weight_bytes; }
const char *rk_model_name(const rk_model *m) { return m->name; }
const struct rk_gguf *rk_model_gguf(const rk_model *m) { return m->gguf; }

rk_status rk_model_tokenize(const rk_model *m, const char *text, size_t len, bool add_special, bool parse_special,
                            int32_t **ids, size_t *n_ids, rk_err *err) {
    return rk_tokenizer_encode(m->tok, text, len, add_special, parse_special, ids, n_ids, err);
}

size_t rk_model_token_piece(const rk_model *m, int32_t id, bool render_special, char *buf, size_t cap) {
    return rk_tokenizer_piece(m->tok, id, render_special, buf, cap);
}

bool rk_model_token_is_eog(const rk_model *m, int32_t id) { return rk_tokenizer_is_eog(m->tok, id); }
int32_t rk_model_token_bos(const rk_model *m) { return rk_tokenizer_bos(m->tok); }
bool rk_model_add_bos(const rk_model *m) { return rk_tokenizer_add_bos(m->tok); }
