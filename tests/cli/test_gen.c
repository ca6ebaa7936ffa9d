/* rk_generate and rk_conv (rk_gen.h) on the tiny stories260K model: stop reasons, the
 * streamed text, cancellation, the conversation rules (system first, the ask prompt,
 * prefix reuse, the overflow rule, answer room) and save/load. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_gen.h"
#include "tb.h"

static rk_model *g_model;

static void load_model(void) {
    char buf[1024];
    if (!tb_shared_path(buf, sizeof buf, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    rk_err e = {0};
    cr_assert_eq(rk_model_load(buf, &g_model, &e), RK_OK, "%s", e.msg);
}

static void free_model(void) { rk_model_destroy(g_model); }

static rk_session *session_b(int n_ctx, rk_kv_kind kv, int n_batch) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = n_ctx;
    sp.n_batch = n_batch;
    sp.n_threads = 1;
    sp.kv.kind = kv;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(g_model, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

static rk_session *session(int n_ctx, rk_kv_kind kv) { return session_b(n_ctx, kv, 0); }

static size_t tokenize(const char *text, int32_t **ids) {
    size_t n = 0;
    rk_err e = {0};
    cr_assert_eq(rk_model_tokenize(g_model, text, strlen(text), true, true, ids, &n, &e), RK_OK, "%s", e.msg);
    return n;
}

static rk_gen_params greedy(int max_tokens) {
    rk_gen_params p = rk_gen_params_default();
    p.sampler.temp = 0;
    p.max_tokens = max_tokens;
    return p;
}

/* Collects what on_token hands out; stops after `stop_after` tokens when > 0. */
typedef struct stream {
    char text[8192];
    size_t n;
    int calls, stop_after;
    bool all_valid;
} stream;

static bool collect(void *ud, int32_t tok, const char *text, size_t n) {
    stream *s = ud;
    cr_assert_geq(tok, 0);
    s->all_valid &= rk_utf8_valid(text, n, NULL);
    cr_assert_lt(s->n + n, sizeof s->text);
    memcpy(s->text + s->n, text, n);
    s->n += n;
    s->text[s->n] = 0;
    s->calls++;
    return !(s->stop_after > 0 && s->calls >= s->stop_after);
}

TestSuite(gen, .init = load_model, .fini = free_model);

Test(gen, greedy_length_and_the_streamed_text) {
    rk_session *s = session(512, RK_KV_F32);
    int32_t *ids = NULL;
    size_t n = tokenize("Once upon a time", &ids);
    stream st = {.all_valid = true};
    rk_gen_params p = greedy(12);
    p.on_token = collect;
    p.token_ud = &st;
    rk_gen_result r = {0};
    rk_err e = {0};
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(r.stop, RK_STOP_LENGTH);
    cr_expect_str_eq(rk_stop_reason_name(r.stop), "length");
    cr_expect_eq(r.n_gen, 12);
    cr_expect_eq(st.calls, 12, "one call per generated token");
    cr_expect_eq(r.n_prompt, (int64_t)n);
    cr_expect_eq(r.n_prefill, (int64_t)n);
    /* golden greedy text (as the CLI test): the streamed part plus the rest is the text */
    cr_expect(!strncmp(r.text, ", there was a little girl named Lily.", 37), "%s", r.text);
    cr_expect(st.all_valid);
    cr_expect_eq(r.n_streamed, st.n);
    cr_expect(r.n_text >= st.n && !memcmp(r.text, st.text, st.n));
    cr_expect_eq(strlen(r.text), r.n_text);
    /* the cache holds the prompt and every generated token but the last (sampled only) */
    cr_expect_eq(rk_session_n_past(s), (int64_t)n + 11);
    cr_expect_eq(r.filled_rows, 0u);
    cr_expect(r.ttft_s >= r.prefill_s && r.prefill_tok_s > 0 && r.decode_tok_s > 0);
    rk_gen_result_deinit(&r);
    rk_gen_result_deinit(&r); /* a deinitialised result may be deinitialised again */
    free(ids);
    rk_session_destroy(s);
}

