/* serve --jsonl: one request line -> a validated serve_req. Every field is type- and
 * range-checked here, so cmd_serve.c never sees a value it has to doubt. */
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"
#include "serve_guard.h"

static const char *const code_names[SERVE_CODE_COUNT] = {
    [SERVE_OK] = "ok",
    [SERVE_BAD_JSON] = "bad_json",
    [SERVE_INVALID_REQUEST] = "invalid_request",
    [SERVE_UNKNOWN_OP] = "unknown_op",
    [SERVE_LINE_TOO_LONG] = "line_too_long",
    [SERVE_INVALID_UTF8] = "invalid_utf8",
    [SERVE_CONTEXT_OVERFLOW] = "context_overflow",
    [SERVE_INTERNAL] = "internal",
};

const char *serve_code_name(serve_code c) { return (unsigned)c < SERVE_CODE_COUNT ? code_names[c] : "internal"; }

static const char *const op_names[] = {
    [SERVE_OP_COMPLETE] = "complete", [SERVE_OP_CHAT] = "chat", [SERVE_OP_ASK] = "ask",
    [SERVE_OP_TOKENIZE] = "tokenize", [SERVE_OP_INFO] = "info",
};

typedef struct ctx {
    char *msg;
    size_t cap;
} ctx;

__attribute__((format(printf, 3, 4))) static serve_code fail(ctx *c, serve_code code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, c->cap, fmt, ap);
    va_end(ap);
    return code;
}

static const char *type_name(json_object *o) {
    switch (json_object_get_type(o)) {
    case json_type_null: return "null";
    case json_type_boolean: return "boolean";
    case json_type_double: return "number";
    case json_type_int: return "integer";
    case json_type_object: return "object";
    case json_type_array: return "array";
    case json_type_string: return "string";
    }
    return "unknown";
}

/* Bytes of s[0..n) to show in a message: at most max, cut at a character boundary
 * (s is well-formed UTF-8). */
static int clip(const char *s, size_t n, size_t max) {
    if (n <= max) return (int)n;
    size_t k = max;
    while (k > 0 && ((unsigned char)s[k] & 0xc0) == 0x80) k--;
    return (int)k;
}

/* The member key of obj. json null reads as absent: optional fields take their default. */
static json_object *member(json_object *obj, const char *key) {
    json_object *v = NULL;
    return json_object_object_get_ex(obj, key, &v) ? v : NULL;
}

static serve_code get_str(ctx *c, json_object *obj, const char *key, const char *path, bool required, const char **out,
                          size_t *out_len) {
    json_object *v = member(obj, key);
    if (!v) {
        if (required) return fail(c, SERVE_INVALID_REQUEST, "missing field '%s' (a string)", path);
        return SERVE_OK;
    }
    if (!json_object_is_type(v, json_type_string))
        return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be a string (got %s)", path, type_name(v));
    const char *s = json_object_get_string(v);
    size_t n = (size_t)json_object_get_string_len(v);
    /* text goes on through C strings (chat templates): the one text rule of both servers */
    serve_code rc = serve_check_text(s, n, path, c->msg, c->cap);
    if (rc) return rc;
    *out = s;
    if (out_len) *out_len = n;
    return SERVE_OK;
}

static serve_code get_bool(ctx *c, json_object *obj, const char *key, bool *out) {
    json_object *v = member(obj, key);
    if (!v) return SERVE_OK;
    if (!json_object_is_type(v, json_type_boolean))
        return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be true or false (got %s)", key, type_name(v));
    *out = json_object_get_boolean(v);
    return SERVE_OK;
}

static serve_code get_float(ctx *c, json_object *obj, const char *key, double lo, double hi, float *out) {
    json_object *v = member(obj, key);
    if (!v) return SERVE_OK;
    if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
        return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be a number (got %s)", key, type_name(v));
    double d = json_object_get_double(v);
    if (!(d >= lo && d <= hi)) /* NaN fails too */
        return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be a number in [%g, %g] (got %.40s)", key, lo, hi,
                    json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
    *out = (float)d;
    return SERVE_OK;
}

