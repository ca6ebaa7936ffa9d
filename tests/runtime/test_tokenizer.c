/* Tokenizer tests: llama.cpp's tokenizer vectors, trained-model vocab goldens, round
 * trips over the corpus, special tokens of the default model, pre-tokenizer splits,
 * malformed input and hand-made vocabularies. Shared files missing -> skip. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gguf.h"
#include "tb.h"
#include "tokenizer_impl.h"

/* ---- helpers ------------------------------------------------------------ */

typedef struct vocab {
    rk_mapping map;
    void *bytes; /* set instead of map for generated files */
    rk_gguf *g;
    rk_tokenizer *t;
} vocab;

static void vocab_close(vocab *v) {
    rk_tokenizer_destroy(v->t);
    rk_gguf_destroy(v->g);
    rk_mapping_close(&v->map);
    free(v->bytes);
    memset(v, 0, sizeof *v);
}

static void vocab_open_path(vocab *v, const char *path) {
    rk_err err = {0};
    memset(v, 0, sizeof *v);
    cr_assert_eq(rk_mapping_open(path, &v->map, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_gguf_parse(v->map.data, v->map.len, &v->g, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_tokenizer_create(v->g, &v->t, &err), RK_OK, "%s: %s", path, err.msg);
}

/* Opens a file under the shared dir; skips the test when it is absent. */
static void vocab_open_shared(vocab *v, const char *rel) {
    char path[1024];
    if (!tb_shared_path(path, sizeof path, rel)) cr_skip_test("missing %s (%s)", rel, path);
    vocab_open_path(v, path);
}

static void encode(const rk_tokenizer *t, const char *s, size_t n, bool add_special, bool parse_special, int32_t **ids,
                   size_t *n_ids) {
    rk_err err = {0};
    cr_assert_eq(rk_tokenizer_encode(t, s, n, add_special, parse_special, ids, n_ids, &err), RK_OK, "%s", err.msg);
}

static char *decode(const rk_tokenizer *t, const int32_t *ids, size_t n, size_t *len) {
    rk_err err = {0};
    char *s = NULL;
    cr_assert_eq(rk_tokenizer_decode(t, ids, n, false, &s, len, &err), RK_OK, "%s", err.msg);
    return s;
}

/* Encodes then decodes s[0..n) (no BOS, no special parsing); true when equal. */
static bool round_trip(const rk_tokenizer *t, const char *s, size_t n, size_t *n_ids) {
    int32_t *ids = NULL;
    size_t len;
    encode(t, s, n, false, false, &ids, n_ids);
    char *back = decode(t, ids, *n_ids, &len);
    bool ok = len == n && memcmp(back, s, n) == 0;
    if (!ok) {
        size_t i = 0;
        while (i < n && i < len && back[i] == s[i]) i++;
        fprintf(stderr, "round trip differs at byte %zu of %zu (decoded %zu)\n", i, n, len);
    }
    free(ids);
    free(back);
    return ok;
}

/* ---- pre-tokenizer cases: word ends per rule set, generated with Python's regex module
 * (the HF patterns, each regex re-splitting the previous pieces as llama.cpp does) ---- */
static const char *const pretok_texts[] = {
    "Hello world! It's 2024, we'll see.  Don't   STOP'LL",
    "  leading and trailing   ",
    "line1\012line2\015\012\015\012  indented\011tab\012\012\012",
    "numbers 1 12 123 1234 12345 1234567 3.14159 \331\241\331\242\331\243\331\244",
    "emoji \360\237\246\231\360\237\246\231 x\360\237\230\200y ...!!! ???",
    "Khmer \341\236\200\341\237\222\341\236\232\341\236\273\341\236\230\341\236\240\341\237\212\341\236\273\341\236\223 CJK \344\275\240\345\245\275\344\270\226\347\225\214 \346\227\245\346\234\254\350\252\236\343\203\206\343\202\255\343\202\271\343\203\210",
    "' quote 's 'S 'Re 've 'M 'LL 'd 'x ''s",
    "mix:foo_bar(baz)+=<tag>|~^$ a+b=c",
    "\011\011  \012 \012  x",
    "a\302\240b \343\200\200c \302\240 d",
    "caf\303\251 na\303\257ve \303\211COLE \316\224\316\265\316\273\317\204\316\261 \320\266\321\203\320\272",
    "x \012\012y!\012\012\012.\015\012",
};
typedef struct pretok_case {
    rk_tok_pre pre;
    int text;
    size_t n, ends[64];
} pretok_case;
static const pretok_case pretok_cases[] = {
    {RK_TOK_PRE_GPT2, 0, 18, {5, 11, 12, 15, 17, 22, 23, 26, 29, 33, 34, 35, 39, 41, 43, 48, 49, 51}},
    {RK_TOK_PRE_GPT2, 1, 5, {1, 9, 13, 22, 25}},
    {RK_TOK_PRE_GPT2, 2, 10, {4, 5, 6, 10, 11, 16, 25, 26, 29, 32}},
    {RK_TOK_PRE_GPT2, 3, 11, {7, 9, 12, 16, 21, 27, 35, 37, 38, 43, 52}},
    {RK_TOK_PRE_GPT2, 4, 7, {5, 14, 16, 20, 21, 28, 32}},
    {RK_TOK_PRE_GPT2, 5, 11, {5, 9, 12, 15, 18, 24, 30, 33, 37, 50, 72}},
    {RK_TOK_PRE_GPT2, 6, 20, {1, 7, 9, 10, 12, 13, 15, 17, 19, 21, 23, 24, 26, 28, 30, 31, 33, 34, 37, 38}},
    {RK_TOK_PRE_GPT2, 7, 15, {3, 4, 7, 8, 11, 12, 15, 19, 22, 27, 29, 30, 31, 32, 33}},
    {RK_TOK_PRE_GPT2, 8, 2, {8, 10}},
    {RK_TOK_PRE_GPT2, 9, 8, {1, 3, 4, 5, 8, 9, 12, 14}},
    {RK_TOK_PRE_GPT2, 10, 5, {5, 12, 19, 30, 37}},
    {RK_TOK_PRE_GPT2, 11, 9, {1, 3, 4, 5, 6, 8, 9, 10, 12}},
    {RK_TOK_PRE_STARCODER, 0, 22, {5,  11, 12, 15, 17, 18, 19, 20, 21, 22, 23,
                                   26, 29, 33, 34, 35, 39, 41, 43, 48, 49, 51}},
    {RK_TOK_PRE_STARCODER, 1, 5, {1, 9, 13, 22, 25}},
    {RK_TOK_PRE_STARCODER, 2, 10, {4, 5, 6, 10, 11, 16, 25, 26, 29, 32}},
    {RK_TOK_PRE_STARCODER, 3, 42, {7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                                   28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 48, 50, 52}},
    {RK_TOK_PRE_STARCODER, 4, 7, {5, 14, 16, 20, 21, 28, 32}},
    {RK_TOK_PRE_STARCODER, 5, 11, {5, 9, 12, 15, 18, 24, 30, 33, 37, 50, 72}},
    {RK_TOK_PRE_STARCODER, 6, 20, {1, 7, 9, 10, 12, 13, 15, 17, 19, 21, 23, 24, 26, 28, 30, 31, 33, 34, 37, 38}},
    {RK_TOK_PRE_STARCODER, 7, 15, {3, 4, 7, 8, 11, 12, 15, 19, 22, 27, 29, 30, 31, 32, 33}},
    {RK_TOK_PRE_STARCODER, 8, 2, {8, 10}},
    {RK_TOK_PRE_STARCODER, 9, 8, {1, 3, 4, 5, 8, 9, 12, 14}},
    {RK_TOK_PRE_STARCODER, 10, 5, {5, 12, 19, 30, 37}},
    {RK_TOK_PRE_STARCODER, 11, 9, {1, 3, 4, 5, 6, 8, 9, 10, 12}},
    {RK_TOK_PRE_QWEN2, 0, 21, {5, 11, 12, 15, 17, 18, 19, 20, 21, 22, 23, 26, 29, 33, 34, 35, 39, 41, 43, 48, 51}},
    {RK_TOK_PRE_QWEN2, 1, 5, {1, 9, 13, 22, 25}},
    {RK_TOK_PRE_QWEN2, 2, 10, {4, 5, 6, 10, 11, 15, 16, 25, 29, 32}},
    {RK_TOK_PRE_QWEN2, 3, 42, {7,  8,  9,  10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27,
                               28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 46, 48, 50, 52}},
    {RK_TOK_PRE_QWEN2, 4, 6, {5, 14, 16, 21, 28, 32}},
    {RK_TOK_PRE_QWEN2, 5, 9, {5, 9, 15, 24, 30, 33, 37, 50, 72}},
    {RK_TOK_PRE_QWEN2, 6, 20, {1, 7, 9, 10, 12, 13, 15, 17, 19, 21, 23, 24, 26, 28, 30, 31, 33, 34, 37, 38}},
    {RK_TOK_PRE_QWEN2, 7, 10, {3, 7, 11, 15, 19, 22, 27, 29, 31, 33}},
    {RK_TOK_PRE_QWEN2, 8, 3, {7, 8, 10}},
    {RK_TOK_PRE_QWEN2, 9, 6, {1, 4, 5, 9, 12, 14}},
    {RK_TOK_PRE_QWEN2, 10, 5, {5, 12, 19, 30, 37}},
    {RK_TOK_PRE_QWEN2, 11, 5, {1, 4, 5, 9, 12}},
    {RK_TOK_PRE_LLAMA3, 0, 19, {5, 11, 12, 15, 17, 18, 21, 22, 23, 26, 29, 33, 34, 35, 39, 41, 43, 48, 51}},
    {RK_TOK_PRE_LLAMA3, 1, 5, {1, 9, 13, 22, 25}},
    {RK_TOK_PRE_LLAMA3, 2, 10, {4, 5, 6, 10, 11, 15, 16, 25, 29, 32}},
    {RK_TOK_PRE_LLAMA3, 3, 25, {7,  8,  9,  10, 12, 13, 16, 17, 20, 21, 22, 25, 27,
                                28, 31, 34, 35, 36, 37, 38, 41, 43, 44, 50, 52}},
    {RK_TOK_PRE_LLAMA3, 4, 6, {5, 14, 16, 21, 28, 32}},
    {RK_TOK_PRE_LLAMA3, 5, 9, {5, 9, 15, 24, 30, 33, 37, 50, 72}},
    {RK_TOK_PRE_LLAMA3, 6, 20, {1, 7, 9, 10, 12, 13, 15, 17, 19, 21, 23, 24, 26, 28, 30, 31, 33, 34, 37, 38}},
    {RK_TOK_PRE_LLAMA3, 7, 10, {3, 7, 11, 15, 19, 22, 27, 29, 31, 33}},
    {RK_TOK_PRE_LLAMA3, 8, 3, {7, 8, 10}},
    {RK_TOK_PRE_LLAMA3, 9, 6, {1, 4, 5, 9, 12, 14}},
    {RK_TOK_PRE_LLAMA3, 10, 5, {5, 12, 19, 30, 37}},
    {RK_TOK_PRE_LLAMA3, 11, 5, {1, 4, 5, 9, 12}},
    {RK_TOK_PRE_DEFAULT, 0, 23, {5,  11, 12, 15, 16, 17, 18, 21, 22, 23, 26, 27,
                                 29, 33, 34, 35, 39, 40, 41, 43, 48, 49, 51}},
    {RK_TOK_PRE_DEFAULT, 1, 5, {1, 9, 13, 22, 25}},
    {RK_TOK_PRE_DEFAULT, 2, 10, {4, 5, 6, 10, 11, 16, 25, 26, 29, 32}},
    {RK_TOK_PRE_DEFAULT, 3, 24, {7,  8,  9,  10, 12, 13, 16, 17, 20, 21, 22, 25,
                                 27, 28, 31, 34, 35, 36, 37, 38, 41, 43, 44, 52}},
    {RK_TOK_PRE_DEFAULT, 4, 9, {5, 14, 16, 20, 21, 22, 28, 29, 32}},
    {RK_TOK_PRE_DEFAULT, 5, 11, {5, 9, 12, 15, 18, 24, 30, 33, 37, 50, 72}},
    {RK_TOK_PRE_DEFAULT, 6, 29, {1,  7,  8,  9,  10, 11, 12, 13, 14, 15, 17, 18, 19, 21, 22,
                                 23, 24, 25, 26, 28, 29, 30, 31, 32, 33, 34, 35, 37, 38}},
    {RK_TOK_PRE_DEFAULT, 7, 15, {3, 4, 7, 8, 11, 12, 15, 19, 22, 27, 29, 30, 31, 32, 33}},
    {RK_TOK_PRE_DEFAULT, 8, 2, {8, 10}},
    {RK_TOK_PRE_DEFAULT, 9, 8, {1, 3, 4, 5, 8, 9, 12, 14}},
    {RK_TOK_PRE_DEFAULT, 10, 5, {5, 12, 19, 30, 37}},
    {RK_TOK_PRE_DEFAULT, 11, 8, {1, 3, 4, 5, 6, 9, 10, 12}},
};

/* ---- 1. llama.cpp tokenizer vectors ------------------------------------- */
static void run_vectors(const char *name) {
    char rel[256], path[1024];
    vocab v;
    snprintf(rel, sizeof rel, "golden/tokenizer/%s", name);
    vocab_open_shared(&v, rel);

    size_t inp_len, out_len;
    snprintf(rel, sizeof rel, "golden/tokenizer/%s.inp", name);
    cr_assert(tb_shared_path(path, sizeof path, rel), "%s", path);
    char *inp = tb_read_file(path, &inp_len);
    snprintf(rel, sizeof rel, "golden/tokenizer/%s.out", name);
    cr_assert(tb_shared_path(path, sizeof path, rel), "%s", path);
    char *out = tb_read_file(path, &out_len);
    cr_assert(inp && out);

    static const char sep[] = "\n__ggml_vocab_test__\n";
    const size_t sep_len = sizeof sep - 1;
    size_t ip = 0, op = 0, n_case = 0, n_pass = 0;
    for (;;) {
        const char *m = memmem(inp + ip, inp_len - ip, sep, sep_len);
        if (!m) break;
        size_t case_len = (size_t)(m - (inp + ip));
        const char *nl = memchr(out + op, '\n', out_len - op);
        cr_assert(nl, "%s: .out has fewer lines than .inp", name);

        /* expected ids: one line of " id id ..." */
        int32_t want[512];
        size_t n_want = 0;
        const char *p = out + op;
        while (p < nl) {
            char *e;
            long id = strtol(p, &e, 10);
            if (e == p) break;
            cr_assert(n_want < 512);
            want[n_want++] = (int32_t)id;
            p = e;
        }
        int32_t *ids = NULL;
        size_t n_ids = 0;
        encode(v.t, inp + ip, case_len, false, false, &ids, &n_ids);
        bool ok = n_ids == n_want && (n_ids == 0 || memcmp(ids, want, n_ids * sizeof *ids) == 0);
        if (ok) {
            n_pass++;
        } else {
            fprintf(stderr, "%s case %zu \"%.*s\": want", name, n_case, (int)case_len, inp + ip);
            for (size_t i = 0; i < n_want; i++) fprintf(stderr, " %d", want[i]);
            fprintf(stderr, "\n  got");
            for (size_t i = 0; i < n_ids; i++) fprintf(stderr, " %d", ids[i]);
            fprintf(stderr, "\n");
        }
        free(ids);
        n_case++;
        ip += case_len + sep_len;
        op = (size_t)(nl - out) + 1;
    }
    fprintf(stderr, "tokenizer vectors %s: %zu/%zu pass\n", name, n_pass, n_case);
    cr_expect_eq(n_case, 46, "%s: %zu cases", name, n_case);
    cr_expect_eq(n_pass, n_case, "%s: %zu/%zu pass", name, n_pass, n_case);
    free(inp);
    free(out);
    vocab_close(&v);
}

Test(tokenizer_shared, vectors_gpt2) { run_vectors("ggml-vocab-gpt-2.gguf"); }
Test(tokenizer_shared, vectors_starcoder) { run_vectors("ggml-vocab-starcoder.gguf"); }
Test(tokenizer_shared, vectors_llama_spm) { run_vectors("ggml-vocab-llama-spm.gguf"); }

/* ---- 2. trained-model vocab goldens -------------------------------------- */

static void run_meta(const rk_tokenizer *t, const char *path) {
    json_object *root = json_object_from_file(path);
    cr_assert(root, "cannot parse %s", path);
    json_object *jp, *jids, *jg, *jgp, *jgt;
    cr_assert(json_object_object_get_ex(root, "prompt_text", &jp));
    cr_assert(json_object_object_get_ex(root, "ids", &jids));
    cr_assert(json_object_object_get_ex(root, "greedy_ids", &jg));
    cr_assert(json_object_object_get_ex(root, "greedy_pieces", &jgp));
    cr_assert(json_object_object_get_ex(root, "greedy_text", &jgt));

    const char *prompt = json_object_get_string(jp);
    int32_t *ids = NULL;
    size_t n_ids;
    encode(t, prompt, strlen(prompt), true, false, &ids, &n_ids);
    size_t n_want = json_object_array_length(jids);
    cr_expect_eq(n_ids, n_want, "%s: %zu ids vs %zu", path, n_ids, n_want);
    for (size_t i = 0; i < n_ids && i < n_want; i++) {
        int32_t w = json_object_get_int(json_object_array_get_idx(jids, i));
        cr_expect_eq(ids[i], w, "%s: id %zu: %d vs %d", path, i, ids[i], w);
        if (ids[i] != w) break;
    }
    free(ids);

    size_t n_g = json_object_array_length(jg);
    cr_assert_eq(n_g, json_object_array_length(jgp));
    char text[8192];
    size_t n_text = 0;
    for (size_t i = 0; i < n_g; i++) {
        int32_t id = json_object_get_int(json_object_array_get_idx(jg, i));
        const char *want = json_object_get_string(json_object_array_get_idx(jgp, i));
        char piece[256];
        size_t k = rk_tokenizer_piece(t, id, false, piece, sizeof piece);
        cr_assert(k <= sizeof piece);
        cr_expect(k == strlen(want) && memcmp(piece, want, k) == 0, "%s: piece of %d is \"%.*s\" (want \"%s\")", path,
                  id, (int)k, piece, want);
        cr_assert(n_text + k < sizeof text);
        memcpy(text + n_text, piece, k);
        n_text += k;
    }
    const char *gt = json_object_get_string(jgt);
    cr_expect(n_text == strlen(gt) && memcmp(text, gt, n_text) == 0, "%s: greedy_text", path);
    json_object_put(root);
}

static void run_model_goldens(const char *model) {
    char rel[256], path[1024];
    vocab v;
    snprintf(rel, sizeof rel, "models/%s/%s-f32.gguf", model, model);
    vocab_open_shared(&v, rel);
    static const char *const seqs[] = {"once_upon", "story_mid", "story_long"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(rel, sizeof rel, "golden/logits/%s/%s.meta.json", model, seqs[i]);
        if (!tb_shared_path(path, sizeof path, rel)) cr_skip_test("missing %s", rel);
        run_meta(v.t, path);
    }
    vocab_close(&v);
}

Test(tokenizer_shared, golden_stories260K) { run_model_goldens("stories260K"); }
Test(tokenizer_shared, golden_aidreams260K) { run_model_goldens("aidreams260K"); }

/* The whole perplexity text (minus its final newline) with BOS: 1822 ids. */
Test(tokenizer_shared, golden_perplexity_text) {
    char path[1024];
    vocab v;
    vocab_open_shared(&v, "models/stories260K/stories260K-f32.gguf");
    if (!tb_shared_path(path, sizeof path, "golden/perplexity/tinystories_sample_clean.txt"))
        cr_skip_test("missing perplexity text");
    size_t len;
    char *text = tb_read_file(path, &len);
    cr_assert(text && len > 0);
    if (text[len - 1] == '\n') len--;
    cr_assert(tb_shared_path(path, sizeof path, "golden/perplexity/tinystories_sample_clean.stories260K.ids.txt"));
    size_t ids_len;
    char *ids_txt = tb_read_file(path, &ids_len);
    cr_assert(ids_txt);
    int32_t *ids;
    size_t n_ids;
    encode(v.t, text, len, true, false, &ids, &n_ids);
    size_t n = 0;
    const char *p = ids_txt, *end = ids_txt + ids_len;
    while (p < end) {
        while (p < end && (*p < '0' || *p > '9')) p++;
        if (p >= end) break;
        long want = strtol(p, (char **)&p, 10);
        cr_assert(n < n_ids, "more golden ids than ours (%zu)", n_ids);
        cr_assert_eq(ids[n], want, "id %zu: %d vs %ld", n, ids[n], want);
        n++;
    }
    cr_expect_eq(n, 1822);
    cr_expect_eq(n_ids, n);
    free(ids);
    free(ids_txt);
    free(text);
    vocab_close(&v);
}

/* ---- 3. round trips over the corpus -------------------------------------- */

/* Three slices (about 4, 8, 16 KiB) of every corpus file. */
static void run_round_trips(const rk_tokenizer *t, const char *label) {
    char dir[1024];
    if (!tb_shared_path(dir, sizeof dir, "corpus")) cr_skip_test("missing corpus");
    DIR *d = opendir(dir);
    cr_assert(d);
    struct dirent *e;
    size_t n_files = 0, n_slices = 0, n_ok = 0, n_tokens = 0, n_bytes = 0;
    bool saw_python = false;
    while ((e = readdir(d))) {
        size_t nl = strlen(e->d_name);
        if (nl < 4 || strcmp(e->d_name + nl - 4, ".txt") != 0) continue;
        char path[2048];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        size_t len;
        char *s = tb_read_file(path, &len);
        cr_assert(s, "%s", path);
        if (strstr(e->d_name, "python")) saw_python = true;
        n_files++;
        static const size_t sizes[3] = {4096, 8192, 16384};
        for (int k = 0; k < 3; k++) {
            if (len < sizes[k] + 16) continue;
            /* start and end on character boundaries (invalid UTF-8 is tested apart) */
            size_t off = (len - sizes[k]) / 7 * (size_t)(2 * k + 1) + (size_t)k;
            size_t end = off + sizes[k];
            while (((unsigned char)s[off] & 0xC0) == 0x80) off++;
            while (end < len && ((unsigned char)s[end] & 0xC0) == 0x80) end++;
            size_t n_ids;
            n_slices++;
            if (round_trip(t, s + off, end - off, &n_ids)) n_ok++;
            else fprintf(stderr, "%s: %s slice at %zu+%zu\n", label, e->d_name, off, end - off);
            n_tokens += n_ids;
            n_bytes += end - off;
        }
        free(s);
    }
    closedir(d);
    fprintf(stderr, "round trip %s: %zu/%zu slices of %zu files, %.2f bytes/token\n", label, n_ok, n_slices, n_files,
            n_tokens ? (double)n_bytes / (double)n_tokens : 0.0);
    cr_expect(saw_python, "python docs missing from the corpus");
    cr_expect_geq(n_slices, 3 * n_files - 3);
    cr_expect_eq(n_ok, n_slices, "%s: %zu/%zu round trips", label, n_ok, n_slices);
}

static void round_trip_shared(const char *rel, const char *label) {
    vocab v;
    vocab_open_shared(&v, rel);
    run_round_trips(v.t, label);
    vocab_close(&v);
}

Test(tokenizer_shared, round_trip_gpt2, .timeout = 120) {
    round_trip_shared("golden/tokenizer/ggml-vocab-gpt-2.gguf", "gpt-2");
}
Test(tokenizer_shared, round_trip_starcoder, .timeout = 120) {
    round_trip_shared("golden/tokenizer/ggml-vocab-starcoder.gguf", "starcoder");
}
Test(tokenizer_shared, round_trip_llama_spm, .timeout = 120) {
    round_trip_shared("golden/tokenizer/ggml-vocab-llama-spm.gguf", "llama-spm");
}
Test(tokenizer_shared, round_trip_stories260K, .timeout = 120) {
    round_trip_shared("models/stories260K/stories260K-f32.gguf", "stories260K");
}
Test(tokenizer_shared, round_trip_default_model, .timeout = 120) {
    char path[1024];
    vocab v;
    if (!tb_default_model(path, sizeof path)) cr_skip_test("default model not in the cache");
    vocab_open_path(&v, path);
    cr_expect_str_eq(rk_tokenizer_pre_name(v.t), "starcoder"); /* SmolLM2: pre "smollm" */
    run_round_trips(v.t, "default model");
    vocab_close(&v);
}

/* ---- 4. special tokens of the default model ------------------------------ */

Test(tokenizer_shared, default_model_special) {
    char path[1024];
    vocab v;
    if (!tb_default_model(path, sizeof path)) cr_skip_test("default model not in the cache");
    vocab_open_path(&v, path);
    const rk_tokenizer *t = v.t;
    static const char chat[] = "<|im_start|>user\nHi<|im_end|>";
    int32_t *ids;
    size_t n, len;
    encode(t, chat, strlen(chat), false, true, &ids, &n);
    cr_assert_geq(n, 3);
    cr_expect_eq(ids[0], 1);
    cr_expect_eq(ids[n - 1], 2);
    for (size_t i = 1; i + 1 < n; i++) cr_expect(ids[i] != 1 && ids[i] != 2);
    char *mid = decode(t, ids + 1, n - 2, &len);
    cr_expect_str_eq(mid, "user\nHi");
    free(mid);
    char buf[64];
    cr_expect_eq(rk_tokenizer_piece(t, 2, false, buf, sizeof buf), 0);
    cr_expect_eq(rk_tokenizer_piece(t, 2, true, buf, sizeof buf), 10);
    cr_expect(memcmp(buf, "<|im_end|>", 10) == 0);
    free(ids);

    /* without parse_special the markers are plain text */
    encode(t, chat, strlen(chat), false, false, &ids, &n);
    for (size_t i = 0; i < n; i++) cr_expect(ids[i] != 1 && ids[i] != 2);
    char *back = decode(t, ids, n, &len);
    cr_expect_str_eq(back, chat);
    free(back);
    free(ids);

    cr_expect(rk_tokenizer_is_eog(t, 2));
    cr_expect(rk_tokenizer_is_eog(t, rk_tokenizer_eos(t)));
    cr_expect(!rk_tokenizer_is_eog(t, 1));
    cr_expect_eq(rk_tokenizer_find(t, "<|im_start|>"), 1);
    cr_expect_eq(rk_tokenizer_find(t, "<|im_end|>"), 2);
    cr_expect_eq(rk_tokenizer_find(t, "no such token"), -1);
    cr_expect(!rk_tokenizer_add_bos(t)); /* the file says add_bos_token = false */
    cr_expect(!rk_tokenizer_pre_fallback(t, NULL));
    vocab_close(&v);
}

/* ---- 5. malformed and extreme input -------------------------------------- */

/* Decodes encode(s) and compares with want. */
static void expect_decoded(const rk_tokenizer *t, const char *s, size_t n, const char *want, size_t n_want,
                           const char *what) {
    int32_t *ids = NULL;
    size_t n_ids, len;
    encode(t, s, n, false, false, &ids, &n_ids);
    char *back = decode(t, ids, n_ids, &len);
    cr_expect(len == n_want && memcmp(back, want, n_want) == 0, "%s: got \"%.*s\"", what, (int)len, back);
    free(back);
    free(ids);
}

static void run_malformed(const rk_tokenizer *t, const char *label) {
    size_t n_ids;
    if (rk_tokenizer_kind(t) == RK_TOK_BPE) {
        /* llama.cpp: every invalid byte becomes U+FFFD (a surrogate passes as is) */
        static const char bad[] =
            "ok \xff\xfe bad \xc3( cut \xe2\x82 \xf0\x9f\x98 \xed\xa0\x80 end\xc3\xf5\x80\x80\x80";
#define R "\xef\xbf\xbd"
        static const char want[] = "ok " R R " bad " R "( cut " R R " " R R R " \xed\xa0\x80 end" R R R R R;
#undef R
        expect_decoded(t, bad, sizeof bad - 1, want, sizeof want - 1, label);
    } else {
        /* SPM keeps the bytes (byte fallback) ... */
        static const char bad[] = "ok\xff\xfe"
                                  "ab \xc3(cd\xe2\x82";
        cr_expect(round_trip(t, bad, sizeof bad - 1, &n_ids), "%s: invalid UTF-8", label);
        /* ... but, as llama.cpp, groups bytes by the lead byte after escaping spaces, so
         * a stray lead byte can swallow part of a "\xe2\x96\x81" */
        expect_decoded(t, "x\xff y", 4, "x\xff\xe2\x96\x81y", 6, label);
    }
    int32_t *ids = NULL;
    size_t n = 99;
    encode(t, "", 0, false, true, &ids, &n);
    cr_expect_eq(n, 0, "%s: empty text", label);
    free(ids);
    encode(t, "", 0, true, false, &ids, &n);
    cr_expect_eq(n, rk_tokenizer_add_bos(t) ? 1u : 0u, "%s: empty text with BOS", label);
    free(ids);

    /* 100K spaces (then 100K newlines mixed with spaces): must come back quickly */
    size_t big = 100000;
    char *s = malloc(big);
    cr_assert(s);
    memset(s, ' ', big);
    cr_expect(round_trip(t, s, big, &n_ids), "%s: 100K spaces", label);
    cr_expect_gt(n_ids, 0);
    for (size_t i = 0; i < big; i++) s[i] = (i % 3) ? ' ' : '\n';
    cr_expect(round_trip(t, s, big, &n_ids), "%s: 100K mixed whitespace", label);
    memset(s, '7', big);
    cr_expect(round_trip(t, s, big, &n_ids), "%s: 100K digits", label);
    free(s);

    rk_err err = {0};
    cr_expect_eq(rk_tokenizer_encode(t, NULL, 5, false, false, &ids, &n, &err), RK_E_INVALID_ARG);
    cr_expect_eq(rk_tokenizer_encode(t, "x", RK_TOK_MAX_TEXT + 1, false, false, &ids, &n, &err), RK_E_INVALID_ARG);
    cr_expect_eq(rk_tokenizer_piece(t, -1, true, NULL, 0), 0);
    cr_expect_eq(rk_tokenizer_piece(t, rk_tokenizer_n_vocab(t), true, NULL, 0), 0);
}

static void malformed_shared(const char *rel, const char *label) {
    vocab v;
    vocab_open_shared(&v, rel);
    run_malformed(v.t, label);
    vocab_close(&v);
}

Test(tokenizer_shared, malformed_gpt2, .timeout = 60) {
    malformed_shared("golden/tokenizer/ggml-vocab-gpt-2.gguf", "gpt-2");
}
Test(tokenizer_shared, malformed_starcoder, .timeout = 60) {
    malformed_shared("golden/tokenizer/ggml-vocab-starcoder.gguf", "starcoder");
}
Test(tokenizer_shared, malformed_llama_spm, .timeout = 60) {
    malformed_shared("golden/tokenizer/ggml-vocab-llama-spm.gguf", "llama-spm");
}
Test(tokenizer_shared, malformed_stories260K, .timeout = 60) {
    malformed_shared("models/stories260K/stories260K-f32.gguf", "stories260K");
}

/* ---- 6. pre-tokenizer splits --------------------------------------------- */

Test(tokenizer, pretokenizer_rules) {
    size_t n_fail = 0;
    for (size_t c = 0; c < sizeof pretok_cases / sizeof pretok_cases[0]; c++) {
        const pretok_case *pc = &pretok_cases[c];
        const char *s = pretok_texts[pc->text];
        size_t *ends = NULL, n = 0;
        rk_err err = {0};
        cr_assert_eq(rk_tok_pretokenize(pc->pre, s, strlen(s), &ends, &n, &err), RK_OK, "%s", err.msg);
        bool ok = n == pc->n;
        for (size_t i = 0; ok && i < n; i++) ok = ends[i] == pc->ends[i];
        if (!ok) {
            n_fail++;
            fprintf(stderr, "pre %s text %d:\n  want", rk_tok_pre_rules_name(pc->pre), pc->text);
            size_t b = 0;
            for (size_t i = 0; i < pc->n; b = pc->ends[i++]) fprintf(stderr, " [%.*s]", (int)(pc->ends[i] - b), s + b);
            fprintf(stderr, "\n  got ");
            b = 0;
            for (size_t i = 0; i < n; b = ends[i++]) fprintf(stderr, " [%.*s]", (int)(ends[i] - b), s + b);
            fprintf(stderr, "\n");
        }
        free(ends);
    }
    cr_expect_eq(n_fail, 0, "%zu pre-tokenizer cases differ", n_fail);
}

/* ---- 7. Unicode helpers --------------------------------------------------- */

Test(tokenizer, unicode_categories) {
    cr_expect_eq(rk_unicode_category('a'), RK_UCAT_L);
    cr_expect_eq(rk_unicode_category('Z'), RK_UCAT_L);
    cr_expect_eq(rk_unicode_category('5'), RK_UCAT_N);
    cr_expect_eq(rk_unicode_category('!'), RK_UCAT_P);
    cr_expect_eq(rk_unicode_category('$'), RK_UCAT_S);
    cr_expect_eq(rk_unicode_category(' '), RK_UCAT_Z);
    cr_expect_eq(rk_unicode_category('\n'), RK_UCAT_C);
    cr_expect_eq(rk_unicode_category(0xE9), RK_UCAT_L);    /* é */
    cr_expect_eq(rk_unicode_category(0x0661), RK_UCAT_N);  /* Arabic-Indic one */
    cr_expect_eq(rk_unicode_category(0x2167), RK_UCAT_N);  /* Roman numeral eight (Nl) */
    cr_expect_eq(rk_unicode_category(0x4E00), RK_UCAT_L);  /* CJK */
    cr_expect_eq(rk_unicode_category(0x17D2), RK_UCAT_M);  /* Khmer coeng */
    cr_expect_eq(rk_unicode_category(0x1F600), RK_UCAT_S); /* emoji */
    cr_expect_eq(rk_unicode_category(0x0378), RK_UCAT_CN); /* unassigned */
    cr_expect_eq(rk_unicode_category(0xD800), RK_UCAT_C);  /* surrogate */
    cr_expect_eq(rk_unicode_category(0x10FFFF), RK_UCAT_CN);
    cr_expect_eq(rk_unicode_category(0x110000), RK_UCAT_CN);
    cr_expect(rk_unicode_is_space(0x3000) && rk_unicode_is_space(0xA0));
    cr_expect(rk_unicode_is_space('\t') && rk_unicode_is_space(0x85));
    cr_expect(!rk_unicode_is_space(0x200B) && !rk_unicode_is_space('x'));
    cr_expect_eq(rk_unicode_flags(0x3000), RK_UF_SPACE);
    cr_expect_eq(rk_unicode_flags(0xFF0C), RK_UF_PUNCT); /* fullwidth comma */

    char b[4];
    uint32_t cp;
    bool ok;
    static const uint32_t cps[] = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF};
    for (size_t i = 0; i < sizeof cps / sizeof cps[0]; i++) {
        size_t k = rk_utf8_encode(cps[i], b);
        cr_expect_eq(rk_utf8_decode(b, k, &cp, &ok), k);
        cr_expect(ok && cp == cps[i], "U+%X", cps[i]);
    }
    cr_expect_eq(rk_utf8_decode("\xe2\x82", 2, &cp, &ok), 1);
    cr_expect(!ok && cp == 0xFFFD);
    cr_expect_eq(rk_utf8_decode("\x80", 1, &cp, &ok), 1);
    cr_expect(!ok);
}

Test(tokenizer, utf8_stream) {
    static const char text[] = "h\xc3\xa9llo \xe2\x86\x92 \xf0\x9f\x98\x80!\xff\xe2\x82";
    const size_t n = sizeof text - 1;
    /* feed in every chunk size; no output chunk may end inside a character */
    for (size_t step = 1; step <= 5; step++) {
        rk_utf8_stream st;
        rk_utf8_stream_init(&st);
        char out[64];
        size_t n_out = 0;
        for (size_t i = 0; i < n; i += step) {
            size_t k = step < n - i ? step : n - i;
            char chunk[16];
            size_t w = rk_utf8_stream_push(&st, text + i, k, chunk, sizeof chunk);
            if (w && i + k < n - 2) { /* before the deliberately cut tail */
                unsigned char last = (unsigned char)chunk[w - 1];
                cr_expect(last < 0x80 || (last & 0xC0) == 0x80 || last == 0xFF, "step %zu: chunk ends in a lead byte",
                          step);
            }
            memcpy(out + n_out, chunk, w);
            n_out += w;
        }
        n_out += rk_utf8_stream_flush(&st, out + n_out, sizeof out - n_out);
        cr_expect(n_out == n && memcmp(out, text, n) == 0, "step %zu", step);
    }
    rk_utf8_stream st;
    rk_utf8_stream_init(&st);
    char small[6];
    cr_expect_eq(rk_utf8_stream_push(&st, "abcd", 4, small, sizeof small), SIZE_MAX);
    cr_expect_eq(rk_utf8_stream_push(&st, "ab\xe2", 3, small, sizeof small), 2);
    cr_expect_eq(rk_utf8_stream_push(&st, "\x82", 1, small, sizeof small), 0);
    cr_expect_eq(rk_utf8_stream_push(&st, "\xac", 1, small, sizeof small), 3);
    cr_expect(memcmp(small, "\xe2\x82\xac", 3) == 0);
}

/* The fingerprint goes into model fingerprints: it must not drift. */
Test(tokenizer_shared, hash_pinned) {
    vocab v;
    vocab_open_shared(&v, "models/stories260K/stories260K-f32.gguf");
    cr_expect_eq(rk_tokenizer_hash(v.t), 0x09a86c68d3398539ull, "%016llx", (unsigned long long)rk_tokenizer_hash(v.t));
    vocab_close(&v);
    vocab_open_shared(&v, "golden/tokenizer/ggml-vocab-gpt-2.gguf");
    cr_expect_eq(rk_tokenizer_hash(v.t), 0x779aa645033227caull, "%016llx", (unsigned long long)rk_tokenizer_hash(v.t));
    vocab_close(&v);
}

/* ---- 8. hand-made vocabularies --------------------------------------------- */

typedef struct kv_spec {
    const char *model;      /* NULL: leave tokenizer.ggml.model out */
    const char *pre;        /* NULL: no tokenizer.ggml.pre */
    const char *const *tok; /* NULL: no tokens */
    size_t n_tok;
    const float *scores;
    size_t n_scores;
    const int32_t *types;
    const char *const *merges;
    size_t n_merges;
} kv_spec;

static rk_status build(const kv_spec *k, vocab *v, rk_err *err) {
    rk_gguf_writer *w;
    size_t len;
    memset(v, 0, sizeof *v);
    cr_assert_eq(rk_gguf_writer_create(0, &w, err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.architecture", "llama", err), RK_OK);
    if (k->model) cr_assert_eq(rk_gguf_writer_set_str(w, "tokenizer.ggml.model", k->model, err), RK_OK);
    if (k->pre) cr_assert_eq(rk_gguf_writer_set_str(w, "tokenizer.ggml.pre", k->pre, err), RK_OK);
    if (k->tok) cr_assert_eq(rk_gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", k->tok, k->n_tok, err), RK_OK);
    if (k->scores)
        cr_assert_eq(rk_gguf_writer_set_arr(w, "tokenizer.ggml.scores", RK_GGUF_F32, k->scores, k->n_scores, err),
                     RK_OK);
    if (k->types)
        cr_assert_eq(rk_gguf_writer_set_arr(w, "tokenizer.ggml.token_type", RK_GGUF_I32, k->types, k->n_tok, err),
                     RK_OK);
    if (k->merges)
        cr_assert_eq(rk_gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", k->merges, k->n_merges, err), RK_OK);
    cr_assert_eq(rk_gguf_writer_finish(w, &v->bytes, &len, err), RK_OK, "%s", err->msg);
    rk_gguf_writer_destroy(w);
    cr_assert_eq(rk_gguf_parse(v->bytes, len, &v->g, err), RK_OK, "%s", err->msg);
    return rk_tokenizer_create(v->g, &v->t, err);
}

/* "▁" = \342\226\201 */
static const char *const spm_tok[] = {"<unk>", "<s>", "</s>", "\342\226\201",  "a",      "b",
                                      "c",     "ab",  "bc",   "\342\226\201a", "<0x0A>", "<|user|>"};
static const float spm_scores[] = {0, 0, 0, -1, -2, -2, -2, -5, -3, -4, 0, 0};
static const int32_t spm_types[] = {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6, 4};
#define N_SPM (sizeof spm_tok / sizeof spm_tok[0])

Test(tokenizer, handmade_spm) {
    rk_err err = {0};
    vocab v;
    kv_spec k = {"llama", NULL, spm_tok, N_SPM, spm_scores, N_SPM, spm_types, NULL, 0};
    cr_assert_eq(build(&k, &v, &err), RK_OK, "%s", err.msg);
    int32_t *ids;
    size_t n;
    /* "abc": "bc" (-3) beats "ab" (-5); the prefix "▁" and "a" then merge (-4) */
    encode(v.t, "abc", 3, true, false, &ids, &n);
    cr_assert_eq(n, 3);
    cr_expect(ids[0] == 1 && ids[1] == 9 && ids[2] == 8, "%d %d %d", ids[0], ids[1], ids[2]);
    free(ids);
    /* newline has a byte token, 'x' has none -> unk; user-defined tokens always split */
    encode(v.t, "a\nx<|user|>b", 12, false, false, &ids, &n);
    /* the text after a special token gets the dummy prefix again: "▁b" -> "▁" "b" */
    cr_assert_eq(n, 6);
    cr_expect(ids[0] == 9 && ids[1] == 10 && ids[2] == 0 && ids[3] == 11 && ids[4] == 3 && ids[5] == 5,
              "%d %d %d %d %d %d", ids[0], ids[1], ids[2], ids[3], ids[4], ids[5]);
    free(ids);
    char buf[8];
    cr_expect_eq(rk_tokenizer_piece(v.t, 9, false, buf, sizeof buf), 2);
    cr_expect(memcmp(buf, " a", 2) == 0);
    cr_expect_eq(rk_tokenizer_piece(v.t, 10, false, buf, sizeof buf), 1);
    cr_expect_eq(buf[0], '\n');
    cr_expect_eq(rk_tokenizer_piece(v.t, 0, false, buf, sizeof buf), 0);
    cr_expect_eq(rk_tokenizer_piece(v.t, 9, false, buf, 1), 2); /* too small: length only */
    cr_expect(rk_tokenizer_is_eog(v.t, 2) && !rk_tokenizer_is_eog(v.t, 1));

    /* the fingerprint follows the scores */
    uint64_t h = rk_tokenizer_hash(v.t);
    vocab v2;
    cr_assert_eq(build(&k, &v2, &err), RK_OK);
    cr_expect_eq(rk_tokenizer_hash(v2.t), h);
    vocab_close(&v2);
    float sc[N_SPM];
    memcpy(sc, spm_scores, sizeof sc);
    sc[7] = -5.5f;
    k.scores = sc;
    cr_assert_eq(build(&k, &v2, &err), RK_OK);
    cr_expect_neq(rk_tokenizer_hash(v2.t), h);
    vocab_close(&v2);
    vocab_close(&v);
}

/* Byte-level: "Ġ" = U+0120 = \304\240 */
static const char *const bpe_tok[] = {"a", "b", "c", "\304\240", "ab", "\304\240ab", "bc", "<|endoftext|>"};
static const char *const bpe_merges[] = {"a b", "\304\240 ab", "b c", "broken"};

Test(tokenizer, handmade_bpe) {
    rk_err err = {0};
    vocab v;
    kv_spec k = {"gpt2", "some-future-pre", bpe_tok, 8, NULL, 0, NULL, bpe_merges, 4};
    cr_assert_eq(build(&k, &v, &err), RK_OK, "%s", err.msg);
    rk_str stored;
    cr_expect(rk_tokenizer_pre_fallback(v.t, &stored));
    cr_expect(rk_str_eq(stored, "some-future-pre"));
    cr_expect_str_eq(rk_tokenizer_pre_name(v.t), "gpt-2");
    cr_expect(rk_tokenizer_is_eog(v.t, 7)); /* by its text */
    cr_expect_eq(rk_tokenizer_type(v.t, 7), RK_TOKTYPE_CONTROL);
    int32_t *ids;
    size_t n;
    /* " abc": word " abc"; "a b" (rank 0) first, then "Ġ ab" (1); "b c" is then stale */
    encode(v.t, " abc", 4, false, false, &ids, &n);
    cr_assert_eq(n, 2);
    cr_expect(ids[0] == 5 && ids[1] == 2, "%d %d", ids[0], ids[1]);
    free(ids);
    char buf[8];
    cr_expect_eq(rk_tokenizer_piece(v.t, 5, false, buf, sizeof buf), 3);
    cr_expect(memcmp(buf, " ab", 3) == 0);
    /* a byte with no token is dropped, as in llama.cpp */
    encode(v.t, "a\n", 2, false, false, &ids, &n);
    cr_expect(n == 1 && ids[0] == 0);
    free(ids);
    vocab_close(&v);
}

Test(tokenizer, handmade_errors) {
    rk_err err = {0};
    vocab v;
    kv_spec k = {NULL, NULL, spm_tok, N_SPM, spm_scores, N_SPM, spm_types, NULL, 0};
    cr_expect_eq(build(&k, &v, &err), RK_E_NOT_FOUND, "%s", err.msg);
    vocab_close(&v);
    k.model = "bert";
    cr_expect_eq(build(&k, &v, &err), RK_E_UNSUPPORTED, "%s", err.msg);
    cr_expect(strstr(err.msg, "bert"), "%s", err.msg);
    vocab_close(&v);
    k.model = "llama";
    k.n_scores = N_SPM - 1;
    cr_expect_eq(build(&k, &v, &err), RK_E_GGUF_COUNT, "%s", err.msg);
    vocab_close(&v);
    k.n_scores = N_SPM;
    k.tok = NULL;
    cr_expect_eq(build(&k, &v, &err), RK_E_NOT_FOUND, "%s", err.msg);
    cr_expect(strstr(err.msg, "tokenizer.ggml.tokens"), "%s", err.msg);
    vocab_close(&v);
    kv_spec kb = {"gpt2", "gpt-2", bpe_tok, 8, NULL, 0, NULL, NULL, 0};
    cr_expect_eq(build(&kb, &v, &err), RK_E_NOT_FOUND, "%s", err.msg);
    cr_expect(strstr(err.msg, "merges"), "%s", err.msg);
    vocab_close(&v);
    rk_tokenizer_destroy(NULL);
}
