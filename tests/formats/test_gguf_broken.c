/* Hand-made broken GGUF files: one per failure class, each must give its own
 * status and a message naming the key / tensor / offset. Then every truncation
 * of a valid file and random byte flips: errors, never crashes. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_fixtures.h"
#include "rk_gguf.h"
#include "tb.h"

/* Parses b and checks the status and that the message contains every needle. */
static void expect(const bb *b, rk_status want, const char *needle1, const char *needle2) {
    rk_err err = {0};
    rk_status st = tf_parse_exact(b->p, b->len, &err);
    cr_assert_eq(st, want, "got %s (%s), want %s", rk_status_name(st), err.msg, rk_status_name(want));
    cr_assert_eq(err.code, want);
    cr_assert(strncmp(err.msg, "gguf: ", 6) == 0, "message '%s'", err.msg);
    if (needle1) cr_assert(strstr(err.msg, needle1), "'%s' not in '%s'", needle1, err.msg);
    if (needle2) cr_assert(strstr(err.msg, needle2), "'%s' not in '%s'", needle2, err.msg);
}

/* One F32 tensor file: header, keys given by the caller, then the tensor info. */
static void one_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset,
                       size_t data_bytes) {
    bb_header(b, 3, 1, 1);
    bb_kv_str(b, "general.architecture", "llama");
    bb_tensor(b, name, n_dims, ne, type, offset);
    bb_pad(b, 32);
    for (size_t i = 0; i < data_bytes; i++) bb_bytes(b, "\x11", 1);
}

Test(gguf_broken, bad_magic) {
    bb b = {0};
    bb_header(&b, 3, 0, 0);
    memcpy(b.p, "GGML", 4);
    expect(&b, RK_E_GGUF_MAGIC, "magic", "47 47 4d 4c");
    bb_free(&b);
}

Test(gguf_broken, version_1_named) {
    bb b = {0};
    bb_bytes(&b, "GGUF", 4);
    bb_u32(&b, 1);
    bb_u32(&b, 0); /* v1 had u32 counts */
    bb_u32(&b, 0);
    expect(&b, RK_E_GGUF_VERSION, "version 1", "re-convert");
    bb_free(&b);
}

Test(gguf_broken, version_unknown) {
    bb b = {0};
    bb_header(&b, 4, 0, 0);
    expect(&b, RK_E_GGUF_VERSION, "version 4", "2 or 3");
    bb_free(&b);
    bb_header(&b, 0x03000000u, 0, 0); /* byte-swapped v3 */
    expect(&b, RK_E_GGUF_VERSION, "big-endian", NULL);
    bb_free(&b);
}

Test(gguf_broken, version_2_accepted) {
    bb b = {0};
    bb_header(&b, 2, 0, 1);
    bb_kv_u32(&b, "x", 5);
    rk_err err = {0};
    cr_assert_eq(tf_parse_exact(b.p, b.len, &err), RK_OK, "%s", err.msg);
    bb_free(&b);
}

Test(gguf_broken, truncated_value) {
    bb b = {0};
    bb_header(&b, 3, 0, 2);
    bb_kv_u32(&b, "a.b", 1);   /* 24 .. 43 */
    bb_str(&b, "c.d");         /* 43 .. 54 */
    bb_u32(&b, RK_GGUF_U64);   /* 54 .. 58 */
    bb_bytes(&b, "\1\2\3", 3); /* 3 of the 8 value bytes */
    expect(&b, RK_E_GGUF_TRUNCATED, "offset 58", "value of key 'c.d'");
    bb_free(&b);
}

Test(gguf_broken, truncated_tensor_info) {
    bb b = {0};
    const uint64_t ne[] = {8, 8};
    bb_header(&b, 3, 1, 0);
    bb_str(&b, "blk.0.attn_k.weight");
    bb_u32(&b, 2);
    bb_u64(&b, ne[0]);
    bb_u64(&b, ne[1]);
    bb_u32(&b, RK_DT_F32);
    bb_u32(&b, 0); /* half of the u64 offset */
    expect(&b, RK_E_GGUF_TRUNCATED, "data offset of tensor 'blk.0.attn_k.weight'", "need 8 bytes");
    bb_free(&b);
}

