/* ridgekv chat and ask, end to end: chat through a pseudo-terminal (Ctrl-C mid-answer,
 * Ctrl-D), chat through a pipe (turns, commands, save/load, dropping old turns), ask on
 * a sample document with the default model, ask's refusals (missing file, too long,
 * Ctrl-C while reading), and --kv / --fill applied by both. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_harness.h"
#include "tb.h"

Test(chat_ask, chat_tty_ctrl_c_stops_answer_then_ctrl_d_exits) {
    char sp[1024];
    stories(sp, sizeof sp);
    /* cpu_ref on one thread writes ~1k tok/s: a 400-token answer leaves time to interrupt */
    char *argv[] = {(char *)bin(), "chat", "-m", sp, "-n", "400", "--backend", "cpu_ref", "-t", "1", NULL};
    term t;
    term_start(&t, argv);
    cr_assert(term_expect(&t, 0, ">>> ", 20), "no prompt: %s", t.buf);
#ifdef RK_HAVE_LIBEDIT /* the test is built with the binary's libedit setting */
    cr_expect(strstr(t.buf, "line editing: libedit"), "built with libedit: %s", t.buf);
#else
    cr_expect(strstr(t.buf, "line editing: plain"), "built without libedit: %s", t.buf);
#endif

    /* Ctrl-C as soon as the answer starts; the answer may rarely finish first, so retry */
    bool stopped = false;
    for (int attempt = 0; attempt < 4 && !stopped; attempt++) {
        term_settle(&t, 150);
        size_t mark = t.len;
        term_send(&t, "Once upon a time\r");
        cr_assert(term_expect(&t, mark, "Once upon a time\r\n", 10), "no echo: %s", t.buf + mark);
        size_t ans = strstr(t.buf + mark, "Once upon a time\r\n") - t.buf + strlen("Once upon a time\r\n");
        double end = now_s() + 10;
        while (t.len == ans && !t.eof && now_s() < end) term_pump(&t, 5);
        cr_assert(t.len > ans, "no answer started: %s", t.buf + mark);
        term_send(&t, "\x03");
        double t0 = now_s();
        bool back = term_expect(&t, ans, ">>> ", 10);
        cr_assert(back, "prompt did not come back after Ctrl-C (%.1f s, %s): %s", now_s() - t0,
                  t.eof ? "terminal closed" : "still open", t.buf + mark);
        stopped = strstr(t.buf + ans, "[stopped]") != NULL;
    }
    cr_expect(stopped, "Ctrl-C never stopped an answer: %s", t.buf);

    /* the chat goes on: a new turn gets an answer */
    term_settle(&t, 150);
    size_t mark = t.len;
    term_send(&t, "The little dog\r");
    cr_assert(term_expect(&t, mark, "The little dog\r\n", 10), "%s", t.buf + mark);
    size_t ans = strstr(t.buf + mark, "The little dog\r\n") - t.buf + strlen("The little dog\r\n");
    cr_assert(term_expect(&t, ans, ">>> ", 30), "second turn did not finish: %s", t.buf + mark);
    const char *p = strstr(t.buf + ans, ">>> ");
    cr_expect(p - (t.buf + ans) > 8, "second turn has no answer: %s", t.buf + mark);
    cr_expect(!strstr(t.buf + ans, "[stopped]"), "%s", t.buf + mark);

    /* Ctrl-C at an empty prompt gives a hint and keeps going; Ctrl-D leaves with 0 */
    term_settle(&t, 150);
    mark = t.len;
    term_send(&t, "\x03");
    cr_expect(term_expect(&t, mark, "Ctrl-D to leave", 10), "no hint: %s", t.buf + mark);
    cr_assert(term_expect(&t, mark, ">>> ", 10), "%s", t.buf + mark);
    term_settle(&t, 150);
    term_send(&t, "\x04");
    int code = term_wait(&t, 20);
    cr_expect_eq(code, 0, "exit %d after Ctrl-D: %s", code, t.buf);
    free(t.buf);
}

