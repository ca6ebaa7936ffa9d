/* serve --jsonl: byte buffers and U+FFFD repair for event text (messages that quote
 * engine text, token pieces). Generated text is repaired by rk_generate's streamer. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

bool serve_buf_put(serve_buf *b, const void *p, size_t n) {
    if (n == 0) return true;
    if (n > SIZE_MAX / 2 - b->n) return false;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) return false;
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return true;
}

void serve_buf_free(serve_buf *b) {
    free(b->p);
    *b = (serve_buf){0};
}

bool serve_utf8_sanitize(serve_buf *out, const char *p, size_t n) {
    size_t len;
    char *t = rk_utf8_repair(p, n, &len);
    const bool ok = t && serve_buf_put(out, t, len);
    free(t);
    return ok;
}