Test(gguf_broken, huge_counts) {
    bb b = {0};
    bb_header(&b, 3, 0, 1ull << 60);
    bb_kv_u32(&b, "x", 1);
    expect(&b, RK_E_GGUF_COUNT, "n_kv 1152921504606846976", NULL);
    bb_free(&b);

    bb_header(&b, 3, UINT64_MAX, 1);
    bb_kv_u32(&b, "x", 1);
    expect(&b, RK_E_GGUF_COUNT, "n_tensors 18446744073709551615", NULL);
    bb_free(&b);

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tokenizer.ggml.scores");
    bb_u32(&b, RK_GGUF_ARRAY);
    bb_u32(&b, RK_GGUF_F32);
    bb_u64(&b, 1ull << 62);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_COUNT, "'tokenizer.ggml.scores'", "4611686018427387904");
    bb_free(&b);

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tokenizer.ggml.tokens");
    bb_u32(&b, RK_GGUF_ARRAY);
    bb_u32(&b, RK_GGUF_STRING);
    bb_u64(&b, UINT64_MAX / 2);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_COUNT, "'tokenizer.ggml.tokens'", "strings");
    bb_free(&b);

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.name");
    bb_u32(&b, RK_GGUF_STRING);
    bb_u64(&b, UINT64_MAX);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_COUNT, "'general.name'", "18446744073709551615");
    bb_free(&b);

    /* string inside a string array */
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "tokenizer.ggml.merges");
    bb_u32(&b, RK_GGUF_ARRAY);
    bb_u32(&b, RK_GGUF_STRING);
    bb_u64(&b, 2);
    bb_str(&b, "a b");
    bb_u64(&b, 1ull << 40);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_COUNT, "'tokenizer.ggml.merges'", "string 1");
    bb_free(&b);

    /* key length */
    bb_header(&b, 3, 0, 1);
    bb_u64(&b, 1ull << 50);
    bb_u32(&b, 0);
    bb_u32(&b, 0);
    bb_u32(&b, 0);
    expect(&b, RK_E_GGUF_COUNT, "key #0", "1125899906842624");
    bb_free(&b);
}

Test(gguf_broken, duplicate_key) {
    bb b = {0};
    bb_header(&b, 3, 0, 3);
    bb_kv_str(&b, "general.architecture", "llama");
    bb_kv_u32(&b, "llama.block_count", 2);
    bb_kv_str(&b, "general.architecture", "qwen2");
    expect(&b, RK_E_GGUF_DUPLICATE, "'general.architecture'", "#0 and #2");
    bb_free(&b);
}

Test(gguf_broken, duplicate_tensor) {
    bb b = {0};
    const uint64_t ne[] = {8};
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "output_norm.weight", 1, ne, RK_DT_F32, 0);
    bb_tensor(&b, "output_norm.weight", 1, ne, RK_DT_F32, 32);
    bb_pad(&b, 32);
    bb_bytes(&b, (uint8_t[64]){0}, 64);
    expect(&b, RK_E_GGUF_DUPLICATE, "tensor 'output_norm.weight'", NULL);
    bb_free(&b);
}

Test(gguf_broken, unknown_value_type) {
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.weird");
    bb_u32(&b, 13);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_TYPE, "'general.weird'", "type 13");
    bb_free(&b);

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.weird");
    bb_u32(&b, RK_GGUF_ARRAY);
    bb_u32(&b, 200);
    bb_u64(&b, 1);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_TYPE, "'general.weird'", "200");
    bb_free(&b);

    bb_header(&b, 3, 0, 1); /* nested arrays */
    bb_str(&b, "general.nested");
    bb_u32(&b, RK_GGUF_ARRAY);
    bb_u32(&b, RK_GGUF_ARRAY);
    bb_u64(&b, 1);
    bb_u64(&b, 0);
    expect(&b, RK_E_GGUF_TYPE, "'general.nested'", "nested");
    bb_free(&b);
}

