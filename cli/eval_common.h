/* Shared by `ridgekv eval needle|nll|splice` (SPEC §2, "three measurement lines"):
 * corpus windows, NLL from logits, paired statistics (exact McNemar, bootstrap CIs),
 * flag splitting and JSON helpers. Built as its own static library so tests link it
 * directly; it calls nothing from args.c. */
#pragma once
#include <json-c/json.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rk.h"

int cmd_eval_needle(int argc, char **argv);
int cmd_eval_nll(int argc, char **argv);
int cmd_eval_splice(int argc, char **argv);

/* ---- random numbers (splitmix64: seeded runs repeat exactly) ---------------- */
uint64_t ev_rand(uint64_t *state);
/* Uniform in [0, n) (n >= 1), without modulo bias. */
uint64_t ev_rand_below(uint64_t *state, uint64_t n);

/* ---- statistics ------------------------------------------------------------- */
/* -log softmax(row)[target] in double; NAN when the row holds a NaN (a filled row). */
double ev_nll_row(const float *row, int32_t n_vocab, int32_t target);
/* Exact two-sided McNemar p-value from the discordant counts b and c:
 * min(1, 2 P(X <= min(b, c))) with X ~ Binomial(b + c, 1/2); 1 when b + c = 0. */
double ev_mcnemar_p(int64_t b, int64_t c);

typedef struct ev_ci {
    double est, lo, hi; /* NAN when undefined (no data, zero denominator) */
} ev_ci;
/* Percentile bootstrap over n units (windows) of the ratio Σnum / Σden (den NULL: every
 * unit weighs 1, i.e. the mean of num). n_boot resamples with replacement from seed;
 * level e.g. 0.95. Resamples whose Σden is 0 are skipped. */
ev_ci ev_bootstrap_ratio(const double *num, const double *den, int n, int n_boot, uint64_t seed, double level);
/* Linear-interpolated quantile q in [0,1] of v[0..n) (sorted in place). */
double ev_quantile(double *v, size_t n, double q);

/* ---- flags ------------------------------------------------------------------ */
/* A subcommand's own flags: each name takes one value, stored in *val (borrowed argv). */
typedef struct ev_flag {
    const char *name;
    const char **val;
} ev_flag;
/* Moves the flags in `flags` out of argv; the rest goes to *av (malloc'd, free it) for
 * cli_parse. Returns 0 or an exit code after printing why. */
int ev_take_flags(int argc, char **argv, const ev_flag *flags, int n_flags, char ***av, int *ac, const char *cmd);
/* Comma lists; false (after printing) on a malformed list or a value outside [lo, hi]. */
bool ev_parse_ints(const char *s, int lo, int hi, int *out, int max, int *n, const char *cmd, const char *flag);
bool ev_parse_doubles(const char *s, double lo, double hi, double *out, int max, int *n, const char *cmd,
                      const char *flag);
bool ev_parse_int(const char *s, long lo, long hi, long *out, const char *cmd, const char *flag);
bool ev_parse_double(const char *s, double lo, double hi, double *out, const char *cmd, const char *flag);
/* Fill modes from a comma list; `off` is put first (added when missing) because every
 * comparison is against it. Returns the count, or -1 after printing why. */
int ev_parse_modes(const char *s, rk_fill_mode *modes, int max, const char *cmd);

/* ---- corpus ----------------------------------------------------------------- */
typedef struct ev_doc {
    char *path;
    int32_t *ids;  /* (n) whole file, tokenized without BOS */
    size_t n;
} ev_doc;

typedef struct ev_corpus {
    ev_doc *docs;
    int n_docs;
    int32_t bos;   /* prepended to every window when the vocab asks for BOS; else -1 */
} ev_corpus;

#define EV_DEFAULT_FILES "doyle_sherlock_holmes_pg1661.txt,melville_moby_dick_pg2701.txt"

/* Tokenizes each file of the comma list. A name without '/' that does not exist as given
 * is looked up in corpus_dir. Returns 0 or an exit code after printing why. */
int ev_corpus_load(ev_corpus *c, const rk_model *m, const char *files, const char *corpus_dir, const char *cmd);
void ev_corpus_deinit(ev_corpus *c);

typedef struct ev_window {
    int doc;
    size_t off;    /* first token of the document used */
} ev_window;
/* Picks n_win windows of n tokens each at random (documents weighted by their number of
 * possible starts), rejecting overlaps within a document when it can. false when no
 * document holds n tokens. */
bool ev_corpus_pick(const ev_corpus *c, size_t n, int n_win, uint64_t *rng, ev_window *out);

/* Document tokens a window of n tokens takes (n, less one when BOS is prepended). */
size_t ev_window_doc_tokens(const ev_corpus *c, size_t n);
/* Writes the n tokens of window w into out: BOS when the vocab asks for it, then the
 * document from w.off. */
void ev_window_ids(const ev_corpus *c, ev_window w, size_t n, int32_t *out);
/* out[j] = NLL of ids[row0 + j + 1] under logits row row0 + j, j < n_rows (logits hold
 * (rows, n_vocab) from an all_rows eval of ids). false when a row is NaN (filled). */
bool ev_nll_rows(const float *logits, int32_t n_vocab, const int32_t *ids, int64_t row0, int64_t n_rows,
                 double *out);

/* ---- output ----------------------------------------------------------------- */
/* JSON numbers that stay valid JSON: non-finite values become null. */
void ev_json_num(json_object *o, const char *key, double v);
void ev_json_ci(json_object *o, const char *key, ev_ci ci);
void ev_json_str(json_object *o, const char *key, const char *v);
void ev_json_int(json_object *o, const char *key, int64_t v);
/* Prints o (pretty when pretty) with a newline to stdout and releases it. */
void ev_json_print(json_object *o, bool pretty);

/* Progress line on stderr: "<what> k/n ... elapsed, ETA"; live on a terminal. */
typedef struct ev_progress {
    double t0;
    bool tty;
} ev_progress;
void ev_progress_init(ev_progress *p);
void ev_progress_line(ev_progress *p, const char *what, int64_t k, int64_t n, const char *detail);
