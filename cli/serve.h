/* ridgekv serve --jsonl, internal to the binary.
 *   serve_req.c   one request line -> serve_req (validated), error codes; no model calls,
 *                 so the libFuzzer target fuzz/fuzz_jsonl.c links it with json-c alone
 *   serve_text.c  byte buffers and U+FFFD repair for event text
 *   serve_ops.c   the ops: sessions and fill per request, rk_generate / rk_conv, events
 *   cmd_serve.c   argv, the stdin line reader, the request loop
 * Generated text goes through rk_generate's streamer (UTF-8 hold-back, stop strings).
 * docs/JSONL.md is the protocol reference; keep it in sync with the codes and fields here. */
#pragma once
#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>

#include "rk_gen.h"

/* Error codes as they appear in `error` events ("code": serve_code_name()). */
typedef enum serve_code {
    SERVE_OK = 0,
    SERVE_BAD_JSON,        /* the line is not one JSON value */
    SERVE_INVALID_REQUEST, /* not an object, or a field missing / of the wrong type or range */
    SERVE_UNKNOWN_OP,
    SERVE_LINE_TOO_LONG,
    SERVE_INVALID_UTF8,
    SERVE_CONTEXT_OVERFLOW, /* the prompt does not fit the context */
    SERVE_INTERNAL,         /* the engine failed; the server keeps going */
    SERVE_CODE_COUNT
} serve_code;

const char *serve_code_name(serve_code c);

typedef enum serve_op { SERVE_OP_COMPLETE, SERVE_OP_CHAT, SERVE_OP_ASK, SERVE_OP_TOKENIZE, SERVE_OP_INFO } serve_op;

#define SERVE_JSON_DEPTH 32 /* nesting a request may use; deeper lines are bad_json */
#define SERVE_MAX_STOP 16
#define SERVE_MAX_STOP_BYTES 256
#define SERVE_MAX_TOKENS_LIMIT (1 << 24)

/* Generation parameters of one request. The server's defaults come from the command line. */
typedef struct serve_gen {
    int max_tokens; /* -1: until end of text or a full context */
    rk_sampler_params sp;
    bool stream;
    int n_stop;
    const char *stop[SERVE_MAX_STOP]; /* borrowed from the request's JSON */
    size_t stop_len[SERVE_MAX_STOP];
    const char *kv;        /* "kv": a KV policy spec; NULL: the server's */
    const char *fill;      /* "fill": a fill mode; NULL: the server's */
    const char *ridgefill; /* "ridgefill": a map file; NULL: the server's */
    int tail;              /* "tail": exact tail; 0: the server's */
} serve_gen;

typedef struct serve_doc {
    const char *name; /* NULL when the doc is a bare string */
    const char *text;
} serve_doc;

/* One parsed request. Every string points into root and lives until serve_req_deinit. */
typedef struct serve_req {
    json_object *root;
    json_object *id; /* borrowed from root; NULL when missing or unusable (reported as null) */
    serve_op op;
    const char *text; /* complete: prompt, tokenize: text */
    size_t text_len;
    bool add_special, parse_special, pieces;
    rk_chat_msg *msgs; /* chat (malloc'd array) */
    size_t n_msgs;
    serve_doc *docs; /* ask (malloc'd array) */
    size_t n_docs;
    const char *question, *system;
    serve_gen gen;
    rk_json_grammar *grammar; /* "response_format" json_object / json_schema (owned); NULL: text */
} serve_req;

/* Parses and validates one line (without its '\n'). On SERVE_OK *r is complete; otherwise
 * msg holds the reason (naming the field) and r->id the request's id when it could be read.
 * Either way the caller releases r with serve_req_deinit. Never aborts on any input. */
serve_code serve_req_parse(const char *line, size_t len, const serve_gen *defaults, serve_req *r, char *msg,
                           size_t cap);
/* Accepts a zeroed or half-built request. */
void serve_req_deinit(serve_req *r);
/* The sampling fields both protocols share: top_k, min_p, repeat_penalty, repeat_last_n,
 * frequency_penalty, presence_penalty, dry_multiplier, dry_base, dry_allowed_length,
 * dry_penalty_last_n, and response_format ({"type": "text" | "json_object" |
 * "json_schema", "json_schema": {"schema": {...}}}) compiled into *grammar (replaced; the
 * caller owns it). SERVE_OK, or SERVE_INVALID_REQUEST with msg naming the field. */