Test(chat_ask, chat_pipe_two_turns_stats_reset) {
    char sp[1024];
    stories(sp, sizeof sp);
    result r = run_argv("Once upon a time\nThe cat sat on the mat\n/stats\n/reset\n/stats\n",
                        (char *[]){"chat", "-m", sp, "-n", "24", "--temp", "0", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(!strstr(r.out, ">>>"), "no prompts when stdin is not a terminal: %s", r.out);
    cr_expect(!strchr(r.out, '\033'), "no escape sequences: %s", r.out);
    const char *s1 = strstr(r.out, "context   ");
    cr_assert(s1, "no /stats output: %s", r.out);
    cr_expect(s1 > r.out + 20, "two answers come before /stats: %s", r.out);
    cr_expect(s1[-1] == '\n', "each answer ends with a newline: %s", r.out);
    cr_expect(strstr(s1, "2 exchanges"), "%s", s1);
    long in_ctx = num_after(s1, "context   "), last_prefill = num_after(s1, "prefill   last ");
    cr_expect(in_ctx > 48 && in_ctx <= 512, "tokens in context: %ld\n%s", in_ctx, s1);
    /* the cache is kept across turns: turn 2 reads only its own tokens */
    cr_expect(last_prefill > 0 && last_prefill < in_ctx - 24, "turn 2 read %ld of %ld tokens\n%s", last_prefill, in_ctx,
              s1);
    const char *kv = strstr(s1, "kv cache  ");
    cr_expect(kv && num_after(kv, "(") > 0 && strstr(kv, "bytes/token x "), "KV bytes: %s", s1);
    const char *s2 = strstr(s1 + 1, "context   ");
    cr_assert(s2, "second /stats missing: %s", r.out);
    cr_expect(!strncmp(s2, "context   0 / 512 tokens", 24), "after /reset: %s", s2);
    cr_expect(strstr(s2, "0 exchanges"), "%s", s2);
    done(&r);
}

Test(chat_ask, chat_save_load_roundtrip) {
    char sp[1024], dir[64], path[96], cmds[512];
    stories(sp, sizeof sp);
    snprintf(path, sizeof path, "%s/chat.json", tmp_dir(dir, sizeof dir));
    snprintf(cmds, sizeof cmds, "Hello\n/save %s\n/reset\n/load %s\n/stats\n/load /nonexistent/x.json\n/stats\n", path,
             path);
    result r = run_argv(cmds, (char *[]){"chat", "-m", sp, "--system", "Be brief.", "-n", "8", "--temp", "0", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.out, "1 exchange"), "loaded conversation has one exchange: %s", r.out);
    cr_expect(strstr(r.err, "/nonexistent/x.json"), "a failed /load names the file: %s", r.err);
    const char *s2 = strstr(r.out, "context   ");
    cr_expect(s2 && strstr(s2 + 1, "1 exchange"), "a failed /load keeps the conversation: %s", r.out);
    json_object *root = json_object_from_file(path);
    cr_assert(root, "saved file is not JSON");
    json_object *msgs;
    cr_assert(json_object_object_get_ex(root, "messages", &msgs));
    cr_assert_eq(json_object_array_length(msgs), 3);
    const char *roles[] = {"system", "user", "assistant"};
    for (size_t i = 0; i < 3; i++) {
        json_object *role;
        cr_assert(json_object_object_get_ex(json_object_array_get_idx(msgs, i), "role", &role));
        cr_expect_str_eq(json_object_get_string(role), roles[i]);
    }
    json_object *c1;
    json_object_object_get_ex(json_object_array_get_idx(msgs, 1), "content", &c1);
    cr_expect_str_eq(json_object_get_string(c1), "Hello");
    json_object_put(root);
    unlink(path);
    rmdir(dir);
    done(&r);
}

Test(chat_ask, chat_context_full_drops_oldest_turns) {
    char sp[1024];
    stories(sp, sizeof sp);
    /* ctx 512, 200 tokens of answer room: the third turn cannot keep the first */
    char big[4096] = "";
    for (int i = 0; i < 150; i++) strcat(big, "the big dog ran ");
    char input[8192];
    snprintf(input, sizeof input, "Once upon a time\nThe cat sat\nA bird sang\nThe end\n%s\n/stats\n", big);
    result r =
        run_argv(input, (char *[]){"chat", "-m", sp, "-n", "200", "--temp", "0", "--system", "Tell a story.", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "context full"), "%s", r.err);
    cr_expect(strstr(r.err, "dropped the oldest"), "%s", r.err);
    cr_expect(strstr(r.err, "does not fit"), "a message longer than the context is refused: %s", r.err);
    const char *s = strstr(r.out, "context   ");
    cr_assert(s, "%s", r.out);
    long in_ctx = num_after(s, "context   ");
    cr_expect(in_ctx > 0 && in_ctx <= 512, "%s", s);
    done(&r);
}

Test(chat_ask, chat_rejects_run_options) {
    result r = run_argv("", (char *[]){"chat", "-p", "hi", NULL});
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "-p does not apply"), "%s", r.err);
    done(&r);
}