Test(gen, stop_string_context_and_prefill_only) {
    rk_session *s = session(32, RK_KV_F16);
    int32_t *ids = NULL;
    size_t n = tokenize("Once upon a time", &ids);
    rk_gen_result r = {0};
    rk_err e = {0};
    /* the context: 32 - 5 evaluated + 1 sampled */
    rk_gen_params p = greedy(-1);
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(r.stop, RK_STOP_CONTEXT);
    cr_expect_eq((int64_t)n + r.n_gen, 33);
    cr_expect_eq(rk_session_n_past(s), 32);
    rk_gen_result_deinit(&r);
    /* a stop string that starts inside a token ("ittle gir"): the text ends before it */
    const char *stop[] = {"zzz", "ittle gir"};
    p = greedy(40);
    p.stop = stop;
    p.n_stop = 2;
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(r.stop, RK_STOP_STRING);
    cr_expect_str_eq(r.text, ", there was a l");
    rk_gen_result_deinit(&r);
    /* max_tokens 0: prefill only, nothing sampled */
    p = greedy(0);
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_OK, "%s", e.msg);
    cr_expect(r.stop == RK_STOP_LENGTH && r.n_gen == 0 && r.ttft_s < 0 && r.n_text == 0);
    cr_expect_eq(rk_session_n_past(s), (int64_t)n);
    rk_gen_result_deinit(&r);
    /* refusals name the numbers and leave the result alone */
    int32_t big[40];
    for (int i = 0; i < 40; i++) big[i] = ids[i % n];
    cr_expect_eq(rk_generate(g_model, s, big, 32, &p, &r, &e), RK_E_CONTEXT);
    cr_expect(strstr(e.msg, "32 tokens") && strstr(e.msg, "context holds 32"), "%s", e.msg);
    cr_expect_eq(rk_generate(g_model, s, ids, 0, &p, &r, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "empty"), "%s", e.msg);
    cr_expect(r.text == NULL && r.tokens == NULL);
    free(ids);
    rk_session_destroy(s);
}

static int g_progress_calls;
static bool cancel_at_first(void *ud, int64_t done, int64_t total) {
    (void)ud, (void)done, (void)total;
    g_progress_calls++;
    return false;
}

Test(gen, cancel_in_prefill_and_in_decode) {
    rk_session *s = session_b(512, RK_KV_F16, 4); /* chunks of 4: a cancel can land before the last */
    int32_t *ids = NULL;
    size_t n = tokenize("Once upon a time there was a little girl who liked to play in the park", &ids);
    rk_gen_result r = {0};
    rk_err e = {0};
    rk_gen_params p = greedy(8);
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_OK);
    rk_gen_result_deinit(&r);
    const int64_t keep = 6;
    /* prefill cancelled: RK_E_CANCELLED, the kept rows stay */
    p.n_reuse = keep;
    p.progress = cancel_at_first;
    g_progress_calls = 0;
    cr_expect_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_E_CANCELLED);
    cr_expect_eq(g_progress_calls, 1);
    cr_expect_eq(rk_session_n_past(s), keep);
    /* decode cancelled by the token callback after 3 tokens */
    stream st = {.all_valid = true, .stop_after = 3};
    p = greedy(20);
    p.on_token = collect;
    p.token_ud = &st;
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(r.stop, RK_STOP_CANCELLED);
    cr_expect_eq(r.n_gen, 3);
    cr_expect_eq(rk_session_n_past(s), (int64_t)n + 2);
    rk_gen_result_deinit(&r);
    /* n_reuse beyond what the session holds is a caller error */
    rk_session_reset(s);
    p = greedy(2);
    p.n_reuse = 3;
    cr_expect_eq(rk_generate(g_model, s, ids, n, &p, &r, &e), RK_E_INVALID_ARG);
    free(ids);
    rk_session_destroy(s);
}

