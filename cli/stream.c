/* Streaming token text to a FILE without splitting UTF-8 characters across writes. */
#include <string.h>

#include "stream.h"

static size_t seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) return 2;
    if ((c & 0xf0) == 0xe0) return 3;
    if ((c & 0xf8) == 0xf0) return 4;
    return 1; /* stray continuation or invalid lead: pass through as is */
}

void cli_stream_put(cli_stream *s, const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s->n >= sizeof s->buf) cli_stream_flush(s);
        s->buf[s->n++] = p[i];
    }
    /* emit every complete character; keep a trailing partial one */
    size_t i = 0, done = 0;
    while (i < s->n) {
        size_t l = seq_len((unsigned char)s->buf[i]);
        if (i + l > s->n) break;
        i += l;
        done = i;
    }
    if (done) {
        if (s->out) fwrite(s->buf, 1, done, s->out), fflush(s->out);
        if (s->sink) s->sink(s->sink_ud, s->buf, done);
        memmove(s->buf, s->buf + done, s->n - done);
        s->n -= done;
    }
}

void cli_stream_flush(cli_stream *s) {
    if (s->n) {
        if (s->out) fwrite(s->buf, 1, s->n, s->out), fflush(s->out);
        if (s->sink) s->sink(s->sink_ud, s->buf, s->n);
    }
    s->n = 0;
}