Test(gguf_broken, unknown_tensor_type) {
    bb b = {0};
    const uint64_t ne[] = {32, 2};
    one_tensor(&b, "blk.0.ffn_up.weight", 2, ne, 6, 0, 44);
    expect(&b, RK_E_GGUF_TYPE, "'blk.0.ffn_up.weight'", "type 6 (q5_0)");
    bb_free(&b);
    one_tensor(&b, "blk.0.ffn_up.weight", 2, ne, 1000, 0, 44);
    expect(&b, RK_E_GGUF_TYPE, "type 1000", NULL);
    bb_free(&b);
}

Test(gguf_broken, bad_alignment_key) {
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 48);
    expect(&b, RK_E_GGUF_ALIGN, "'general.alignment'", "48");
    bb_free(&b);

    bb_header(&b, 3, 0, 1);
    bb_kv_u32(&b, "general.alignment", 0);
    expect(&b, RK_E_GGUF_ALIGN, "'general.alignment'", "power of two");
    bb_free(&b);

    bb_header(&b, 3, 0, 1);
    bb_str(&b, "general.alignment");
    bb_u32(&b, RK_GGUF_U64);
    bb_u64(&b, 32);
    expect(&b, RK_E_GGUF_ALIGN, "'general.alignment'", "u64");
    bb_free(&b);
}

Test(gguf_broken, misaligned_offset) {
    bb b = {0};
    const uint64_t ne[] = {4};
    one_tensor(&b, "blk.1.attn_norm.weight", 1, ne, RK_DT_F32, 16, 64);
    expect(&b, RK_E_GGUF_ALIGN, "'blk.1.attn_norm.weight' offset 16", "alignment 32");
    bb_free(&b);
}

Test(gguf_broken, overlapping_tensors) {
    bb b = {0};
    const uint64_t ne_a[] = {16}, ne_b[] = {8};
    bb_header(&b, 3, 2, 0);
    bb_tensor(&b, "tensor.a", 1, ne_a, RK_DT_F32, 0);  /* [0, 64) */
    bb_tensor(&b, "tensor.b", 1, ne_b, RK_DT_F32, 32); /* [32, 64) */
    bb_pad(&b, 32);
    bb_bytes(&b, (uint8_t[64]){0}, 64);
    expect(&b, RK_E_GGUF_OVERLAP, "'tensor.a' [0, 64)", "'tensor.b' [32, 64)");
    bb_free(&b);
}

Test(gguf_broken, data_past_end) {
    bb b = {0};
    const uint64_t ne[] = {64};
    one_tensor(&b, "blk.0.attn_q.weight", 1, ne, RK_DT_F32, 0, 32); /* 256 bytes needed */
    size_t data = b.len - 32;
    char want[160];
    snprintf(want, sizeof want, "gguf: tensor 'blk.0.attn_q.weight' data [%zu, %zu) past end of file (len %zu)", data,
             data + 256, b.len);
    rk_err err = {0};
    cr_assert_eq(tf_parse_exact(b.p, b.len, &err), RK_E_GGUF_BOUNDS, "%s", err.msg);
    cr_assert_str_eq(err.msg, want);
    bb_free(&b);

    /* offset itself far past the end, where data_offset + offset overflows */
    one_tensor(&b, "x", 1, ne, RK_DT_F32, UINT64_MAX - 31, 0);
    expect(&b, RK_E_GGUF_BOUNDS, "'x' data", "past end");
    bb_free(&b);
}

Test(gguf_broken, bad_dims) {
    bb b = {0};
    const uint64_t ne5[] = {1, 1, 1, 1, 1}, ne0[] = {8, 0}, neg[] = {1ull << 63};
    const uint64_t big[] = {1ull << 32, 1ull << 32}, bytes_ovf[] = {1ull << 62};
    one_tensor(&b, "t.zero_dims", 0, ne5, RK_DT_F32, 0, 0);
    expect(&b, RK_E_GGUF_DIM, "'t.zero_dims' has n_dims 0", NULL);
    bb_free(&b);
    one_tensor(&b, "t.five_dims", 5, ne5, RK_DT_F32, 0, 4);
    expect(&b, RK_E_GGUF_DIM, "'t.five_dims' has n_dims 5", NULL);
    bb_free(&b);
    one_tensor(&b, "t.empty", 2, ne0, RK_DT_F32, 0, 0);
    expect(&b, RK_E_GGUF_DIM, "'t.empty' ne[1] = 0", NULL);
    bb_free(&b);
    one_tensor(&b, "t.negative", 1, neg, RK_DT_F32, 0, 0);
    expect(&b, RK_E_GGUF_DIM, "'t.negative' ne[0] = -9223372036854775808", NULL);
    bb_free(&b);
    one_tensor(&b, "t.elements", 2, big, RK_DT_F32, 0, 0);
    expect(&b, RK_E_GGUF_DIM, "'t.elements' element count overflows", NULL);
    bb_free(&b);
    one_tensor(&b, "t.bytes", 1, bytes_ovf, RK_DT_F32, 0, 0);
    expect(&b, RK_E_GGUF_DIM, "'t.bytes' byte size overflows", NULL);
    bb_free(&b);
}