/* Integers may also be written as integral decimals (5.0), as some JSON encoders do. */
static serve_code get_int(ctx *c, json_object *obj, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_object *v = member(obj, key);
    if (!v) return SERVE_OK;
    int64_t x;
    if (json_object_is_type(v, json_type_int)) {
        x = json_object_get_int64(v); /* saturates, so huge values fail the range check */
    } else if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) goto range;
        x = (int64_t)d;
    } else {
        return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be an integer (got %s)", key, type_name(v));
    }
    if (x < lo || x > hi) goto range;
    *out = x;
    return SERVE_OK;
range:
    return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be an integer in [%lld, %lld] (got %.40s)", key,
                (long long)lo, (long long)hi, json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN));
}

static serve_code get_seed(ctx *c, json_object *obj, uint64_t *out) {
    json_object *v = member(obj, "seed");
    return v ? serve_check_seed(v, out, c->msg, c->cap) : SERVE_OK;
}

static serve_code get_stop(ctx *c, json_object *obj, serve_gen *g) {
    json_object *v = member(obj, "stop");
    g->n_stop = 0;
    if (!v) return SERVE_OK;
    bool one = json_object_is_type(v, json_type_string);
    if (!one && !json_object_is_type(v, json_type_array))
        return fail(c, SERVE_INVALID_REQUEST, "field 'stop' must be a string or an array of strings (got %s)",
                    type_name(v));
    size_t n = one ? 1 : json_object_array_length(v);
    if (n > SERVE_MAX_STOP)
        return fail(c, SERVE_INVALID_REQUEST, "field 'stop' has %zu strings (at most %d)", n, SERVE_MAX_STOP);
    for (size_t i = 0; i < n; i++) {
        json_object *s = one ? v : json_object_array_get_idx(v, i);
        if (!json_object_is_type(s, json_type_string))
            return fail(c, SERVE_INVALID_REQUEST, "field 'stop[%zu]' must be a string (got %s)", i, type_name(s));
        size_t len = (size_t)json_object_get_string_len(s);
        if (len == 0 || len > SERVE_MAX_STOP_BYTES) {
            char path[32] = "stop";
            if (!one) snprintf(path, sizeof path, "stop[%zu]", i);
            return fail(c, SERVE_INVALID_REQUEST, "field '%s' must be 1 to %d bytes long (got %zu)", path,
                        SERVE_MAX_STOP_BYTES, len);
        }
        g->stop[g->n_stop] = json_object_get_string(s);
        g->stop_len[g->n_stop++] = len;
    }
    return SERVE_OK;
}

/* response_format: text, json_object (llama.cpp's "schema" beside it is honoured too) or
 * json_schema with json_schema.schema. */
