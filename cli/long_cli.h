/* Long prompts without flags (ask, run, chat, serve; the "default" fill of bench and eval): the library's
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

/* `--fill off,default` (bench, eval nll, eval needle): the one place that says what the two
 * references run.
 *   off      the exact reference: no fill, f16 KV, no budget, dense attention; the only
 *            change is the RoPE scaling the length needs (applied to the model before);
 *   default  what `ask` runs with no flag at this prompt length: rk_long_defaults_get's KV
 *            policy and budget (--kv / --kv-budget given win, as in ask), the default fill
 *            with the model's cached maps (cli_long_default_fill), and sparse attention on
 *            (cli_sparse_params: on unless --sparse or --no-ridgefill says otherwise).
 * Other modes run as given (0, nothing changed). For off and default, *kv becomes the
 * policy to run (for default, the caller's *kv stays when --kv was given), and for default
 * *mode becomes default_fill, and *n_batch (when not NULL) the chunk ask reads with when
 * sparse attention acts (rk_long_defaults.n_batch; left as it is otherwise or when -b was
 * given). n_prompt, n_rows: as for cli_long_request. Returns an exit code. */
int cli_long_mode(const cli_opts *o, const rk_model *m, int64_t n_prompt, int64_t n_rows, const char **mode,
                  const char *default_fill, rk_kv_params *kv, int *n_batch);
/* Whether the command's sparse attention is on: without --sparse unless --no-ridgefill,
 * with it when it says on (cli_sparse_params). */
bool cli_long_sparse_on(const cli_opts *o);
/* The fill mode "default" runs with: ask's (cli_auto_fill over a copy of o: the model's
 * cached maps, which it says on stderr; --ridgefill given wins), whose maps become
 * o->ridgefill; "off" when there are none or with --no-ridgefill. */
const char *cli_long_default_fill(cli_opts *o, const rk_model *m, const char *cmd);
