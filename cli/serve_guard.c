/* Request-value rules shared by serve --jsonl and serve --http, and the HTTP header
 * checks: see serve_guard.h. */
#include "serve_guard.h"

#include <arpa/inet.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* ---- request values ------------------------------------------------------------------ */
serve_code serve_check_text(const char *s, size_t n, const char *path, char *msg, size_t cap) {
    if (memchr(s, 0, n)) {
        snprintf(msg, cap, "field '%s' contains a NUL character (\\u0000)", path);
        return SERVE_INVALID_REQUEST;
    }
    size_t bad = 0;
    if (!rk_utf8_valid(s, n, &bad)) {
        snprintf(msg, cap, "field '%s' is not valid UTF-8 (byte %zu is 0x%02x)", path, bad, (unsigned char)s[bad]);
        return SERVE_INVALID_UTF8;
    }
    return SERVE_OK;
}

serve_code serve_check_seed(json_object *v, uint64_t *out, char *msg, size_t cap) {
    if (json_object_is_type(v, json_type_int)) {
        /* json-c reads a larger integer as INT64_MAX (and its unsigned view as up to
         * UINT64_MAX), so only a true INT64_MAX has both views equal */
        int64_t i = json_object_get_int64(v);
        if (i >= 0 && (i < INT64_MAX || json_object_get_uint64(v) == (uint64_t)INT64_MAX)) {
            *out = (uint64_t)i;
            return SERVE_OK;
        }
    } else if (json_object_is_type(v, json_type_double)) {
        double d = json_object_get_double(v);
        if (d >= 0 && d <= 9007199254740992.0 && d == floor(d)) {
            *out = (uint64_t)d;
            return SERVE_OK;
        }
    }
    /* a number's JSON text is ASCII; other values are named by type (a string could hold anything) */
    const bool is_int = json_object_is_type(v, json_type_int),
               is_num = is_int || json_object_is_type(v, json_type_double);
    snprintf(msg, cap, "field 'seed' must be an integer in [0, %lld] (got %.40s)", (long long)SERVE_SEED_MAX,
             is_int && json_object_get_int64(v) == INT64_MAX ? "a larger integer"
             : is_num                                        ? json_object_to_json_string_ext(v, JSON_C_TO_STRING_PLAIN)
             : json_object_is_type(v, json_type_string)      ? "a string"
             : json_object_is_type(v, json_type_boolean)     ? "a boolean"
             : json_object_is_type(v, json_type_array)       ? "an array"
                                                             : "an object");
    return SERVE_INVALID_REQUEST;
}

/* ---- HTTP headers -------------------------------------------------------------------- */
__attribute__((format(printf, 5, 6))) static bool refuse(serve_verdict *v, unsigned status, const char *type,
                                                         const char *code, const char *fmt, ...) {
    v->status = status;
    v->type = type;
    v->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->msg, sizeof v->msg, fmt, ap);
    va_end(ap);
    return false;
}

static bool allowed(serve_verdict *v) {
    v->status = 0;
    v->type = v->code = NULL;
    v->msg[0] = 0;
    return true;
}

/* Header text shown in a message: printable ASCII only, at most 80 bytes. */
static const char *shown(const char *s, char *buf, size_t cap) {
    size_t k = 0;
    for (; s && *s && k + 1 < cap && k < 80; s++) buf[k++] = (*s >= 0x20 && *s < 0x7f) ? *s : '?';
    buf[k] = 0;
    return buf;
}

static bool eq_n(const char *a, size_t n, const char *b) { return strlen(b) == n && !strncasecmp(a, b, n); }

/* host[:port] (or [v6][:port]): name (brackets kept) and port (-1: none; -2: malformed). */
static bool split_host(const char *s, size_t len, const char **name, size_t *name_len, long *port) {
    const char *end = s + len, *colon = NULL;
    *port = -1;
    if (len == 0) return false;
    if (s[0] == '[') {
        const char *rb = memchr(s, ']', len);
        if (!rb) return false;
        *name = s;
        *name_len = (size_t)(rb - s) + 1;
        if (rb + 1 < end) {
            if (rb[1] != ':') return false;
            colon = rb + 1;
        }
    } else {
        colon = memchr(s, ':', len);
        if (colon && memchr(colon + 1, ':', (size_t)(end - colon - 1))) return false;
        *name = s;
        *name_len = colon ? (size_t)(colon - s) : len;
    }
    if (*name_len == 0) return false;
    if (colon) {
        long p = 0;
        const char *d = colon + 1;
        if (d == end || end - d > 5) return false;
        for (; d < end; d++) {
            if (*d < '0' || *d > '9') return false;
            p = p * 10 + (*d - '0');
        }
        *port = p;
    }
    return true;
}

