/* ridgekv eval library: the measurement drivers of `ridgekv eval ppl|needle|nll|splice`
 * (SPEC §2, "three measurement lines", and perplexity) over the public API, and their statistics as
 * pure functions. Like the runtime it never prints, reads the environment or exits:
 * drivers report progress through a callback and return results the CLI formats. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rk_experimental.h"

#define EV_MAX_MODES 8
#define EV_MAX_LIST 16
#define EV_DEFAULT_FILES "doyle_sherlock_holmes_pg1661.txt,melville_moby_dick_pg2701.txt"

/* ---- random numbers (splitmix64: seeded runs repeat exactly) ------------------------ */
uint64_t ev_rand(uint64_t *state);
/* Uniform in [0, n) (n >= 1), without modulo bias. */
uint64_t ev_rand_below(uint64_t *state, uint64_t n);

/* ---- statistics (pure) ---------------------------------------------------------------- */
/* -log softmax(row)[target] in double; NAN when the row holds a NaN (a filled row) or the
 * target is outside the vocab. */
double ev_nll_row(const float *row, int32_t n_vocab, int32_t target);
/* out[j] = NLL of ids[row0 + j + 1] under logits row row0 + j, j < n_rows (logits hold
 * (rows, n_vocab) from an all_rows eval of ids). false when a row is NaN (filled). */
bool ev_nll_rows(const float *logits, int32_t n_vocab, const int32_t *ids, int64_t row0, int64_t n_rows, double *out);
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
/* Linear-interpolated quantile q in [0,1] of v[0..n) (sorted in place); NAN when n = 0. */
double ev_quantile(double *v, size_t n, double q);

/* LongPPL's long-range tokens. gain[k] = NLL with a short context - NLL with the full
 * window, for each scored token of the exact model. ev_gain_select marks sel[k] when
 * gain[k] > thr (strict) or >= thr (not strict) and returns how many it marked.
 * ev_top_threshold is the gain at which the top `share` of the n tokens starts: the
 * (1 - share) quantile of gain (gain itself is not changed); NAN when n = 0. */
size_t ev_gain_select(const double *gain, size_t n, double thr, bool strict, unsigned char *sel);
double ev_top_threshold(const double *gain, size_t n, double share);

/* Per-window sums over a token set: for window w (score tokens each), den[w] counts the
 * selected tokens, sum[m][w] adds mode m's NLL over them and num[m][w] its difference to
 * mode 0 (off). Arrays are (n_win) and zeroed by the caller; nll[m] is (n_win, score). */
void ev_set_sums(const unsigned char *sel, const double *const *nll, int n_modes, int n_win, int64_t score, double *den,
                 double *const *sum, double *const *num);

/* ---- parsing of the eval flags (pure: the CLI prints the messages) -------------------- */
/* Comma lists; RK_E_INVALID_ARG naming flag for a malformed list or a value outside [lo, hi]. */
rk_status ev_parse_ints(const char *s, int lo, int hi, int *out, int max, int *n, const char *flag, rk_err *err);
rk_status ev_parse_doubles(const char *s, double lo, double hi, double *out, int max, int *n, const char *flag,
                           rk_err *err);
rk_status ev_parse_int(const char *s, long lo, long hi, long *out, const char *flag, rk_err *err);
rk_status ev_parse_double(const char *s, double lo, double hi, double *out, const char *flag, rk_err *err);
/* Fill modes from a comma list; off is put first (added when missing) because every
 * comparison is against it, duplicates dropped. Returns the count, or -1 (err set). */
int ev_parse_modes(const char *s, rk_fill_mode *modes, int max, rk_err *err);

/* A subcommand's own flags: each name takes one value, stored in *val (borrowed argv). */
typedef struct ev_flag {
    const char *name;
    const char **val;
} ev_flag;
/* Moves the flags in `flags` out of argv; the rest goes to *av (malloc'd, free it).
 * RK_E_INVALID_ARG when a flag lacks its value. */
