/* The document cache's key from a session's own settings (rk_doc_cache_session_key), the
 * documents' prefix of an ask prompt (rk_doc_ask_prefix) and the product's fill defaults,
 * on generated tiny models. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_cache.h"
#include "rk_gen.h"
#include "tb.h"

typedef struct tiny {
    char path[512];
    rk_model *m;
} tiny;

static void tiny_open(tiny *t, const tb_tiny_spec *spec) {
    cr_assert(tb_tiny_model(spec, t->path, sizeof t->path), "%s", t->path);
    rk_err e = {0};
    cr_assert_eq(rk_model_load(t->path, &t->m, &e), RK_OK, "%s", e.msg);
}

static void tiny_close(tiny *t) {
    rk_model_destroy(t->m);
    unlink(t->path);
}

static rk_session *mk(const rk_model *m, const char *kv, int n_batch) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 256;
    sp.n_threads = 1;
    sp.n_batch = n_batch;
    rk_err e = {0};
    cr_assert_eq(rk_kv_params_parse(kv, &sp.kv, &e), RK_OK, "%s", e.msg);
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s: %s", kv, e.msg);
    return s;
}

static void key_of(const rk_session *s, const int32_t *ids, size_t n, char key[65]) {
    rk_err e = {0};
    cr_assert_eq(rk_doc_cache_session_key(s, ids, n, key, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(strlen(key), 64);
}

static const int32_t k_ids[8] = {5, 9, 11, 40, 3, 17, 60, 2};

Test(doc_key, equal_settings_equal_keys_any_change_another_key) {
    tiny t;
    tiny_open(&t, &(tb_tiny_spec){.arch = TB_ARCH_LLAMA, .n_layer = 4, .n_ctx_train = 512, .seed = 3});
    char a[65], b[65];
    rk_session *s1 = mk(t.m, "f16", 64), *s2 = mk(t.m, "f16", 64);
    key_of(s1, k_ids, 8, a);
    key_of(s2, k_ids, 8, b);
    cr_expect_str_eq(a, b, "two sessions with the same settings");
    key_of(s1, k_ids, 7, b);
    cr_expect_str_neq(a, b, "the tokens");

    /* fill read from the session: the same settings spelled two ways give one key */
    rk_err e = {0};
    rk_fill_params f = {.mode = RK_FILL_IDENTITY, .split = 2};
    cr_assert_eq(rk_session_set_fill(s1, &f, &e), RK_OK, "%s", e.msg);
    f.tail = rk_fill_default_tail(RK_FILL_IDENTITY), f.n_sink = 4;
    cr_assert_eq(rk_session_set_fill(s2, &f, &e), RK_OK, "%s", e.msg);
    char fa[65], fb[65];
    key_of(s1, k_ids, 8, fa);
    key_of(s2, k_ids, 8, fb);
    cr_expect_str_eq(fa, fb, "tail 0 is the mode's default tail, n_sink 0 is 4");
    cr_expect_str_neq(fa, a, "fill on against off");
    f.group = 16;
    cr_assert_eq(rk_session_set_fill(s2, &f, &e), RK_OK, "%s", e.msg);
    key_of(s2, k_ids, 8, fb);
    cr_expect_str_neq(fa, fb, "the group");
    f.group = 0, f.split = 1;
    cr_assert_eq(rk_session_set_fill(s2, &f, &e), RK_OK, "%s", e.msg);
    key_of(s2, k_ids, 8, fb);
    cr_expect_str_neq(fa, fb, "the split");
    f.mode = RK_FILL_OFF;
    cr_assert_eq(rk_session_set_fill(s2, &f, &e), RK_OK, "%s", e.msg);
    key_of(s2, k_ids, 8, fb);
    cr_expect_str_eq(a, fb, "fill off: its other settings do not matter");

    /* the KV policy and its parameters, the prefill chunk */
    rk_session *s3 = mk(t.m, "f32", 64), *s4 = mk(t.m, "f16", 32), *l1 = mk(t.m, "lowram:rank=8", 64),
               *l2 = mk(t.m, "lowram:rank=4", 64), *l3 = mk(t.m, "lowram:rank=8,budget=64", 64);
    key_of(s3, k_ids, 8, b);
    cr_expect_str_neq(a, b, "f32 against f16");
    key_of(s4, k_ids, 8, b);
    cr_expect_str_neq(a, b, "the prefill chunk");
    char la[65], lb[65];
    key_of(l1, k_ids, 8, la);
    key_of(l2, k_ids, 8, lb);
    cr_expect_str_neq(la, lb, "the LowRAM rank (a parameter of its blocks)");
    key_of(l3, k_ids, 8, lb);
    cr_expect_str_eq(la, lb, "decode's budget does not change the stored state");
    /* a memory budget spills rows, bit-identical to the rows in memory: the same entry */
    rk_session_params bp = rk_session_params_default();
    bp.n_ctx = 256, bp.n_threads = 1, bp.n_batch = 64, bp.kv.budget = 4096;
    rk_session *s5 = NULL;
    cr_assert_eq(rk_session_create(t.m, &bp, &s5, &e), RK_OK, "%s", e.msg);
    key_of(s5, k_ids, 8, b);
    cr_expect_str_eq(a, b, "the budget does not change the rows");
    rk_session *ss[] = {s1, s2, s3, s4, s5, l1, l2, l3};
    for (size_t i = 0; i < sizeof ss / sizeof *ss; i++) rk_session_destroy(ss[i]);

    /* the same weights with RoPE scaled: other rows */
    rk_model *m2 = NULL;
    cr_assert_eq(rk_model_load(t.path, &m2, &e), RK_OK, "%s", e.msg);
    rk_rope_override ro = rk_rope_override_default();
    ro.factor = 2.0f;
    cr_assert_eq(rk_model_set_rope(m2, &ro, &e), RK_OK, "%s", e.msg);
    rk_session *r = mk(m2, "f16", 64);
    key_of(r, k_ids, 8, b);
    cr_expect_str_neq(a, b, "RoPE scaling");
    rk_session_destroy(r);
    rk_model_destroy(m2);

    /* another model (other weights): another key for the same settings and tokens */
    tiny u;
    tiny_open(&u, &(tb_tiny_spec){.arch = TB_ARCH_LLAMA, .n_layer = 4, .n_ctx_train = 512, .seed = 4});
    rk_session *o = mk(u.m, "f16", 64);
    key_of(o, k_ids, 8, b);
    cr_expect_str_neq(a, b, "the model");
    rk_session_destroy(o);
    tiny_close(&u);
    tiny_close(&t);
}

