/* Long prompts without flags (ask, run, chat, serve; bench's "default"): the library's
 * rk_long_defaults_get decides RoPE scaling, KV policy and budget; this applies them to
 * the model and the flags and says so on stderr. */
#pragma once
#include "cli.h"
#include "rk_long.h"

/* MemAvailable of /proc/meminfo in bytes; 0 when it cannot be read. */
uint64_t cli_mem_available(void);
/* The request for m under the flags o: the catalogue's documented scaling for the model
 * file, the free memory, which flags were given. n_prompt: prompt tokens (0: unknown);
 * n_rows: rows the session must hold (0: n_prompt). */
rk_long_request cli_long_request(const cli_opts *o, const rk_model *m, int64_t n_prompt, int64_t n_rows);
/* Decides (rk_long_defaults_get) and applies the outcome: a scaling the length needs is
 * set on m (before any session), o->n_ctx becomes the context to open, o->kv / o->kv_budget
 * the default policy and budget (flags given stay). One stderr line for the RoPE when the
 * length needs scaling, one for the KV when the default changes it. A length past every
 * limit is refused with the numbers and the flags (RK_EXIT_CONTEXT). Returns an exit code;
 * out (may be NULL) receives the decision (also with RK_EXIT_CONTEXT). */
int cli_long_apply(const char *cmd, cli_opts *o, rk_model *m, int64_t n_prompt, int64_t n_rows, rk_long_defaults *out);
