/* rk_model_load on tiny models with one thing wrong (a tensor or key missing, a wrong
 * shape, type or value): a specific status, a message naming the culprit and the file,
 * no model, no leak (ASan), no crash. The files are generated tiny models (tests/tb)
 * rewritten key by key and tensor by tensor with the formats writer. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_gguf.h"
#include "tb.h"

typedef enum set_kind { SET_NONE, SET_U32, SET_F32, SET_STR } set_kind;

typedef struct mutation {
    const char *what;
    tb_arch arch;
    const char *drop_key;    /* left out */
    const char *drop_tensor; /* left out */
    const char *to_f16;      /* an F32 tensor stored as F16 */
    const char *shrink;      /* a 2-D tensor with one row less */
    set_kind set;            /* a key replaced (or added) with this type and value */
    const char *set_key;
    uint32_t u32;
    float f32;
    const char *str;
    rk_status want;
    const char *want_msg; /* substring of the message */
} mutation;

static const mutation k_cases[] = {
    {"missing layer tensor", TB_ARCH_LLAMA, .drop_tensor = "blk.1.ffn_down.weight", .want = RK_E_NOT_FOUND,
     .want_msg = "blk.1.ffn_down.weight"},
    {"missing output norm", TB_ARCH_LLAMA, .drop_tensor = "output_norm.weight", .want = RK_E_NOT_FOUND,
     .want_msg = "output_norm.weight"},
    {"missing embeddings", TB_ARCH_QWEN3, .drop_tensor = "token_embd.weight", .want = RK_E_NOT_FOUND,
     .want_msg = "token_embd.weight"},
    {"qwen2 without a QKV bias", TB_ARCH_QWEN2, .drop_tensor = "blk.0.attn_k.bias", .want = RK_E_NOT_FOUND,
     .want_msg = "blk.0.attn_k.bias"},
    {"qwen3 without a q norm", TB_ARCH_QWEN3, .drop_tensor = "blk.1.attn_q_norm.weight", .want = RK_E_NOT_FOUND,
     .want_msg = "attn_q_norm"},
    {"f16 norm weight", TB_ARCH_LLAMA, .to_f16 = "blk.0.attn_norm.weight", .want = RK_E_UNSUPPORTED,
     .want_msg = "expected f32"},
    {"f16 bias", TB_ARCH_QWEN2, .to_f16 = "blk.1.attn_v.bias", .want = RK_E_UNSUPPORTED, .want_msg = "attn_v.bias"},
    {"q projection one row short", TB_ARCH_LLAMA, .shrink = "blk.0.attn_q.weight", .want = RK_E_MISMATCH,
     .want_msg = "attn_q.weight"},
    {"ffn_up one row short", TB_ARCH_QWEN3, .shrink = "blk.1.ffn_up.weight", .want = RK_E_MISMATCH,
     .want_msg = "ffn_up.weight"},
    {"fewer embedding rows than tokens", TB_ARCH_LLAMA, .shrink = "token_embd.weight", .want = RK_E_MISMATCH,
     .want_msg = "tokenizer has"},
    {"unknown architecture", TB_ARCH_LLAMA, .set = SET_STR, .set_key = "general.architecture", .str = "mamba",
     .want = RK_E_UNSUPPORTED, .want_msg = "'mamba'"},
    {"no architecture", TB_ARCH_LLAMA, .drop_key = "general.architecture", .want = RK_E_NOT_FOUND,
     .want_msg = "general.architecture"},
    {"missing embedding_length", TB_ARCH_LLAMA, .drop_key = "llama.embedding_length", .want = RK_E_NOT_FOUND,
     .want_msg = "llama.embedding_length"},
    {"embedding_length as a string", TB_ARCH_QWEN2, .set = SET_STR, .set_key = "qwen2.embedding_length", .str = "64",
     .want = RK_E_GGUF_TYPE, .want_msg = "qwen2.embedding_length"},
    {"n_head not a multiple of n_head_kv", TB_ARCH_LLAMA, .set = SET_U32, .set_key = "llama.attention.head_count_kv",
     .u32 = 3, .want = RK_E_MISMATCH, .want_msg = "n_head_kv 3"},
    {"zero heads", TB_ARCH_LLAMA, .set = SET_U32, .set_key = "llama.attention.head_count", .u32 = 0,
     .want = RK_E_MISMATCH, .want_msg = "n_head 0"},
    {"zero layers", TB_ARCH_QWEN3, .set = SET_U32, .set_key = "qwen3.block_count", .u32 = 0, .want = RK_E_MISMATCH,
     .want_msg = "n_layer 0"},
    {"more layers than tensors", TB_ARCH_LLAMA, .set = SET_U32, .set_key = "llama.block_count", .u32 = 3,
     .want = RK_E_NOT_FOUND, .want_msg = "blk.2."},
    {"value length != key length", TB_ARCH_LLAMA, .set = SET_U32, .set_key = "llama.attention.value_length", .u32 = 8,
     .want = RK_E_UNSUPPORTED, .want_msg = "value 8"},
    {"odd rope dimension", TB_ARCH_QWEN2, .set = SET_U32, .set_key = "qwen2.rope.dimension_count", .u32 = 7,
     .want = RK_E_UNSUPPORTED, .want_msg = "rope.dimension_count 7"},
    {"rope dimension past head_dim", TB_ARCH_LLAMA, .set = SET_U32, .set_key = "llama.rope.dimension_count", .u32 = 18,
     .want = RK_E_UNSUPPORTED, .want_msg = "rope.dimension_count 18"},
    {"zero rope base", TB_ARCH_LLAMA, .set = SET_F32, .set_key = "llama.rope.freq_base", .f32 = 0.0f,
     .want = RK_E_MISMATCH, .want_msg = "freq_base"},
    {"negative rms epsilon", TB_ARCH_QWEN3, .set = SET_F32, .set_key = "qwen3.attention.layer_norm_rms_epsilon",
     .f32 = -1e-6f, .want = RK_E_MISMATCH, .want_msg = "epsilon"},
    {"no tokenizer model", TB_ARCH_LLAMA, .drop_key = "tokenizer.ggml.model", .want = RK_E_NOT_FOUND,
     .want_msg = "tokenizer.ggml.model"},
    {"unknown tokenizer model", TB_ARCH_LLAMA, .set = SET_STR, .set_key = "tokenizer.ggml.model", .str = "bert",
     .want = RK_E_UNSUPPORTED, .want_msg = "bert"},
    {"gpt2 vocab without merges", TB_ARCH_QWEN2, .drop_key = "tokenizer.ggml.merges", .want = RK_E_NOT_FOUND,
     .want_msg = "merges"},
    {"no tokens", TB_ARCH_LLAMA, .drop_key = "tokenizer.ggml.tokens", .want = RK_E_NOT_FOUND,
     .want_msg = "tokenizer.ggml.tokens"},
};

