/* `ridgekv serve --jsonl` end to end on the tiny stories260K model: every non-blank line gets
 * exactly one terminal event (done or error) carrying its id, bad lines never stop the server,
 * stop strings, stream on/off, tokenize, a closed stdout, and a few thousand fuzzed lines. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tb.h"

typedef struct served {
    int code;
    char *out, *err;
    json_object **ev; /* one per stdout line, in order */
    size_t n_ev;
} served;

static const char *stories(char *buf, size_t cap) {
    if (!tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    return buf;
}

/* Every stdout line must be one JSON object, well-formed UTF-8, with a known event. */
static json_object *parse_event(const char *line, size_t n) {
    json_tokener *tok = json_tokener_new();
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_VALIDATE_UTF8);
    json_object *o = json_tokener_parse_ex(tok, line, (int)n);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    cr_assert(je == json_tokener_success && end == n && o && json_object_is_type(o, json_type_object),
              "stdout line is not one JSON object (%s): %.*s", json_tokener_error_desc(je), (int)(n < 300 ? n : 300),
              line);
    json_object *ev, *id;
    cr_assert(json_object_object_get_ex(o, "event", &ev) && json_object_is_type(ev, json_type_string), "%.300s", line);
    cr_assert(json_object_object_get_ex(o, "id", &id), "event without id: %.300s", line);
    const char *e = json_object_get_string(ev);
    cr_assert(!strcmp(e, "token") || !strcmp(e, "tokens") || !strcmp(e, "info") || !strcmp(e, "done") ||
                  !strcmp(e, "error"),
              "unknown event %s", e);
    if (!strcmp(e, "error")) {
        json_object *c, *m;
        cr_assert(json_object_object_get_ex(o, "code", &c) && json_object_is_type(c, json_type_string));
        cr_assert(json_object_object_get_ex(o, "message", &m) && json_object_get_string_len(m) > 0);
        const char *codes[] = {"bad_json",     "invalid_request",  "unknown_op", "line_too_long",
                               "invalid_utf8", "context_overflow", "internal"};
        bool known = false;
        for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++)
            known |= !strcmp(codes[i], json_object_get_string(c));
        cr_assert(known, "unknown error code %s", json_object_get_string(c));
    }
    return o;
}

/* Runs `ridgekv serve --jsonl -m stories260K <flags>` with input on stdin. */
static served serve(const char *flags, const void *input, size_t n) {
    const char *bin = getenv("RK_BIN");
    cr_assert(bin, "RK_BIN not set (meson sets it)");
    char model[1024];
    stories(model, sizeof model);
    char dir[] = "/tmp/rkserveXXXXXX";
    cr_assert(mkdtemp(dir));
    char in[128], outp[128], errp[128], cmd[4096];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(outp, sizeof outp, "%s/out", dir);
    snprintf(errp, sizeof errp, "%s/err", dir);
    FILE *f = fopen(in, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(input, 1, n, f), n);
    fclose(f);
    snprintf(cmd, sizeof cmd, "'%s' serve --jsonl -m '%s' -t 2 %s <%s >%s 2>%s", bin, model, flags, in, outp, errp);
    int st = system(cmd);
    served s = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, NULL, NULL, NULL, 0};
    size_t len_out, len_err;
    s.out = tb_read_file(outp, &len_out);
    s.err = tb_read_file(errp, &len_err);
    cr_assert(s.out && s.err);
    unlink(in);
    unlink(outp);
    unlink(errp);
    rmdir(dir);
    cr_assert(len_out == 0 || s.out[len_out - 1] == '\n', "stdout does not end with a newline");
    size_t cap = 16;
    s.ev = malloc(cap * sizeof *s.ev);
    for (char *p = s.out; *p;) {
        char *nl = strchr(p, '\n');
        cr_assert(nl);
        if (s.n_ev == cap) s.ev = realloc(s.ev, (cap *= 2) * sizeof *s.ev);
        s.ev[s.n_ev++] = parse_event(p, (size_t)(nl - p));
        p = nl + 1;
    }
    return s;
}

static served serve_str(const char *flags, const char *input) { return serve(flags, input, strlen(input)); }

static void served_free(served *s) {
    for (size_t i = 0; i < s->n_ev; i++) json_object_put(s->ev[i]);
    free(s->ev);
    free(s->out);
    free(s->err);
}

static const char *str(json_object *o, const char *key) {
    json_object *v;
    return json_object_object_get_ex(o, key, &v) && json_object_is_type(v, json_type_string) ? json_object_get_string(v)
                                                                                             : NULL;
}

static int64_t num(json_object *o, const char *key) {
    json_object *v;
    cr_assert(json_object_object_get_ex(o, key, &v), "no field %s in %s", key, json_object_to_json_string(o));
    return json_object_get_int64(v);
}

static bool terminal(json_object *ev) {
    const char *e = str(ev, "event");
    return !strcmp(e, "done") || !strcmp(e, "error");
}

/* The id as JSON text ("null" when absent or null). */
static const char *id_text(json_object *ev) {
    json_object *id = NULL;
    json_object_object_get_ex(ev, "id", &id);
    return json_object_to_json_string_ext(id, JSON_C_TO_STRING_PLAIN);
}