static serve_code get_format(ctx *c, json_object *o, rk_json_grammar **out) {
    json_object *v = member(o, "response_format");
    if (!v) return SERVE_OK;
    if (!json_object_is_type(v, json_type_object))
        return fail(c, SERVE_INVALID_REQUEST, "field 'response_format' must be an object (got %s)", type_name(v));
    const char *type = NULL;
    serve_code rc = get_str(c, v, "type", "response_format.type", true, &type, NULL);
    if (rc) return rc;
    json_object *schema = NULL;
    const char *path = "response_format.schema";
    if (!strcmp(type, "text")) return SERVE_OK;
    if (!strcmp(type, "json_schema")) {
        json_object *js = member(v, "json_schema");
        if (!js || !json_object_is_type(js, json_type_object))
            return fail(c, SERVE_INVALID_REQUEST,
                        "field 'response_format.json_schema' must be an object holding \"schema\" (got %s)",
                        js ? type_name(js) : "nothing");
        schema = member(js, "schema");
        path = "response_format.json_schema.schema";
        if (!schema) return fail(c, SERVE_INVALID_REQUEST, "missing field '%s' (a JSON Schema object)", path);
    } else if (!strcmp(type, "json_object")) {
        schema = member(v, "schema");
    } else {
        return fail(c, SERVE_INVALID_REQUEST,
                    "field 'response_format.type' must be \"text\", \"json_object\" or \"json_schema\" (got "
                    "\"%.*s\")",
                    clip(type, strlen(type), 40), type);
    }
    rk_err e = {0};
    size_t n = 0;
    const char *text = schema ? json_object_to_json_string_length(schema, JSON_C_TO_STRING_PLAIN, &n) : NULL;
    rk_json_grammar *g = NULL;
    rk_status st = rk_json_grammar_create(text, n, &g, &e);
    if (st) return fail(c, st == RK_E_NOMEM ? SERVE_INTERNAL : SERVE_INVALID_REQUEST, "field '%s': %s", path, e.msg);
    rk_json_grammar_destroy(*out);
    *out = g;
    return SERVE_OK;
}

static serve_code parse_sampling(ctx *c, json_object *o, serve_gen *g, rk_json_grammar **grammar) {
    serve_code rc;
    int64_t i = g->sp.top_k;
    if ((rc = get_int(c, o, "top_k", 0, SERVE_MAX_TOKENS_LIMIT, &i))) return rc;
    g->sp.top_k = (int32_t)i;
    if ((rc = get_float(c, o, "min_p", 0, 1, &g->sp.min_p))) return rc;
    if ((rc = get_float(c, o, "repeat_penalty", 0.01, 100, &g->sp.repeat_penalty))) return rc;
    i = g->sp.repeat_last_n;
    if ((rc = get_int(c, o, "repeat_last_n", 0, SERVE_MAX_TOKENS_LIMIT, &i))) return rc;
    g->sp.repeat_last_n = (int32_t)i;
    if ((rc = get_float(c, o, "frequency_penalty", -2, 2, &g->sp.frequency_penalty))) return rc;
    if ((rc = get_float(c, o, "presence_penalty", -2, 2, &g->sp.presence_penalty))) return rc;
    if ((rc = get_float(c, o, "dry_multiplier", 0, 100, &g->sp.dry_multiplier))) return rc;
    if ((rc = get_float(c, o, "dry_base", 1.0001, 100, &g->sp.dry_base))) return rc;
    i = g->sp.dry_allowed_length;
    if ((rc = get_int(c, o, "dry_allowed_length", 1, 1 << 16, &i))) return rc;
    g->sp.dry_allowed_length = (int32_t)i;
    i = g->sp.dry_penalty_last_n;
    if ((rc = get_int(c, o, "dry_penalty_last_n", -1, SERVE_MAX_TOKENS_LIMIT, &i))) return rc;
    g->sp.dry_penalty_last_n = (int32_t)i;
    return get_format(c, o, grammar);
}

serve_code serve_parse_sampling(json_object *o, serve_gen *g, rk_json_grammar **grammar, char *msg, size_t cap) {
    ctx c = {msg, cap};
    return parse_sampling(&c, o, g, grammar);
}

