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
 * flags (maps loaded into *maps); each mode checked on s. The item default runs what ask
 * runs (long_cli.h, cli_long_mode): the fill of cli_long_default_fill (its cached maps
 * become o->ridgefill) with ask's sparse attention (cli_sparse_params); its KV policy is
 * cli_ev_sessions's. Prints why and returns an exit code. */
int cli_ev_modes(cli_opts *o, const rk_model *m, rk_session *s, rk_ridge_maps **maps, ev_modes *out, const char *cmd);
/* Whether the --fill list holds the item default (before the modes are parsed: the RoPE
 * the lengths need goes on the model before any session). */
bool cli_ev_lists_default(const char *fill);
/* The index of the default mode in mo; -1 when none. */
int cli_ev_default(const ev_modes *mo);
/* The session of each mode, s[mi] for mi < mo->n, and its policy in mo->kv[mi]: base (a
 * session made with the flags' policy) for every mode, except off and default when the
 * list holds default: they run the policy of cli_long_mode at each of the lengths lens
 * (rows: the length + extra_rows), which must be one policy (else refused naming both),
 * on a session of their own (n_ctx) when it is not base's. One stderr line says what
 * default runs. owned[mi]: the sessions made here, for the caller to destroy. Exit code. */
int cli_ev_sessions(const cli_opts *o, const rk_model *m, const int *lens, int n_lens, int extra_rows, int n_ctx,
                    rk_session *base, ev_modes *mo, rk_session **s, rk_session **owned, const char *cmd);

/* Progress lines on stderr: "<what> k/n  detail  elapsed, ETA"; live on a terminal. */
typedef struct cli_ev_progress {
    const char *what;
    double t0;
    bool tty;
} cli_ev_progress;
void cli_ev_progress_init(cli_ev_progress *p, const char *what);
void cli_ev_progress_fn(void *ud, int64_t done, int64_t total, const char *detail);

/* The results file of `eval needle --results FILE` (eval_needle_log.c): a header line
 * {"format": "ridgekv_needle_results", "settings": {...}} (binary, model fingerprint, maps
 * and haystack hashes, every flag that changes an answer; a file of other settings is
 * refused naming what differs), then one JSON line per paired trial, appended with one
 * write and fsync as the trial ends. The file is locked while a run has it open. */
typedef struct cli_needle_log {
    const char *path;
    int fd;
    json_object **rec; /* (n) the trial records read from the file */
    int n, max_trial;  /* max_trial: the largest trial index read (-1: none) */
    int appended;      /* trials this run wrote */
    ev_modes modes;
    const ev_needle_params *params; /* set by the caller before the run (lengths, depths) */
    const ev_corpus *corpus;        /* likewise: file names of the trials */
} cli_needle_log;
/* The settings object of the header (new reference). */
/* Adds the run's "lengths" and "depths" arrays to j. */
void ev_json_lens_depths(json_object *j, const ev_needle_params *p);
json_object *cli_needle_settings(const cli_opts *o, const rk_model *m, const ev_needle_params *p, const ev_corpus *c,
                                 const char *modes, int split);
/* Opens (creates, locks) the file and reads its trials; a new file gets the header. Prints
 * why not and returns an exit code (0: fine). */
int cli_needle_log_open(cli_needle_log *lg, const char *path, json_object *settings, const ev_modes *mo);
/* ev_needle_params.on_trial: appends trial t of r. */
rk_status cli_needle_log_append(void *ud, const ev_needle_result *r, int t, rk_err *err);
/* The distractors of trial tr as a JSON array of {key, wording, pos, len}. */
json_object *cli_needle_distractors_json(const ev_needle_trial *tr);
/* The file's trials into r (done[t] set) after checking each against the prompt this run
 * built for it; prints why not and returns an exit code. */
int cli_needle_log_merge(cli_needle_log *lg, ev_needle_result *r);
void cli_needle_log_close(cli_needle_log *lg);

/* JSON numbers that stay valid JSON: non-finite values become null. */
void ev_json_num(json_object *o, const char *key, double v);
void ev_json_ci(json_object *o, const char *key, ev_ci ci);
void ev_json_str(json_object *o, const char *key, const char *v);
void ev_json_int(json_object *o, const char *key, int64_t v);
/* Prints o (pretty when pretty) with a newline to stdout and releases it. */
void ev_json_print(json_object *o, bool pretty);