static bool name_ok(const serve_guard *g, const char *name, size_t n) {
    if (eq_n(name, n, "localhost") || eq_n(name, n, "127.0.0.1") || eq_n(name, n, "[::1]")) return true;
    const bool any = !strcmp(g->bind_addr, "0.0.0.0");
    if (!any && eq_n(name, n, g->bind_addr)) return true;
    for (int i = 0; i < g->n_allow_host; i++)
        if (eq_n(name, n, g->allow_host[i])) return true;
    if (any && n < 16) { /* an address literal cannot be rebound by a DNS answer */
        char lit[16];
        struct in_addr a;
        memcpy(lit, name, n);
        lit[n] = 0;
        if (inet_pton(AF_INET, lit, &a) == 1) return true;
    }
    return false;
}

bool serve_guard_host(const serve_guard *g, const char *host, serve_verdict *v) {
    if (!host) return allowed(v);
    char buf[96];
    const char *name;
    size_t n;
    long port;
    size_t len = strlen(host);
    while (len && (host[len - 1] == ' ' || host[len - 1] == '\t')) len--;
    while (len && (*host == ' ' || *host == '\t')) host++, len--;
    if (!split_host(host, len, &name, &n, &port) || !name_ok(g, name, n) || (port >= 0 && port != (long)g->port))
        return refuse(v, 403, "invalid_request_error", "forbidden_host",
                      "Host '%s' is not this server (localhost, 127.0.0.1, [::1] or the bound address with "
                      "port %u; allow another name with --allow-host NAME)",
                      shown(host, buf, sizeof buf), g->port);
    return allowed(v);
}

bool serve_guard_origin(const serve_guard *g, const char *origin, serve_verdict *v) {
    if (!origin) return allowed(v);
    size_t len = strlen(origin);
    while (len && origin[len - 1] == '/') len--;
    for (int i = 0; i < g->n_allow_origin; i++) {
        const char *a = g->allow_origin[i];
        size_t al = strlen(a);
        while (al && a[al - 1] == '/') al--;
        if (!strcmp(a, "*") || (al == len && !strncasecmp(a, origin, len))) return allowed(v);
    }
    /* this server's own origin: http://HOST:PORT (no port: 80) */
    if (len > 7 && !strncasecmp(origin, "http://", 7)) {
        const char *name;
        size_t n;
        long port;
        if (split_host(origin + 7, len - 7, &name, &n, &port) && name_ok(g, name, n) &&
            (port < 0 ? 80 : port) == (long)g->port)
            return allowed(v);
    }
    char buf[96];
    return refuse(v, 403, "invalid_request_error", "forbidden_origin",
                  "requests from the web page at origin '%s' are refused (allow it with --allow-origin ORIGIN)",
                  shown(origin, buf, sizeof buf));
}

bool serve_guard_equal(const char *a, const char *b) {
    const size_t la = strlen(a), lb = strlen(b), n = la > lb ? la : lb;
    unsigned char diff = (unsigned char)(la != lb);
    for (size_t i = 0; i < n; i++) {
        const unsigned char x = i < la ? (unsigned char)a[i] : 0, y = i < lb ? (unsigned char)b[i] : 0;
        diff |= (unsigned char)(x ^ y);
    }
    return diff == 0;
}

bool serve_guard_auth(const serve_guard *g, const char *authorization, serve_verdict *v) {
    if (!g->api_key || !g->api_key[0]) return allowed(v);
    if (!authorization)
        return refuse(v, 401, "invalid_request_error", "invalid_api_key",
                      "this server needs an API key: send the header 'Authorization: Bearer KEY' (the openai "
                      "client's api_key)");
    const char *p = authorization;
    while (*p == ' ') p++;
    if (strncasecmp(p, "Bearer", 6) || (p[6] != ' ' && p[6] != '\t'))
        return refuse(v, 401, "invalid_request_error", "invalid_api_key",
                      "the Authorization header must be 'Bearer KEY'");
    p += 6;
    while (*p == ' ' || *p == '\t') p++;
    char key[512];
    size_t n = strlen(p);
    while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
    if (n >= sizeof key) n = sizeof key - 1;
    memcpy(key, p, n);
    key[n] = 0;
    bool ok = serve_guard_equal(key, g->api_key);
    memset(key, 0, sizeof key);
    if (!ok) return refuse(v, 401, "invalid_request_error", "invalid_api_key", "incorrect API key provided");
    return allowed(v);
}

bool serve_guard_json_type(const char *content_type, serve_verdict *v) {
    char buf[96];
    if (content_type) {
        const char *p = content_type;
        while (*p == ' ' || *p == '\t') p++;
        size_t n = strcspn(p, ";");
        while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
        if (eq_n(p, n, "application/json")) return allowed(v);
    }
    return refuse(v, 415, "invalid_request_error", "unsupported_media_type",
                  "the body must be sent with 'Content-Type: application/json' (got %s%s%s)",
                  content_type ? "'" : "no Content-Type", content_type ? shown(content_type, buf, sizeof buf) : "",
                  content_type ? "'" : "");
}
