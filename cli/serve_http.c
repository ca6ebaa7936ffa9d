/* ridgekv serve --http ADDR:PORT: OpenAI-compatible endpoints on libmicrohttpd.
 *
 *   GET  /health                 {"status":"ok"}
 *   GET  /v1/models              the one model
 *   POST /v1/chat/completions    messages -> an rk_conv turn (the JSONL chat path)
 *   POST /v1/completions         prompt -> rk_generate (the JSONL complete path)
 *
 * "stream": true answers with server-sent events (data: {chunk}\n\n ... data: [DONE]).
 * One model and one session, loaded once; generation runs one request at a time (a mutex:
 * other requests wait in line, concurrency 1). Each connection has its own thread, so a
 * streaming answer is produced by a generation thread writing SSE lines into a pipe that
 * libmicrohttpd sends; a client that goes away closes the pipe, the next write fails and
 * the generation stops. Bodies over max_body get 413 before they are read. The connection
 * layer (serve_conn.c) checks Host, Origin, the API key and the body's type before a body
 * is read, sheds idle and slow connections, and stops a non-streamed generation whose
 * client left. docs/HTTP.md. */
#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "catalog.h"
#include "cli.h"
#include "serve.h"
#include "serve_conn.h"
#include "serve_guard.h"

static pthread_mutex_t g_engine = PTHREAD_MUTEX_INITIALIZER; /* one generation at a time */
static unsigned long long g_req_counter;
/* stream threads alive (detached): shutdown waits for them before the model goes */
static pthread_mutex_t g_jobs_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_jobs_cv = PTHREAD_COND_INITIALIZER;
static int g_jobs;

static void jobs_add(int d) {
    pthread_mutex_lock(&g_jobs_mu);
    g_jobs += d;
    if (!g_jobs) pthread_cond_broadcast(&g_jobs_cv);
    pthread_mutex_unlock(&g_jobs_mu);
}

typedef struct http_conn {
    serve_buf body;
    bool too_big;
} http_conn;

/* ---- responses ---------------------------------------------------------------------- */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_object *o) {
    size_t n = 0;
    const char *s = json_object_to_json_string_length(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n);
    struct MHD_Response *r = MHD_create_response_from_buffer(n, (void *)s, MHD_RESPMEM_MUST_COPY);
    json_object_put(o);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "application/json");
    serve_conn_cors(c, r);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status, const char *type, const char *msg) {
    json_object *o = json_object_new_object(), *e = json_object_new_object();
    serve_buf clean = {0};
    serve_utf8_sanitize(&clean, msg, strlen(msg));
    json_object_object_add(e, "message", json_object_new_string_len(clean.p ? clean.p : "", (int)clean.n));
    serve_buf_free(&clean);
    json_object_object_add(e, "type", json_object_new_string(type));
    json_object_object_add(e, "code", json_object_new_int((int)status));
    json_object_object_add(o, "error", e);
    return send_json(c, status, o);
}

/* ---- request -> serve_req ------------------------------------------------------------ */
typedef struct http_req {
    serve_req r; /* root owns every string */
    bool chat;
    char id[48];
    long long created;
    char model[256];
    rk_chat_msg *msgs;
} http_req;

/* A message's content as one string: a string as it is, or the text parts of a list
 * ([{"type": "text", "text": ...}]) joined; the joined text replaces the list in the
 * message object, which keeps it. Returns 0 or an HTTP status with msg set. */