Test(gguf_broken, row_not_multiple_of_block) {
    bb b = {0};
    const uint64_t ne[] = {48, 2};
    one_tensor(&b, "blk.0.ffn_gate.weight", 2, ne, RK_DT_Q4_0, 0, 64);
    expect(&b, RK_E_GGUF_BLOCK, "'blk.0.ffn_gate.weight' row length ne[0] = 48", "q4_0 block size 32");
    bb_free(&b);
}

/* Vocab-only files end right after the header: the padded data offset lies past
 * the end, which is fine while there are no tensors. */
Test(gguf_broken, vocab_only_data_offset_past_end_ok) {
    bb b = {0};
    bb_header(&b, 3, 0, 1);
    bb_kv_str(&b, "tokenizer.ggml.model", "gpt2");
    cr_assert_neq(b.len % 32, 0);
    rk_err err = {0};
    rk_gguf *g = NULL;
    cr_assert_eq(rk_gguf_parse(b.p, b.len, &g, &err), RK_OK, "%s", err.msg);
    cr_assert_gt(rk_gguf_data_offset(g), b.len);
    rk_gguf_destroy(g);
    bb_free(&b);
}

Test(gguf_broken, empty_and_null) {
    rk_err err = {0};
    rk_gguf *g = NULL;
    cr_assert_eq(rk_gguf_parse(NULL, 0, &g, &err), RK_E_GGUF_TRUNCATED);
    cr_assert(strstr(err.msg, "magic"), "%s", err.msg);
    cr_assert_null(g);
    cr_assert_eq(rk_gguf_parse(NULL, 10, &g, &err), RK_E_INVALID_ARG);
    cr_assert_eq(rk_gguf_parse("GGUF", 4, NULL, &err), RK_E_INVALID_ARG);
    cr_assert_eq(rk_gguf_parse("GGUF", 4, &g, NULL), RK_E_GGUF_TRUNCATED, "err may be NULL");
}

/* ---- every prefix, random flips --------------------------------------------- */

Test(gguf_fuzzish, every_truncation_fails_cleanly) {
    size_t len = 0;
    uint8_t *full = tf_small_file(32, &len);
    rk_err err = {0};
    rk_gguf *g = NULL;
    cr_assert_eq(rk_gguf_parse(full, len, &g, &err), RK_OK, "%s", err.msg);
    /* the writer pads after the last tensor; cutting only padding stays valid */
    size_t need = 0;
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        size_t end = (size_t)(rk_gguf_data_offset(g) + t->offset + t->n_bytes);
        need = end > need ? end : need;
    }
    rk_gguf_destroy(g);
    cr_assert(need > 0 && need <= len);
    for (size_t l = need; l <= len; l++)
        cr_assert_eq(tf_parse_exact(full, l, &err), RK_OK, "length %zu: %s", l, err.msg);
    size_t n_trunc = 0, n_count = 0, n_bounds = 0;
    for (size_t l = 0; l < need; l++) {
        rk_err e = {0};
        rk_status st = tf_parse_exact(full, l, &e);
        cr_assert(st == RK_E_GGUF_TRUNCATED || st == RK_E_GGUF_COUNT || st == RK_E_GGUF_BOUNDS, "prefix %zu: %s (%s)",
                  l, rk_status_name(st), e.msg);
        cr_assert(strncmp(e.msg, "gguf: ", 6) == 0, "prefix %zu: '%s'", l, e.msg);
        n_trunc += st == RK_E_GGUF_TRUNCATED;
        n_count += st == RK_E_GGUF_COUNT;
        n_bounds += st == RK_E_GGUF_BOUNDS;
    }
    /* each kind of truncation is reached: fixed fields, lengths, tensor data */
    cr_assert(n_trunc && n_count && n_bounds, "%zu %zu %zu", n_trunc, n_count, n_bounds);
    free(full);
}

