/* Internal to the ridgekv binary: what the generating commands (run, chat, ask, serve)
 * share on top of rk_gen.h. */
#pragma once
#include <stdio.h>

#include "cli.h"
#include "rk_gen.h"

/* Sampler and -n from the flags; everything else as rk_gen_params_default(). */
rk_gen_params cli_gen_params(const cli_opts *o);
/* Creates the session from the flags (-c unless n_ctx > 0, -t, -b, --kv, --backend) and
 * prints its warning, if any. Returns an exit code after printing why. */
int cli_open_session(const cli_opts *o, const rk_model *m, int n_ctx, rk_session **s);

/* Generated text to a FILE as it comes (rk_gen_params.on_token with this as token_ud). */
typedef struct cli_sink {
    FILE *f;
    bool sigint_stops;   /* a pending Ctrl-C stops the generation */
    size_t n;            /* bytes written */
} cli_sink;
bool cli_sink_token(void *ud, int32_t token, const char *text, size_t n);
/* Writes what the callbacks did not: text held back at the end. */
void cli_sink_rest(cli_sink *k, const rk_gen_result *r);

/* 1.5 KiB style */
void cli_fmt_bytes(char *buf, size_t cap, double b);
/* "f16", or "lowram, 123 of 456 rows compressed, 12.3 KiB (f16: 45.6 KiB)" once LowRAM
 * compressed rows: what the session's KV cache holds now. kv_flag: --kv (NULL: f16). */
void cli_kv_summary(const rk_session *s, const char *kv_flag, char *buf, size_t cap);
/* After a generation with -v: prefill and decode numbers, filled rows, the KV summary. */
void cli_gen_verbose(const char *cmd, const rk_session *s, const cli_opts *o, const rk_gen_result *r);
