#include "gguf_fixtures.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

void bb_free(bb *b) {
    free(b->p);
    *b = (bb){0};
}

void bb_bytes(bb *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        cr_assert(q, "out of memory");
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
}

void bb_u32(bb *b, uint32_t v) { bb_bytes(b, &v, 4); }

void bb_u64(bb *b, uint64_t v) { bb_bytes(b, &v, 8); }

void bb_str(bb *b, const char *s) {
    bb_u64(b, strlen(s));
    bb_bytes(b, s, strlen(s));
}

void bb_pad(bb *b, size_t alignment) {
    static const uint8_t zero[256];
    while (b->len % alignment) bb_bytes(b, zero, 1);
}

void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    bb_bytes(b, "GGUF", 4);
    bb_u32(b, version);
    bb_u64(b, n_tensors);
    bb_u64(b, n_kv);
}

void bb_kv_u32(bb *b, const char *key, uint32_t v) {
    bb_str(b, key);
    bb_u32(b, RK_GGUF_U32);
    bb_u32(b, v);
}

void bb_kv_str(bb *b, const char *key, const char *v) {
    bb_str(b, key);
    bb_u32(b, RK_GGUF_STRING);
    bb_str(b, v);
}

void bb_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset) {
    bb_str(b, name);
    bb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) bb_u64(b, ne[d]);
    bb_u32(b, type);
    bb_u64(b, offset);
}

void *tf_small_file(uint32_t alignment, size_t *len) {
    rk_err err = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(alignment, &w, &err), RK_OK, "%s", err.msg);
    static const char *const toks[] = {"<unk>", "a", "bc", ""};
    static const float scores[] = {0.0f, -1.5f, -2.25f, 3.0f};
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.architecture", "llama", &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "llama.block_count", 2, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 4, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_arr(w, "tokenizer.ggml.scores", RK_GGUF_F32, scores, 4, &err), RK_OK);
    float emb[32];
    for (int i = 0; i < 32; i++) emb[i] = (float)i * 0.5f;
    uint8_t q8[2 * 34];
    for (int i = 0; i < (int)sizeof q8; i++) q8[i] = (uint8_t)(i * 7);
    uint16_t norm[8];
    for (int i = 0; i < 8; i++) norm[i] = rk_f32_to_f16(1.0f + (float)i);
    const int64_t ne_emb[] = {8, 4}, ne_q[] = {32, 2}, ne_n[] = {8};
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "token_embd.weight", RK_DT_F32, 2, ne_emb, emb, sizeof emb, &err), RK_OK,
                 "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "blk.0.attn_q.weight", RK_DT_Q8_0, 2, ne_q, q8, sizeof q8, &err), RK_OK,
                 "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "output_norm.weight", RK_DT_F16, 1, ne_n, norm, sizeof norm, &err), RK_OK,
                 "%s", err.msg);
    void *bytes = NULL;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, len, &err), RK_OK, "%s", err.msg);
    rk_gguf_writer_destroy(w);
    return bytes;
}

rk_status tf_parse_exact(const void *bytes, size_t len, rk_err *err) {
    void *copy = malloc(len ? len : 1);
    cr_assert(copy);
    if (len) memcpy(copy, bytes, len);
    rk_gguf *g = NULL;
    rk_status st = rk_gguf_parse(copy, len, &g, err);
    rk_gguf_destroy(g);
    free(copy);
    return st;
}
