/* The tiny models' vocabularies through the model API: exact ids the merge / score rules
 * predict, round trips, special tokens, BOS, end-of-generation ids, and the chat family
 * read from the template. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "tb.h"

typedef struct tiny {
    char path[512];
    rk_model *m;
} tiny;

static void tiny_open(tiny *t, tb_tiny_spec spec) {
    memset(t, 0, sizeof *t);
    cr_assert(tb_tiny_model(&spec, t->path, sizeof t->path), "%s", t->path);
    rk_err e = {0};
    rk_status st = rk_model_load(t->path, &t->m, &e);
    if (st != RK_OK) unlink(t->path);
    cr_assert_eq(st, RK_OK, "%s: %s", rk_status_name(st), e.msg);
}

static void tiny_close(tiny *t) {
    rk_model_destroy(t->m);
    unlink(t->path);
    t->m = NULL;
}

static int32_t *tok(const tiny *t, const char *s, bool add_special, bool parse_special, size_t *n) {
    int32_t *ids = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_tokenize(t->m, s, strlen(s), add_special, parse_special, &ids, n, &e), RK_OK, "%s", e.msg);
    return ids;
}

/* Concatenated pieces; returns the malloc'd text. */
static char *detok(const tiny *t, const int32_t *ids, size_t n, bool render_special, size_t *len) {
    size_t cap = 16 * n + 16, k = 0;
    char *s = malloc(cap + 1);
    for (size_t i = 0; i < n; i++) {
        size_t m = rk_model_token_piece(t->m, ids[i], render_special, s + k, cap - k);
        cr_assert(m <= cap - k);
        k += m;
    }
    s[k] = 0;
    *len = k;
    return s;
}

static void expect_ids(const int32_t *got, size_t n, const int32_t *want, size_t n_want, const char *what) {
    bool same = n == n_want;
    for (size_t i = 0; same && i < n; i++) same = got[i] == want[i];
    char buf[512] = "";
    size_t k = 0;
    for (size_t i = 0; i < n && k + 12 < sizeof buf; i++) k += (size_t)snprintf(buf + k, sizeof buf - k, "%d ", got[i]);
    cr_expect(same, "%s: got [%s] (%zu ids, want %zu)", what, buf, n, n_want);
}

static const char k_text[] = "the cat sat on the mat, and it is here.\n\nZ\xc3\xbcrich 2024!\t <tag> caf\xc3\xa9";

Test(tiny, gpt2_vocab_round_trip_and_exact_ids) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_QWEN2, .seed = 20});
    size_t n, len;
    /* " the": Ġ t h e -> "Ġ t" (rank 0), "h e" (1), "Ġt he" (2) -> one token */
    int32_t *ids = tok(&t, " the", false, false, &n);
    expect_ids(ids, n, (int32_t[]){256 + 2}, 1, "' the'");
    free(ids);
    /* " on": "o n" (rank 6) beats "Ġ o" (21), and "Ġ on" is no merge: two tokens */
    ids = tok(&t, " on", false, false, &n);
    expect_ids(ids, n, (int32_t[]){' ', 256 + 6}, 2, "' on'");
    free(ids);
    /* " cat": "Ġ c" (12), "a t" (13), then "Ġc at" (19) */
    ids = tok(&t, "cat cat", false, false, &n);
    expect_ids(ids, n, (int32_t[]){'c', 256 + 13, 256 + 19}, 3, "'cat cat'");
    free(ids);
    /* "\n\n" merges into "ĊĊ" (23) */
    ids = tok(&t, "\n\n", false, false, &n);
    expect_ids(ids, n, (int32_t[]){256 + 23}, 1, "newlines");
    free(ids);
    /* special tokens: parsed only with parse_special, and never add BOS (add_bos false) */
    ids = tok(&t, "<|im_start|>user\nhi<|im_end|>", true, true, &n);
    cr_assert(n >= 4);
    cr_expect_eq(ids[0], TB_GPT2_IM_START);
    cr_expect_eq(ids[n - 1], TB_GPT2_IM_END);
    char *back = detok(&t, ids, n, true, &len);
    cr_expect_str_eq(back, "<|im_start|>user\nhi<|im_end|>");
    free(back);
    back = detok(&t, ids, n, false, &len);
    cr_expect_str_eq(back, "user\nhi", "special pieces render empty without render_special");
    free(back);
    free(ids);
    ids = tok(&t, "<|im_end|>", false, false, &n);
    cr_expect_gt(n, 1, "without parse_special the markup is plain text");
    for (size_t i = 0; i < n; i++) cr_expect_lt(ids[i], TB_GPT2_ENDOFTEXT);
    free(ids);
    /* every byte string comes back: the 256 byte tokens cover all bytes */
    ids = tok(&t, k_text, false, false, &n);
    back = detok(&t, ids, n, false, &len);
    cr_expect(len == strlen(k_text) && !memcmp(back, k_text, len), "round trip: '%s'", back);
    cr_expect_lt(n, strlen(k_text), "merges shorten the text");
    free(back), free(ids);
    /* every ASCII byte, and multi-byte characters, come back (bytes that are not valid
     * UTF-8 become U+FFFD before the byte mapping, as in llama.cpp, so they are left out) */
    char all[200];
    size_t k = 0;
    for (int i = 1; i < 128; i++) all[k++] = (char)i;
    const char mb[] = "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\xe4\xb8\xad";
    memcpy(all + k, mb, sizeof mb);
    k += sizeof mb - 1;
    ids = tok(&t, all, false, false, &n);
    back = detok(&t, ids, n, false, &len);
    cr_expect(len == k && !memcmp(back, all, k), "every ASCII byte and some UTF-8 round-trip");
    free(back), free(ids);
    cr_expect(rk_model_token_is_eog(t.m, TB_GPT2_IM_END));
    cr_expect(rk_model_token_is_eog(t.m, TB_GPT2_ENDOFTEXT));
    cr_expect(!rk_model_token_is_eog(t.m, TB_GPT2_IM_START));
    cr_expect(!rk_model_token_is_eog(t.m, 'a'));
    tiny_close(&t);
    /* add_bos: BOS first */
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .add_bos = true, .seed = 20});
    ids = tok(&t, "hi", true, false, &n);
    expect_ids(ids, n, (int32_t[]){TB_GPT2_ENDOFTEXT, 'h', 'i'}, 3, "BOS + hi");
    free(ids);
    tiny_close(&t);
}

