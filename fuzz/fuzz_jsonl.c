/* libFuzzer target for the serve --jsonl request parser and rk_generate's text streamer.
 * Every input must give a known code with a well-formed UTF-8 message; a usable id is a
 * string or a number. The input bytes are then streamed in uneven chunks through
 * rk_gen_text with the request's stop strings (or "</s>"): the output must be well-formed,
 * and for well-formed input it must be the input up to the first stop string to complete.
 * Build: cli/serve_req.c + cli/serve_text.c + runtime/generate/gen_text.c + this file,
 * json-c, -Icli -Iruntime/generate -Iruntime/include -Ibase/include (neither
 * calls the model). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen_impl.h"
#include "serve.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok) {
    if (!ok) __builtin_trap();
}

static void stream(const serve_gen *g, const uint8_t *data, size_t size) {
    rk_gen_text t = {.stop = g->stop, .stop_len = g->stop_len, .n_stop = g->n_stop};
    size_t at = 0, k = 0, sent = 0;
    while (at < size) {
        size_t n = 1 + (data[k++ % size] & 7); /* token-sized pieces */
        if (n > size - at) n = size - at;
        check(rk_gen_text_push(&t, (const char *)data + at, n));
        size_t off, len;
        rk_gen_text_take(&t, &off, &len);
        check(off == sent);
        sent += len;
        at += n;
    }
    check(rk_gen_text_finish(&t));
    check(rk_utf8_valid(t.out.p ? t.out.p : "", t.out.n, NULL));
    if (rk_utf8_valid((const char *)data, size, NULL)) {
        /* the text is the input up to where a stop string starts (the first one to be
         * complete), holds no whole stop string, and is all of the input without a stop */
        check(t.out.n <= size && (t.out.n == 0 || !memcmp(t.out.p, data, t.out.n)));
        bool at_stop = false;
        for (int i = 0; i < g->n_stop; i++) {
            check(!t.out.n || !memmem(t.out.p, t.out.n, g->stop[i], g->stop_len[i]));
            at_stop |= g->stop_len[i] <= size - t.out.n && !memcmp(data + t.out.n, g->stop[i], g->stop_len[i]);
        }
        check(t.stopped ? at_stop : t.out.n == size);
    }
    rk_gen_text_deinit(&t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    serve_gen def = {.max_tokens = 16, .stream = true};
    serve_req r;
    char msg[512];
    serve_code c = serve_req_parse((const char *)data, size, &def, &r, msg, sizeof msg);
    check((unsigned)c < SERVE_CODE_COUNT);
    check(c == SERVE_OK || msg[0] != 0);
    check(rk_utf8_valid(msg, strlen(msg), NULL));
    if (r.id)
        check(json_object_is_type(r.id, json_type_string) || json_object_is_type(r.id, json_type_int) ||
              json_object_is_type(r.id, json_type_double));
    if (c == SERVE_OK) {
        check(r.op <= SERVE_OP_INFO);
        check(r.gen.n_stop >= 0 && r.gen.n_stop <= SERVE_MAX_STOP);
        for (int i = 0; i < r.gen.n_stop; i++)
            check(r.gen.stop_len[i] > 0 && r.gen.stop_len[i] <= SERVE_MAX_STOP_BYTES);
        if (r.op == SERVE_OP_CHAT) check(r.n_msgs > 0 && r.msgs[0].role && r.msgs[0].content);
    }
    serve_gen g = {.n_stop = 1, .stop = {"</s>"}, .stop_len = {4}};
    stream(c == SERVE_OK && r.gen.n_stop ? &r.gen : &g, data, size);
    serve_req_deinit(&r);
    return 0;
}
