/* The JSON grammar (runtime/generate/json_grammar.c): every prefix of a text the schema
 * allows is accepted byte by byte and only the whole text is complete; texts outside it
 * are refused at the first byte that leaves the language; json_object mode agrees with
 * json-c on generated texts; schemas outside the subset are refused by keyword. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gen.h"
#include "tb.h"

static rk_json_grammar *grammar(const char *schema) {
    rk_json_grammar *g = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_json_grammar_create(schema, schema ? strlen(schema) : 0, &g, &e), RK_OK, "%s: %s",
                 schema ? schema : "(object)", e.msg);
    return g;
}

/* Feeds text byte by byte: the number of bytes accepted (strlen when all were). */
static size_t run(rk_json_state *st, const char *text, bool *complete) {
    rk_json_state_reset(st);
    size_t n = strlen(text), i = 0;
    for (; i < n; i++)
        if (!rk_json_state_feed(st, text + i, 1)) break; /* also every byte after a complete value */
    if (complete) *complete = rk_json_state_complete(st);
    return i;
}

static void expect_ok(rk_json_state *st, const char *text) {
    bool done;
    size_t k = run(st, text, &done);
    cr_expect_eq(k, strlen(text), "%s: refused at byte %zu ('%c')", text, k, text[k]);
    cr_expect(done && rk_json_state_can_end(st), "%s: not complete", text);
}

/* text is refused exactly at byte `at` */
static void expect_bad(rk_json_state *st, const char *text, size_t at) {
    size_t k = run(st, text, NULL);
    cr_expect_eq(k, at, "%s: refused at byte %zu, expected %zu", text, k, at);
}

static rk_json_state *state(const rk_json_grammar *g) {
    rk_json_state *st = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_json_state_create(g, &st, &e), RK_OK, "%s", e.msg);
    return st;
}

Test(json_grammar, object_mode_accepts_json_objects_only) {
    rk_json_grammar *g = grammar(NULL);
    rk_json_state *st = state(g);
    expect_ok(st, "{}");
    expect_ok(st, "{\"a\": [1, -2.5e+3, true, null, {\"b\": \"x\\\"y\\u00e9\"}], \"a\": 0}");
    expect_ok(st, "{\n  \"k\": \"\xc3\xa9\xe2\x82\xac\"\n}");
    expect_bad(st, " {}", 0); /* nothing before the value either */
    expect_bad(st, "[1]", 0);
    expect_bad(st, "{\"a\" 1}", 5);
    expect_bad(st, "{\"a\": 01}", 7);
    expect_bad(st, "{\"a\": 1.}", 8);
    expect_bad(st, "{\"a\": tru}", 9);
    expect_bad(st, "{\"a\": \"\x01\"}", 7);
    expect_bad(st, "{\"a\": \"\\x\"}", 8);
    expect_bad(st, "{\"a\": 1,}", 8);
    expect_bad(st, "{} ", 2); /* nothing after the value */
    expect_bad(st, "{\"a\": [1 2]}", 9);
    expect_bad(st, "{\"a\": \"\xff\"}", 7);
    /* whitespace runs are bounded */
    char ws[64] = "{";
    memset(ws + 1, ' ', RK_JSON_MAX_WS + 1);
    expect_bad(st, ws, 1 + RK_JSON_MAX_WS);
    /* nesting is bounded: depth RK_JSON_MAX_DEPTH is fine, one more is refused */
    char deep[256] = "{\"a\":";
    size_t n = strlen(deep);
    for (int i = 1; i < RK_JSON_MAX_DEPTH; i++) deep[n++] = '[';
    deep[n] = 0;
    cr_expect_eq(run(st, deep, NULL), n);
    deep[n++] = '[';
    deep[n] = 0;
    cr_expect_eq(run(st, deep, NULL), n - 1);
    /* a multi-byte feed is all or nothing */
    rk_json_state_reset(st);
    cr_expect(rk_json_state_feed(st, "{\"a\"", 4));
    cr_expect(!rk_json_state_feed(st, ":1}x", 4));
    cr_expect(rk_json_state_accepts(st, ":1}", 3));
    cr_expect(rk_json_state_feed(st, ":1}", 3));
    cr_expect(rk_json_state_complete(st));
    rk_json_state_destroy(st);
    rk_json_grammar_destroy(g);
}