static unsigned message_text(json_object *m, size_t i, const char **out, char *msg, size_t cap) {
    json_object *content = NULL;
    if (!json_object_object_get_ex(m, "content", &content) || json_object_is_type(content, json_type_null))
        return snprintf(msg, cap, "messages[%zu].content is missing (a string or a list of text parts)", i), 400;
    if (json_object_is_type(content, json_type_array)) {
        serve_buf b = {0};
        const size_t n = json_object_array_length(content);
        for (size_t k = 0; k < n; k++) {
            json_object *part = json_object_array_get_idx(content, k), *type, *text;
            const char *ts =
                json_object_object_get_ex(part, "type", &type) && json_object_is_type(type, json_type_string)
                    ? json_object_get_string(type)
                    : NULL;
            if (!ts) {
                serve_buf_free(&b);
                return snprintf(msg, cap, "messages[%zu].content[%zu] needs a string 'type'", i, k), 400;
            }
            if (strcmp(ts, "text")) {
                serve_buf_free(&b);
                return snprintf(msg, cap,
                                "messages[%zu].content[%zu] is a \"%.40s\" part: this model reads text only "
                                "(parts of type \"text\")",
                                i, k, ts),
                       400;
            }
            if (!json_object_object_get_ex(part, "text", &text) || !json_object_is_type(text, json_type_string)) {
                serve_buf_free(&b);
                return snprintf(msg, cap, "messages[%zu].content[%zu].text must be a string", i, k), 400;
            }
            if (!serve_buf_put(&b, json_object_get_string(text), (size_t)json_object_get_string_len(text))) {
                serve_buf_free(&b);
                return snprintf(msg, cap, "out of memory"), 500;
            }
        }
        json_object *joined = json_object_new_string_len(b.p ? b.p : "", (int)b.n);
        serve_buf_free(&b);
        if (!joined) return snprintf(msg, cap, "out of memory"), 500;
        json_object_object_add(m, "content", joined);
        content = joined;
    }
    if (!json_object_is_type(content, json_type_string))
        return snprintf(msg, cap, "messages[%zu].content must be a string or a list of text parts", i), 400;
    const char *cs = json_object_get_string(content);
    char path[48]; /* one rule with JSONL: no NUL, valid UTF-8 (cli/serve_guard.c) */
    snprintf(path, sizeof path, "messages[%zu].content", i);
    if (serve_check_text(cs, (size_t)json_object_get_string_len(content), path, msg, cap)) return 400;
    *out = cs;
    return 0;
}

/* The messages of a chat request. System (and developer) messages are joined, in order,
 * into one system message that comes first: the templates take one system message at the
 * start. Tool calls are refused by field: this server has no tool calling. */
static unsigned parse_messages(json_object *root, serve_req *r, char *msg, size_t cap) {
    json_object *v;
    if (!json_object_object_get_ex(root, "messages", &v) || !json_object_is_type(v, json_type_array) ||
        json_object_array_length(v) == 0)
        return snprintf(msg, cap, "'messages' must be a non-empty array"), 400;
    size_t nm = json_object_array_length(v);
    if (!(r->msgs = calloc(nm, sizeof *r->msgs))) return snprintf(msg, cap, "out of memory"), 500;
    serve_buf sys = {0};
    size_t n_sys = 0, n = 0; /* system messages; the others */
    unsigned code = 0;
    for (size_t i = 0; i < nm && !code; i++) {
        json_object *m = json_object_array_get_idx(v, i), *role, *x;
        if (!json_object_is_type(m, json_type_object) || !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string)) {
            code = 400, snprintf(msg, cap, "messages[%zu] needs a string 'role'", i);
            break;
        }
        const char *rs = json_object_get_string(role);
        if (!strcmp(rs, "tool") || !strcmp(rs, "function")) {
            code = 400, snprintf(msg, cap,
                                 "messages[%zu].role \"%s\" is not supported: this server has no tool calling "
                                 "(send the tool's result as a user message)",
                                 i, rs);
            break;
        }
        if ((json_object_object_get_ex(m, "tool_calls", &x) && !json_object_is_type(x, json_type_null) &&
             !(json_object_is_type(x, json_type_array) && json_object_array_length(x) == 0)) ||
            (json_object_object_get_ex(m, "function_call", &x) && !json_object_is_type(x, json_type_null))) {
            code = 400,
            snprintf(msg, cap, "messages[%zu].tool_calls is not supported: this server has no tool calling", i);
            break;
        }
        const bool is_sys = !strcmp(rs, "system") || !strcmp(rs, "developer"); /* developer: the newer name */
        if (!is_sys && strcmp(rs, "user") && strcmp(rs, "assistant")) {
            code = 400, snprintf(msg, cap,
                                 "messages[%zu].role must be \"system\", \"developer\", \"user\" or "
                                 "\"assistant\" (got \"%.32s\")",
                                 i, rs);
            break;
        }
        const char *cs = NULL;
        if ((code = message_text(m, i, &cs, msg, cap))) break;
        if (!is_sys) {
            r->msgs[n++] = (rk_chat_msg){rs, cs};
            continue;
        }
        if ((n_sys++ && !serve_buf_put(&sys, "\n\n", 2)) || !serve_buf_put(&sys, cs, strlen(cs)))
            code = 500, snprintf(msg, cap, "out of memory");
    }
    if (!code && n_sys) {
        /* the joined system text lives in the root object, with every other string */
        json_object *joined = json_object_new_string_len(sys.p ? sys.p : "", (int)sys.n);
        if (!joined) code = 500, snprintf(msg, cap, "out of memory");
        else {
            json_object_object_add(root, "\x01system", joined);
            memmove(r->msgs + 1, r->msgs, n * sizeof *r->msgs);
            r->msgs[0] = (rk_chat_msg){"system", json_object_get_string(joined)};
            n++;
        }
    }
    serve_buf_free(&sys);
    r->n_msgs = n;
    return code;
}