Test(gen, reused_prefix_gives_the_same_answer_as_a_fresh_read) {
    rk_session *s = session(512, RK_KV_F32), *fresh = session(512, RK_KV_F32);
    int32_t *ids = NULL;
    size_t n = tokenize("Once upon a time there was a little girl named Lily. She loved to play", &ids);
    rk_gen_result a = {0}, b = {0};
    rk_err e = {0};
    rk_gen_params p = greedy(4);
    cr_assert_eq(rk_generate(g_model, s, ids, 10, &p, &a, &e), RK_OK);
    rk_gen_result_deinit(&a);
    /* the first 10 tokens are in s: read only the rest */
    p = greedy(16);
    p.n_reuse = 10;
    cr_assert_eq(rk_generate(g_model, s, ids, n, &p, &a, &e), RK_OK);
    cr_expect_eq(a.n_prefill, (int64_t)n - 10);
    p.n_reuse = 0;
    cr_assert_eq(rk_generate(g_model, fresh, ids, n, &p, &b, &e), RK_OK);
    cr_expect_eq(b.n_prefill, (int64_t)n);
    cr_expect_str_eq(a.text, b.text, "f32 cache: the kept rows are the rows a fresh read writes");
    rk_gen_result_deinit(&a);
    rk_gen_result_deinit(&b);
    free(ids);
    rk_session_destroy(s);
    rk_session_destroy(fresh);
}

/* ---- conversation ---------------------------------------------------------------------- */

Test(gen, system_message_only_first_and_roles_checked) {
    rk_session *s = session(512, RK_KV_F16);
    rk_conv *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_conv_create(g_model, s, NULL, &c, &e), RK_OK);
    cr_expect_eq(rk_conv_add(c, "user", "hi", 2, &e), RK_OK);
    cr_expect_eq(rk_conv_add(c, "system", "late", 4, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "only the first message"), "%s", e.msg);
    cr_expect_eq(rk_conv_add(c, "robot", "x", 1, &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_conv_add(c, "user", "a\0b", 3, &e), RK_E_INVALID_ARG, "a NUL inside the content");
    cr_expect_eq(rk_conv_n_messages(c), 1u, "refused messages are not added");
    rk_conv_reset(c, true);
    cr_expect_eq(rk_conv_n_messages(c), 0u, "no system message to keep");
    cr_expect_eq(rk_conv_add(c, "system", "first", 5, &e), RK_OK);
    cr_expect_eq(rk_conv_add(c, "user", "q", 1, &e), RK_OK);
    rk_conv_reset(c, true);
    cr_expect_eq(rk_conv_n_messages(c), 1u);
    cr_expect_str_eq(rk_conv_message(c, 0).role, "system");
    rk_conv_destroy(c);
    rk_session_destroy(s);
}