/* ---- generated values ---------------------------------------------------------------- */
static json_object *random_value(uint64_t *rng, int depth) {
    int kind = (int)(rk_splitmix64(rng) % (depth > 3 ? 5 : 7));
    switch (kind) {
    case 0: return json_object_new_int64((int64_t)(rk_splitmix64(rng) % 2001) - 1000);
    case 1: return json_object_new_double((double)(int64_t)(rk_splitmix64(rng) % 100000) / 64.0 - 700.0);
    case 2: return json_object_new_boolean(rk_splitmix64(rng) & 1);
    case 3: return NULL; /* null */
    case 4: {
        static const char *const s[] = {
            "", "plain", "quote \" back \\ slash", "tab\tnl\n", "caf\xc3\xa9 \xe2\x82\xac", "\xf0\x9f\x99\x82", "/ok/"};
        return json_object_new_string(s[rk_splitmix64(rng) % 7]);
    }
    case 5: {
        json_object *a = json_object_new_array();
        int n = (int)(rk_splitmix64(rng) % 4);
        for (int i = 0; i < n; i++) json_object_array_add(a, random_value(rng, depth + 1));
        return a;
    }
    default: {
        json_object *o = json_object_new_object();
        int n = (int)(rk_splitmix64(rng) % 4);
        for (int i = 0; i < n; i++) {
            char k[16];
            snprintf(k, sizeof k, "k%d", (int)(rk_splitmix64(rng) % 10));
            json_object_object_add(o, k, random_value(rng, depth + 1));
        }
        return o;
    }
    }
}

/* json-c's three layouts of 300 random objects are accepted and complete exactly at their end;
 * cutting the last byte leaves an incomplete text; random single-byte edits are accepted only
 * when json-c parses the edited text as an object too. */
Test(json_grammar, object_mode_agrees_with_json_c_on_generated_texts) {
    rk_json_grammar *g = grammar(NULL);
    rk_json_state *st = state(g);
    uint64_t rng = 12345;
    const int flags[3] = {JSON_C_TO_STRING_PLAIN, JSON_C_TO_STRING_SPACED, JSON_C_TO_STRING_PRETTY};
    int edits_ok = 0, edits_bad = 0;
    for (int i = 0; i < 300; i++) {
        json_object *o = json_object_new_object();
        int n = (int)(rk_splitmix64(&rng) % 5);
        for (int k = 0; k < n; k++) {
            char key[16];
            snprintf(key, sizeof key, "key%d", k);
            json_object_object_add(o, key, random_value(&rng, 1));
        }
        const char *text = json_object_to_json_string_ext(o, flags[i % 3]);
        if (strlen(text) <= 1 + 4 * RK_JSON_MAX_WS) expect_ok(st, text); /* PRETTY indents deep values */
        else if (i % 3 != 2) expect_ok(st, text);
        char *cut = strdup(text);
        cut[strlen(cut) - 1] = 0;
        bool done = true;
        cr_expect_eq(run(st, cut, &done), strlen(cut));
        cr_expect(!done && !rk_json_state_can_end(st), "%s is not complete", cut);
        /* an edit: one byte replaced by a JSON-ish byte */
        static const char subst[] = "{}[],:\"0-.e tfn\\x";
        char *ed = strdup(text);
        const size_t at = rk_splitmix64(&rng) % strlen(ed);
        ed[at] = subst[rk_splitmix64(&rng) % (sizeof subst - 1)];
        bool ed_done = false;
        const bool all = run(st, ed, &ed_done) == strlen(ed);
        json_tokener *tok = json_tokener_new();
        json_object *back = json_tokener_parse_ex(tok, ed, (int)strlen(ed));
        const bool parses = json_tokener_get_error(tok) == json_tokener_success && back &&
                            json_object_is_type(back, json_type_object) &&
                            json_tokener_get_parse_end(tok) == strlen(ed);
        json_tokener_free(tok);
        json_object_put(back);
        if (all && ed_done) {
            cr_expect(parses, "accepted but json-c refuses: %s", ed);
            edits_ok++;
        } else {
            edits_bad++;
        }
        free(ed);
        free(cut);
        json_object_put(o);
    }
    cr_expect(edits_bad > 100, "most edits break the text (%d ok, %d bad)", edits_ok, edits_bad);
    rk_json_state_destroy(st);
    rk_json_grammar_destroy(g);
}