static serve_code parse_gen(ctx *c, json_object *o, serve_gen *g, rk_json_grammar **grammar) {
    serve_code rc;
    int64_t i;
    i = g->max_tokens;
    if ((rc = get_int(c, o, "max_tokens", -1, SERVE_MAX_TOKENS_LIMIT, &i))) return rc;
    g->max_tokens = (int)i;
    if ((rc = get_float(c, o, "temperature", 0, 100, &g->sp.temp))) return rc;
    if ((rc = get_float(c, o, "top_p", 0, 1, &g->sp.top_p))) return rc;
    if ((rc = parse_sampling(c, o, g, grammar))) return rc;
    if ((rc = get_seed(c, o, &g->sp.seed))) return rc;
    if ((rc = get_stop(c, o, g))) return rc;
    if ((rc = get_bool(c, o, "stream", &g->stream))) return rc;
    /* the session and the prefill; the values are checked against the engine in serve_ops.c */
    if ((rc = get_str(c, o, "kv", "kv", false, &g->kv, NULL))) return rc;
    if ((rc = get_str(c, o, "fill", "fill", false, &g->fill, NULL))) return rc;
    if ((rc = get_str(c, o, "ridgefill", "ridgefill", false, &g->ridgefill, NULL))) return rc;
    i = g->tail;
    if ((rc = get_int(c, o, "tail", 512, SERVE_MAX_TOKENS_LIMIT, &i))) return rc;
    g->tail = (int)i;
    return SERVE_OK;
}

static serve_code parse_chat(ctx *c, json_object *o, serve_req *r) {
    json_object *v = member(o, "messages");
    if (!v) return fail(c, SERVE_INVALID_REQUEST, "missing field 'messages' (an array of {\"role\", \"content\"})");
    if (!json_object_is_type(v, json_type_array))
        return fail(c, SERVE_INVALID_REQUEST, "field 'messages' must be an array (got %s)", type_name(v));
    size_t n = json_object_array_length(v);
    if (n == 0) return fail(c, SERVE_INVALID_REQUEST, "field 'messages' is empty");
    if (!(r->msgs = calloc(n, sizeof *r->msgs))) return fail(c, SERVE_INTERNAL, "out of memory");
    r->n_msgs = n;
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(v, i);
        char path[64];
        if (!json_object_is_type(m, json_type_object))
            return fail(c, SERVE_INVALID_REQUEST, "field 'messages[%zu]' must be an object (got %s)", i, type_name(m));
        serve_code rc;
        snprintf(path, sizeof path, "messages[%zu].role", i);
        if ((rc = get_str(c, m, "role", path, true, &r->msgs[i].role, NULL))) return rc;
        if (strcmp(r->msgs[i].role, "system") && strcmp(r->msgs[i].role, "user") &&
            strcmp(r->msgs[i].role, "assistant"))
            return fail(c, SERVE_INVALID_REQUEST,
                        "field '%s' must be \"system\", \"user\" or \"assistant\" (got \"%.*s\")", path,
                        clip(r->msgs[i].role, strlen(r->msgs[i].role), 32), r->msgs[i].role);
        snprintf(path, sizeof path, "messages[%zu].content", i);
        if ((rc = get_str(c, m, "content", path, true, &r->msgs[i].content, NULL))) return rc;
    }
    return SERVE_OK;
}

static serve_code parse_ask(ctx *c, json_object *o, serve_req *r) {
    json_object *v = member(o, "docs");
    if (!v) return fail(c, SERVE_INVALID_REQUEST, "missing field 'docs' (an array of strings or {\"name\", \"text\"})");
    if (!json_object_is_type(v, json_type_array))
        return fail(c, SERVE_INVALID_REQUEST, "field 'docs' must be an array (got %s)", type_name(v));
    size_t n = json_object_array_length(v);
    if (n && !(r->docs = calloc(n, sizeof *r->docs))) return fail(c, SERVE_INTERNAL, "out of memory");
    r->n_docs = n;
    serve_code rc;
    for (size_t i = 0; i < n; i++) {
        json_object *d = json_object_array_get_idx(v, i);
        char path[64];
        if (json_object_is_type(d, json_type_string)) {
            snprintf(path, sizeof path, "docs[%zu]", i);
            const char *s = json_object_get_string(d);
            if ((rc = serve_check_text(s, (size_t)json_object_get_string_len(d), path, c->msg, c->cap))) return rc;
            r->docs[i].text = s;
            continue;
        }
        if (!json_object_is_type(d, json_type_object))
            return fail(c, SERVE_INVALID_REQUEST, "field 'docs[%zu]' must be a string or an object (got %s)", i,
                        type_name(d));
        snprintf(path, sizeof path, "docs[%zu].name", i);
        if ((rc = get_str(c, d, "name", path, false, &r->docs[i].name, NULL))) return rc;
        snprintf(path, sizeof path, "docs[%zu].text", i);
        if ((rc = get_str(c, d, "text", path, true, &r->docs[i].text, NULL))) return rc;
    }
    if ((rc = get_str(c, o, "question", "question", true, &r->question, NULL))) return rc;
    return get_str(c, o, "system", "system", false, &r->system, NULL);
}