Test(gen, ask_prompt_text_and_its_tokens) {
    rk_session *s = session(512, RK_KV_F16);
    rk_conv *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_conv_create(g_model, s, NULL, &c, &e), RK_OK);
    rk_doc d[2] = {{"a.txt", "Tom has a ball.\n\n", 17}, {NULL, "Sue has a cat.", 14}};
    cr_assert_eq(rk_conv_add_ask(c, NULL, d, 2, "Who has a cat?", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_conv_n_messages(c), 2u);
    cr_expect_str_eq(rk_conv_message(c, 0).content, RK_ASK_SYSTEM);
    cr_expect_str_eq(rk_conv_message(c, 1).content,
                     "Document 1 of 2: a.txt\n\"\"\"\nTom has a ball.\n\"\"\"\n\n"
                     "Document 2 of 2\n\"\"\"\nSue has a cat.\n\"\"\"\n\nQuestion: Who has a cat?");
    rk_conv_destroy(c);
    /* one named document: "Document: NAME" */
    cr_assert_eq(rk_conv_create(g_model, s, NULL, &c, &e), RK_OK);
    cr_assert_eq(rk_conv_add_ask(c, "Be brief.", d, 1, "Q?", &e), RK_OK);
    cr_expect_str_eq(rk_conv_message(c, 0).content, "Be brief.");
    cr_expect_str_eq(rk_conv_message(c, 1).content, "Document: a.txt\n\"\"\"\nTom has a ball.\n\"\"\"\n\nQuestion: Q?");
    /* the prompt: the markup between the contents tokenized with special tokens (BOS
     * first), each content tokenized as text */
    int32_t *ids = NULL;
    size_t n = 0;
    cr_assert_eq(rk_conv_prompt(c, &ids, &n, &e), RK_OK);
    cr_assert_eq(rk_conv_family(c), RK_CHAT_CHATML, "stories260K names no template");
    const struct {
        const char *text;
        bool markup;
    } part[] = {{"<|im_start|>system\n", true},
                {"Be brief.", false},
                {"<|im_end|>\n<|im_start|>user\n", true},
                {rk_conv_message(c, 1).content, false},
                {"<|im_end|>\n<|im_start|>assistant\n", true}};
    int32_t want[1024];
    size_t nw = 0;
    for (size_t i = 0; i < 5; i++) {
        int32_t *t = NULL;
        size_t nt = 0;
        cr_assert_eq(
            rk_model_tokenize(g_model, part[i].text, strlen(part[i].text), i == 0, part[i].markup, &t, &nt, &e), RK_OK);
        cr_assert_leq(nw + nt, 1024u);
        memcpy(want + nw, t, nt * sizeof *t);
        nw += nt;
        free(t);
    }
    cr_expect_eq(ids[0], rk_model_token_bos(g_model), "BOS first");
    cr_assert_eq(n, nw);
    cr_expect_arr_eq(ids, want, n * sizeof *ids);
    free(ids);
    rk_conv_destroy(c);
    rk_session_destroy(s);
}