Test(tiny, spm_vocab_round_trip_and_byte_fallback) {
    tiny t;
    tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .vocab = TB_VOCAB_SPM, .seed = 21});
    size_t n, len;
    const int32_t P = TB_SPM_FIRST_PIECE;
    /* "the cat": BOS, dummy prefix: "▁the" (piece 19), "▁cat" (36) */
    int32_t *ids = tok(&t, "the cat", true, false, &n);
    expect_ids(ids, n, (int32_t[]){1, P + 19, P + 36}, 3, "'the cat'");
    free(ids);
    /* 'ü' (c3 bc) and 'Z' have no piece: byte tokens 3 + byte */
    ids = tok(&t, "Z\xc3\xbc", false, false, &n);
    expect_ids(ids, n, (int32_t[]){P + 0, 3 + 'Z', 3 + 0xc3, 3 + 0xbc}, 4, "byte fallback");
    free(ids);
    ids = tok(&t, k_text, false, false, &n);
    char *s = detok(&t, ids, n, false, &len);
    /* the dummy prefix comes back as a leading space */
    cr_expect(len == strlen(k_text) + 1 && s[0] == ' ' && !memcmp(s + 1, k_text, len - 1), "round trip: '%s'", s);
    free(s), free(ids);
    ids = tok(&t, "<|im_start|>x", false, true, &n);
    cr_expect_eq(ids[0], TB_SPM_IM_START);
    free(ids);
    cr_expect(rk_model_token_is_eog(t.m, 2));
    cr_expect(rk_model_token_is_eog(t.m, TB_SPM_IM_END));
    cr_expect(!rk_model_token_is_eog(t.m, 1));
    tiny_close(&t);
}

Test(tiny, chat_family_follows_the_template) {
    const struct {
        const char *tmpl;
        rk_chat_family want;
    } cases[] = {
        {NULL, RK_CHAT_CHATML}, /* the generator's ChatML template */
        {"", RK_CHAT_CHATML},   /* none: the fallback */
        {"{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}", RK_CHAT_LLAMA3},
        {"{{ '<|user|>\\n' + message['content'] + eos_token }}", RK_CHAT_ZEPHYR},
        {"{{ bos_token + '[INST] ' + message['content'] + ' [/INST]' }}", RK_CHAT_LLAMA2},
        {"{{ message['content'] }}", RK_CHAT_CHATML},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        tiny t;
        tiny_open(&t, (tb_tiny_spec){.arch = TB_ARCH_LLAMA, .chat_template = cases[i].tmpl, .seed = 22});
        cr_expect_eq(rk_model_chat_family(t.m), cases[i].want, "case %zu: %s", i,
                     rk_chat_family_name(rk_model_chat_family(t.m)));
        tiny_close(&t);
    }
}