typedef struct expect {
    const char *line;       /* sent as is, then '\n' */
    const char *id;         /* id as JSON text in the answer, "null" for unusable ids */
    const char *code;       /* "done" or the error code */
    const char *in_message; /* NULL or a substring the error message must contain */
} expect;

/* Walks the events: each request's non-terminal events, then its one terminal event. */
static size_t check_answers(const served *s, const expect *x, size_t n_x) {
    size_t e = 0;
    for (size_t i = 0; i < n_x; i++) {
        if (!x[i].code) continue; /* blank line: no answer */
        while (e < s->n_ev && !terminal(s->ev[e])) {
            cr_expect_str_eq(id_text(s->ev[e]), x[i].id, "line %zu: event for another id", i);
            e++;
        }
        cr_assert_lt(e, s->n_ev, "line %zu (%.80s) got no terminal event", i, x[i].line);
        json_object *t = s->ev[e++];
        cr_expect_str_eq(id_text(t), x[i].id, "line %zu (%.80s): id", i, x[i].line);
        const char *got = !strcmp(str(t, "event"), "done") ? "done" : str(t, "code");
        cr_expect_str_eq(got, x[i].code, "line %zu (%.80s): %s", i, x[i].line, json_object_to_json_string(t));
        if (x[i].in_message)
            cr_expect(strstr(str(t, "message"), x[i].in_message), "line %zu: message '%s' lacks '%s'", i,
                      str(t, "message"), x[i].in_message);
    }
    cr_expect_eq(e, s->n_ev, "%zu events after the last answer", s->n_ev - e);
    return e;
}