Test(gen, conversation_reuses_the_cache_between_turns) {
    rk_session *s = session(512, RK_KV_F32);
    rk_conv *c = NULL;
    rk_conv_params cp = {.n_answer = 16, .room_div = 2, .drop_oldest = true};
    rk_err e = {0};
    cr_assert_eq(rk_conv_create(g_model, s, &cp, &c, &e), RK_OK);
    cr_assert_eq(rk_conv_add(c, "system", "Tell a story.", 13, &e), RK_OK);
    cr_assert_eq(rk_conv_add(c, "user", "Once upon a time", 16, &e), RK_OK);
    rk_gen_params p = greedy(16);
    rk_gen_result r = {0};
    cr_assert_eq(rk_conv_generate(c, &p, &r, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_conv_last_fit(c).n_reused, 0);
    cr_expect_eq(r.n_prefill, r.n_prompt);
    const int64_t after1 = rk_session_n_past(s);
    cr_assert_eq(rk_conv_n_messages(c), 3u);
    cr_expect_str_eq(rk_conv_message(c, 2).role, "assistant");
    cr_expect_str_eq(rk_conv_message(c, 2).content, r.text);
    rk_gen_result_deinit(&r);
    cr_assert_eq(rk_conv_add(c, "user", "The cat sat", 11, &e), RK_OK);
    cr_assert_eq(rk_conv_generate(c, &p, &r, &e), RK_OK, "%s", e.msg);
    /* turn 2 keeps every row turn 1 left and reads only what follows */
    cr_expect_eq(rk_conv_last_fit(c).n_reused, after1);
    cr_expect_eq(r.n_prefill, r.n_prompt - after1);
    cr_expect_eq(rk_conv_n_exchanges(c), 2u);
    /* the same conversation read from scratch answers the same */
    rk_session *s2 = session(512, RK_KV_F32);
    rk_conv *c2 = NULL;
    cr_assert_eq(rk_conv_create(g_model, s2, &cp, &c2, &e), RK_OK);
    for (size_t i = 0; i + 1 < rk_conv_n_messages(c); i++) {
        rk_chat_msg m = rk_conv_message(c, i);
        cr_assert_eq(rk_conv_add(c2, m.role, m.content, strlen(m.content), &e), RK_OK);
    }
    rk_gen_result r2 = {0};
    cr_assert_eq(rk_conv_generate(c2, &p, &r2, &e), RK_OK);
    cr_expect_eq(r2.n_prompt, r.n_prompt, "the model's own answer tokens are what re-tokenizing gives here");
    cr_expect_str_eq(r2.text, r.text);
    rk_gen_result_deinit(&r);
    rk_gen_result_deinit(&r2);
    rk_conv_destroy(c2);
    rk_session_destroy(s2);
    rk_conv_destroy(c);
    rk_session_destroy(s);
}

Test(gen, overflow_rule_drops_oldest_or_refuses) {
    rk_session *s = session(256, RK_KV_F16);
    rk_conv *c = NULL;
    rk_conv_params cp = {.n_answer = 60, .room_div = 2, .drop_oldest = true};
    rk_err e = {0};
    cr_assert_eq(rk_conv_create(g_model, s, &cp, &c, &e), RK_OK);
    cr_expect_eq(rk_conv_answer_room(c), 60);
    cr_assert_eq(rk_conv_add(c, "system", "Be brief.", 9, &e), RK_OK);
    rk_gen_params p = greedy(40);
    rk_gen_result r = {0};
    const char *turns[] = {"Once upon a time there was a dog", "The cat sat on the mat and looked", "A bird sang"};
    int dropped = 0;
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(rk_conv_add(c, "user", turns[i], strlen(turns[i]), &e), RK_OK);
        cr_assert_eq(rk_conv_generate(c, &p, &r, &e), RK_OK, "turn %d: %s", i, e.msg);
        const rk_conv_fit f = rk_conv_last_fit(c);
        cr_expect_leq(f.n_prompt + f.n_room, f.n_ctx, "turn %d fits with its room", i);
        dropped += f.n_dropped;
        rk_gen_result_deinit(&r);
    }
    cr_expect_gt(dropped, 0, "three exchanges of ~100 tokens do not fit 256 with 60 of room");
    cr_expect_str_eq(rk_conv_message(c, 0).role, "system", "the system message stays");
    cr_expect_str_eq(rk_conv_message(c, rk_conv_n_messages(c) - 2).content, turns[2], "the newest stays");
    /* a message that does not fit even alone: refused, nothing added */
    char big[4096] = "";
    for (int i = 0; i < 120; i++) strcat(big, "the dog ran ");
    size_t before = rk_conv_n_messages(c);
    cr_assert_eq(rk_conv_add(c, "user", big, strlen(big), &e), RK_OK);
    cr_expect_eq(rk_conv_generate(c, &p, &r, &e), RK_E_CONTEXT);
    cr_expect(rk_conv_last_fit(c).too_long);
    cr_expect_str_eq(rk_conv_message(c, rk_conv_n_messages(c) - 1).content, big, "the caller pops it");
    rk_conv_pop(c);
    cr_expect_leq(rk_conv_n_messages(c), before);
    rk_conv_destroy(c);
    /* without drop_oldest (ask, JSONL): the rule refuses instead */
    cp = (rk_conv_params){.n_answer = 200, .room_div = 4};
    cr_assert_eq(rk_conv_create(g_model, s, &cp, &c, &e), RK_OK);
    cr_expect_eq(rk_conv_answer_room(c), 64, "capped at a quarter of 256");
    cr_assert_eq(rk_conv_add(c, "user", big, strlen(big), &e), RK_OK);
    cr_expect_eq(rk_conv_generate(c, &p, &r, &e), RK_E_CONTEXT);
    cr_expect(strstr(e.msg, "context holds 256"), "%s", e.msg);
    cr_expect_eq(rk_conv_last_fit(c).n_dropped, 0);
    rk_conv_destroy(c);
    rk_session_destroy(s);
}

