/* libFuzzer target for serve --http's request path before the model: the header checks
 * (cli/serve_guard.c: Host, Origin, Content-Type, Authorization) and the body -> request
 * parser (serve_http_parse, cli/serve_http.c, with the text and seed rules it shares with
 * JSONL). Input: one flag byte (bit 0: chat endpoint; bit 1: bound to 0.0.0.0; bit 2: an
 * API key is set), then the Host, Origin, Content-Type and Authorization values, one per
 * line ('\n'; an empty line: the header is absent), then the body to the end. Every
 * refusal must carry its status (401, 403, 415) and a printable message; a header that
 * passes must pass again (the checks are pure); the parser answers 0, 400 or 500 with a
 * well-formed UTF-8 message. Seeds: fuzz/http_seeds/. The model is a zeroed rk_model with
 * a name (the parser reads only that); nothing generates. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"
#include "serve.h"
#include "serve_guard.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok) {
    if (!ok) __builtin_trap();
}

/* serve_http.c's generation path, never reached by serve_http_parse */
rk_status serve_run_gen(server *sv, const serve_req *r, rk_session *s, const rk_gen_params *gp, rk_conv **conv,
                        int32_t **ids, size_t *n_ids, rk_gen_result *res, const char **what, double *t_call,
                        rk_err *e) {
    (void)sv, (void)r, (void)s, (void)gp, (void)conv, (void)ids, (void)n_ids, (void)res, (void)what, (void)t_call;
    return rk_err_set(e, RK_E_INTERNAL, "fuzz: no generation");
}

static void verdict_ok(bool pass, const serve_verdict *v, unsigned status) {
    if (pass) {
        check(v->status == 0);
        return;
    }
    check(v->status == status && v->type && v->code && v->msg[0]);
    for (const char *p = v->msg; *p; p++) check((unsigned char)*p >= 0x20 && (unsigned char)*p < 0x7f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t flags = data[0];
    /* four header values, each NUL-terminated in its own buffer; NULL when empty */
    char *hdr[4] = {NULL, NULL, NULL, NULL};
    size_t at = 1;
    for (int k = 0; k < 4 && at <= size; k++) {
        const uint8_t *nl = at < size ? memchr(data + at, '\n', size - at) : NULL;
        size_t len = nl ? (size_t)(nl - (data + at)) : size - at;
        if (len && !memchr(data + at, 0, len)) { /* MHD hands header values as C strings */
            hdr[k] = malloc(len + 1);
            memcpy(hdr[k], data + at, len);
            hdr[k][len] = 0;
        }
        at += len + 1;
    }
    serve_guard g = {.port = 8080, .n_allow_host = 1, .n_allow_origin = 1};
    snprintf(g.bind_addr, sizeof g.bind_addr, "%s", flags & 2 ? "0.0.0.0" : "127.0.0.1");
    g.allow_host[0] = "models.lan";
    g.allow_origin[0] = "https://app.example:8443";
    g.api_key = flags & 4 ? "sk-fuzz-key" : NULL;
    serve_verdict v, v2;
    bool p;
    p = serve_guard_host(&g, hdr[0], &v);
    verdict_ok(p, &v, 403);
    check(p == serve_guard_host(&g, hdr[0], &v2));
    p = serve_guard_origin(&g, hdr[1], &v);
    verdict_ok(p, &v, 403);
    check(p == serve_guard_origin(&g, hdr[1], &v2));
    p = serve_guard_json_type(hdr[2], &v);
    verdict_ok(p, &v, 415);
    p = serve_guard_auth(&g, hdr[3], &v);
    verdict_ok(p, &v, 401);
    if (!g.api_key) check(p);
    if (p && g.api_key) check(hdr[3] && strstr(hdr[3], "sk-fuzz-key"));
    if (hdr[3] && g.api_key && !strcmp(hdr[3], "Bearer sk-fuzz-key")) check(p);
    if (hdr[3]) check(serve_guard_equal(hdr[3], hdr[3]));
    if (hdr[2] && hdr[3]) check(serve_guard_equal(hdr[2], hdr[3]) == !strcmp(hdr[2], hdr[3]));

    struct rk_model fake = {.name = "fuzz-model"};
    server sv = {.m = &fake, .defaults = {.max_tokens = 16, .sp = rk_sampler_params_default()}};
    const size_t n = at < size ? size - at : 0;
    char *body = malloc(n + 1); /* a copy of its own size: reads past it are caught */
    memcpy(body, data + (size - n), n);
    body[n] = 0;
    char msg[512] = "";
    unsigned code = serve_http_parse(&sv, body, n, flags & 1, msg, sizeof msg);
    check(code == 0 || code == 400 || code == 500);
    if (code) check(msg[0] && rk_utf8_valid(msg, strlen(msg), NULL));
    free(body);
    for (int k = 0; k < 4; k++) free(hdr[k]);
    return 0;
}