/* Uses whatever a successful parse hands out, so ASan sees any bad view. */
static uint64_t touch_all(const rk_gguf *g) {
    uint64_t sum = 0;
    rk_err err = {0};
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++) {
        const rk_gguf_kv *kv = rk_gguf_kv_at(g, i);
        for (uint64_t k = 0; k < kv->key.len; k++) sum += (uint8_t)kv->key.ptr[k];
        char key[128];
        size_t n = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
        memcpy(key, kv->key.ptr, n);
        key[n] = 0;
        uint32_t u32;
        float f;
        rk_str s;
        bool b;
        sum += rk_gguf_get_u32(g, key, &u32, &err) + rk_gguf_get_f32(g, key, &f, &err);
        sum += rk_gguf_get_bool(g, key, &b, &err);
        if (rk_gguf_get_str(g, key, &s, &err) == RK_OK)
            for (uint64_t k = 0; k < s.len; k++) sum += (uint8_t)s.ptr[k];
        if (kv->type != RK_GGUF_ARRAY) continue;
        for (uint64_t j = 0; j < kv->n && j < 4096; j++) {
            int64_t v;
            if (rk_gguf_arr_str(g, kv, j, &s, &err) == RK_OK) {
                for (uint64_t k = 0; k < s.len; k++) sum += (uint8_t)s.ptr[k];
            } else if (rk_gguf_arr_i64(kv, j, &v, &err) == RK_OK) {
                sum += (uint64_t)v;
            } else if (rk_gguf_arr_f32(kv, j, &f, &err) == RK_OK) {
                sum += f > 0;
            }
        }
    }
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        const uint8_t *d = t->data;
        sum += d[0] + d[t->n_bytes - 1];
    }
    return sum;
}

static void flip_loop(const uint8_t *orig, size_t len, size_t span, int iters, uint64_t seed) {
    uint8_t *buf = malloc(len);
    cr_assert(buf);
    int ok = 0;
    for (int it = 0; it < iters; it++) {
        memcpy(buf, orig, len);
        int flips = 1 + (int)(tb_rand_u64(&seed) % 8);
        for (int k = 0; k < flips; k++) {
            size_t at = (size_t)(tb_rand_u64(&seed) % span);
            uint64_t r = tb_rand_u64(&seed);
            buf[at] = (r & 1) ? (uint8_t)(buf[at] ^ (1u << ((r >> 1) % 8))) : (uint8_t)(r >> 8);
        }
        rk_err err = {0};
        rk_gguf *g = NULL;
        rk_status st = rk_gguf_parse(buf, len, &g, &err);
        if (st == RK_OK) {
            (void)touch_all(g);
            ok++;
        } else {
            cr_assert_null(g);
            cr_assert(err.msg[0], "status %s without a message", rk_status_name(st));
        }
        rk_gguf_destroy(g);
    }
    cr_log_info("%d of %d flipped files still parsed", ok, iters);
    free(buf);
}

Test(gguf_fuzzish, random_flips_small_file) {
    size_t len = 0;
    uint8_t *full = tf_small_file(32, &len);
    flip_loop(full, len, len, 20000, 1);
    free(full);
}

Test(gguf_fuzzish_shared, random_flips_real_header) {
    char buf[1024];
    const char *path = tb_shared_path(buf, sizeof buf, "models/stories260K/stories260K-f32.gguf");
    if (!path) cr_skip_test("%s", buf);
    size_t len = 0;
    uint8_t *bytes = tb_read_file(path, &len);
    cr_assert(bytes);
    rk_gguf *g = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_gguf_parse(bytes, len, &g, &err), RK_OK, "%s", err.msg);
    size_t head = (size_t)rk_gguf_data_offset(g); /* flip only the header */
    rk_gguf_destroy(g);
    flip_loop(bytes, len, head, 300, 2);
    free(bytes);
}
