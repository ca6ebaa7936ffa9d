/* The first hour of a llama.cpp user, end to end on the binary:
 * progress lines with an ETA, answers capped by the answer room with a cut marker,
 * history recalling whole messages (pty), one prompt for CLI and JSONL ask, one
 * system-first rule, SIGPIPE -> exit 5, --flag=value, unquoted questions, seeds, refused
 * flags, --verbose-prompt, tokenize, --stop / -r, CRLF and non-UTF-8 documents, help vs docs. */
#include <ctype.h>
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

#include "tb.h"
#include "cli_harness.h"


static const char *default_model(char *buf, size_t cap) {
    if (!tb_default_model(buf, cap)) cr_skip_test("the default model is not in the cache (ridgekv pull)");
    return buf;
}

/* ---- SIGPIPE: a closed stdout is exit 5 -------------------------------------------- */
/* Runs argv with stdout a pipe whose read end is closed after `keep` bytes; stdin from
 * input (a file). Returns the raw wait status. */
static int run_closed_stdout(char *const argv[], const char *input, size_t keep) {
    char in[1024];
    cr_assert(tb_tmp_path(in, sizeof in, "rkux-in", ".txt"), "%s", in);
    write_text(in, input ? input : "");
    int p[2];
    cr_assert(pipe(p) == 0);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int i0 = open(in, O_RDONLY), dn = open("/dev/null", O_WRONLY);
        dup2(i0, 0), dup2(p[1], 1), dup2(dn, 2);
        close(p[0]), close(p[1]);
        setsid();
        execv(argv[0], argv);
        _exit(127);
    }
    close(p[1]);
    char buf[64];
    size_t got = 0;
    double end = now_s() + 240; /* sanitizer builds on a busy machine are slow */
    while (got < keep && now_s() < end) {
        ssize_t k = read(p[0], buf, keep - got < sizeof buf ? keep - got : sizeof buf);
        if (k <= 0) break;
        got += (size_t)k;
    }
    close(p[0]);
    int st = 0;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid) break;
        if (now_s() > end + 30) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            break;
        }
        usleep(20000);
    }
    unlink(in);
    cr_assert(got == keep, "the child wrote only %zu bytes", got);
    return st;
}

