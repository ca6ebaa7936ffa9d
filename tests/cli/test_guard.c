/* cli/serve_guard.c in-process: the Host, Origin, API key and body-type checks of
 * serve --http, and the text and seed rules both servers apply. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "serve_guard.h"

static serve_guard guard(const char *bind) {
    serve_guard g = {.port = 8080, .n_allow_host = 1, .n_allow_origin = 1};
    snprintf(g.bind_addr, sizeof g.bind_addr, "%s", bind);
    g.allow_host[0] = "models.lan";
    g.allow_origin[0] = "https://app.example:8443";
    return g;
}

Test(guard, host) {
    serve_guard g = guard("127.0.0.1");
    serve_verdict v;
    const char *ok[] = {NULL,         "127.0.0.1:8080", "localhost:8080",  "LOCALHOST",
                        "[::1]:8080", "models.lan",     "models.lan:8080", " 127.0.0.1:8080 "};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cr_expect(serve_guard_host(&g, ok[i], &v) && v.status == 0, "%s: %s", ok[i] ? ok[i] : "(none)", v.msg);
    const char *bad[] = {"evil.example:8080", "127.0.0.1:8081", "127.0.0.1:", "127.0.0.1:80808", "localhost.evil",
                         "10.0.0.5:8080",     "[::1",           "",           "a:b:c",           "[::2]:8080",
                         "127.0.0.1:8080x",   "models.lan.evil"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect(!serve_guard_host(&g, bad[i], &v), "%s passed", bad[i]);
        cr_expect(v.status == 403 && !strcmp(v.code, "forbidden_host") && strstr(v.msg, "--allow-host"), "%s: %s",
                  bad[i], v.msg);
    }
    /* bound to every address: address literals pass (no DNS answer can rebind them), names do not */
    serve_guard any = guard("0.0.0.0");
    cr_expect(serve_guard_host(&any, "192.168.1.20:8080", &v), "%s", v.msg);
    cr_expect(!serve_guard_host(&any, "0.0.0.0.evil:8080", &v));
    cr_expect(!serve_guard_host(&any, "evil.example:8080", &v));
    /* control bytes in the header are not echoed */
    cr_expect(!serve_guard_host(&g, "ev\x01il\x7f", &v));
    cr_expect(strstr(v.msg, "ev?il?"), "%s", v.msg);
}

Test(guard, origin) {
    serve_guard g = guard("127.0.0.1");
    serve_verdict v;
    const char *ok[] = {NULL,
                        "http://localhost:8080",
                        "http://127.0.0.1:8080/",
                        "https://app.example:8443",
                        "HTTPS://APP.EXAMPLE:8443",
                        "http://[::1]:8080"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        cr_expect(serve_guard_origin(&g, ok[i], &v), "%s: %s", ok[i] ? ok[i] : "(none)", v.msg);
    const char *bad[] = {"http://evil.example",           "null",
                         "http://localhost:3000",         "http://localhost",
                         "https://localhost:8080",        "https://app.example",
                         "https://app.example:8443.evil", ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect(!serve_guard_origin(&g, bad[i], &v), "%s passed", bad[i]);
        cr_expect(v.status == 403 && !strcmp(v.code, "forbidden_origin"), "%s: %s", bad[i], v.msg);
    }
    g.allow_origin[0] = "*";
    cr_expect(serve_guard_origin(&g, "http://evil.example", &v));
}

Test(guard, api_key) {
    serve_guard g = guard("127.0.0.1");
    serve_verdict v;
    cr_expect(serve_guard_auth(&g, NULL, &v), "no key configured: everything passes");
    g.api_key = "sk-abc123";
    cr_expect(serve_guard_auth(&g, "Bearer sk-abc123", &v));
    cr_expect(serve_guard_auth(&g, "bearer   sk-abc123  ", &v));
    const char *bad[] = {NULL,
                         "Bearer sk-abc12",
                         "Bearer sk-abc1234",
                         "Bearer",
                         "Bearersk-abc123",
                         "Basic sk-abc123",
                         "Bearer SK-ABC123",
                         "sk-abc123",
                         "Bearer sk-abc123 x"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect(!serve_guard_auth(&g, bad[i], &v), "%s passed", bad[i] ? bad[i] : "(none)");
        cr_expect(v.status == 401 && !strcmp(v.code, "invalid_api_key"), "%s", v.msg);
        cr_expect(!strstr(v.msg, "sk-abc123"), "the key is not in the message: %s", v.msg);
    }
    cr_expect(serve_guard_equal("", ""));
    cr_expect(!serve_guard_equal("a", ""));
    cr_expect(!serve_guard_equal("abc", "abd"));
    cr_expect(!serve_guard_equal("abc", "abcd"));
}

Test(guard, json_type) {
    serve_verdict v;
    cr_expect(serve_guard_json_type("application/json", &v));
    cr_expect(serve_guard_json_type("Application/JSON; charset=utf-8", &v));
    const char *bad[] = {NULL,
                         "text/plain",
                         "application/x-www-form-urlencoded",
                         "multipart/form-data; b=1",
                         "application/jsonx",
                         "application/json-seq",
                         ""};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect(!serve_guard_json_type(bad[i], &v), "%s passed", bad[i] ? bad[i] : "(none)");
        cr_expect(v.status == 415 && strstr(v.msg, "application/json"), "%s", v.msg);
    }
}

Test(guard, text_rule) {
    char msg[256];
    cr_expect_eq(serve_check_text("héllo", strlen("héllo"), "prompt", msg, sizeof msg), SERVE_OK);
    cr_expect_eq(serve_check_text("a\0b", 3, "prompt", msg, sizeof msg), SERVE_INVALID_REQUEST);
    cr_expect(strstr(msg, "'prompt'") && strstr(msg, "NUL"), "%s", msg);
    cr_expect_eq(serve_check_text("a\xff", 2, "messages[1].content", msg, sizeof msg), SERVE_INVALID_UTF8);
    cr_expect(strstr(msg, "'messages[1].content'") && strstr(msg, "0xff"), "%s", msg);
    cr_expect_eq(serve_check_text("\xed\xa0\x80", 3, "prompt", msg, sizeof msg), SERVE_INVALID_UTF8, "a surrogate");
}

static serve_code seed_of(const char *json, uint64_t *out, char *msg, size_t cap) {
    json_object *v = json_tokener_parse(json);
    cr_assert(v, "%s", json);
    serve_code c = serve_check_seed(v, out, msg, cap);
    json_object_put(v);
    return c;
}

Test(guard, seed_rule) {
    char msg[256];
    uint64_t s = 7;
    cr_expect_eq(seed_of("0", &s, msg, sizeof msg), SERVE_OK);
    cr_expect_eq(s, 0);
    cr_expect_eq(seed_of("9223372036854775807", &s, msg, sizeof msg), SERVE_OK);
    cr_expect_eq(s, (uint64_t)INT64_MAX);
    cr_expect_eq(seed_of("5.0", &s, msg, sizeof msg), SERVE_OK);
    cr_expect_eq(s, 5);
    s = 7;
    const char *bad[] = {"9223372036854775808",
                         "18446744073709551615",
                         "18446744073709551616",
                         "1e30",
                         "-1",
                         "1.5",
                         "\"12\"",
                         "true",
                         "[1]",
                         "-0.5"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_expect_eq(seed_of(bad[i], &s, msg, sizeof msg), SERVE_INVALID_REQUEST, "%s", bad[i]);
        cr_expect(strstr(msg, "'seed'"), "%s", msg);
        cr_expect_eq(s, 7, "out untouched");
    }
}