#define PERSON                                                                                               \
    "{\"type\": \"object\", \"title\": \"P\", \"properties\": {"                                             \
    "\"name\": {\"type\": \"string\", \"minLength\": 1, \"maxLength\": 5},"                                  \
    "\"age\": {\"type\": \"integer\"},"                                                                      \
    "\"score\": {\"type\": \"number\"},"                                                                     \
    "\"ok\": {\"type\": \"boolean\"},"                                                                       \
    "\"tags\": {\"type\": \"array\", \"items\": {\"enum\": [\"a\", \"ab\", 1, 12, null]}, \"maxItems\": 2}," \
    "\"pet\": {\"type\": [\"object\", \"null\"], \"properties\": {\"kind\": {\"const\": \"cat\"}},"          \
    "\"required\": [\"kind\"], \"additionalProperties\": false}"                                             \
    "}, \"required\": [\"name\", \"age\"]}"

Test(json_grammar, schema_constraints) {
    rk_json_grammar *g = grammar(PERSON);
    rk_json_state *st = state(g);
    expect_ok(st, "{\"name\": \"Bo\", \"age\": 3}");
    expect_ok(st, "{\"age\":-3,\"name\":\"\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9\"}");
    expect_ok(st, "{\"name\": \"Bo\", \"age\": 0, \"score\": 1.5e-3, \"ok\": false, \"tags\": [\"ab\", 12],"
                  " \"pet\": {\"kind\": \"cat\"}}");
    expect_ok(st, "{\"pet\": null, \"name\": \"x\", \"age\": 1, \"tags\": []}");
    expect_bad(st, "{\"name\": \"Bo\"}", 13);          /* age is required */
    expect_bad(st, "{\"nam\": ", 5);                   /* no such property */
    expect_bad(st, "{\"name\": \"Bo\", \"name\"", 16); /* at most once: "name" is used */
    expect_bad(st, "{\"extra\"", 2);                   /* only the listed properties */
    expect_bad(st, "{\"age\": 3.5", 9);                /* integer */
    expect_bad(st, "{\"age\": 3e2", 9);
    expect_bad(st, "{\"age\": \"3\"", 8);               /* the type */
    expect_bad(st, "{\"name\": \"\"", 10);              /* minLength 1 */
    expect_bad(st, "{\"name\": \"abcdef\"", 15);        /* maxLength 5 */
    expect_bad(st, "{\"tags\": [\"abc\"", 13);          /* enum */
    expect_bad(st, "{\"tags\": [1, 2", 13);             /* 1 and 12 only */
    expect_bad(st, "{\"tags\": [1, 12, null", 15);      /* maxItems 2: no third item */
    expect_bad(st, "{\"pet\": {}", 9);                  /* kind is required */
    expect_bad(st, "{\"pet\": {\"kind\": \"dog\"", 18); /* const */
    expect_bad(st, "{\"ok\": 1", 7);
    /* a top-level enum of numbers may end after 1 or go on to 12 */
    rk_json_grammar *ge = grammar("{\"enum\": [1, 12, \"x\"]}");
    rk_json_state *se = state(ge);
    cr_expect(rk_json_state_feed(se, "1", 1));
    cr_expect(rk_json_state_can_end(se) && !rk_json_state_complete(se));
    cr_expect(rk_json_state_feed(se, "2", 1));
    cr_expect(rk_json_state_complete(se));
    expect_ok(se, "\"x\"");
    expect_bad(se, "2", 0);
    rk_json_state_destroy(se);
    rk_json_grammar_destroy(ge);
    rk_json_state_destroy(st);
    rk_json_grammar_destroy(g);
}

