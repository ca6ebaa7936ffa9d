/* The reading progress of a long prefill on stderr (ask): a bar redrawn after every chunk
 * on a terminal, plain lines at the start, every few seconds and at the end otherwise. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

typedef struct cli_progress {
    const char *cmd;   /* "ask": plain lines read "ridgekv ask: read ..." */
    bool tty;
    double t0, last;
    int64_t total;
} cli_progress;

/* Starts at 0/total (drawn now). */
void cli_progress_start(cli_progress *p, const char *cmd, int64_t total);
/* rk_progress_fn: redraws; returns false (cancel) when Ctrl-C is pending. */
bool cli_progress_fn(void *ud, int64_t done, int64_t total);
/* Ends the bar's line on a terminal. */
void cli_progress_end(cli_progress *p);
