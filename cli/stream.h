#pragma once
#include <stdio.h>

typedef struct cli_stream {
    FILE *out;                                         /* may be NULL */
    void (*sink)(void *ud, const char *p, size_t n);   /* optional second consumer */
    void *sink_ud;
    char buf[64];
    size_t n;
} cli_stream;

void cli_stream_put(cli_stream *s, const char *p, size_t n);
void cli_stream_flush(cli_stream *s);