rk_status ev_take_flags(int argc, char **argv, const ev_flag *flags, int n_flags, char ***av, int *ac, rk_err *err);

/* ---- corpus ------------------------------------------------------------------------------- */
typedef struct ev_doc {
    char *path;
    int32_t *ids; /* (n) whole file, tokenized without BOS */
    size_t n;
} ev_doc;

typedef struct ev_corpus {
    ev_doc *docs;
    int n_docs;
    int32_t bos; /* prepended to every window when the vocab asks for BOS; else -1 */
} ev_corpus;

/* Tokenizes each file of the comma list. A name without '/' that does not exist as given
 * is looked up in corpus_dir (may be NULL). A file that cannot be read gives the read's
 * status (RK_E_NOT_FOUND when missing) with a message naming it and the directory. */
rk_status ev_corpus_load(ev_corpus *c, const rk_model *m, const char *files, const char *corpus_dir, rk_err *err);
void ev_corpus_deinit(ev_corpus *c);

typedef struct ev_window {
    int doc;
    size_t off; /* first token of the document used */
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

/* ---- drivers -------------------------------------------------------------------------- */
/* Called after each trial / window with a one-line summary of it (borrowed). */
typedef void (*ev_progress_fn)(void *ud, int64_t done, int64_t total, const char *detail);

/* What every driver compares: modes[0] is off, each mode runs on the same inputs with
 * `fill` (maps, tail, split, keep share) and its own mode, and, for a variant (a --fill
 * item such as quality:share=0.2:band=256:tail=1536), its own keep share, band or tail.
 * Zero-initialised entries are plain modes named by rk_fill_mode_name. */
enum { EV_SET_SHARE = 1, EV_SET_BAND = 2, EV_SET_TAIL = 4, EV_SET_GROUP = 8, EV_SET_SPARSE = 16, EV_SET_DEFAULT = 32 };
#define EV_LABEL_BYTES 160
typedef struct ev_modes {
    rk_fill_mode mode[EV_MAX_MODES];
    int n;
    rk_fill_params fill;
    unsigned char set[EV_MAX_MODES]; /* EV_SET_* bits: which of the three below apply */
    float share[EV_MAX_MODES];
    int32_t band[EV_MAX_MODES], tail[EV_MAX_MODES], group[EV_MAX_MODES];
    char label[EV_MAX_MODES][EV_LABEL_BYTES]; /* the item as given ("" for a plain mode) */
    rk_sparse_params sparse;                  /* what a :sparse=1 variant runs with (EV_SET_SPARSE); the others exact */
    /* KV policies compared instead of fill modes (ev_parse_kv_modes): every mode is off and
     * runs on a session of its own policy kv[mi]; mode 0 is the reference. false: every mode
     * runs on the caller's one session. */
    bool by_kv;
    rk_kv_params kv[EV_MAX_MODES];
} ev_modes;
/* Modes and variants from a --fill comma list: each item is a mode name, optionally
 * followed by :share=X (0..1), :band=N (>= 0), :tail=N (>= min_tail), :group=G (0..4096,
 * rk_fill_params.group), :sparse=0|1 (the mode with ev_modes.sparse); off first (added
 * when missing; it takes no settings but sparse, and off:sparse=1 is a variant of its own),
 * repeated items dropped. The item default (no settings) is labelled "default", set
 * EV_SET_DEFAULT and mode off: the caller makes it what `ask` runs (its fill mode, sparse
 * attention, its session's KV policy). Writes mode, n, set, share,
 * band, tail, group and label of *out (fill untouched). RK_E_INVALID_ARG naming the item. */
rk_status ev_parse_variants(const char *s, int min_tail, ev_modes *out, rk_err *err);
/* KV policies from the items of a --kv-modes list (split by the caller: lowram specs hold
 * commas), each parsed by rk_kv_params_parse: n items give n modes, all fill off, by_kv set,
 * label the item as given; the first is the reference. A repeated item runs again under the
 * label ITEM#k (its k-th time): a null comparison, which must show no discordant pairs.
 * Writes mode, n, set, label, by_kv and kv of *out (fill untouched). RK_E_INVALID_ARG
 * naming the item (unknown policy, bad lowram option, too long) or too many items. */
rk_status ev_parse_kv_modes(const char *const *items, int n_items, ev_modes *out, rk_err *err);
/* Mode mi's fill parameters: fill with its mode and its variant's settings. */
void ev_modes_params(const ev_modes *m, int mi, rk_fill_params *out);
/* Mode mi's name in tables and JSON: its label, else the mode's name. */
const char *ev_modes_label(const ev_modes *m, int mi);
/* Whether any mode carries variant settings (default is not a variant). */
bool ev_modes_have_variants(const ev_modes *m);

/* Passkey retrieval with the needle in the bulk region (see `ridgekv eval needle --help`). */
struct ev_needle_result;
typedef struct ev_needle_params {
    int lens[EV_MAX_LIST], n_lens;
    double depths[EV_MAX_LIST];
    int n_depths;
    int n_trials;
    int gen; /* greedy answer tokens */
    uint64_t seed;
    const rk_sampler_params *sampler; /* the answers' penalties (temperature forced to 0); NULL: defaults */
    int n_wordings; /* needle sentence / question wordings cycled over (0: 1; at most EV_NEEDLE_WORDINGS) */
    /* Distractors: sentences of the other wordings (the one after the question's first), each
     * with a key of its own, at random depths of the bulk region away from the needle (0..
     * EV_NEEDLE_WORDINGS - 1; 0 draws nothing more from the random stream, so its trials are
     * those of a run without them). An answer that holds a distractor's key is "lured" and not
     * correct. */
    int n_distractors;
    /* Called with each trial's prompt once it is built (before a skipped trial is passed
     * over); NULL: not called. For tests and dumps. */
    void (*on_prompt)(void *ud, int t, const int32_t *ids, size_t n);
    void *prompt_ud;
    ev_modes modes;
    ev_progress_fn progress;
    void *progress_ud;
    /* Resuming (a results file): trials with skip[t] set are not run, but their prompts are
     * still built (same random stream, trials[t] filled) so that the caller can check them
     * against its record. NULL: run every trial. */
    const unsigned char *skip;
    /* Called after each trial this call ran (r holds it at t); a status other than RK_OK
     * stops the run with it (the caller has what it recorded of the trials before). */
    rk_status (*on_trial)(void *ud, const struct ev_needle_result *r, int t, rk_err *err);
    void *trial_ud;
    /* > 0: no new trial starts once the time spent plus its expected time would pass budget_s
     * seconds (the rest are left undone: done[t] = 0); expected: the slowest seconds per
     * length^1.5 of this call's trials times its length^1.5 (the first trial always starts). */
    double budget_s;
} ev_needle_params;
#define EV_NEEDLE_WORDINGS 4

typedef struct ev_needle_trial {
    int len_i, depth_i; /* cell: lens[len_i] x depths[depth_i] */
    int key;
    int wording;        /* index of the needle / question wording */
    int64_t needle_len; /* tokens of the needle sentence */
    int64_t needle_pos, bulk_end;
    int doc;
    size_t off;
    int n_distr; /* distractors in the prompt */
    int dkey[EV_NEEDLE_WORDINGS - 1], dwording[EV_NEEDLE_WORDINGS - 1];
    int64_t dpos[EV_NEEDLE_WORDINGS - 1], dlen[EV_NEEDLE_WORDINGS - 1]; /* prompt position, tokens */
} ev_needle_trial;

#define EV_ANSWER_BYTES 256
typedef struct ev_needle_result {
    int n_trials, n_modes;
    ev_needle_trial *trials; /* (n_trials) */
    unsigned char *correct;  /* (n_trials, n_modes) */
    unsigned char *lured;    /* (n_trials, n_modes) 1: the answer holds a distractor's key */
    char *answers;           /* (n_trials, n_modes, EV_ANSWER_BYTES) NUL-terminated */
    int64_t *kept;           /* (n_trials, n_modes) needle tokens kept exact by the question-aware
                                  selection (quality mode), -1 for modes without one */
    double prefill_s[EV_MAX_MODES];
    double *trial_prefill_s; /* (n_trials, n_modes) seconds */
    unsigned char *done;     /* (n_trials) 1: ran (or was filled in by the caller) */
} ev_needle_result;

/* Allocates r for n_trials x n_modes (everything zero, kept -1, nothing done). */
rk_status ev_needle_result_init(ev_needle_result *r, int n_trials, int n_modes, rk_err *err);
/* Keeps only the trials with done[t] set, in order (prefill sums recomputed from
 * trial_prefill_s). */
void ev_needle_result_compact(ev_needle_result *r);
/* Checks that every length leaves room for the needle before the exact tail (RK_E_INVALID_ARG
 * naming the length) and returns the context the run needs (longest length + gen). */
rk_status ev_needle_plan(const rk_model *m, const ev_needle_params *p, int *n_ctx, rk_err *err);
/* Runs the trials: mode mi on s[mi] (sessions of m with n_ctx from ev_needle_plan or more;
 * borrowed, (modes.n)). Fill modes may share one session; KV modes (modes.by_kv) need one
 * session of policy kv[mi] each. */
rk_status ev_needle_run(const rk_model *m, rk_session *const *s, const ev_corpus *c, const ev_needle_params *p,
                        ev_needle_result *out, rk_err *err);
void ev_needle_result_free(ev_needle_result *r);
/* Correct answers of mode mi and its discordant pairs with mode 0 (off, or the reference
 * KV policy): b = mode 0 right and mi wrong, c = mode 0 wrong and mi right. */
void ev_needle_count(const ev_needle_result *r, int mi, int *k, int *b, int *c);
/* Answers of mode mi that hold a distractor's key. */
int ev_needle_lured(const ev_needle_result *r, int mi);
/* Trials and correct answers of mode mi in cell `cell` of the lengths (by_length) or depths. */
void ev_needle_cell(const ev_needle_result *r, int mi, bool by_length, int cell, int *n, int *k);

/* ΔNLL on the last tokens of long windows, and on long-range tokens (LongPPL). */
typedef struct ev_nll_params {
    int64_t len, score, n_short;
    int n_win;
    uint64_t seed;
    ev_modes modes;
    ev_progress_fn progress;
    void *progress_ud;
} ev_nll_params;

typedef struct ev_nll_result {
    int n_win, n_modes;
    int64_t score;
    ev_window *wins;           /* (n_win) */
    double *nll[EV_MAX_MODES]; /* (n_win, score) per scored token */
    double *nll_short;         /* (n_win, score): the exact model with a short prefix */
    double prefill_s[EV_MAX_MODES];
} ev_nll_result;

/* s: sessions of m with n_ctx >= len, (modes.n): mode mi runs on s[mi] (modes may share
 * one), the short-prefix evals of the exact model on s[0]. */
rk_status ev_nll_run(const rk_model *m, rk_session *const *s, const ev_corpus *c, const ev_nll_params *p,
                     ev_nll_result *out, rk_err *err);
void ev_nll_result_free(ev_nll_result *r);

enum { EV_SET_LAST, EV_SET_LONG_RANGE, EV_SET_TOP, EV_SET_COUNT };
typedef struct ev_nll_summary {
    size_t n_tok, n_long_range, n_top;
    double top_thr, mean_gain;
    double mean[EV_SET_COUNT][EV_MAX_MODES]; /* mean NLL over the set */
    ev_ci delta[EV_SET_COUNT][EV_MAX_MODES]; /* mean ΔNLL vs off, bootstrap over windows */
} ev_nll_summary;
/* The three token sets (all scored, gain > thr, top `top` share by gain) and their CIs. */
rk_status ev_nll_summarize(const ev_nll_result *r, double thr, double top, int n_boot, uint64_t seed,
                           ev_nll_summary *out, rk_err *err);

/* Which filled caches carry the loss gap: exact K or V spliced per layer group. */
typedef struct ev_splice_params {
    int64_t len, score;
    int n_win, n_groups;
    uint64_t seed;
    rk_fill_params fill; /* the filled run's mode and maps */
    ev_progress_fn progress;
    void *progress_ud;
} ev_splice_params;

typedef struct ev_splice_variant {
    int lo, hi; /* layers [lo, hi) */
    bool k, v;
    bool all;      /* every late layer */
    double *delta; /* (n_win) ΔNLL of the spliced run vs off */
} ev_splice_variant;

typedef struct ev_splice_result {
    int n_win, split, n_late, n_var;
    int64_t bulk_end;
    double *d_fill; /* (n_win) ΔNLL of the filled run vs off */
    ev_splice_variant var[2 * 64 + 3];
    rk_kv_error *kerr, *verr; /* (n_late) per late layer, pooled over windows */
} ev_splice_result;

/* ex and fs: two sessions of m (same KV policy, n_ctx >= len): the exact run and the
 * filled one. */
rk_status ev_splice_run(const rk_model *m, rk_session *ex, rk_session *fs, const ev_corpus *c,
                        const ev_splice_params *p, ev_splice_result *out, rk_err *err);
void ev_splice_result_free(ev_splice_result *r);

/* ---- perplexity (eval ppl): llama-perplexity's procedure, so numbers compare ----------
 * The text's tokens (ev_ppl_tokenize) are cut into chunks of n_ctx; each chunk starts from
 * an empty KV cache with its first token replaced by BOS (when the vocab uses BOS), and
 * tokens n_ctx/2 .. n_ctx-1 of each chunk are scored (row n_ctx-1 has no next token: the
 * last scored row is n_ctx-2). */
typedef struct ev_ppl_params {
    int32_t n_ctx;      /* chunk size (at least 4) */
    int64_t max_chunks; /* at most this many chunks (0: every whole chunk) */
} ev_ppl_params;

typedef struct ev_ppl_result {
    int64_t n_chunk;     /* chunks scored */
    int64_t n_scored;    /* tokens scored */
    double nll;          /* mean NLL over them */
    double ppl, ppl_err; /* exp(nll) and its standard error, ppl * sd(NLL) / sqrt(n_scored - 1) */
} ev_ppl_result;

/* After each chunk: chunks done of total, and the perplexity so far. */
typedef void (*ev_ppl_progress_fn)(void *ud, int64_t done, int64_t total, double running_ppl);

/* The text as llama-perplexity tokenizes it: one trailing newline dropped, BOS first when
 * the vocab asks for it (*ids malloc'd). */
rk_status ev_ppl_tokenize(const rk_model *m, const char *text, size_t len, int32_t **ids, size_t *n, rk_err *err);
/* The chunks ev_ppl_run scores over n_ids tokens (0: fewer than one chunk). */
int64_t ev_ppl_n_chunks(size_t n_ids, const ev_ppl_params *p);
/* s: a session of m with n_ctx >= p->n_ctx (its fill and KV policy apply); ids is not
 * changed. RK_E_INVALID_ARG for n_ctx < 4 or fewer tokens than one chunk. */
rk_status ev_ppl_run(const rk_model *m, rk_session *s, const int32_t *ids, size_t n_ids, const ev_ppl_params *p,
                     ev_ppl_progress_fn progress, void *ud, ev_ppl_result *out, rk_err *err);