static rk_status ask_ids(const rk_model *m, rk_session *s, const rk_doc *d, size_t nd, const char *q, int32_t **ids,
                         size_t *n) {
    rk_conv_params cp = {.n_answer = 1, .room_div = 4};
    rk_conv *c = NULL;
    rk_err e = {0};
    rk_status st = rk_conv_create(m, s, &cp, &c, &e);
    if (!st) st = rk_conv_add_ask(c, NULL, d, nd, q, &e);
    if (!st) st = rk_conv_prompt(c, ids, n, &e);
    rk_conv_destroy(c);
    return st;
}

static void prefix_case(tb_vocab vocab) {
    tiny t;
    tiny_open(&t, &(tb_tiny_spec){.arch = TB_ARCH_LLAMA, .vocab = vocab, .n_ctx_train = 2048, .seed = 5});
    rk_session *s = mk(t.m, "f16", 64);
    const char *text = "the cat sat on the mat.\nthe dog ate the hat, then it ran to the sea!\n";
    const rk_doc docs[2] = {{"notes.txt", text, strlen(text)}, {NULL, "a b c\n", 6}};
    /* questions whose first characters the tokenizer could join to "Question:" differently */
    static const char *const qs[] = {"what did the cat do?", "7 + 1?", "?", "  the sea", "\"quoted\"", "x"};
    size_t p0 = 0;
    int32_t *first = NULL;
    for (size_t i = 0; i < sizeof qs / sizeof *qs; i++) {
        int32_t *ids = NULL;
        size_t n = 0, p = 0;
        rk_err e = {0};
        cr_assert_eq(ask_ids(t.m, s, docs, 2, qs[i], &ids, &n), RK_OK);
        cr_assert_eq(rk_doc_ask_prefix(t.m, s, NULL, docs, 2, ids, n, &p, &e), RK_OK, "%s", e.msg);
        cr_expect(p > 20 && p < n, "%s: prefix %zu of %zu", qs[i], p, n);
        if (!i) {
            p0 = p;
            first = ids;
            continue;
        }
        /* rows [0, p) are the same tokens whatever the question: one cache entry serves all */
        cr_expect_eq(p, p0, "%s: prefix %zu, the first question's %zu", qs[i], p, p0);
        cr_expect(!memcmp(ids, first, (p < p0 ? p : p0) * sizeof *ids), "%s", qs[i]);
        free(ids);
    }
    /* another document: another prefix (its tokens differ) */
    const rk_doc other = {"notes.txt", "the cat sat on the hat.\n", 24};
    int32_t *ids = NULL;
    size_t n = 0, p = 0;
    rk_err e = {0};
    cr_assert_eq(ask_ids(t.m, s, &other, 1, qs[0], &ids, &n), RK_OK);
    cr_assert_eq(rk_doc_ask_prefix(t.m, s, NULL, &other, 1, ids, n, &p, &e), RK_OK, "%s", e.msg);
    cr_expect(p > 0 && p < n && p != p0);
    /* ids that are not this prompt share only what they share */
    cr_assert_eq(rk_doc_ask_prefix(t.m, s, NULL, docs, 2, ids, n, &p, &e), RK_OK, "%s", e.msg);
    size_t same = 0;
    while (same < n && ids[same] == first[same]) same++;
    cr_expect_eq(p, same);
    free(ids);
    free(first);
    rk_session_destroy(s);
    tiny_close(&t);
}

Test(doc_key, ask_prefix_is_the_same_for_every_question_gpt2) { prefix_case(TB_VOCAB_GPT2); }
Test(doc_key, ask_prefix_is_the_same_for_every_question_spm) { prefix_case(TB_VOCAB_SPM); }

Test(doc_key, fill_defaults_are_the_products) {
    const rk_fill_params f = rk_fill_params_default();
    cr_expect_eq(f.mode, RK_FILL_QUALITY);
    cr_expect_eq(f.group, 16);
    cr_expect_eq(f.group, rk_fill_default_group(RK_FILL_QUALITY));
    cr_expect_eq(f.tail, 0, "the mode's default tail");
    cr_expect_lt(f.keep_share, 0.0f, "the map file's keep share");
    cr_expect_null(f.maps);
    cr_expect_eq(rk_fill_default_group(RK_FILL_SPEED), 16);
    cr_expect_eq(rk_fill_default_group(RK_FILL_IDENTITY), 0);
    cr_expect_eq(rk_fill_default_group(RK_FILL_PLUMB), 0);
    cr_expect_eq(rk_fill_default_group(RK_FILL_OFF), 0);
}