/* Takes root's id when it is usable; returns why not (msg) otherwise. */
static serve_code take_id(ctx *c, serve_req *r) {
    json_object *id = NULL;
    if (!json_object_object_get_ex(r->root, "id", &id))
        return fail(c, SERVE_INVALID_REQUEST, "missing field 'id' (a string or a number)");
    switch (json_object_get_type(id)) {
    case json_type_string:
        /* escapes decode to well-formed text, but a raw bad byte may sit in an invalid_utf8 line */
        if (!rk_utf8_valid(json_object_get_string(id), (size_t)json_object_get_string_len(id), NULL))
            return fail(c, SERVE_INVALID_REQUEST, "field 'id' is not valid UTF-8");
        break;
    case json_type_double:
        /* json-c reads NaN and Infinity, which no JSON reader could take back */
        if (!isfinite(json_object_get_double(id)))
            return fail(c, SERVE_INVALID_REQUEST, "field 'id' must be a finite number");
        break;
    case json_type_int: {
        /* json-c clamps integers beyond 64 bits to these, so they would not echo back */
        int64_t s = json_object_get_int64(id);
        if (s == INT64_MIN || (s == INT64_MAX && json_object_get_uint64(id) == UINT64_MAX))
            return fail(c, SERVE_INVALID_REQUEST, "field 'id' is outside the 64-bit integer range (use a string)");
        break;
    }
    default: return fail(c, SERVE_INVALID_REQUEST, "field 'id' must be a string or a number (got %s)", type_name(id));
    }
    r->id = id;
    return SERVE_OK;
}

