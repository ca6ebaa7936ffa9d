/* Internal to the ridgekv binary: what the generating commands (run, chat, ask, serve)
 * share on top of rk_gen.h. */
#pragma once
#include <stdio.h>

#include "cli.h"
#include "rk_gen.h"

/* Sampler, -n and --stop from the flags; everything else as rk_gen_params_default(). */
rk_gen_params cli_gen_params(const cli_opts *o);
/* The grammar of --json-schema FILE / --json-object (NULL without them), for
 * rk_gen_params.grammar; the caller destroys it. Returns 0 or an exit code after printing why. */
int cli_gen_grammar(const char *cmd, const cli_opts *o, rk_json_grammar **g);
/* Creates the session from the flags (-c unless n_ctx > 0, -t, -b, --kv, --backend) and
 * prints its warning, if any. Returns an exit code after printing why. */
int cli_open_session(const cli_opts *o, const rk_model *m, int n_ctx, rk_session **s);

/* Generated text to a FILE as it comes (rk_gen_params.on_token with this as token_ud). */
typedef struct cli_sink {
    FILE *f;
    bool sigint_stops; /* a pending Ctrl-C stops the generation */
    size_t n;          /* bytes written */
    bool failed;       /* a write failed (closed pipe, full disk): the generation stopped */
    int err;           /* its errno */
} cli_sink;
bool cli_sink_token(void *ud, int32_t token, const char *text, size_t n);
/* Writes what the callbacks did not: text held back at the end. */
void cli_sink_rest(cli_sink *k, const rk_gen_result *r);
/* After the sink's last write (and the caller's own newline): RK_EXIT_IO after one stderr
 * line when a write to the sink failed, else 0. */
int cli_sink_check(const char *cmd, cli_sink *k);

/* --verbose-prompt: the prompt as the model sees it (special tokens rendered) and then
 * every token as "id 'piece'", on stderr. */
void cli_show_prompt(const char *cmd, const rk_model *m, const int32_t *ids, size_t n);

/* Text read from a file made fit for the tokenizer, in place (*text realloc'd):
 * CRLF and lone CR become LF; bytes that are not UTF-8 are converted (as Latin-1 when
 * the text holds no multi-byte UTF-8 character at all, else each bad byte becomes
 * U+FFFD) with one warning on stderr naming the file and the first bad offset.
 * Returns 0, or RK_EXIT_ERROR when out of memory. */
int cli_text_clean(const char *cmd, const char *path, char **text, size_t *len);

/* The answer's end when a cap cut it: "-n N", or the answer room; one notice on stderr
 * ("[answer cut: ...]" on a terminal): returns true when it printed. cap is the cap the
 * turn ran under (rk_conv_last_fit().n_answer_cap, or -n for run). */
bool cli_cut_marker(const char *cmd, const cli_opts *o, const rk_gen_result *r, int64_t cap, bool tty);

/* 1.5 KiB style */
void cli_fmt_bytes(char *buf, size_t cap, double b);
/* "f16", or "lowram, 123 of 456 rows compressed, 12.3 KiB (f16: 45.6 KiB)" once LowRAM
 * compressed rows: what the session's KV cache holds now. kv_flag: --kv (NULL: f16). */
void cli_kv_summary(const rk_session *s, const char *kv_flag, char *buf, size_t cap);
/* After a generation with -v: prefill and decode numbers, filled rows, the KV summary. */
void cli_gen_verbose(const char *cmd, const rk_session *s, const cli_opts *o, const rk_gen_result *r);