/* A generated instance of PERSON-like schemas (random key order, layout and values) is
 * accepted; the schema's own required set and types hold. */
Test(json_grammar, generated_instances_of_a_nested_schema) {
    const char *schema = "{\"$defs\": {\"pt\": {\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"number\"},"
                         "\"y\": {\"type\": \"number\"}}, \"required\": [\"x\", \"y\"]}},"
                         "\"type\": \"object\", \"properties\": {\"id\": {\"type\": \"integer\"},"
                         "\"path\": {\"type\": \"array\", \"items\": {\"$ref\": \"#/$defs/pt\"}, \"minItems\": 1},"
                         "\"label\": {\"type\": \"string\"}}, \"required\": [\"id\", \"path\"]}";
    rk_json_grammar *g = grammar(schema);
    rk_json_state *st = state(g);
    uint64_t rng = 99;
    for (int i = 0; i < 200; i++) {
        json_object *o = json_object_new_object(), *path = json_object_new_array();
        int np = 1 + (int)(rk_splitmix64(&rng) % 4);
        for (int k = 0; k < np; k++) {
            json_object *pt = json_object_new_object();
            const bool swap = rk_splitmix64(&rng) & 1;
            json_object_object_add(pt, swap ? "y" : "x", json_object_new_double((double)k / 8.0 - 3.0));
            json_object_object_add(pt, swap ? "x" : "y", json_object_new_int(k * 7));
            json_object_array_add(path, pt);
        }
        const int order = (int)(rk_splitmix64(&rng) % 3);
        if (order == 0) json_object_object_add(o, "label", json_object_new_string("a \"q\""));
        json_object_object_add(o, "path", path);
        json_object_object_add(o, "id", json_object_new_int64((int64_t)(rk_splitmix64(&rng) % 100000) - 50000));
        if (order == 1) json_object_object_add(o, "label", json_object_new_string(""));
        const char *text = json_object_to_json_string_ext(o, i % 2 ? JSON_C_TO_STRING_SPACED : JSON_C_TO_STRING_PLAIN);
        expect_ok(st, text);
        json_object_put(o);
    }
    expect_bad(st, "{\"id\": 1, \"path\": []", 19);           /* minItems 1 */
    expect_bad(st, "{\"id\": 1, \"path\": [{\"x\": 1}]", 26); /* y is required */
    rk_json_state_destroy(st);
    rk_json_grammar_destroy(g);
}

static void expect_refused(const char *schema, const char *what) {
    rk_json_grammar *g = NULL;
    rk_err e = {0};
    cr_expect_eq(rk_json_grammar_create(schema, strlen(schema), &g, &e), RK_E_INVALID_ARG, "%s", schema);
    cr_expect_null(g);
    cr_expect(strstr(e.msg, what), "%s: message '%s' lacks '%s'", schema, e.msg, what);
}

Test(json_grammar, unsupported_schemas_are_refused_by_name) {
    expect_refused("{\"type\": \"string\", \"pattern\": \"^a\"}", "'pattern'");
    expect_refused("{\"anyOf\": [{\"type\": \"string\"}]}", "'anyOf'");
    expect_refused("{\"properties\": {\"a\": {\"format\": \"date\"}}}", "#/properties/a");
    expect_refused("{\"type\": \"strin\"}", "'type'");
    expect_refused("{\"type\": \"object\", \"additionalProperties\": true}", "additionalProperties");
    expect_refused("{\"properties\": {\"a\": {}}, \"required\": [\"b\"]}", "'required'");
    expect_refused("{\"$ref\": \"#/$defs/none\"}", "$ref");
    expect_refused("{\"$defs\": {\"a\": {\"$ref\": \"#/$defs/a\"}}, \"$ref\": \"#/$defs/a\"}", "deeper");
    expect_refused("{\"enum\": []}", "'enum'");
    expect_refused("{\"type\": \"array\", \"minItems\": 3, \"maxItems\": 2}", "maximum");
    expect_refused("{\"type\": ", "not valid JSON");
    expect_refused("[1]", "must be an object");
}