static bool is(rk_str s, const char *c) { return c && rk_str_eq(s, c); }

/* The tiny model of m->arch with the mutation applied, written to a fresh temp file. */
static void write_mutated(const mutation *m, char *path, size_t cap) {
    char why[256];
    size_t len;
    tb_tiny_spec spec = {.arch = m->arch, .seed = 31};
    void *bytes = tb_tiny_gguf(&spec, &len, why, sizeof why);
    cr_assert(bytes, "%s", why);
    rk_err e = {0};
    rk_gguf *g = NULL;
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_parse(bytes, len, &g, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_gguf_writer_create(rk_gguf_alignment(g), &w, &e), RK_OK, "%s", e.msg);
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++) {
        const rk_gguf_kv *kv = rk_gguf_kv_at(g, i);
        if (is(kv->key, m->drop_key) || is(kv->key, m->set_key)) continue;
        cr_assert_eq(rk_gguf_writer_set_kv(w, kv, &e), RK_OK, "%s", e.msg);
    }
    rk_status st = RK_OK;
    if (m->set == SET_U32) st = rk_gguf_writer_set_u32(w, m->set_key, m->u32, &e);
    if (m->set == SET_F32) st = rk_gguf_writer_set_f32(w, m->set_key, m->f32, &e);
    if (m->set == SET_STR) st = rk_gguf_writer_set_str(w, m->set_key, m->str, &e);
    cr_assert_eq(st, RK_OK, "%s", e.msg);
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        if (is(t->name, m->drop_tensor)) continue;
        int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        uint32_t type = t->type;
        uint64_t n_bytes = t->n_bytes;
        void *data = NULL;
        const void *src = t->data;
        if (is(t->name, m->to_f16)) {
            cr_assert_eq(t->type, RK_DT_F32, "%s", name);
            const int64_t n = ne[0] * ne[1] * ne[2] * ne[3];
            uint16_t *h = malloc((size_t)n * 2);
            for (int64_t k = 0; k < n; k++) {
                float f;
                memcpy(&f, (const char *)t->data + 4 * k, 4);
                h[k] = rk_f32_to_f16(f);
            }
            data = h;
            src = h;
            type = RK_DT_F16;
            n_bytes = (uint64_t)n * 2;
        } else if (is(t->name, m->shrink)) {
            cr_assert(t->n_dims == 2 && ne[1] > 1, "%s", name);
            n_bytes -= n_bytes / (uint64_t)ne[1];
            ne[1]--;
        }
        cr_assert_eq(rk_gguf_writer_add_tensor(w, name, type, t->n_dims, ne, src, n_bytes, &e), RK_OK, "%s: %s", name,
                     e.msg);
        free(data);
    }
    void *out;
    size_t out_len;
    cr_assert_eq(rk_gguf_writer_finish(w, &out, &out_len, &e), RK_OK, "%s", e.msg);
    rk_gguf_writer_destroy(w);
    rk_gguf_destroy(g);
    free(bytes);
    cr_assert(tb_tmp_path(path, cap, "rk-tiny-broken", ".gguf"), "%s", path);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(out, 1, out_len, f) == out_len, "%s", path);
    fclose(f);
    free(out);
}