Test(serve, script_of_good_and_bad_lines) {
    char big[12000], deep[3001], overflow[4000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    const char *head = "{\"id\":99,\"op\":\"complete\",\"prompt\":\""; /* over --max-line 4096 */
    memcpy(big, head, strlen(head));
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    strcpy(overflow, "{\"id\":\"ctx\",\"op\":\"complete\",\"prompt\":\"");
    for (int i = 0; i < 80; i++) strcat(overflow, "Once upon a time ");
    strcat(overflow, "\"}");
    const expect x[] = {
        {"{\"id\":1,\"op\":\"info\"}", "1", "done", NULL},
        {"{\"id\":2,", "null", "bad_json", "ends inside"},
        {"{\"id\":3 \"op\":\"info\"}", "null", "bad_json", NULL},
        {"{\"id\":4,\"op\":\"info\"} trailing", "null", "bad_json", "after the value"},
        {"[1,2]", "null", "invalid_request", "object"},
        {"\"just a string\"", "null", "invalid_request", "object"},
        {"null", "null", "invalid_request", "object"},
        {"{\"op\":\"info\"}", "null", "invalid_request", "'id'"},
        {"{\"id\":true,\"op\":\"info\"}", "null", "invalid_request", "'id'"},
        {"{\"id\":NaN,\"op\":\"info\"}", "null", "invalid_request", "'id'"},
        {"{\"id\":5}", "5", "invalid_request", "'op'"},
        {"{\"id\":6,\"op\":7}", "6", "invalid_request", "'op'"},
        {"{\"id\":\"u\",\"op\":\"dance\"}", "\"u\"", "unknown_op", "dance"},
        {"{\"id\":8,\"op\":\"complete\",\"prompt\":42}", "8", "invalid_request", "'prompt'"},
        {"{\"id\":9,\"op\":\"complete\"}", "9", "invalid_request", "'prompt'"},
        {"{\"id\":10,\"op\":\"complete\",\"prompt\":\"x\",\"temperature\":\"hot\"}", "10", "invalid_request",
         "'temperature'"},
        {"{\"id\":11,\"op\":\"complete\",\"prompt\":\"x\",\"max_tokens\":-5}", "11", "invalid_request", "'max_tokens'"},
        {"{\"id\":12,\"op\":\"complete\",\"prompt\":\"x\",\"stop\":[\"a\",3]}", "12", "invalid_request", "'stop[1]'"},
        {"{\"id\":13,\"op\":\"complete\",\"prompt\":\"x\",\"stream\":\"yes\"}", "13", "invalid_request", "'stream'"},
        {"{\"id\":14,\"op\":\"chat\"}", "14", "invalid_request", "'messages'"},
        {"{\"id\":15,\"op\":\"chat\",\"messages\":[{\"role\":\"robot\",\"content\":\"x\"}]}", "15", "invalid_request",
         "'messages[0].role'"},
        {"{\"id\":16,\"op\":\"chat\",\"messages\":[{\"role\":\"user\"}]}", "16", "invalid_request",
         "'messages[0].content'"},
        {"{\"id\":17,\"op\":\"ask\",\"docs\":[1],\"question\":\"q\"}", "17", "invalid_request", "'docs[0]'"},
        {"{\"id\":18,\"op\":\"ask\",\"docs\":[\"d\"]}", "18", "invalid_request", "'question'"},
        {"{\"id\":19,\"op\":\"tokenize\",\"text\":\"a\",\"pieces\":1}", "19", "invalid_request", "'pieces'"},
        {"{\"id\":20,\"op\":\"complete\",\"prompt\":\"a\\u0000b\"}", "20", "invalid_request", "NUL"},
        {"{\"id\":21,\"op\":\"complete\",\"prompt\":\"\xff\xfe\"}", "21", "invalid_utf8", "byte 35"},
        {"\xc0\xaf{}", "null", "invalid_utf8", NULL},
        {"{\"id\":\"\xed\xa0\x80\",\"op\":\"info\"}", "null", "invalid_utf8", NULL},
        {big, "null", "line_too_long", "4096"},
        {"", NULL, NULL, NULL},
        {"   \t ", NULL, NULL, NULL},
        {deep, "null", "bad_json", "nesting"},
        {overflow, "\"ctx\"", "context_overflow", "context holds 256"},
        {"{\"id\":22,\"op\":\"complete\",\"prompt\":\"\",\"add_special\":false}", "22", "invalid_request", "empty"},
        {"{\"id\":\"s-23\",\"op\":\"complete\",\"prompt\":\"Once upon a time\",\"max_tokens\":4,\"temperature\":0}",
         "\"s-23\"", "done", NULL},
        {"{\"id\":24.5,\"op\":\"chat\",\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},"
         "{\"role\":\"user\",\"content\":\"Hi\"}],\"max_tokens\":3,\"temperature\":0}",
         "24.5", "done", NULL},
        {"{\"id\":-25,\"op\":\"ask\",\"docs\":[\"Tom has a red ball.\",{\"name\":\"b\",\"text\":\"Sue has a cat.\"}],"
         "\"question\":\"Who has a cat?\",\"max_tokens\":3,\"temperature\":0,\"stream\":false}",
         "-25", "done", NULL},
        {"{\"id\":26,\"op\":\"tokenize\",\"text\":\"Once upon a time\"}", "26", "done", NULL},
        {"{\"id\":27,\"op\":\"complete\",\"prompt\":\"x\",\"max_tokens\":0}", "27", "done", NULL},
        {"{\"id\":28,\"op\":\"complete\",\"prompt\":\"x\",\"frequency_penalty\":2.5}", "28", "invalid_request",
         "'frequency_penalty'"},
        {"{\"id\":29,\"op\":\"complete\",\"prompt\":\"x\",\"dry_base\":1}", "29", "invalid_request", "'dry_base'"},
        {"{\"id\":30,\"op\":\"complete\",\"prompt\":\"x\",\"response_format\":{\"type\":\"xml\"}}", "30",
         "invalid_request", "'response_format.type'"},
        {"{\"id\":31,\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"response_format\":"
         "{\"type\":\"json_schema\",\"json_schema\":{\"schema\":{\"type\":\"string\",\"minimum\":1}}}}",
         "31", "invalid_request", "'minimum'"},
        /* a JSON answer: the grammar ends it once the value is complete */
        {"{\"id\":32,\"op\":\"complete\",\"prompt\":\"Once upon a time\",\"max_tokens\":60,\"temperature\":0,"
         "\"stream\":false,\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":"
         "{\"enum\":[\"yes\",\"no\"]}}}}",
         "32", "done", NULL},
        {"{\"id\":33,\"op\":\"complete\",\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"temperature\":0,"
         "\"frequency_penalty\":0.5,\"presence_penalty\":-0.5,\"dry_multiplier\":0,\"repeat_last_n\":8}",
         "33", "done", NULL},
    };
    size_t n_x = sizeof x / sizeof x[0];
    size_t cap = 64 * 1024, n = 0;
    char *in = malloc(cap);
    for (size_t i = 0; i < n_x; i++) {
        size_t l = strlen(x[i].line);
        memcpy(in + n, x[i].line, l);
        n += l;
        in[n++] = '\n';
    }
    const char *last = "{\"id\":\"last\",\"op\":\"info\"}"; /* no newline: EOF ends the last line */
    memcpy(in + n, last, strlen(last));
    n += strlen(last);
    /* 256: the ask below is the CLI's prompt (default system prompt, quoted documents) */
    served s = serve("-c 256 --max-line 4096", in, n);
    free(in);
    cr_assert_eq(s.code, 0, "exit %d: %s", s.code, s.err);
    cr_assert_geq(s.n_ev, 2);
    /* the final request answered: info then done, after everything else */
    cr_expect_str_eq(str(s.ev[s.n_ev - 2], "event"), "info");
    cr_expect_str_eq(id_text(s.ev[s.n_ev - 2]), "\"last\"");
    cr_expect_str_eq(str(s.ev[s.n_ev - 1], "event"), "done");
    served cut = s;
    cut.n_ev -= 2;
    check_answers(&cut, x, n_x);
    for (size_t i = 0; i < s.n_ev; i++) {
        json_object *ev = s.ev[i];
        if (!strcmp(str(ev, "event"), "info")) {
            cr_expect_eq(num(ev, "n_vocab"), 512);
            cr_expect_eq(num(ev, "n_layer"), 5);
            cr_expect_eq(num(ev, "n_ctx"), 256);
            cr_expect_str_eq(str(ev, "arch"), "llama");
            cr_expect(str(ev, "chat_template"));
        }
        if (!strcmp(id_text(ev), "\"s-23\"") && !strcmp(str(ev, "event"), "done")) {
            cr_expect_str_eq(str(ev, "finish_reason"), "length");
            json_object *u;
            cr_assert(json_object_object_get_ex(ev, "usage", &u));
            cr_expect_eq(num(u, "completion_tokens"), 4);
            cr_expect_eq(num(u, "prompt_tokens"), 5); /* BOS + 4 */
            cr_expect_gt(json_object_get_double(json_object_object_get(ev, "ttft_ms")), 0.0);
            cr_expect_gt(json_object_get_double(json_object_object_get(ev, "prefill_tok_s")), 0.0);
        }
        if (!strcmp(id_text(ev), "27") && !strcmp(str(ev, "event"), "done")) {
            cr_expect_str_eq(str(ev, "finish_reason"), "length");
            cr_expect(json_object_is_type(json_object_object_get(ev, "ttft_ms"), json_type_null));
        }
        if (!strcmp(id_text(ev), "-25") && !strcmp(str(ev, "event"), "done")) cr_expect(str(ev, "text"));
        if (!strcmp(id_text(ev), "32") && !strcmp(str(ev, "event"), "done")) {
            const char *t = str(ev, "text");
            cr_expect(t && (!strcmp(t, "\"yes\"") || !strcmp(t, "\"no\"")), "enum answer: %s", t ? t : "(none)");
            cr_expect_str_eq(str(ev, "finish_reason"), "eog");
        }
    }
    served_free(&s);
}

/* Collected text of one request: token texts + done's text, and the done event. */
typedef struct answer {
    char text[8192];
    int n_token_events;
    json_object *done;
} answer;

static answer collect(const served *s, size_t from, size_t *next) {
    answer a = {.text = "", .n_token_events = 0, .done = NULL};
    size_t i = from;
    for (; i < s->n_ev; i++) {
        json_object *ev = s->ev[i];
        const char *e = str(ev, "event");
        if (!strcmp(e, "token")) {
            strcat(a.text, str(ev, "text"));
            a.n_token_events++;
            continue;
        }
        cr_assert_str_eq(e, "done", "%s", json_object_to_json_string(ev));
        if (str(ev, "text")) strcat(a.text, str(ev, "text"));
        a.done = ev;
        break;
    }
    cr_assert(a.done, "no done event");
    *next = i + 1;
    return a;
}

static int64_t usage(json_object *done, const char *key) {
    json_object *u;
    cr_assert(json_object_object_get_ex(done, "usage", &u));
    return num(u, key);
}

#define GREEDY "\"prompt\":\"Once upon a time\",\"max_tokens\":40,\"temperature\":0"

Test(serve, stream_false_equals_streamed_text) {
    served s = serve_str("", "{\"id\":1,\"op\":\"complete\"," GREEDY "}\n"
                             "{\"id\":2,\"op\":\"complete\"," GREEDY ",\"stream\":false}\n");
    cr_assert_eq(s.code, 0, "%s", s.err);
    size_t i = 0;
    answer a = collect(&s, 0, &i), b = collect(&s, i, &i);
    cr_expect_eq(i, s.n_ev);
    cr_expect_eq(a.n_token_events, 40, "one token event per generated token");
    cr_expect_eq(usage(a.done, "completion_tokens"), 40);
    cr_expect_eq(b.n_token_events, 0);
    cr_expect_str_eq(a.text, b.text);
    cr_expect(!strncmp(a.text, ", there was a little girl named Lily", 36), "%s", a.text); /* greedy stories260K */
    cr_expect_str_eq(str(a.done, "finish_reason"), "length");
    served_free(&s);
}

Test(serve, stop_strings_end_the_text_and_are_not_sent) {
    served s0 = serve_str("", "{\"id\":0,\"op\":\"complete\"," GREEDY ",\"stream\":false}\n");
    cr_assert_eq(s0.code, 0, "%s", s0.err);
    size_t i;
    answer full = collect(&s0, 0, &i);
    size_t len = strlen(full.text);
    cr_assert_gt(len, 60, "%s", full.text);
    /* a stop string from the middle of the text, starting inside a token ("ittle gir") */
    char stop[32], want[8192];
    const char *at = strstr(full.text, "ittle gir");
    cr_assert(at, "%s", full.text);
    snprintf(stop, sizeof stop, "%.9s", at);
    snprintf(want, sizeof want, "%.*s", (int)(at - full.text), full.text);
    /* the text ends with a prefix of this one, so its last bytes are held back to the end;
     * it never matches, so all text must still come out */
    char never[16];
    snprintf(never, sizeof never, "%sQQ", full.text + len - 3);
    json_object *js = json_object_new_string(stop), *jn = json_object_new_string(never);
    char in[4096];
    snprintf(in, sizeof in,
             "{\"id\":1,\"op\":\"complete\"," GREEDY ",\"stop\":%s}\n"
             "{\"id\":2,\"op\":\"complete\"," GREEDY ",\"stop\":[\"zzzz\",%s],\"stream\":false}\n"
             "{\"id\":3,\"op\":\"complete\"," GREEDY ",\"stop\":%s}\n"
             "{\"id\":4,\"op\":\"complete\"," GREEDY ",\"stop\":[%s],\"stream\":false}\n",
             json_object_to_json_string(js), json_object_to_json_string(js), json_object_to_json_string(jn),
             json_object_to_json_string(jn));
    json_object_put(js);
    json_object_put(jn);
    served s = serve_str("", in);
    cr_assert_eq(s.code, 0, "%s", s.err);
    answer a = collect(&s, 0, &i), b = collect(&s, i, &i), c = collect(&s, i, &i), d = collect(&s, i, &i);
    cr_expect_str_eq(a.text, want);
    cr_expect_str_eq(b.text, want);
    cr_expect_str_eq(str(a.done, "finish_reason"), "stop");
    cr_expect_str_eq(str(b.done, "finish_reason"), "stop");
    cr_expect_eq(a.n_token_events, usage(a.done, "completion_tokens"));
    cr_expect_lt(usage(a.done, "completion_tokens"), 40);
    for (size_t k = 0; k < s.n_ev; k++) {
        const char *t = str(s.ev[k], "text");
        if (t && !strcmp(id_text(s.ev[k]), "1")) cr_expect(!strstr(t, "ittle"), "stop text sent: %s", t);
    }
    cr_expect_str_eq(c.text, full.text, "held-back text must be released at the end");
    cr_expect_str_eq(str(c.done, "text") ? str(c.done, "text") : "", full.text + len - 3,
                     "the held tail comes in the done event");
    cr_expect_str_eq(d.text, full.text);
    cr_expect_str_eq(str(c.done, "finish_reason"), "length");
    served_free(&s);
    served_free(&s0);
}

Test(serve, tokenize_round_trip) {
    const char *text = "Once upon a time, there was a little girl named Lily.";
    char in[1024];
    snprintf(in, sizeof in,
             "{\"id\":1,\"op\":\"tokenize\",\"text\":\"%s\",\"add_special\":false,\"pieces\":true}\n"
             "{\"id\":2,\"op\":\"tokenize\",\"text\":\"%s\"}\n"
             "{\"id\":3,\"op\":\"complete\",\"prompt\":\"%s\",\"max_tokens\":1,\"temperature\":0}\n",
             text, text, text);
    served s = serve_str("", in);
    cr_assert_eq(s.code, 0, "%s", s.err);
    cr_assert_eq(s.n_ev, 6, "%s", s.out);
    json_object *toks, *pieces, *toks2;
    cr_assert(json_object_object_get_ex(s.ev[0], "tokens", &toks));
    cr_assert(json_object_object_get_ex(s.ev[0], "pieces", &pieces));
    cr_assert(json_object_object_get_ex(s.ev[2], "tokens", &toks2));
    cr_expect(!json_object_object_get_ex(s.ev[2], "pieces", NULL));
    size_t n = json_object_array_length(toks);
    cr_assert_gt(n, 5);
    cr_assert_eq(json_object_array_length(pieces), n);
    char joined[1024] = "";
    for (size_t i = 0; i < n; i++) {
        int64_t t = json_object_get_int64(json_object_array_get_idx(toks, i));
        cr_expect(t >= 0 && t < 512);
        strcat(joined, json_object_get_string(json_object_array_get_idx(pieces, i)));
    }
    /* SentencePiece puts a space before the first word */
    cr_expect(!strcmp(joined, text) || (joined[0] == ' ' && !strcmp(joined + 1, text)), "%s", joined);
    /* add_special (the default) puts BOS first, then the same tokens */
    cr_assert_eq(json_object_array_length(toks2), n + 1);
    cr_expect_eq(json_object_get_int64(json_object_array_get_idx(toks2, 0)), 1);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(json_object_get_int64(json_object_array_get_idx(toks2, i + 1)),
                     json_object_get_int64(json_object_array_get_idx(toks, i)));
    /* and complete evaluates exactly those */
    cr_expect_eq(usage(s.ev[5], "prompt_tokens"), (int64_t)n + 1);
    served_free(&s);
}

Test(serve, generation_ends_at_the_context) {
    served s = serve_str("-c 32", "{\"id\":1,\"op\":\"complete\",\"prompt\":\"Once upon a time\",\"max_tokens\":-1,"
                                  "\"temperature\":0,\"stream\":false}\n");
    cr_assert_eq(s.code, 0, "%s", s.err);
    cr_assert_eq(s.n_ev, 1);
    cr_expect_str_eq(str(s.ev[0], "finish_reason"), "context");
    cr_expect_eq(usage(s.ev[0], "prompt_tokens") + usage(s.ev[0], "completion_tokens"), 33,
                 "the last token is sampled, not evaluated");
    served_free(&s);
}

Test(serve, usage_errors) {
    const char *bin = getenv("RK_BIN");
    cr_assert(bin);
    char cmd[2048];
    const struct {
        const char *args;
        int code;
    } cases[] = {
        {"serve </dev/null", 2},
        {"serve --jsonl --max-line 12 </dev/null", 2},
        {"serve --jsonl --max-line abc </dev/null", 2},
        {"serve --jsonl -p hi </dev/null", 2},
        {"serve --jsonl -m /nonexistent/model.gguf </dev/null", 3},
        {"serve --help", 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(cmd, sizeof cmd, "'%s' %s >/dev/null 2>&1", bin, cases[i].args);
        int st = system(cmd);
        cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == cases[i].code, "%s: exit %d", cases[i].args,
                  WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    served s = serve_str("", ""); /* nothing to do: clean exit, no output */
    cr_expect_eq(s.code, 0, "%s", s.err);
    cr_expect_eq(s.n_ev, 0);
    served_free(&s);
}

/* stdout with no reader: the server says so on stderr and exits 5 instead of dying of SIGPIPE. */
Test(serve, closed_stdout_exits_5) {
    const char *bin = getenv("RK_BIN");
    cr_assert(bin);
    char model[1024];
    stories(model, sizeof model);
    char in[] = "/tmp/rkservepipeXXXXXX", err[] = "/tmp/rkserveerrXXXXXX";
    int fin = mkstemp(in), ferr = mkstemp(err);
    cr_assert(fin >= 0 && ferr >= 0);
    const char *req = "{\"id\":1,\"op\":\"complete\",\"prompt\":\"Once\",\"max_tokens\":50}\n";
    for (int i = 0; i < 20; i++) cr_assert_eq(write(fin, req, strlen(req)), (ssize_t)strlen(req));
    lseek(fin, 0, SEEK_SET);
    int p[2];
    cr_assert_eq(pipe(p), 0);
    close(p[0]); /* no reader, before the child can write anything */
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(fin, 0);
        dup2(p[1], 1);
        dup2(ferr, 2);
        execl(bin, bin, "serve", "--jsonl", "-m", model, (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_expect(WIFEXITED(st), "killed by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    cr_expect_eq(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 5);
    size_t n;
    char *e = tb_read_file(err, &n);
    cr_expect(e && strstr(e, "writing to stdout failed"), "%s", e ? e : "");
    free(e);
    close(fin);
    close(ferr);
    unlink(in);
    unlink(err);
}

/* ---- fuzz: thousands of random, truncated and mutated lines in one server run ------- */
static const char *const seeds[] = {
    "{\"id\":1,\"op\":\"complete\",\"prompt\":\"Once upon a time\",\"max_tokens\":3,\"temperature\":0}",
    "{\"id\":\"c\",\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"Hi \\u00e9\"}],\"max_tokens\":2,"
    "\"stop\":[\"a\",\"the\"],\"top_k\":5,\"top_p\":0.9,\"min_p\":0.1,\"seed\":7}",
    "{\"id\":3,\"op\":\"ask\",\"docs\":[\"A cat.\",{\"name\":\"n\",\"text\":\"A dog.\"}],\"question\":\"Who?\","
    "\"max_tokens\":2,\"stream\":false,\"repeat_penalty\":1.1}",
    "{\"id\":4.5,\"op\":\"tokenize\",\"text\":\"caf\\u00e9 \\ud83d\\ude00 \xe2\x82\xac\",\"pieces\":true,"
    "\"parse_special\":false}",
    "{\"id\":\"i\",\"op\":\"info\"}",
    "{\"id\":6,\"op\":\"complete\",\"prompt\":\"<s>x</s>\",\"max_tokens\":2,\"stop\":\"x\",\"add_special\":false}",
};

static const char *const junk[] = {"{",
                                   "}",
                                   "[",
                                   "]",
                                   "\"",
                                   ":",
                                   ",",
                                   "\\",
                                   "\\u",
                                   "\\ud800",
                                   "null",
                                   "true",
                                   "1e999",
                                   "-",
                                   "NaN",
                                   "\xff",
                                   "\xc3",
                                   "\xe2\x82",
                                   "\xf0\x9f",
                                   "\x01",
                                   "\t",
                                   "\r",
                                   "\"op\"",
                                   "\"id\"",
                                   "\"stop\"",
                                   "{\"",
                                   "[[[[[[[[",
                                   "0.5",
                                   "\"max_tokens\":2"};

static size_t fuzz_line(uint64_t *rng, char *buf, size_t cap) {
    size_t n = 0;
    uint64_t kind = tb_rand_u64(rng) % 8;
    if (kind == 0) { /* random bytes */
        n = tb_rand_u64(rng) % 200;
        for (size_t i = 0; i < n; i++) buf[i] = (char)(tb_rand_u64(rng) % 256);
    } else if (kind == 1) { /* random tokens of JSON-ish junk */
        int k = (int)(tb_rand_u64(rng) % 40);
        for (int i = 0; i < k; i++) {
            const char *j = junk[tb_rand_u64(rng) % (sizeof junk / sizeof junk[0])];
            size_t l = strlen(j);
            if (n + l >= cap) break;
            memcpy(buf + n, j, l);
            n += l;
        }
    } else { /* a valid request, truncated or mutated */
        const char *s = seeds[tb_rand_u64(rng) % (sizeof seeds / sizeof seeds[0])];
        n = strlen(s);
        memcpy(buf, s, n);
        if (kind == 2) n = tb_rand_u64(rng) % (n + 1);
        int muts = kind == 7 ? 0 : (int)(tb_rand_u64(rng) % 4);
        for (int m = 0; m < muts && n > 0; m++) {
            size_t at = tb_rand_u64(rng) % n;
            switch (tb_rand_u64(rng) % 4) {
            case 0: buf[at] = (char)(tb_rand_u64(rng) % 256); break;
            case 1: memmove(buf + at, buf + at + 1, n - at - 1), n--; break;
            case 2: {
                const char *j = junk[tb_rand_u64(rng) % (sizeof junk / sizeof junk[0])];
                size_t l = strlen(j);
                if (n + l >= cap) break;
                memmove(buf + at + l, buf + at, n - at);
                memcpy(buf + at, j, l);
                n += l;
                break;
            }
            default: { /* duplicate a span */
                size_t l = tb_rand_u64(rng) % (n - at) + 1;
                if (n + l >= cap) break;
                memmove(buf + at + l, buf + at, n - at);
                n += l;
                break;
            }
            }
        }
    }
    for (size_t i = 0; i < n; i++)
        if (buf[i] == '\n') buf[i] = ' ';
    return n;
}

static bool blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return false;
    return true;
}

Test(serve, fuzzed_lines_each_get_one_answer) {
    enum { N_LINES = 3000 };
    size_t cap = (size_t)N_LINES * 700 + 5000, n = 0;
    char *in = malloc(cap), line[600];
    uint64_t rng = 0x5eed5e12e;
    size_t expected = 0;
    for (int i = 0; i < N_LINES; i++) {
        size_t l = fuzz_line(&rng, line, sizeof line);
        if (i % 500 == 499) { /* now and then a line over the limit */
            memset(in + n, 'x', 3000);
            l = 3000;
        } else {
            memcpy(in + n, line, l);
        }
        expected += !blank(in + n, l);
        n += l;
        in[n++] = '\n';
    }
    const char *last = "{\"id\":\"end\",\"op\":\"complete\",\"prompt\":\"Once\",\"max_tokens\":2,\"temperature\":0}\n";
    memcpy(in + n, last, strlen(last));
    n += strlen(last);
    expected++;
    served s = serve("-c 64 -n 4 --max-line 2048", in, n);
    free(in);
    cr_assert_eq(s.code, 0, "exit %d: %.2000s", s.code, s.err);
    size_t n_term = 0, n_err = 0, n_done = 0;
    for (size_t i = 0; i < s.n_ev; i++)
        if (terminal(s.ev[i])) {
            n_term++;
            n_err += !strcmp(str(s.ev[i], "event"), "error");
            n_done += !strcmp(str(s.ev[i], "event"), "done");
        }
    cr_expect_eq(n_term, expected, "terminal events %zu for %zu non-blank lines", n_term, expected);
    cr_expect_gt(n_done, 100, "mutations should leave many valid requests (%zu)", n_done);
    cr_expect_gt(n_err, 1000, "and many bad ones (%zu)", n_err);
    cr_assert_gt(s.n_ev, 0);
    cr_expect_str_eq(id_text(s.ev[s.n_ev - 1]), "\"end\"");
    cr_expect_str_eq(str(s.ev[s.n_ev - 1], "event"), "done");
    served_free(&s);
}

/* ---- the session and the prefill per request: "kv", "fill", "ridgefill", "tail" ---------- */

static json_object *find_done(const served *s, const char *id) {
    for (size_t i = 0; i < s->n_ev; i++)
        if (!strcmp(id_text(s->ev[i]), id) && terminal(s->ev[i])) return s->ev[i];
    cr_assert_fail("no terminal event for id %s", id);
    return NULL;
}

/* Appends a greedy 8-token complete request with a ~720-token prompt (over the 512-token
 * exact tail) and `extra` fields to buf. */
static void long_req(char *buf, size_t cap, const char *id, const char *extra) {
    size_t n = strlen(buf);
    n += (size_t)snprintf(buf + n, cap - n, "{\"id\":%s,\"op\":\"complete\",\"prompt\":\"", id);
    for (int i = 0; i < 60 && n < cap; i++) n += (size_t)snprintf(buf + n, cap - n, "The little dog ran in the park. ");
    snprintf(buf + n, cap - n, "\",\"max_tokens\":8,\"temperature\":0,\"stream\":false%s}\n", extra);
}

Test(serve, per_request_kv_and_fill) {
    static char in[32768];
    in[0] = 0;
    long_req(in, sizeof in, "1", "");
    long_req(in, sizeof in, "2", ",\"kv\":\"f32\"");
    long_req(in, sizeof in, "3", ",\"kv\":\"lowram:window=32\"");
    long_req(in, sizeof in, "4", ",\"fill\":\"identity\",\"tail\":512");
    long_req(in, sizeof in, "5", ",\"fill\":\"plumb\",\"tail\":512");
    long_req(in, sizeof in, "6", ",\"kv\":\"f16\"");
    strcat(in, "{\"id\":7,\"op\":\"complete\",\"prompt\":\"x\",\"kv\":\"bogus\"}\n"
               "{\"id\":8,\"op\":\"complete\",\"prompt\":\"x\",\"fill\":\"speed\"}\n"
               "{\"id\":9,\"op\":\"complete\",\"prompt\":\"x\",\"fill\":\"fast\"}\n"
               "{\"id\":10,\"op\":\"complete\",\"prompt\":\"x\",\"ridgefill\":\"/nonexistent/m.gguf\"}\n"
               "{\"id\":11,\"op\":\"complete\",\"prompt\":\"x\",\"tail\":100}\n"
               "{\"id\":12,\"op\":\"chat\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"},"
               "{\"role\":\"system\",\"content\":\"late\"}]}\n");
    served s = serve_str("-c 1024 --ctx-overflow-ok --split 2", in); /* stories260K trains on 512 */
    cr_assert_eq(s.code, 0, "%s", s.err);
    json_object *d[7];
    for (int i = 1; i <= 6; i++) {
        char id[8];
        snprintf(id, sizeof id, "%d", i);
        d[i] = find_done(&s, id);
        cr_assert_str_eq(str(d[i], "event"), "done", "%s", json_object_to_json_string(d[i]));
    }
    const int64_t n_prompt = usage(d[1], "prompt_tokens"), rows = n_prompt + 7; /* the 8th is sampled only */
    cr_expect_gt(n_prompt, 600);
    cr_expect_str_eq(str(d[1], "kv"), "f16");
    cr_expect_eq(num(d[1], "kv_bytes"), rows * 5 * 2 * 4 * 8 * 2, "f16 rows");
    cr_expect_str_eq(str(d[2], "kv"), "f32");
    cr_expect_eq(num(d[2], "kv_bytes"), 2 * num(d[1], "kv_bytes"), "a session of its own with f32 rows");
    cr_expect_str_eq(str(d[3], "kv"), "lowram:window=32");
    cr_expect_neq(num(d[3], "kv_bytes"), num(d[1], "kv_bytes"), "LowRAM holds its rows otherwise");
    cr_expect_str_eq(str(d[1], "fill"), "off");
    cr_expect_eq(num(d[1], "filled_rows"), 0);
    cr_expect_str_eq(str(d[4], "fill"), "identity");
    cr_expect_eq(num(d[4], "filled_rows"), 3 * (n_prompt - 512), "bulk rows x the 3 layers past split 2");
    cr_expect_str_eq(str(d[5], "fill"), "plumb");
    cr_expect_eq(num(d[5], "filled_rows"), 3 * (n_prompt - 512));
    cr_expect_str_eq(str(d[5], "text"), str(d[1], "text"), "plumb is off through the fill path");
    cr_expect_eq(num(d[6], "filled_rows"), 0, "a request's fill does not stick");
    cr_expect_str_eq(str(d[6], "kv"), "f16", "the server's own policy: its own session");
    const struct {
        const char *id, *in_message;
    } bad[] = {{"7", "field 'kv'"},         {"8", "needs a map file"}, {"9", "field 'fill'"},
               {"10", "field 'ridgefill'"}, {"11", "field 'tail'"},    {"12", "only the first message"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_object *e = find_done(&s, bad[i].id);
        cr_expect_str_eq(str(e, "event"), "error", "%s", json_object_to_json_string(e));
        cr_expect_str_eq(str(e, "code"), "invalid_request", "%s", json_object_to_json_string(e));
        cr_expect(strstr(str(e, "message"), bad[i].in_message), "%s: %s", bad[i].id, str(e, "message"));
    }
    served_free(&s);
}

Test(serve, server_kv_and_fill_flags) {
    static char in[16384];
    snprintf(in, sizeof in, "{\"id\":1,\"op\":\"info\"}\n");
    long_req(in, sizeof in, "2", "");
    long_req(in, sizeof in, "3", ",\"fill\":\"off\"");
    served s = serve_str("-c 1024 --ctx-overflow-ok --kv f32 --split 2 --fill identity --tail 512", in);
    cr_assert_eq(s.code, 0, "%s", s.err);
    cr_expect_str_eq(str(s.ev[0], "kv"), "f32");
    cr_expect_str_eq(str(s.ev[0], "fill"), "identity");
    json_object *a = find_done(&s, "2"), *b = find_done(&s, "3");
    cr_expect_str_eq(str(a, "kv"), "f32");
    cr_expect_eq(num(a, "filled_rows"), 3 * (usage(a, "prompt_tokens") - 512));
    cr_expect_eq(num(b, "filled_rows"), 0, "a request turns the server's fill off");
    served_free(&s);
    /* a fill the server cannot apply is a usage error at startup */
    const char *bin = getenv("RK_BIN");
    char model[1024], cmd[2048];
    stories(model, sizeof model);
    snprintf(cmd, sizeof cmd, "'%s' serve --jsonl -m '%s' --fill identity </dev/null >/dev/null 2>&1", bin, model);
    int st = system(cmd);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "identity without --split: exit %d", WEXITSTATUS(st));
}
