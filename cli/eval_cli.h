/* `ridgekv eval needle|nll|splice`, internal to the binary: flags in, the eval library's
 * drivers (rk_eval.h) run, tables or JSON out. Helpers in eval_out.c. */
#pragma once
#include <json-c/json.h>

#include "cli.h"
#include "rk_eval.h"

int cmd_eval_needle(int argc, char **argv);
int cmd_eval_nll(int argc, char **argv);
int cmd_eval_splice(int argc, char **argv);

/* "ridgekv <cmd>: <message>" on stderr; returns RK_EXIT_USAGE (RK_EXIT_ERROR for NOMEM). */
int cli_ev_fail(const char *cmd, const rk_err *e);
/* --corpus, else $RIDGEKV_CORPUS, else ../shared/corpus. */
const char *cli_ev_corpus_dir(const char *flag);
/* Loads the corpus; prints why not and returns an exit code. */
int cli_ev_corpus(ev_corpus *c, const rk_model *m, const char *files, const char *dir, const char *cmd);
/* The modes of --fill LIST (default from --ridgefill / --split) with the fill of the
 * flags (maps loaded into *maps); each mode checked on s. Prints why and returns an exit
 * code. */
int cli_ev_modes(const cli_opts *o, const rk_model *m, rk_session *s, rk_ridge_maps **maps, ev_modes *out,
                 const char *cmd);

/* Progress lines on stderr: "<what> k/n  detail  elapsed, ETA"; live on a terminal. */
typedef struct cli_ev_progress {
    const char *what;
    double t0;
    bool tty;
} cli_ev_progress;
void cli_ev_progress_init(cli_ev_progress *p, const char *what);
void cli_ev_progress_fn(void *ud, int64_t done, int64_t total, const char *detail);

/* JSON numbers that stay valid JSON: non-finite values become null. */
void ev_json_num(json_object *o, const char *key, double v);
void ev_json_ci(json_object *o, const char *key, ev_ci ci);
void ev_json_str(json_object *o, const char *key, const char *v);
void ev_json_int(json_object *o, const char *key, int64_t v);
/* Prints o (pretty when pretty) with a newline to stdout and releases it. */
void ev_json_print(json_object *o, bool pretty);