/* Parses an OpenAI request body into h (the JSONL request it stands for). Returns 0, or
 * an HTTP status with msg set. */
static unsigned parse_body(const server *sv, const char *body, size_t n, bool chat, http_req *h, char *msg,
                           size_t cap) {
    memset(h, 0, sizeof *h);
    h->chat = chat;
    json_tokener *tok = json_tokener_new_ex(SERVE_JSON_DEPTH);
    if (!tok) return snprintf(msg, cap, "out of memory"), 500;
    json_object *root = json_tokener_parse_ex(tok, body, (int)n);
    enum json_tokener_error je = json_tokener_get_error(tok);
    size_t used = json_tokener_get_parse_end(tok);
    json_tokener_free(tok);
    if (!root || je != json_tokener_success || used != n) {
        json_object_put(root);
        snprintf(msg, cap, "the body is not one JSON value (%s)",
                 je != json_tokener_success ? json_tokener_error_desc(je) : "text after the value");
        return 400;
    }
    h->r.root = root;
    if (!json_object_is_type(root, json_type_object)) return snprintf(msg, cap, "the body must be a JSON object"), 400;
    serve_req *r = &h->r;
    r->gen = sv->defaults;
    r->gen.stream = false;
    r->add_special = true;
    r->parse_special = false; /* prompts are text: "<|im_end|>" in a prompt stays text */
    json_object *v;
    if (json_object_object_get_ex(root, "model", &v) && json_object_is_type(v, json_type_string))
        snprintf(h->model, sizeof h->model, "%s", json_object_get_string(v));
    else snprintf(h->model, sizeof h->model, "%s", sv->model_id);
    if (chat) {
        r->op = SERVE_OP_CHAT;
        unsigned code = parse_messages(root, r, msg, cap);
        if (code) return code;
    } else {
        r->op = SERVE_OP_COMPLETE;
        if (!json_object_object_get_ex(root, "prompt", &v) || !json_object_is_type(v, json_type_string))
            return snprintf(msg, cap, "'prompt' must be a string"), 400;
        r->text = json_object_get_string(v);
        r->text_len = (size_t)json_object_get_string_len(v);
        if (serve_check_text(r->text, r->text_len, "prompt", msg, cap)) return 400;
    }
    if ((json_object_object_get_ex(root, "max_completion_tokens", &v) ||
         json_object_object_get_ex(root, "max_tokens", &v)) &&
        !json_object_is_type(v, json_type_null)) {
        int64_t k = json_object_get_int64(v);
        if (!json_object_is_type(v, json_type_int) || k < 1 || k > SERVE_MAX_TOKENS_LIMIT)
            return snprintf(msg, cap, "'max_tokens' must be an integer in [1, %d]", SERVE_MAX_TOKENS_LIMIT), 400;
        r->gen.max_tokens = (int)k;
    }
    if (json_object_object_get_ex(root, "temperature", &v) && !json_object_is_type(v, json_type_null)) {
        double t = json_object_get_double(v);
        if (!(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) || !(t >= 0 && t <= 2))
            return snprintf(msg, cap, "'temperature' must be a number in [0, 2]"), 400;
        r->gen.sp.temp = (float)t;
    }
    if (json_object_object_get_ex(root, "top_p", &v) && !json_object_is_type(v, json_type_null)) {
        double t = json_object_get_double(v);
        if (!(json_object_is_type(v, json_type_double) || json_object_is_type(v, json_type_int)) || !(t > 0 && t <= 1))
            return snprintf(msg, cap, "'top_p' must be a number in (0, 1]"), 400;
        r->gen.sp.top_p = (float)t;
    }
    if (json_object_object_get_ex(root, "seed", &v) && !json_object_is_type(v, json_type_null)) {
        if (serve_check_seed(v, &r->gen.sp.seed, msg, cap)) return 400;
    }
    if (json_object_object_get_ex(root, "stream", &v) && !json_object_is_type(v, json_type_null)) {
        if (!json_object_is_type(v, json_type_boolean)) return snprintf(msg, cap, "'stream' must be a boolean"), 400;
        r->gen.stream = json_object_get_boolean(v);
    }
    if (json_object_object_get_ex(root, "n", &v) && !json_object_is_type(v, json_type_null) &&
        json_object_get_int(v) != 1)
        return snprintf(msg, cap, "'n' must be 1 (one choice per request)"), 400;
    static const char *const no_tools[] = {"tools", "functions"};
    for (size_t k = 0; k < 2; k++)
        if (json_object_object_get_ex(root, no_tools[k], &v) && !json_object_is_type(v, json_type_null) &&
            !(json_object_is_type(v, json_type_array) && json_object_array_length(v) == 0))
            return snprintf(msg, cap, "'%s' is not supported: this server has no tool calling", no_tools[k]), 400;
    if (json_object_object_get_ex(root, "tool_choice", &v) && !json_object_is_type(v, json_type_null) &&
        !(json_object_is_type(v, json_type_string) &&
          (!strcmp(json_object_get_string(v), "none") || !strcmp(json_object_get_string(v), "auto"))))
        return snprintf(msg, cap, "'tool_choice' is not supported: this server has no tool calling"), 400;
    if (serve_parse_sampling(root, &r->gen, &r->grammar, msg, cap)) return 400;
    if (json_object_object_get_ex(root, "stop", &v) && !json_object_is_type(v, json_type_null)) {
        json_object *one[1] = {v};
        size_t ns = json_object_is_type(v, json_type_array) ? json_object_array_length(v) : 1;
        if (ns > SERVE_MAX_STOP) return snprintf(msg, cap, "'stop' has more than %d strings", SERVE_MAX_STOP), 400;
        for (size_t i = 0; i < ns; i++) {
            json_object *s = json_object_is_type(v, json_type_array) ? json_object_array_get_idx(v, i) : one[0];
            size_t sl = json_object_is_type(s, json_type_string) ? (size_t)json_object_get_string_len(s) : 0;
            if (sl == 0 || sl > SERVE_MAX_STOP_BYTES)
                return snprintf(msg, cap, "'stop' must be a string or an array of 1..%d byte strings",
                                SERVE_MAX_STOP_BYTES),
                       400;
            r->gen.stop[r->gen.n_stop] = json_object_get_string(s);
            r->gen.stop_len[r->gen.n_stop++] = sl;
        }
    }
    /* the model: the served one by its id, GGUF name or file name; another is not here */
    const char *want = h->model;
    char file[sizeof sv->model_id + 8];
    snprintf(file, sizeof file, "%s.gguf", sv->model_id);
    if (strcmp(want, sv->model_id) && strcmp(want, rk_model_name(sv->m)) && strcmp(want, file)) {
        snprintf(msg, cap, "the model '%.100s' does not exist: this server serves '%s' (GET /v1/models)", want,
                 sv->model_id);
        return 404;
    }
    snprintf(h->model, sizeof h->model, "%s", sv->model_id);
    h->created = (long long)time(NULL);
    snprintf(h->id, sizeof h->id, "%s-%llu", chat ? "chatcmpl" : "cmpl",
             __atomic_add_fetch(&g_req_counter, 1, __ATOMIC_RELAXED));
    return 0;
}

