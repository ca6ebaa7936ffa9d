/* serve_guard.c: the rules both servers apply to request values (text, seed), and the
 * HTTP server's checks of a request's headers (Host, Origin, Content-Type, Authorization)
 * before its body is read. Pure functions over strings: no sockets, no model, so
 * fuzz/fuzz_http.c links them with json-c alone. docs/HTTP.md, "Security model". */
#pragma once
#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "serve.h"

/* ---- request values (serve --jsonl and serve --http) ------------------------------------ */
/* Text a request hands to the model (a prompt, a message, a document, a question): no NUL
 * (C strings carry it on) and well-formed UTF-8 (a JSON string may hold raw bytes that are
 * not). path names the field in msg. SERVE_OK,
 * SERVE_INVALID_REQUEST (NUL) or SERVE_INVALID_UTF8. */
serve_code serve_check_text(const char *s, size_t n, const char *path, char *msg, size_t cap);
/* "seed": an integer in [0, 2^63 - 1], written as an integer or an integral decimal up to
 * 2^53; negative, fractional, non-numeric and larger values are refused (json-c clamps
 * integers past 64 bits, so the bound is the one it can tell from a clamp). *out written
 * only on SERVE_OK. */
#define SERVE_SEED_MAX INT64_MAX
serve_code serve_check_seed(json_object *v, uint64_t *out, char *msg, size_t cap);

/* ---- HTTP headers ----------------------------------------------------------------------- */
#define SERVE_GUARD_MAX_NAMES 16

typedef struct serve_guard {
    char bind_addr[64];                            /* the listening address ("127.0.0.1", "0.0.0.0", ...) */
    unsigned port;                                 /* the bound port (the real one when 0 was asked) */
    const char *allow_host[SERVE_GUARD_MAX_NAMES]; /* --allow-host NAME (borrowed) */
    int n_allow_host;
    const char *allow_origin[SERVE_GUARD_MAX_NAMES]; /* --allow-origin ORIGIN or "*" (borrowed) */
    int n_allow_origin;
    const char *api_key; /* --api-key / RIDGEKV_API_KEY; NULL or "": none (borrowed) */
} serve_guard;

/* A refusal: HTTP status (0: allowed), OpenAI error type and code, and a message. */
typedef struct serve_verdict {
    unsigned status;
    const char *type, *code;
    char msg[320];
} serve_verdict;

/* The Host header (NULL: absent, as HTTP/1.0 allows) names this server: localhost,
 * 127.0.0.1, [::1], the bound address, an --allow-host name, or any IPv4 literal when bound
 * to 0.0.0.0, with the bound port when a port is given. Anything else is a DNS-rebinding
 * name: 403. */
bool serve_guard_host(const serve_guard *g, const char *host, serve_verdict *v);
/* The Origin header (NULL: not a browser request) is allowed: an --allow-origin entry
 * ("*" allows every origin) or this server's own origin (http://HOST:PORT with HOST as
 * serve_guard_host allows). Otherwise 403. */
bool serve_guard_origin(const serve_guard *g, const char *origin, serve_verdict *v);
/* The Authorization header carries "Bearer KEY" with the server's key (compared in time
 * independent of where the bytes differ); always true without a key. Otherwise 401. */
bool serve_guard_auth(const serve_guard *g, const char *authorization, serve_verdict *v);
/* A body-carrying request declares Content-Type application/json (parameters such as
 * charset=utf-8 allowed). Otherwise 415: a browser sends text/plain, form types or no type
 * across sites without asking first, never application/json. */
bool serve_guard_json_type(const char *content_type, serve_verdict *v);
/* Equal strings, in time that depends only on their lengths. */
bool serve_guard_equal(const char *a, const char *b);