Test(gen, save_load_roundtrip_with_or_without_kv) {
    char dir[] = "/tmp/rkgenXXXXXX", path[128], kvp[160];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/conv.json", dir);
    snprintf(kvp, sizeof kvp, "%s.kv", path);
    rk_session *s = session(512, RK_KV_F16);
    rk_conv *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_conv_create(g_model, s, NULL, &c, &e), RK_OK);
    cr_assert_eq(rk_conv_add(c, "system", "Be brief.", 9, &e), RK_OK);
    cr_assert_eq(rk_conv_add(c, "user", "Hello \"there\"\n", 14, &e), RK_OK);
    rk_gen_params p = greedy(6);
    rk_gen_result r = {0};
    cr_assert_eq(rk_conv_generate(c, &p, &r, &e), RK_OK);
    rk_gen_result_deinit(&r);
    bool kv_saved = true, kv_loaded = true;
    cr_assert_eq(rk_conv_save(c, path, &kv_saved, &e), RK_OK, "%s", e.msg);
    /* the KV block goes beside the messages exactly when the session can export it */
    void *blk = NULL;
    size_t nb = 0;
    const rk_status ex = rk_session_kv_export(s, 0, rk_session_n_past(s), &blk, &nb, NULL);
    free(blk);
    cr_expect_eq(kv_saved, ex == RK_OK);
    cr_expect_eq(access(kvp, F_OK) == 0, ex == RK_OK);
    rk_session *s2 = session(512, RK_KV_F16);
    rk_conv *c2 = NULL;
    cr_assert_eq(rk_conv_create(g_model, s2, NULL, &c2, &e), RK_OK);
    cr_assert_eq(rk_conv_load(c2, path, &kv_loaded, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(kv_loaded, ex == RK_OK, "no block: the next turn reads the messages");
    cr_assert_eq(rk_conv_n_messages(c2), 3u);
    for (size_t i = 0; i < 3; i++) {
        cr_expect_str_eq(rk_conv_message(c2, i).role, rk_conv_message(c, i).role);
        cr_expect_str_eq(rk_conv_message(c2, i).content, rk_conv_message(c, i).content);
    }
    /* a file that breaks the rules is refused and the conversation stays */
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\",\"content\":\"b\"}]}", f);
    fclose(f);
    cr_expect_eq(rk_conv_load(c2, path, NULL, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "only the first message") && strstr(e.msg, path), "%s", e.msg);
    cr_expect_eq(rk_conv_n_messages(c2), 3u);
    cr_expect_neq(rk_conv_load(c2, "/nonexistent/x.json", NULL, &e), RK_OK);
    cr_expect(strstr(e.msg, "/nonexistent/x.json"), "%s", e.msg);
    unlink(path);
    unlink(kvp);
    rmdir(dir);
    rk_conv_destroy(c2);
    rk_conv_destroy(c);
    rk_session_destroy(s2);
    rk_session_destroy(s);
}

Test(gen, utf8_checks) {
    size_t bad = 0;
    cr_expect(rk_utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 14, NULL));
    cr_expect(!rk_utf8_valid("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", 13, &bad) && bad == 10,
              "cut inside the emoji");
    cr_expect(!rk_utf8_valid("ab\xc0\xaf", 4, &bad) && bad == 2, "overlong at 2");
    cr_expect(!rk_utf8_valid("\xed\xa0\x80", 3, &bad) && bad == 0, "surrogate");
    cr_expect_eq(rk_utf8_char((const unsigned char *)"\xe2\x82", 2), 0, "a proper prefix");
    cr_expect_eq(rk_utf8_char((const unsigned char *)"\xf4\x90\x80\x80", 4), -1, "past U+10FFFF");
    cr_expect_eq(rk_utf8_char((const unsigned char *)"\xe2\x82\xac", 3), 3);
}