serve_code serve_req_parse(const char *line, size_t len, const serve_gen *defaults, serve_req *r, char *msg,
                           size_t cap) {
    ctx c = {msg, cap};
    memset(r, 0, sizeof *r);
    r->gen = *defaults;
    r->gen.n_stop = 0;
    r->add_special = r->parse_special = true;
    if (cap) msg[0] = 0;
    if (len > INT_MAX) return fail(&c, SERVE_LINE_TOO_LONG, "line too long (%zu bytes)", len);

    size_t bad = 0;
    bool utf8_ok = rk_utf8_valid(line, len, &bad);
    json_tokener *tok = json_tokener_new_ex(SERVE_JSON_DEPTH);
    if (!tok) return fail(&c, SERVE_INTERNAL, "out of memory");
    /* trailing text is checked below, for a message with its position */
    json_tokener_set_flags(tok, JSON_TOKENER_STRICT | JSON_TOKENER_ALLOW_TRAILING_CHARS);
    r->root = json_tokener_parse_ex(tok, line, (int)len);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t end = json_tokener_get_parse_end(tok);
    if (je == json_tokener_continue) {
        /* a bare number or literal ends only at a terminator: json-c takes a NUL as end of input */
        r->root = json_tokener_parse_ex(tok, "", 1);
        je = json_tokener_get_error(tok);
        end = len;
    }
    json_tokener_free(tok);
    size_t trail = end;
    while (trail < len && (line[trail] == ' ' || line[trail] == '\t' || line[trail] == '\r')) trail++;
    bool json_ok = je == json_tokener_success && trail == len;
    bool is_obj = json_ok && r->root && json_object_is_type(r->root, json_type_object);
    char scratch[8];
    ctx quiet = {scratch, sizeof scratch};

    if (!utf8_ok) {
        if (is_obj) take_id(&quiet, r); /* answer with the id when the rest of the line allows */
        return fail(&c, SERVE_INVALID_UTF8, "the line is not valid UTF-8 (byte %zu is 0x%02x)", bad,
                    (unsigned char)line[bad]);
    }
    if (je == json_tokener_continue || je == json_tokener_error_parse_eof)
        return fail(&c, SERVE_BAD_JSON, "malformed JSON: the line ends inside a value (%zu bytes)", len);
    if (je == json_tokener_error_depth)
        return fail(&c, SERVE_BAD_JSON, "malformed JSON: nesting deeper than %d levels at byte %zu", SERVE_JSON_DEPTH,
                    end);
    if (je != json_tokener_success)
        return fail(&c, SERVE_BAD_JSON, "malformed JSON at byte %zu: %s", end, json_tokener_error_desc(je));
    if (!json_ok) return fail(&c, SERVE_BAD_JSON, "malformed JSON: unexpected text after the value at byte %zu", trail);
    if (!is_obj) return fail(&c, SERVE_INVALID_REQUEST, "a request must be a JSON object (got %s)", type_name(r->root));

    serve_code rc;
    if ((rc = take_id(&c, r))) return rc;
    json_object *o = r->root, *op = member(o, "op");
    if (!op) return fail(&c, SERVE_INVALID_REQUEST, "missing field 'op' (complete, chat, ask, tokenize or info)");
    if (!json_object_is_type(op, json_type_string))
        return fail(&c, SERVE_INVALID_REQUEST, "field 'op' must be a string (got %s)", type_name(op));
    const char *ops = json_object_get_string(op);
    size_t ops_len = (size_t)json_object_get_string_len(op);
    size_t k = 0, n_ops = sizeof op_names / sizeof op_names[0];
    while (k < n_ops && (strlen(op_names[k]) != ops_len || memcmp(op_names[k], ops, ops_len))) k++;
    if (k == n_ops)
        return fail(&c, SERVE_UNKNOWN_OP, "unknown op \"%.*s\" (expected complete, chat, ask, tokenize or info)",
                    clip(ops, strnlen(ops, ops_len), 64), ops);
    r->op = (serve_op)k;

    switch (r->op) {
    case SERVE_OP_COMPLETE:
        if ((rc = get_str(&c, o, "prompt", "prompt", true, &r->text, &r->text_len))) return rc;
        if ((rc = get_bool(&c, o, "add_special", &r->add_special))) return rc;
        if ((rc = get_bool(&c, o, "parse_special", &r->parse_special))) return rc;
        return parse_gen(&c, o, &r->gen, &r->grammar);
    case SERVE_OP_CHAT:
        if ((rc = parse_chat(&c, o, r))) return rc;
        return parse_gen(&c, o, &r->gen, &r->grammar);
    case SERVE_OP_ASK:
        if ((rc = parse_ask(&c, o, r))) return rc;
        return parse_gen(&c, o, &r->gen, &r->grammar);
    case SERVE_OP_TOKENIZE:
        if ((rc = get_str(&c, o, "text", "text", true, &r->text, &r->text_len))) return rc;
        if ((rc = get_bool(&c, o, "add_special", &r->add_special))) return rc;
        if ((rc = get_bool(&c, o, "parse_special", &r->parse_special))) return rc;
        return get_bool(&c, o, "pieces", &r->pieces);
    case SERVE_OP_INFO: return SERVE_OK;
    }
    return fail(&c, SERVE_INTERNAL, "op %d not handled", (int)r->op);
}

void serve_req_deinit(serve_req *r) {
    if (!r) return;
    json_object_put(r->root);
    rk_json_grammar_destroy(r->grammar);
    free(r->msgs);
    free(r->docs);
    memset(r, 0, sizeof *r);
}