serve_code serve_parse_sampling(json_object *o, serve_gen *g, rk_json_grammar **grammar, char *msg, size_t cap);

/* ---- text (serve_text.c) ---------------------------------------------------------------- */
/* A growable byte buffer. */
typedef struct serve_buf {
    char *p;
    size_t n, cap;
} serve_buf;

bool serve_buf_put(serve_buf *b, const void *p, size_t n);
void serve_buf_free(serve_buf *b);

/* Appends p[0..n) to out with each byte that starts no well-formed character replaced by
 * U+FFFD (rk_utf8_char decides). Returns false when out of memory. */
bool serve_utf8_sanitize(serve_buf *out, const char *p, size_t n);

/* ---- the server (cmd_serve.c, serve_ops.c) ------------------------------------------ */
typedef struct server {
    rk_model *m;
    const rk_hparams *hp;
    rk_session_params sp; /* of every session: the server's -c, -t, -b, --backend */
    rk_session *s;        /* the server's session, with its KV policy */
    char kv[1200];        /* --kv (or "f16") */
    rk_session *alt;      /* the session of the last request that asked for another policy */
    char alt_kv[1200];
    bool alt_default;        /* alt has an ask's default policy (the flags' tier settings, alt_budget) */
    uint64_t alt_budget;     /* the budget that default set (0: none) */
    rk_fill_params fill;     /* --ridgefill / --fill / --tail / --split */
    rk_ridge_maps *maps;     /* --ridgefill */
    rk_ridge_maps *req_maps; /* the last request's "ridgefill" */
    char req_maps_path[4096];
    serve_buf piece;
    serve_gen defaults;
    bool verbose;
    bool write_failed;
    int write_errno;
    const struct cli_opts *o;   /* the server's flags (the document cache's key) */
    struct rk_doc_cache *cache; /* ask's document KV cache; NULL: --no-cache or unusable */
    char model_id[256];         /* HTTP: the catalogue name (smollm2-135m), else the file's name
                                   without .gguf */
} server;

/* Runs one request line: exactly one terminal event (done or error). */
void serve_handle_line(server *sv, const char *line, size_t n);
/* An error event for the request id (NULL: null). */
void serve_emit_error(server *sv, json_object *id, serve_code code, const char *msg);
void serve_deinit(server *sv);
/* Whether the prompt of a complete / chat request fits the context of session s (the
 * rule of rk_generate: n_prompt < n_ctx), without reading it: RK_E_CONTEXT naming both
 * numbers when it does not. Tokenizes only; s is not changed. */
rk_status serve_prompt_fits(server *sv, const serve_req *r, rk_session *s, rk_err *e);
/* The generation of a complete / chat / ask request on session s (reset first): the one
 * path of JSONL and HTTP serving. *conv, *ids: made here, freed by the caller; *what names
 * the step that failed (may stay NULL); *t_call when the engine was called. */
rk_status serve_run_gen(server *sv, const serve_req *r, rk_session *s, const rk_gen_params *gp, rk_conv **conv,
                        int32_t **ids, size_t *n_ids, rk_gen_result *res, const char **what, double *t_call, rk_err *e);

/* ---- HTTP (serve_http.c; built with libmicrohttpd, RK_HAVE_MHD) ------------------------- */
/* Serves the OpenAI-compatible endpoints on addr:port until SIGINT / SIGTERM, one request
 * at a time. max_body: the largest request body accepted; guard: the Host / Origin / API
 * key settings (serve_guard.h; its address and port are filled in here). Returns an exit
 * code. */
struct serve_guard;
int serve_http(server *sv, const char *addr, int port, size_t max_body, const struct serve_guard *guard);
/* The body of a POST to /v1/chat/completions (chat) or /v1/completions parsed and checked
 * as serve_http does, then released: 0, or the HTTP status (400, 500) with msg set. Reads
 * sv->defaults and the model's name. For fuzz/fuzz_http.c. */
unsigned serve_http_parse(const server *sv, const char *body, size_t n, bool chat, char *msg, size_t cap);