Test(chat_ask, ask_answers_from_the_document) {
    char mp[1024], doc[1024];
    if (!tb_default_model(mp, sizeof mp))
        cr_skip_test("default model absent (run `ridgekv pull`); ask on a real model not checked");
    result r = run_argv(NULL, (char *[]){"ask", "-m", mp, "--doc", sample(doc, sizeof doc, "ridgekv_design.md"),
                                         "What is the name of the method ridgekv plans for long prompts?", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strcasestr(r.out, "ridgefill"), "answer should name RidgeFill: %s", r.out);
    /* a 509-token document stays exact with or without cached maps (it is shorter than the
     * tail): RidgeFill is not named, nor any maps path */
    cr_expect(!strcasestr(r.err, "ridgefill") && !strstr(r.err, "/maps/"), "%s", r.err);
    cr_expect(strstr(r.err, "time to first token"), "%s", r.err);
    done(&r);
}

Test(chat_ask, ask_plumbing_progress_and_timings) {
    char sp[1024], dir[64], doc[96];
    stories(sp, sizeof sp);
    snprintf(doc, sizeof doc, "%s/small.txt", tmp_dir(dir, sizeof dir));
    write_text(doc, "Lily had a red ball. She played with it in the park every day with her dog Max.\n");
    result r =
        run_argv(NULL, (char *[]){"ask", "-m", sp, "-n", "16", "-b", "8", "--doc", doc, "What did Lily have?", NULL});
    unlink(doc);
    rmdir(dir);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strlen(r.out) > 1 && r.out[strlen(r.out) - 1] == '\n', "answer on stdout: %s", r.out);
    cr_expect(strstr(r.err, "accelerations: lowram off"), "%s", r.err);
    cr_expect(!strchr(r.err, '\r'), "no bar redraws when stderr is not a terminal: %s", r.err);
    long total = num_after(r.err, "read 0/");
    char fin[64];
    snprintf(fin, sizeof fin, "read %ld/%ld tokens (100%%)", total, total);
    cr_expect(total > 100 && strstr(r.err, fin), "progress lines: %s", r.err);
    cr_expect(strstr(r.err, "tok/s); time to first token"), "%s", r.err);
    done(&r);
}

Test(chat_ask, ask_missing_document_exit_5_names_it) {
    char sp[1024];
    stories(sp, sizeof sp);
    result r = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", "/nonexistent/notes.txt", "Why?", NULL});
    cr_expect_eq(r.code, 5, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "/nonexistent/notes.txt"), "%s", r.err);
    done(&r);
    r = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", "/etc", "Why?", NULL});
    cr_expect_eq(r.code, 5, "a directory: exit %d: %s", r.code, r.err);
    done(&r);
    r = run_argv(NULL, (char *[]){"ask", "-m", sp, "Why?", NULL});
    cr_expect_eq(r.code, 2, "no --doc: exit %d", r.code);
    done(&r);
}

Test(chat_ask, ask_document_longer_than_context_exit_4_with_numbers) {
    char sp[1024], doc[1024];
    stories(sp, sizeof sp);
    sample(doc, sizeof doc, "austen_pride_and_prejudice_ch1.txt");
    result r = run_argv(NULL, (char *[]){"ask", "-m", sp, "-c", "256", "--doc", doc, "Who came?", NULL});
    cr_expect_eq(r.code, 4, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "austen_pride_and_prejudice_ch1.txt: "), "names the document: %s", r.err);
    cr_expect(strstr(r.err, "the context holds 256"), "%s", r.err);
    long doc_tokens = num_after(r.err, "austen_pride_and_prejudice_ch1.txt: ");
    long cut = num_after(r.err, "Cut at least ");
    cr_expect(doc_tokens > 256, "document tokens: %s", r.err);
    /* 64 answer room (a quarter of 256): the cut leaves exactly what fits */
    cr_expect(cut > doc_tokens - 256 && cut < doc_tokens, "cut %ld of %ld: %s", cut, doc_tokens, r.err);
    cr_expect_str_eq(r.out, "", "no answer, no silent truncation");
    done(&r);
}