static const char *finish_reason(rk_stop_reason s) {
    return s == RK_STOP_LENGTH || s == RK_STOP_CONTEXT ? "length" : "stop";
}

/* A chunk or completion object with one choice. */
static json_object *choice_obj(const http_req *h, bool chunk, const char *text, size_t n, const char *finish,
                               bool first) {
    json_object *o = json_object_new_object(), *choices = json_object_new_array(), *c = json_object_new_object();
    json_object_object_add(o, "id", json_object_new_string(h->id));
    json_object_object_add(
        o, "object",
        json_object_new_string(h->chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"));
    json_object_object_add(o, "created", json_object_new_int64(h->created));
    json_object_object_add(o, "model", json_object_new_string(h->model));
    json_object_object_add(c, "index", json_object_new_int(0));
    if (h->chat) {
        json_object *m = json_object_new_object();
        if (!chunk || first) json_object_object_add(m, "role", json_object_new_string("assistant"));
        if (text) json_object_object_add(m, "content", json_object_new_string_len(text, (int)n));
        json_object_object_add(c, chunk ? "delta" : "message", m);
    } else {
        json_object_object_add(c, "text", json_object_new_string_len(text ? text : "", text ? (int)n : 0));
    }
    json_object_object_add(c, "finish_reason", finish ? json_object_new_string(finish) : NULL);
    json_object_array_add(choices, c);
    json_object_object_add(o, "choices", choices);
    return o;
}

static json_object *usage_obj(const rk_gen_result *res) {
    json_object *u = json_object_new_object();
    json_object_object_add(u, "prompt_tokens", json_object_new_int64(res->n_prompt));
    json_object_object_add(u, "completion_tokens", json_object_new_int64(res->n_gen));
    json_object_object_add(u, "total_tokens", json_object_new_int64(res->n_prompt + res->n_gen));
    return u;
}

/* ---- generation --------------------------------------------------------------------- */
typedef struct stream_job {
    server *sv;
    http_req h;
    int fd;    /* the pipe's write end */
    bool gone; /* the client went away (a write failed) */
    bool first;
} stream_job;

static bool write_all(int fd, const char *p, size_t n) {
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static bool sse(stream_job *j, json_object *o) {
    const char *s = json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
    bool ok =
        !j->gone && write_all(j->fd, "data: ", 6) && write_all(j->fd, s, strlen(s)) && write_all(j->fd, "\n\n", 2);
    json_object_put(o);
    if (!ok) j->gone = true;
    return ok;
}

static bool stream_token(void *ud, int32_t tok, const char *text, size_t n) {
    (void)tok;
    stream_job *j = ud;
    if (!n) return !j->gone;
    bool ok = sse(j, choice_obj(&j->h, true, text, n, NULL, j->first));
    j->first = false;
    return ok;
}

static rk_gen_params gen_params(const serve_req *r) {
    rk_gen_params gp = rk_gen_params_default();
    gp.sampler = r->gen.sp;
    gp.max_tokens = r->gen.max_tokens;
    gp.stop = r->gen.stop;
    gp.stop_len = r->gen.stop_len;
    gp.n_stop = r->gen.n_stop;
    gp.grammar = r->grammar;
    return gp;
}

/* Runs the request on the server's session under the engine lock. */
static rk_status run_locked(server *sv, const serve_req *r, rk_gen_params *gp, rk_gen_result *res, rk_err *e) {
    rk_conv *conv = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const char *what = NULL;
    double t_call = 0;
    pthread_mutex_lock(&g_engine);
    rk_status st = rk_session_set_fill(sv->s, &sv->fill, e);
    if (!st) st = serve_run_gen(sv, r, sv->s, gp, &conv, &ids, &n_ids, res, &what, &t_call, e);
    pthread_mutex_unlock(&g_engine);
    rk_conv_destroy(conv);
    free(ids);
    if (st && what && strcmp(what, "generate")) rk_err_wrap(e, "%s", what);
    return st;
}

static unsigned status_of(rk_status st) { return st == RK_E_CONTEXT || st == RK_E_INVALID_ARG ? 400 : 500; }

static void *stream_main(void *arg) {
    stream_job *j = arg;
    rk_gen_params gp = gen_params(&j->h.r);
    gp.on_token = stream_token;
    gp.token_ud = j;
    rk_gen_result res = {0};
    rk_err e = {0};
    rk_status st = run_locked(j->sv, &j->h.r, &gp, &res, &e);
    if (st) {
        json_object *o = json_object_new_object(), *er = json_object_new_object();
        json_object_object_add(er, "message", json_object_new_string(e.msg));
        json_object_object_add(er, "type",
                               json_object_new_string(st == RK_E_CONTEXT ? "context_length_exceeded" : "server_error"));
        json_object_object_add(er, "code", json_object_new_int((int)status_of(st)));
        json_object_object_add(o, "error", er);
        sse(j, o);
    } else {
        if (res.n_text > res.n_streamed) stream_token(j, -1, res.text + res.n_streamed, res.n_text - res.n_streamed);
        json_object *fin = choice_obj(&j->h, true, NULL, 0, finish_reason(res.stop), j->first);
        json_object_object_add(fin, "usage", usage_obj(&res));
        sse(j, fin);
    }
    if (!j->gone && !write_all(j->fd, "data: [DONE]\n\n", 14)) j->gone = true;
    if (j->sv->verbose)
        fprintf(stderr, "ridgekv serve: %s %s: %lld prompt tokens, %lld generated (%s)%s\n", j->h.id,
                st ? "failed" : "done", (long long)res.n_prompt, (long long)res.n_gen,
                st ? e.msg : rk_stop_reason_name(res.stop), j->gone ? "; the client went away" : "");
    rk_gen_result_deinit(&res);
    close(j->fd);
    serve_req_deinit(&j->h.r);
    free(j);
    jobs_add(-1);
    return NULL;
}

static enum MHD_Result generate(server *sv, struct MHD_Connection *c, http_conn *hc, bool chat) {
    http_req h;
    char msg[512];
    unsigned code = parse_body(sv, hc->body.p ? hc->body.p : "", hc->body.n, chat, &h, msg, sizeof msg);
    if (code) {
        serve_req_deinit(&h.r);
        return send_error(c, code, code == 500 ? "server_error" : "invalid_request_error", msg);
    }
    if (h.r.gen.stream) {
        /* a prompt that does not fit is a 400 before the stream's 200 is sent */
        rk_err fe = {0};
        pthread_mutex_lock(&g_engine);
        rk_status fst = serve_prompt_fits(sv, &h.r, sv->s, &fe);
        pthread_mutex_unlock(&g_engine);
        if (fst) {
            serve_req_deinit(&h.r);
            return send_error(c, status_of(fst),
                              fst == RK_E_CONTEXT       ? "context_length_exceeded"
                              : fst == RK_E_INVALID_ARG ? "invalid_request_error"
                                                        : "server_error",
                              fe.msg);
        }
        int p[2];
        stream_job *j = calloc(1, sizeof *j);
        if (!j || pipe2(p, O_CLOEXEC) != 0) {
            free(j);
            serve_req_deinit(&h.r);
            return send_error(c, 500, "server_error", "out of resources for a stream");
        }
        *j = (stream_job){.sv = sv, .h = h, .fd = p[1], .first = true};
        struct MHD_Response *r = MHD_create_response_from_pipe(p[0]);
        pthread_t th;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        jobs_add(1);
        if (!r || pthread_create(&th, &at, stream_main, j) != 0) {
            jobs_add(-1);
            pthread_attr_destroy(&at);
            if (r) MHD_destroy_response(r);
            else close(p[0]);
            close(p[1]);
            serve_req_deinit(&j->h.r);
            free(j);
            return send_error(c, 500, "server_error", "cannot start the stream");
        }
        pthread_attr_destroy(&at);
        MHD_add_response_header(r, "Content-Type", "text/event-stream");
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        serve_conn_cors(c, r);
        serve_conn_phase(c, SERVE_CONN_WORK);
        enum MHD_Result ret = MHD_queue_response(c, 200, r);
        MHD_destroy_response(r);
        return ret;
    }
    rk_gen_params gp = gen_params(&h.r);
    serve_conn_watch watch;
    serve_conn_watch_client(c, &gp, &watch);
    serve_conn_phase(c, SERVE_CONN_WORK);
    rk_gen_result res = {0};
    rk_err e = {0};
    rk_status st = run_locked(sv, &h.r, &gp, &res, &e);
    enum MHD_Result ret;
    if (watch.gone) {
        serve_conn_count_cancel();
        ret = MHD_NO; /* nobody to answer: the connection is closed */
    } else if (st) {
        ret = send_error(c, status_of(st),
                         st == RK_E_CONTEXT       ? "context_length_exceeded"
                         : st == RK_E_INVALID_ARG ? "invalid_request_error"
                                                  : "server_error",
                         e.msg);
    } else {
        json_object *o = choice_obj(&h, false, res.text, res.n_text, finish_reason(res.stop), true);
        json_object_object_add(o, "usage", usage_obj(&res));
        ret = send_json(c, 200, o);
    }
    if (sv->verbose)
        fprintf(stderr, "ridgekv serve: %s %s: %lld prompt tokens, %lld generated (%s)%s\n", h.id,
                st ? "failed" : "done", (long long)res.n_prompt, (long long)res.n_gen,
                st ? e.msg : rk_stop_reason_name(res.stop), watch.gone ? "; the client went away" : "");
    rk_gen_result_deinit(&res);
    serve_req_deinit(&h.r);
    return ret;
}

/* ---- routing -------------------------------------------------------------------------- */
typedef struct http_server {
    server *sv;
    size_t max_body;
    const serve_guard *guard;
} http_server;

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_size, void **state) {
    (void)version;
    http_server *hs = cls;
    server *sv = hs->sv;
    const bool post = !strcmp(method, MHD_HTTP_METHOD_POST);
    const bool chat = !strcmp(url, "/v1/chat/completions"), comp = !strcmp(url, "/v1/completions");
    if (!*state) {
        http_conn *hc = calloc(1, sizeof *hc);
        if (!hc) return MHD_NO;
        *state = hc;
        serve_conn_phase(c, SERVE_CONN_BODY);
        bool done;
        enum MHD_Result ret = serve_conn_admit(hs->guard, c, url, method, &done);
        if (done) return ret;
        if (post) {
            const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
            if (cl && strtoull(cl, NULL, 10) > hs->max_body) hc->too_big = true;
        }
        if (!hc->too_big) return MHD_YES; /* the body (if any) comes in the next calls */
    }
    http_conn *hc = *state;
    if (*upload_size) {
        if (serve_conn_body_late(c)) return MHD_NO; /* a body trickling in past its deadline: the connection goes */
        if (!hc->too_big && hc->body.n + *upload_size > hs->max_body) hc->too_big = true;
        if (!hc->too_big && !serve_buf_put(&hc->body, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    if (hc->too_big) {
        char m[128];
        snprintf(m, sizeof m, "the request body is larger than %zu bytes (see --http-max-body)", hs->max_body);
        return send_error(c, 413, "invalid_request_error", m);
    }
    if (!strcmp(url, "/health")) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "status", json_object_new_string("ok"));
        return send_json(c, 200, o);
    }
    if (!strcmp(url, "/v1/models")) {
        json_object *o = json_object_new_object(), *d = json_object_new_array(), *m = json_object_new_object();
        json_object_object_add(o, "object", json_object_new_string("list"));
        json_object_object_add(m, "id", json_object_new_string(sv->model_id));
        json_object_object_add(m, "object", json_object_new_string("model"));
        json_object_object_add(m, "created", json_object_new_int(0));
        json_object_object_add(m, "owned_by", json_object_new_string("ridgekv"));
        json_object_object_add(m, "context_length", json_object_new_int64(rk_session_n_ctx(sv->s)));
        json_object_array_add(d, m);
        json_object_object_add(o, "data", d);
        return send_json(c, 200, o);
    }
    if (chat || comp) {
        if (!post) return send_error(c, 405, "invalid_request_error", "use POST");
        return generate(sv, c, hc, chat);
    }
    char m[300];
    snprintf(m, sizeof m, "no such endpoint: %s %.200s (/v1/chat/completions, /v1/completions, /v1/models, /health)",
             method, url);
    return send_error(c, 404, "invalid_request_error", m);
}

static void completed(void *cls, struct MHD_Connection *c, void **state, enum MHD_RequestTerminationCode toe) {
    (void)cls, (void)toe;
    serve_conn_phase(c, SERVE_CONN_IDLE);
    http_conn *hc = *state;
    if (hc) {
        serve_buf_free(&hc->body);
        free(hc);
    }
    *state = NULL;
}

/* libmicrohttpd's own messages, as ours: one "ridgekv serve: http: ..." line each. Its bind
 * failure is left out: serve_http says it, with the port asked for. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    const int saved = errno; /* serve_http reports a failed start with errno */
    char m[512];
    vsnprintf(m, sizeof m, fmt, ap);
    size_t n = strlen(m);
    while (n && (m[n - 1] == '\n' || m[n - 1] == '\r')) m[--n] = 0;
    if (strncmp(m, "Failed to bind to port", 22)) fprintf(stderr, "ridgekv serve: http: %s\n", m);
    errno = saved;
}

static bool loopback(const char *addr) { return !strcmp(addr, "localhost") || !strncmp(addr, "127.", 4); }

/* The id clients name the model by: the catalogue name when the file is a catalogue
 * model's, else the file name without .gguf. */
static void set_model_id(server *sv) {
    char buf[4096];
    const char *path = sv->o ? cli_model_path(sv->o, buf, sizeof buf) : NULL;
    const char *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : path ? path : rk_model_name(sv->m);
    for (int i = 0; i < cli_catalog_n; i++)
        if (!strcmp(base, cli_catalog[i].file)) {
            snprintf(sv->model_id, sizeof sv->model_id, "%s", cli_catalog[i].name);
            return;
        }
    size_t n = strlen(base);
    if (n > 5 && !strcmp(base + n - 5, ".gguf")) n -= 5;
    snprintf(sv->model_id, sizeof sv->model_id, "%.*s", (int)(n < 255 ? n : 255), base);
}

int serve_http(server *sv, const char *addr, int port, size_t max_body, const serve_guard *guard_in) {
    set_model_id(sv);
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    const char *a = !strcmp(addr, "localhost") ? "127.0.0.1" : addr;
    if (inet_pton(AF_INET, a, &sin.sin_addr) != 1) {
        fprintf(stderr, "ridgekv serve: --http expects an IPv4 address and a port, like 127.0.0.1:8080 (got '%s')\n",
                addr);
        return RK_EXIT_USAGE;
    }
    serve_guard guard = *guard_in;
    const bool keyed = guard.api_key && guard.api_key[0];
    if (!loopback(addr))
        fprintf(stderr, "ridgekv serve: warning: listening on %s: reachable from other machines%s\n", addr,
                keyed ? "" : ", with no API key (--api-key or RIDGEKV_API_KEY)");
    /* the signals that end the server are taken by sigtimedwait below, in no other thread */
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    http_server hs = {sv, max_body, &guard};
    struct MHD_Daemon *d = MHD_start_daemon(
        MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ITC | MHD_USE_ERROR_LOG, 0, NULL,
        NULL, handle, &hs, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sin,
        MHD_OPTION_NOTIFY_COMPLETED, completed, NULL, MHD_OPTION_NOTIFY_CONNECTION, serve_conn_notify, NULL,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)SERVE_CONN_MAX, MHD_OPTION_CONNECTION_TIMEOUT,
        (unsigned)SERVE_CONN_IDLE_S, MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "ridgekv serve: cannot listen on %s:%d: %s\n", addr, port,
                strerror(errno ? errno : EADDRINUSE));
        return RK_EXIT_IO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    guard.port = info ? info->port : (unsigned)port;
    snprintf(guard.bind_addr, sizeof guard.bind_addr, "%s", a);
    fprintf(stderr,
            "ridgekv serve: %s (%s, ctx %lld) listening on http://%s:%u (OpenAI-compatible; one request at "
            "a time%s)\n",
            sv->model_id, sv->hp->arch_name, (long long)rk_session_n_ctx(sv->s), addr, guard.port,
            keyed ? "; API key required" : "");
    fflush(stderr);
    int sig = 0;
    const struct timespec tick = {1, 0};
    for (;;) { /* once a second: shed connections past their time limits */
        sig = sigtimedwait(&set, NULL, &tick);
        if (sig == SIGINT || sig == SIGTERM) break;
        serve_conn_reap();
    }
    fprintf(stderr, "ridgekv serve: %s: stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    /* no new connections; then the generations in progress (and streams waiting in line)
     * finish before the model and session go */
    MHD_quiesce_daemon(d);
    pthread_mutex_lock(&g_jobs_mu);
    while (g_jobs) pthread_cond_wait(&g_jobs_cv, &g_jobs_mu);
    pthread_mutex_unlock(&g_jobs_mu);
    MHD_stop_daemon(d);
    if (sv->verbose) {
        unsigned long long shed, cancelled;
        serve_conn_stats(&shed, &cancelled);
        fprintf(stderr, "ridgekv serve: %llu connections shed (idle or slow), %llu answers cancelled (client gone)\n",
                shed, cancelled);
    }
    return RK_EXIT_OK;
}

unsigned serve_http_parse(const server *sv, const char *body, size_t n, bool chat, char *msg, size_t cap) {
    http_req h;
    unsigned code = parse_body(sv, body, n, chat, &h, msg, cap);
    serve_req_deinit(&h.r);
    return code;
}