Test(ux, closed_stdout_is_exit_5_for_run_ask_chat) {
    char mp[1024], doc[1024];
    default_model(mp, sizeof mp);
    sample(doc, sizeof doc, "ridgekv_design.md");
    char *run_args[] = {(char *)bin(), "run", "-m", mp, "-p", "Once upon a time", "-n", "80", "--temp", "0", NULL};
    char *ask_args[] = {(char *)bin(), "ask", "-m",   mp,         "--doc", doc,      "-n",
                        "80",          "-c",  "2048", "Describe", "the",   "design", NULL};
    char *chat_args[] = {(char *)bin(), "chat", "-m", mp, "-n", "80", "--temp", "0", NULL};
    struct {
        const char *name;
        char *const *argv;
        const char *input;
        size_t keep; /* bytes read before the pipe is closed: `| head -c 4`, or `| true` (0) for
                        answers that may be shorter (every answer ends with a newline write) */
    } cases[] = {{"run", run_args, NULL, 4},
                 {"ask", ask_args, NULL, 0},
                 {"chat", chat_args, "Tell me a long story about a dragon.\nAnd another one.\n", 0}};
    for (size_t i = 0; i < 3; i++) {
        int st = run_closed_stdout(cases[i].argv, cases[i].input, cases[i].keep);
        cr_expect(!WIFSIGNALED(st), "%s died by signal %d", cases[i].name, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 5, "%s: status %d (want exit 5)", cases[i].name,
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

/* ---- --flag=value, refused flags, unquoted questions ------------------------------ */
Test(ux, flag_equals_value_is_the_same_flag) {
    char sp[1024];
    stories(sp, sizeof sp);
    result a = run_argv(NULL, (char *[]){"run", "-m", sp, "-p", "Once upon", "-n", "12", "--temp", "0", NULL});
    char mflag[1100];
    snprintf(mflag, sizeof mflag, "--model=%s", sp);
    result b = run_argv(NULL, (char *[]){"run", mflag, "--prompt=Once upon", "--n-predict=12", "--temp=0", NULL});
    cr_assert_eq(a.code, 0, "%s", a.err);
    cr_assert_eq(b.code, 0, "%s", b.err);
    cr_expect_str_eq(a.out, b.out);
    cr_expect(num_after(a.err, "generated ") == 12, "%s", a.err);
    done(&a), done(&b);
    /* a value that itself looks like --x=y stays the value of a text flag */
    result c = run_argv(NULL, (char *[]){"run", "-m", sp, "-p", "--x=y", "-n", "1", "--verbose-prompt", NULL});
    cr_expect_eq(c.code, 0, "%s", c.err);
    cr_expect(strstr(c.err, "--x=y"), "%s", c.err);
    done(&c);
    result d = run_argv(NULL, (char *[]){"run", "-m", sp, "--n-predict=zz", "-p", "x", NULL});
    cr_expect_eq(d.code, 2);
    cr_expect(strstr(d.err, "--n-predict expects an integer"), "%s", d.err);
    done(&d);
}

Test(ux, flags_a_command_does_not_use_are_refused) {
    char sp[1024];
    stories(sp, sizeof sp);
    struct {
        char *args[10];
        const char *flag;
    } cases[] = {
        {{"serve", "--jsonl", "-m", sp, "--chat", NULL}, "--chat"},
        {{"serve", "--jsonl", "-m", sp, "--stop", "x", NULL}, "--stop"},
        {{"chat", "-m", sp, "--json", NULL}, "--json"},
        {{"ask", "-m", sp, "--doc", "x", "-f", "y", "q", NULL}, "-f"},
        {{"bench", "-m", sp, "--system", "x", NULL}, "--system"},
        {{"run", "-m", sp, "-p", "x", "--json", NULL}, "--json"},
        {{"tokenize", "-m", sp, "--temp", "0", "x", NULL}, "--temp"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        result r = run_argv("", cases[i].args);
        cr_expect_eq(r.code, 2, "%s %s: exit %d: %s", cases[i].args[0], cases[i].flag, r.code, r.err);
        char want[96];
        snprintf(want, sizeof want, "%s does not apply to %s", cases[i].flag, cases[i].args[0]);
        cr_expect(strstr(r.err, want), "%s: %s", want, r.err);
        done(&r);
    }
    /* a map file that does not exist stops serve before it reads a line */
    result r = run_argv("", (char *[]){"serve", "--jsonl", "-m", sp, "--ridgefill", "/nonexistent/maps.gguf", NULL});
    cr_expect_neq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "/nonexistent/maps.gguf"), "%s", r.err);
    done(&r);
}

/* The rendered prompt of --verbose-prompt (between "prompt (N tokens):" and "prompt tokens:"). */
static char *shown_prompt(const char *err) {
    const char *a = strstr(err, "tokens):\n");
    const char *b = a ? strstr(a, "prompt tokens:\n") : NULL;
    cr_assert(a && b, "no --verbose-prompt output: %s", err);
    a += strlen("tokens):\n");
    return strndup(a, (size_t)(b - a));
}

/* The token lines of --verbose-prompt. */
static char *shown_tokens(const char *err) {
    const char *b = strstr(err, "prompt tokens:\n");
    cr_assert(b, "%s", err);
    b += strlen("prompt tokens:\n");
    const char *e = b;
    while (e && (*e == ' ' || (*e >= '0' && *e <= '9'))) { /* lines "%6d 'piece'" */
        e = strchr(e, '\n');
        if (e) e++;
    }
    return strndup(b, e ? (size_t)(e - b) : strlen(b));
}

Test(ux, ask_joins_unquoted_words_and_verbose_prompt_shows_them) {
    char sp[1024], dir[64], small[128];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(small, sizeof small, "%s/note.txt", dir);
    write_text(small, "The cat is called Tom.\n");
    result r = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", small, "-n", "1", "What", "is", "the", "cat",
                                         "called?", "--verbose-prompt", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    char *pr = shown_prompt(r.err);
    cr_expect(strstr(pr, "Question: What is the cat called?"), "%s", pr);
    cr_expect(strstr(pr, "Document: note.txt"), "%s", pr);
    cr_expect(strstr(pr, "<|im_start|>"), "the template's markup is shown: %s", pr);
    char *toks = shown_tokens(r.err);
    cr_expect(strstr(toks, "'Tom'") || strstr(toks, "'T'"), "%s", toks);
    free(pr), free(toks);
    done(&r);
    unlink(small), rmdir(dir);
}

/* ---- seeds -------------------------------------------------------------------------- */
static char *run_out(const char *sp, const char *seed, const char *temp, char **err) {
    char *args[16] = {"run", "-m", (char *)sp, "-p", "Once upon a time", "-n", "24", "--temp", (char *)temp, "-v"};
    int n = 10;
    if (seed) args[n++] = "--seed", args[n++] = (char *)seed;
    args[n] = NULL;
    result r = run_argv(NULL, args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    if (err) *err = r.err;
    else free(r.err);
    return r.out;
}

Test(ux, default_seed_is_random_and_printed_seed_repeats) {
    char sp[1024];
    stories(sp, sizeof sp);
    char *e1, *e2;
    char *a = run_out(sp, NULL, "1.0", &e1), *b = run_out(sp, NULL, "1.0", &e2);
    const char *p1 = strstr(e1, "seed "), *p2 = strstr(e2, "seed ");
    cr_assert(p1 && p2, "-v prints the seed: %s", e1);
    unsigned long long s1 = strtoull(p1 + 5, NULL, 10), s2 = strtoull(p2 + 5, NULL, 10);
    cr_expect(strstr(e1, "(random"), "-v says the seed is random: %s", e1);
    cr_expect(s1 != s2, "two default runs drew the same seed %llu", s1);
    cr_expect(strcmp(a, b) != 0, "two runs with random seeds wrote the same 24 tokens at temp 1: %s", a);
    /* the printed seed repeats the first run exactly */
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", s1);
    char *c = run_out(sp, seed, "1.0", NULL);
    cr_expect_str_eq(c, a);
    /* --seed -1 is random too; --seed N twice is the same; --temp 0 ignores the seed */
    char *ee;
    char *d = run_out(sp, "-1", "1.0", &ee);
    cr_expect(strstr(ee, "(random"), "%s", ee);
    char *f = run_out(sp, "7", "1.0", NULL), *g = run_out(sp, "7", "1.0", NULL);
    cr_expect_str_eq(f, g);
    char *h = run_out(sp, NULL, "0", NULL), *k = run_out(sp, NULL, "0", NULL);
    cr_expect_str_eq(h, k);
    free(a), free(b), free(c), free(d), free(f), free(g), free(h), free(k), free(e1), free(e2), free(ee);
}

/* ---- --stop / -r ---------------------------------------------------------------------- */
Test(ux, stop_strings_cut_the_text_before_them) {
    char sp[1024];
    stories(sp, sizeof sp);
    result r = run_argv(NULL, (char *[]){"run", "-m", sp, "-p", "Once upon a time", "-n", "60", "--temp", "0", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    size_t n = strlen(r.out);
    cr_assert(n > 40, "%s", r.out);
    /* a stop string from the middle of the greedy text: the text ends right before its first occurrence */
    char stop[8];
    memcpy(stop, r.out + n / 2, 5);
    stop[5] = 0;
    const char *first = strstr(r.out, stop);
    size_t want = (size_t)(first - r.out);
    const char *forms[][2] = {{"--stop", stop}, {"-r", stop}};
    for (int i = 0; i < 2; i++) {
        result s = run_argv(NULL, (char *[]){"run", "-m", sp, "-p", "Once upon a time", "-n", "60", "--temp", "0",
                                             (char *)forms[i][0], (char *)forms[i][1], "-v", NULL});
        cr_assert_eq(s.code, 0, "%s", s.err);
        cr_expect_eq(strlen(s.out), want + 1, "%s '%s': got '%s' want '%.*s'", forms[i][0], stop, s.out, (int)want,
                     r.out);
        cr_expect(!strncmp(s.out, r.out, want), "%s", s.out);
        cr_expect(strstr(s.err, "tokens generated (stop)"), "%s", s.err);
        done(&s);
    }
    done(&r);
}

/* ---- tokenize ------------------------------------------------------------------------- */
Test(ux, tokenize_matches_the_jsonl_tokenizer) {
    char sp[1024];
    stories(sp, sizeof sp);
    const char *text = "Hello <|im_start|> world\nx";
    result r = run_argv(NULL, (char *[]){"tokenize", "-m", sp, "--ids", "-p", (char *)text, NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *line = json_object_new_object();
    json_object_object_add(line, "id", json_object_new_int(1));
    json_object_object_add(line, "op", json_object_new_string("tokenize"));
    json_object_object_add(line, "text", json_object_new_string(text));
    char in[4096];
    snprintf(in, sizeof in, "%s\n", json_object_to_json_string_ext(line, JSON_C_TO_STRING_PLAIN));
    json_object_put(line);
    result s = run_argv(in, (char *[]){"serve", "--jsonl", "-m", sp, NULL});
    cr_assert_eq(s.code, 0, "%s", s.err);
    json_object *ev = json_tokener_parse(s.out);
    cr_assert(ev, "%s", s.out);
    json_object *toks = json_object_object_get(ev, "tokens");
    cr_assert(json_object_is_type(toks, json_type_array), "%s", s.out);
    char ids[4096] = "";
    for (size_t i = 0; i < json_object_array_length(toks); i++) {
        char b[16];
        snprintf(b, sizeof b, i ? " %d" : "%d", json_object_get_int(json_object_array_get_idx(toks, i)));
        strcat(ids, b);
    }
    strcat(ids, "\n");
    cr_expect_str_eq(r.out, ids);
    cr_expect(num_after(r.err, "tokenize: ") == (long)json_object_array_length(toks), "%s", r.err);
    json_object_put(ev);
    done(&s);
    done(&r);
    /* the listing: one "id\t'piece'" line per token, with the newline escaped */
    r = run_argv(NULL, (char *[]){"tokenize", "-m", sp, "a\nb", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "\\n'"), "%s", r.out);
    cr_expect(strstr(r.out, "\t'"), "%s", r.out);
    done(&r);
}

/* ---- CRLF and non-UTF-8 documents ---------------------------------------------------- */
Test(ux, crlf_documents_read_as_lf_and_latin1_is_converted) {
    char sp[1024], dir[64], lf[128], crlf[128], latin[128];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(lf, sizeof lf, "%s/lf.txt", dir);
    snprintf(crlf, sizeof crlf, "%s/crlf.txt", dir);
    snprintf(latin, sizeof latin, "%s/latin.txt", dir);
    write_text(lf, "Line one.\nLine two.\n");
    write_text(crlf, "Line one.\r\nLine two.\r\n");
    write_text(latin, "Caf\xe9 au lait.\n");
    result a = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", lf, "-n", "1", "What?", "--verbose-prompt", NULL});
    result b = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", crlf, "-n", "1", "What?", "--verbose-prompt", NULL});
    cr_assert_eq(a.code, 0, "%s", a.err);
    cr_assert_eq(b.code, 0, "%s", b.err);
    char *tb = shown_tokens(b.err);
    cr_expect(strstr(tb, "\\r") == NULL, "CR left in the prompt: %s", tb);
    char *pa = shown_prompt(a.err), *pb = shown_prompt(b.err);
    char *qa = strstr(pa, "\"\"\""), *qb = strstr(pb, "\"\"\"");
    cr_assert(qa && qb, "%s", pa);
    cr_expect_str_eq(qa, qb); /* the same prompt after the document's name */
    free(tb), free(pa), free(pb);
    done(&a), done(&b);
    result c =
        run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", latin, "-n", "1", "What?", "--verbose-prompt", NULL});
    cr_expect_eq(c.code, 0, "%s", c.err);
    cr_expect(strstr(c.err, "is not UTF-8 (byte 0xE9 at offset 3)"), "%s", c.err);
    cr_expect(strstr(c.err, "Latin-1"), "%s", c.err);
    cr_expect(strstr(c.err, "Caf\xc3\xa9 au lait."), "converted to UTF-8: %s", c.err);
    done(&c);
    unlink(lf), unlink(crlf), unlink(latin), rmdir(dir);
}

/* ---- one prompt for one question; one system rule -------------------------------------- */
Test(ux, cli_ask_and_jsonl_ask_build_the_same_prompt_and_answer) {
    char mp[1024], doc[1024];
    default_model(mp, sizeof mp);
    sample(doc, sizeof doc, "ridgekv_design.md");
    result a = run_argv(NULL, (char *[]){"ask", "-m", mp, "--doc", doc, "-n", "16", "-c", "4096", "-v",
                                         "What does RidgeFill do?", NULL});
    cr_assert_eq(a.code, 0, "%s", a.err);
    long n_cli = num_after(a.err, "prompt ");
    size_t len;
    char *text = tb_read_file(doc, &len);
    cr_assert(text);
    json_object *req = json_object_new_object(), *docs = json_object_new_array(), *d = json_object_new_object();
    json_object_object_add(req, "id", json_object_new_int(1));
    json_object_object_add(req, "op", json_object_new_string("ask"));
    json_object_object_add(d, "name", json_object_new_string("ridgekv_design.md"));
    json_object_object_add(d, "text", json_object_new_string_len(text, (int)len));
    json_object_array_add(docs, d);
    json_object_object_add(req, "docs", docs);
    json_object_object_add(req, "question", json_object_new_string("What does RidgeFill do?"));
    json_object_object_add(req, "max_tokens", json_object_new_int(16));
    json_object_object_add(req, "temperature", json_object_new_double(0));
    json_object_object_add(req, "stream", json_object_new_boolean(0));
    char *in = NULL;
    cr_assert(asprintf(&in, "%s\n", json_object_to_json_string_ext(req, JSON_C_TO_STRING_PLAIN)) > 0);
    json_object_put(req);
    free(text);
    result s = run_argv(in, (char *[]){"serve", "--jsonl", "-m", mp, "-c", "4096", NULL});
    free(in);
    cr_assert_eq(s.code, 0, "%s", s.err);
    json_object *ev = json_tokener_parse(s.out);
    cr_assert(ev, "%s", s.out);
    cr_assert_str_eq(json_object_get_string(json_object_object_get(ev, "event")), "done", "%s", s.out);
    long n_jsonl = json_object_get_int(json_object_object_get(json_object_object_get(ev, "usage"), "prompt_tokens"));
    cr_expect_eq(n_cli, n_jsonl, "CLI ask read %ld prompt tokens, JSONL ask %ld", n_cli, n_jsonl);
    char want[4096];
    snprintf(want, sizeof want, "%s\n", json_object_get_string(json_object_object_get(ev, "text")));
    cr_expect_str_eq(a.out, want);
    json_object_put(ev);
    done(&a), done(&s);
}

Test(ux, system_message_only_first_in_jsonl_chat_and_load) {
    char sp[1024], dir[64], path[128];
    stories(sp, sizeof sp);
    const char *line =
        "{\"id\":1,\"op\":\"chat\",\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
        "{\"role\":\"system\",\"content\":\"late\"}]}\n";
    result s = run_argv(line, (char *[]){"serve", "--jsonl", "-m", sp, NULL});
    cr_assert_eq(s.code, 0, "%s", s.err);
    cr_expect(strstr(s.out, "\"event\":\"error\"") && strstr(s.out, "invalid_request"), "%s", s.out);
    cr_expect(strstr(s.out, "only the first message"), "%s", s.out);
    done(&s);
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/c.json", dir);
    write_text(path, "{\"format\":\"ridgekv-chat\",\"version\":1,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
                     "{\"role\":\"system\",\"content\":\"late\"}]}");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "/load %s\n", path);
    result c = run_argv(cmd, (char *[]){"chat", "-m", sp, NULL});
    cr_expect_eq(c.code, 0, "%s", c.err);
    cr_expect(strstr(c.err, "cannot load") && strstr(c.err, "only the first message"), "%s", c.err);
    done(&c);
    unlink(path), rmdir(dir);
}

/* ---- answers capped by the answer room; the cut marker ----------------------------------- */
Test(ux, chat_answer_capped_by_room_keeps_history) {
    char sp[1024], dir[64], path[128];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/c.json", dir);
    char in[300];
    snprintf(in, sizeof in, "Once upon a time\nThe dog ran\n/save %s\n", path);
    /* -n -1: only the room (a quarter of 256 = 64 tokens) ends an answer that does not end itself */
    result r = run_argv(in, (char *[]){"chat", "-m", sp, "-c", "256", "-n", "-1", "--temp", "0", "-v", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "dropped"), "the second turn dropped history: %s", r.err);
    cr_expect(!strstr(r.err, "context full"), "%s", r.err);
    const char *cut = strstr(r.err, "[answer cut: the answer room of 64 tokens");
    const char *eog = strstr(r.err, "tokens generated (eog)");
    cr_expect(cut || eog, "an answer neither ended nor was cut by the room: %s", r.err);
    if (cut) cr_expect(strstr(r.err, "64 tokens generated (length)"), "%s", r.err);
    size_t len;
    char *saved = tb_read_file(path, &len);
    cr_assert(saved, "no /save file");
    json_object *j = json_tokener_parse(saved);
    cr_assert(j, "%s", saved);
    json_object *msgs = json_object_object_get(j, "messages");
    cr_expect_eq(json_object_array_length(msgs), 4, "both exchanges kept: %s", saved);
    json_object_put(j);
    free(saved);
    done(&r);
    /* -n: the marker names it, in chat and in ask */
    result n = run_argv("Once upon a time\n", (char *[]){"chat", "-m", sp, "-n", "5", "--temp", "0", NULL});
    cr_expect_eq(n.code, 0, "%s", n.err);
    cr_expect(strstr(n.err, "[answer cut: -n 5 tokens reached]"), "%s", n.err);
    done(&n);
    char doc[128];
    snprintf(doc, sizeof doc, "%s/d.txt", dir);
    write_text(doc, "Tom is a cat. He lives in a big house.\n");
    result a = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", doc, "-n", "3", "Who is Tom?", NULL});
    cr_expect_eq(a.code, 0, "%s", a.err);
    cr_expect(strstr(a.err, "[answer cut: -n 3 tokens reached]"), "%s", a.err);
    done(&a);
    unlink(doc), unlink(path), rmdir(dir);
}

/* ---- history recalls whole messages (pty, libedit) ------------------------------------ */
Test(ux, history_recalls_a_block_as_one_message) {
#ifndef RK_HAVE_LIBEDIT
    cr_skip_test("built without libedit: no history");
#endif
    char sp[1024], dir[64], path[128];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/h.json", dir);
    char *argv[] = {(char *)bin(), "chat", "-m", sp, "-n", "4", "--temp", "0", NULL};
    term t;
    term_start(&t, argv);
    cr_assert(term_expect(&t, 0, ">>> ", 20), "no prompt: %s", t.buf);
    term_settle(&t, 200);
    size_t mark = t.len;
    term_send(&t, "\"\"\"\r");
    cr_assert(term_expect(&t, mark, "... ", 10), "%s", t.buf + mark);
    term_settle(&t, 100);
    term_send(&t, "first line\r");
    cr_assert(term_expect(&t, mark, "first line", 10), "%s", t.buf + mark);
    term_settle(&t, 100);
    term_send(&t, "second line\r");
    term_settle(&t, 100);
    mark = t.len;
    term_send(&t, "\"\"\"\r");
    cr_assert(term_expect(&t, mark, ">>> ", 30), "no answer: %s", t.buf + mark);
    term_settle(&t, 200);
    /* Up arrow: the whole block comes back as one entry; Enter sends it again */
    term_send(&t, "\x1b[A");
    term_settle(&t, 200);
    mark = t.len;
    term_send(&t, "\r");
    cr_assert(term_expect(&t, mark, ">>> ", 30), "no answer to the recalled message: %s", t.buf + mark);
    term_settle(&t, 200);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "/save %s\r", path);
    mark = t.len;
    term_send(&t, cmd);
    cr_expect(term_expect(&t, mark, "saved", 10), "%s", t.buf + mark);
    term_settle(&t, 200);
    term_send(&t, "\x04");
    term_wait(&t, 20);
    size_t len;
    char *saved = tb_read_file(path, &len);
    cr_assert(saved, "no saved chat: %s", t.buf);
    json_object *j = json_tokener_parse(saved);
    json_object *msgs = json_object_object_get(j, "messages");
    cr_assert_eq(json_object_array_length(msgs), 4, "%s", saved);
    const char *u1 = json_object_get_string(json_object_object_get(json_object_array_get_idx(msgs, 0), "content"));
    const char *u2 = json_object_get_string(json_object_object_get(json_object_array_get_idx(msgs, 2), "content"));
    cr_expect_str_eq(u1, "first line\nsecond line");
    cr_expect_str_eq(u2, u1, "the recalled message differs: '%s' vs '%s'", u2, u1);
    json_object_put(j);
    free(saved);
    free(t.buf);
    unlink(path), rmdir(dir);
}

/* ---- progress lines ------------------------------------------------------------------------ */
Test(ux, ask_progress_lines_count_up_with_an_eta) {
    char sp[1024], dir[64], doc[128];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(doc, sizeof doc, "%s/long.txt", dir);
    FILE *f = fopen(doc, "w");
    cr_assert(f);
    for (int i = 0; i < 12; i++) fprintf(f, "Lily saw a big red ball in the park and ran to it. ");
    fclose(f);
    char *args[] = {"ask", "-m", sp, "--doc", doc, "-b", "32", "-n", "1", "--no-cache", "What did Lily see?", NULL};
    setenv("RIDGEKV_PROGRESS_EVERY", "0", 1);
    result r = run_argv(NULL, args);
    unsetenv("RIDGEKV_PROGRESS_EVERY");
    cr_assert_eq(r.code, 0, "%s", r.err);
    long prev = -1, total = -1;
    int lines = 0, with_eta = 0;
    for (const char *p = r.err; (p = strstr(p, "ridgekv ask: read ")); p++) {
        char *sl;
        long d = strtol(p + strlen("ridgekv ask: read "), &sl, 10);
        if (*sl != '/') continue; /* the summary line "read N tokens in ..." */
        long t = strtol(sl + 1, NULL, 10);
        cr_expect(d > prev, "done went from %ld to %ld", prev, d);
        prev = d;
        total = t;
        lines++;
        const char *nl = strchr(p, '\n'), *eta = strstr(p, "ETA ");
        if (d > 0 && eta && eta < nl && eta[4] >= '0' && eta[4] <= '9') with_eta++;
    }
    cr_expect(lines >= 5, "%d progress lines: %s", lines, r.err);
    cr_expect_eq(prev, total, "the last line is the end: %s", r.err);
    cr_expect(with_eta >= lines - 1, "%d of %d lines have an ETA: %s", with_eta, lines, r.err);
    done(&r);
    unlink(doc), rmdir(dir);
}

/* ---- help and docs agree ------------------------------------------------------------------- */
/* The flags (words starting with '-' after a space or punctuation) of a text, as " -a --bb ... " */
static void flags_of(const char *text, char *out, size_t cap) {
    strcpy(out, " ");
    for (const char *p = text; *p; p++) {
        bool start = *p == '-' && (p == text || strchr(" \t\n([|`,", p[-1])) &&
                     (isalpha((unsigned char)p[1]) || (p[1] == '-' && isalpha((unsigned char)p[2])));
        if (!start) continue;
        size_t n = strspn(p, "-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789");
        while (n && p[n - 1] == '-') n--;
        char w[80];
        snprintf(w, sizeof w, " %.*s ", (int)(n < 60 ? n : 60), p);
        if (!strstr(out, w) && strlen(out) + strlen(w) + 1 < cap) strcat(out, w + 1);
        p += n - 1;
    }
}

Test(ux, help_and_usage_md_list_the_same_flags) {
    const char *src = getenv("RK_SOURCE_DIR");
    cr_assert(src);
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/USAGE.md", src);
    size_t len;
    char *doc = tb_read_file(path, &len);
    cr_assert(doc, "%s", path);
    const char *cmds[] = {"run",  "chat",      "ask",      "serve",       "bench",    "tokenize",   "info",
                          "pull", "calibrate", "eval ppl", "eval needle", "eval nll", "eval splice"};
    for (size_t i = 0; i < sizeof cmds / sizeof *cmds; i++) {
        char head[64];
        snprintf(head, sizeof head, "\n### `ridgekv %s` flags\n", cmds[i]);
        const char *sec = strstr(doc, head);
        cr_expect(sec, "docs/USAGE.md has no section '%s'", head + 1);
        if (!sec) continue;
        sec += strlen(head);
        const char *end = strstr(sec, "\n#");
        char *body = strndup(sec, end ? (size_t)(end - sec) : strlen(sec));
        char word1[32], *word2 = NULL;
        snprintf(word1, sizeof word1, "%s", cmds[i]);
        if (strchr(word1, ' ')) word2 = strchr(word1, ' ') + 1, word2[-1] = 0;
        result r = word2 ? run_argv(NULL, (char *[]){word1, word2, "--help", NULL})
                         : run_argv(NULL, (char *[]){word1, "--help", NULL});
        cr_expect_eq(r.code, 0);
        char fh[8192], fd[8192];
        flags_of(r.out, fh, sizeof fh);
        flags_of(body, fd, sizeof fd);
        /* every flag of --help is in the docs' section, and the reverse */
        for (int pass = 0; pass < 2; pass++) {
            const char *from = pass ? fd : fh, *to = pass ? fh : fd;
            for (const char *w = from + 1; *w;) {
                const char *sp2 = strchr(w, ' ');
                char key[80];
                snprintf(key, sizeof key, " %.*s ", (int)(sp2 - w), w);
                cr_expect(strstr(to, key), "ridgekv %s: %s is in %s but not in %s", cmds[i], key,
                          pass ? "docs/USAGE.md" : "--help", pass ? "--help" : "docs/USAGE.md");
                w = sp2 + 1;
            }
        }
        /* the commands of this issue's surfaces say their exit codes */
        if (!strcmp(cmds[i], "run") || !strcmp(cmds[i], "chat") || !strcmp(cmds[i], "ask") ||
            !strcmp(cmds[i], "serve") || !strcmp(cmds[i], "tokenize"))
            cr_expect(strstr(r.out, "exit codes:"), "ridgekv %s --help has no exit codes", cmds[i]);
        done(&r);
        free(body);
    }
    result m = run_argv(NULL, (char *[]){"--help", NULL});
    cr_expect(strstr(m.out, "--version"), "ridgekv --help does not list --version: %s", m.out);
    cr_expect(strstr(m.out, "tokenize"), "%s", m.out);
    done(&m);
    result v = run_argv(NULL, (char *[]){"--version", NULL});
    cr_expect(v.code == 0 && !strncmp(v.out, "ridgekv ", 8), "%s", v.out);
    done(&v);
    cr_expect(strstr(doc, "`-c 0`"), "docs/USAGE.md documents -c 0");
    free(doc);
}

/* On a terminal the progress is one bar redrawn in place (\r), ending at 100%. */
Test(ux, ask_progress_bar_on_a_terminal) {
    char sp[1024], dir[64], doc[128];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(doc, sizeof doc, "%s/long.txt", dir);
    FILE *f = fopen(doc, "w");
    cr_assert(f);
    for (int i = 0; i < 12; i++) fprintf(f, "Lily saw a big red ball in the park and ran to it. ");
    fclose(f);
    char *argv[] = {(char *)bin(),        "ask", "-m", sp, "--doc", doc, "-b", "32", "-n", "1", "--no-cache",
                    "What did Lily see?", NULL};
    term t;
    term_start(&t, argv);
    int code = term_wait(&t, 60);
    cr_expect_eq(code, 0, "%s", t.buf);
    cr_expect(strstr(t.buf, "\rread [") && strstr(t.buf, "] 100% "), "no bar: %s", t.buf);
    int redraws = 0;
    for (const char *p = t.buf; (p = strstr(p, "\rread [")); p++) redraws++;
    cr_expect(redraws >= 5, "%d redraws: %s", redraws, t.buf);
    cr_expect(strstr(t.buf, "ETA "), "%s", t.buf);
    free(t.buf);
    unlink(doc), rmdir(dir);
}

/* chat --verbose-prompt: each turn's prompt (the history in it) on stderr. */
Test(ux, chat_verbose_prompt_shows_each_turn) {
    char sp[1024];
    stories(sp, sizeof sp);
    result r = run_argv("first turn\nsecond turn\n",
                        (char *[]){"chat", "-m", sp, "-n", "3", "--temp", "0", "--verbose-prompt", NULL});
    cr_assert_eq(r.code, 0, "%s", r.err);
    const char *a = strstr(r.err, "ridgekv chat: prompt (");
    cr_assert(a, "%s", r.err);
    const char *b = strstr(a + 1, "ridgekv chat: prompt (");
    cr_assert(b, "one prompt per turn: %s", r.err);
    cr_expect(strstr(b, "first turn") && strstr(b, "second turn"), "the second prompt holds the history: %s", b);
    done(&r);
}