Test(chat_ask, ask_ctrl_c_while_reading_exit_130) {
    char mp[1024], doc[1024];
    if (!tb_default_model(mp, sizeof mp)) cr_skip_test("default model absent (run `ridgekv pull`)");
    sample(doc, sizeof doc, "austen_persuasion_ch1.txt");
    char dir[64], err[96];
    snprintf(err, sizeof err, "%s/ask.err", tmp_dir(dir, sizeof dir));
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600), nul = open("/dev/null", O_RDWR);
        dup2(nul, 0), dup2(nul, 1), dup2(e, 2);
        execl(bin(), bin(), "ask", "-m", mp, "-b", "16", "--doc", doc, "Who is Sir Walter?", (char *)NULL);
        _exit(127);
    }
    /* wait for the first progress line, then Ctrl-C */
    double end = now_s() + 30;
    size_t len = 0;
    char *text = NULL;
    while (now_s() < end) {
        free(text);
        text = tb_read_file(err, &len);
        if (text && strstr(text, "read 0/")) break;
        usleep(20000);
    }
    cr_assert(text && strstr(text, "read 0/"), "no progress: %s", text ? text : "");
    double t0 = now_s();
    kill(pid, SIGINT);
    int st;
    waitpid(pid, &st, 0);
    double dt = now_s() - t0;
    free(text);
    text = tb_read_file(err, &len);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 130, "status %d: %s", st, text);
    cr_expect(strstr(text, "stopped while reading"), "%s", text);
    cr_expect(dt < 15, "took %.1f s to stop", dt);
    free(text);
    unlink(err);
    rmdir(dir);
}

/* CHAT_ASK.md points to USAGE.md for the flags: USAGE.md quotes both helps as printed */
Test(chat_ask, docs_quote_help_exactly) {
    const char *src = getenv("RK_SOURCE_DIR");
    cr_assert(src, "RK_SOURCE_DIR not set (meson sets it)");
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/USAGE.md", src);
    size_t len;
    char *doc = tb_read_file(path, &len);
    cr_assert(doc, "cannot read %s", path);
    const char *cmds[] = {"chat", "ask"};
    for (int i = 0; i < 2; i++) {
        result r = run_argv(NULL, (char *[]){(char *)cmds[i], "--help", NULL});
        cr_expect_eq(r.code, 0);
        cr_expect(strstr(doc, r.out), "docs/USAGE.md does not quote `ridgekv %s --help` as printed:\n%s", cmds[i],
                  r.out);
        done(&r);
    }
    free(doc);
}

/* ---- --kv and --fill: the session's policy and the prefill's fill, in chat and ask -------- */

/* A story of about `words` words for prompts longer than the 512-token exact tail. */
static char *long_text(int reps) {
    const char *line = "The little dog ran in the park and the cat sat on the mat. ";
    char *b = malloc(strlen(line) * (size_t)reps + 1);
    b[0] = 0;
    for (int i = 0; i < reps; i++) strcat(b, line);
    return b;
}