Test(tiny_broken, every_mutation_is_refused_with_its_reason) {
    for (size_t i = 0; i < sizeof k_cases / sizeof k_cases[0]; i++) {
        const mutation *m = &k_cases[i];
        char path[512];
        write_mutated(m, path, sizeof path);
        rk_model *model = NULL;
        rk_err e = {0};
        rk_status st = rk_model_load(path, &model, &e);
        cr_expect_eq(st, m->want, "%s: %s instead of %s: %s", m->what, rk_status_name(st), rk_status_name(m->want),
                     e.msg);
        cr_expect(strstr(e.msg, m->want_msg), "%s: message lacks '%s': %s", m->what, m->want_msg, e.msg);
        cr_expect(strstr(e.msg, path), "%s: message does not name the file: %s", m->what, e.msg);
        cr_expect_null(model, "%s: out-param written on failure", m->what);
        if (st == RK_OK) rk_model_destroy(model);
        unlink(path);
    }
}

/* The rewrite itself is faithful: with no mutation the model loads and gives the same
 * logits as the original file. */
Test(tiny_broken, unmutated_rewrite_loads) {
    const mutation none = {"none", TB_ARCH_QWEN2, .want = RK_OK};
    char path[512], orig[512];
    write_mutated(&none, path, sizeof path);
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2, .seed = 31};
    cr_assert(tb_tiny_model(&spec, orig, sizeof orig), "%s", orig);
    rk_model *a = NULL, *b = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(path, &a, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_model_load(orig, &b, &e), RK_OK, "%s", e.msg);
    const int32_t ids[5] = {3, 1, 4, 1, 5};
    const int32_t nv = rk_model_hparams(a)->n_vocab;
    float *la = malloc((size_t)nv * sizeof *la), *lb = malloc((size_t)nv * sizeof *lb);
    rk_session_params p = rk_session_params_default();
    p.backend = RK_BACKEND_CPU_REF;
    rk_session *sa = NULL, *sb = NULL;
    cr_assert_eq(rk_session_create(a, &p, &sa, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_create(b, &p, &sb, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(sa, ids, 5, la, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(sb, ids, 5, lb, false, &e), RK_OK, "%s", e.msg);
    cr_expect(memcmp(la, lb, (size_t)nv * sizeof *la) == 0);
    free(la), free(lb);
    rk_session_destroy(sa), rk_session_destroy(sb);
    rk_model_destroy(a), rk_model_destroy(b);
    unlink(path), unlink(orig);
}