Test(chat_ask, chat_kv_lowram_compresses_the_conversation) {
    char sp[1024];
    stories(sp, sizeof sp);
    char *msg = long_text(20), input[8192];
    snprintf(input, sizeof input, "%s\nThe end\n/stats\n", msg);
    free(msg);
    result r =
        run_argv(input, (char *[]){"chat", "-m", sp, "-n", "8", "--temp", "0", "--kv", "lowram:window=32", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    const char *kv = strstr(r.out, "kv cache  ");
    cr_assert(kv, "%s", r.out);
    long rows = num_after(kv, ", lowram, ");
    cr_expect(rows > 0, "the LowRAM session compressed old rows: %s", kv);
    cr_expect(strstr(kv, "rows compressed"), "%s", kv);
    done(&r);
    /* the same conversation in f16: no compression, plain bytes per token */
    r = run_argv("Once upon a time\n/stats\n", (char *[]){"chat", "-m", sp, "-n", "8", "--temp", "0", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    kv = strstr(r.out, "kv cache  ");
    cr_assert(kv, "%s", r.out);
    cr_expect(num_after(kv, "(") == 5 * 2 * 4 * 8 * 2 && strstr(kv, "x ") && strstr(kv, "f16)"),
              "f16: 640 bytes/token: %s", kv);
    done(&r);
}

Test(chat_ask, chat_fill_identity_fills_a_long_message) {
    char sp[1024];
    stories(sp, sizeof sp);
    char *msg = long_text(25), input[8192];
    snprintf(input, sizeof input, "%s\n", msg);
    free(msg);
    char *args_fill[] = {"chat", "-m", sp,        "-c", "1024",   "--ctx-overflow-ok", "-n",     "4",   "--temp",
                         "0",    "-v", "--split", "2",  "--fill", "identity",          "--tail", "512", NULL};
    result r = run_argv(input, args_fill);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    long filled = num_after(r.err, "; filled ");
    long prompt = num_after(r.err, "prefill ");
    /* rows with >= 512 prompt tokens after them, in the 3 layers past the split */
    cr_expect(prompt > 520 && filled == 3 * (prompt - 512), "prompt %ld, filled %ld: %s", prompt, filled, r.err);
    done(&r);
    char *args_off[] = {"chat", "-m", sp, "-c", "1024", "--ctx-overflow-ok", "-n", "4", "--temp", "0", "-v", NULL};
    r = run_argv(input, args_off);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect_eq(num_after(r.err, "; filled "), 0, "%s", r.err);
    done(&r);
}

Test(chat_ask, ask_applies_kv_and_fill) {
    char sp[1024], dir[64], doc[96];
    stories(sp, sizeof sp);
    snprintf(doc, sizeof doc, "%s/long.txt", tmp_dir(dir, sizeof dir));
    char *text = long_text(25);
    write_text(doc, text);
    free(text);
    result r = run_argv(NULL, (char *[]){"ask", "-m", sp, "-c", "1024", "--ctx-overflow-ok", "-n", "8", "-v", "--kv",
                                         "lowram:window=32", "--doc", doc, "Who ran?", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "lowram on (fitted on the prompt), document cache on; lowram KV cache"), "%s", r.err);
    cr_expect(num_after(r.err, "KV lowram, ") > 0, "rows compressed: %s", r.err);
    done(&r);
    r = run_argv(NULL, (char *[]){"ask",      "-m",     sp,    "-c",         "1024",  "--ctx-overflow-ok",
                                  "-n",       "8",      "-v",  "--split",    "2",     "--fill",
                                  "identity", "--tail", "512", "--no-cache", "--doc", doc,
                                  "Who ran?", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    /* the documents are read apart from the question (the document cache): their last 512 are exact */
    long prompt = num_after(r.err, "prefill "), filled = num_after(r.err, "; filled "),
         docs = num_after(r.err, "the documents are the first ");
    cr_expect(prompt > 520 && docs > 520 && docs < prompt && filled == 3 * (docs - 512),
              "prompt %ld, documents %ld, filled %ld: %s", prompt, docs, filled, r.err);
    cr_expect(strstr(r.err, "accelerations: RidgeFill identity for this") && strstr(r.err, "exact tail 512"), "%s",
              r.err);
    done(&r);
    unlink(doc);
    rmdir(dir);
}

/* One prompt builder: `ask` and a JSONL ask request with the same document (named as the
 * file) and question read the same number of tokens, and answer the same (greedy). */
Test(chat_ask, ask_and_jsonl_ask_build_the_same_prompt) {
    char sp[1024], dir[64], doc[96];
    stories(sp, sizeof sp);
    snprintf(doc, sizeof doc, "%s/notes.txt", tmp_dir(dir, sizeof dir));
    const char *text = "Lily had a red ball. She played with it in the park every day with her dog Max.\n";
    write_text(doc, text);
    result a = run_argv(NULL, (char *[]){"ask", "-m", sp, "-n", "6", "-v", "--doc", doc, "What did Lily have?", NULL});
    cr_assert_eq(a.code, 0, "%s", a.err);
    long n_cli = num_after(a.err, "document, prompt ");
    json_object *req = json_object_new_object(), *docs = json_object_new_array(), *d = json_object_new_object();
    json_object_object_add(d, "name", json_object_new_string("notes.txt"));
    json_object_object_add(d, "text", json_object_new_string(text));
    json_object_array_add(docs, d);
    json_object_object_add(req, "id", json_object_new_int(1));
    json_object_object_add(req, "op", json_object_new_string("ask"));
    json_object_object_add(req, "docs", docs);
    json_object_object_add(req, "question", json_object_new_string("What did Lily have?"));
    json_object_object_add(req, "max_tokens", json_object_new_int(6));
    json_object_object_add(req, "temperature", json_object_new_int(0));
    json_object_object_add(req, "stream", json_object_new_boolean(false));
    char line[2048];
    snprintf(line, sizeof line, "%s\n", json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN));
    json_object_put(req);
    result s = run_argv(line, (char *[]){"serve", "--jsonl", "-m", sp, NULL});
    cr_assert_eq(s.code, 0, "%s", s.err);
    json_object *ev = json_tokener_parse(s.out), *u, *pt, *t;
    cr_assert(ev && json_object_object_get_ex(ev, "usage", &u) && json_object_object_get_ex(u, "prompt_tokens", &pt),
              "%s", s.out);
    cr_expect(n_cli > 50 && json_object_get_int64(pt) == n_cli, "ask read %ld tokens, JSONL ask %lld", n_cli,
              (long long)json_object_get_int64(pt));
    cr_assert(json_object_object_get_ex(ev, "text", &t));
    char want[512];
    snprintf(want, sizeof want, "%s\n", json_object_get_string(t));
    cr_expect_str_eq(a.out, want, "the same greedy answer");
    json_object_put(ev);
    done(&a);
    done(&s);
    unlink(doc);
    rmdir(dir);
}
