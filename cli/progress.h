/* Progress of long work on stderr (ask's prefill; calibrate, pull and eval can use it):
 * a bar redrawn at each step on a terminal, plain lines at the start, every few seconds
 * and at the end otherwise; the ETA comes from a cost model fitted on the steps done.
 *
 * The cost model (cli_eta): a step covering units [a, b) costs
 *     alpha * (b - a)  +  beta * sum_{p=a}^{b-1} (pos0 + p)
 * the linear term (weights: the same work for every token) and, with attention on, the
 * attention term (each token attends to every row before it, so its cost grows with its
 * position). alpha and beta are least-squares fits (both >= 0) on the steps done so far
 * (the first step is left out once three others exist: it pays for cold caches); the
 * ETA is the model's cost of the units left. A plain rate (done / elapsed) underestimates
 * a long prefill badly: the last chunks cost several times the first.
 *
 * A prefill through the library reports its tokens in cost-weighted units already: the
 * session's progress moves with the cost model of runtime/prefill/cost.c (matrix FLOPs of
 * the rows each layer actually runs, attention FLOPs by position), so a RidgeFill
 * layer-major phase, whose late layers run few rows, counts what it costs. For such units
 * cli_eta_cost_units turns the attention term off: the ETA is the seconds per unit so far
 * (all seconds over all units of the steps used, the first step left out as above) times
 * the units left. tests/cli/test_progress.c checks it on a simulated 30.5K-token layer-major
 * fill: within 20% of the time left at every step after two minutes, also with the true
 * attention cost 1.5x off the model's. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- the estimator (pure: no clock, no output) ---------------------------------------- */
typedef struct cli_eta {
    bool attention;    /* the beta term */
    int64_t pos0;      /* position of unit 0 (rows already in the cache) */
    int64_t last_done; /* units done at the last observation */
    double last_t;
    int n_obs; /* steps observed */
    /* normal equations over the steps used (x1 = units, x2 = position sum, y = seconds) */
    double s11, s12, s22, s1y, s2y;
    double sx, sy;   /* units and seconds of the steps used (cost units: seconds per unit = sy / sx) */
    bool cost_units; /* cli_eta_cost_units */
    double first[3]; /* the first step's x1, x2, y (left out once three others exist) */
    double kappa;    /* prior beta / alpha from the model's shape (0: none); see cli_eta_prior */
    int n_used;      /* steps in the sums */
} cli_eta;

/* Starts at done = 0 at time t. */
void cli_eta_init(cli_eta *e, bool attention, int64_t pos0, double t);
/* Records that done units are finished at time t (done grows; equal done is ignored). */
void cli_eta_add(cli_eta *e, int64_t done, double t);
/* A prior for beta / alpha (cli_attn_ratio): the fit is pulled toward beta = kappa *
 * alpha with the weight of two steps, so a few noisy early chunks (where the attention
 * term is still small) do not decide the growth alone; more steps outweigh it. */
void cli_eta_prior(cli_eta *e, double kappa);
/* The units are cost-weighted (a library prefill's progress): seconds per unit only, no
 * attention term and no prior. Call after cli_eta_init (cli_progress_start). */
void cli_eta_cost_units(cli_eta *e);
/* beta / alpha for a prefill of this model shape: attention's 4 * n_layer * n_head *
 * head_dim FLOPs per token and position over the 2 * (matrix weights) FLOPs per token,
 * times 3 (CPU attention runs at about a third of the matrix kernels' rate, measured). */
struct rk_hparams;
double cli_attn_ratio(const struct rk_hparams *hp);
/* Seconds the units [done, total) will take under the fitted model; -1 before one step. */
double cli_eta_left(const cli_eta *e, int64_t done, int64_t total);
/* The fitted coefficients (seconds per unit, seconds per unit per position). */
void cli_eta_coef(const cli_eta *e, double *alpha, double *beta);

/* ---- the display ------------------------------------------------------------------------ */
typedef struct cli_progress {
    const char *cmd;  /* "ask": plain lines read "ridgekv ask: read ..." */
    const char *verb; /* "read", "fit", "download", ... */
    const char *unit; /* "tokens", "bytes", "windows", ... */
    bool tty;
    double t0, last, every; /* every: seconds between plain lines (RIDGEKV_PROGRESS_EVERY, default 2) */
    int64_t total;
    cli_eta eta;
    /* the terminal bar: it owns stderr's current line while on_line; the line ends (a
     * newline, or erased with erase) when the work is done or at cli_progress_end, and is
     * erased by cli_progress_break before other output */
    bool on_line;
    bool erase;     /* end by erasing the bar (the screen goes on as if it was never there) */
    bool tty_only;  /* no plain lines when stderr is not a terminal */
    bool ended;     /* done == total was drawn and the line ended: later updates draw nothing */
    double after_s; /* first drawn once this many seconds have passed (quick work shows nothing) */
} cli_progress;

/* A prefill of total tokens (attention term on, pos0 0): cli_progress_begin(p, cmd,
 * "read", "tokens", total, true). Drawn at 0 now. */
void cli_progress_start(cli_progress *p, const char *cmd, int64_t total);
/* Any work: verb and unit name what is counted; attention for work whose step cost grows
 * with the position (a prefill), false for work of even steps (a download, eval windows). */
void cli_progress_begin(cli_progress *p, const char *cmd, const char *verb, const char *unit, int64_t total,
                        bool attention);
/* A prefill bar for work that is usually quick (a chat turn): on a terminal only, first
 * drawn once after_s seconds have passed with the work unfinished, erased when it ends
 * (the answer then starts where the bar was). total may be 0 until the first update. */
void cli_progress_begin_late(cli_progress *p, const char *cmd, int64_t total, double after_s);
/* Rows already in the cache before the first unit (the attention term starts there). */
void cli_progress_set_pos0(cli_progress *p, int64_t pos0);
/* done of total now (total may change); redraws on a terminal, else at most every few
 * seconds and at the end. On a terminal, done >= total ends the bar's line. */
void cli_progress_update(cli_progress *p, int64_t done, int64_t total);
/* rk_progress_fn over cli_progress_update; returns false (cancel) when Ctrl-C is pending. */
bool cli_progress_fn(void *ud, int64_t done, int64_t total);
/* Ends the bar's line on a terminal (a newline, or erased); a no-op when it has ended. */
void cli_progress_end(cli_progress *p);
/* Erases whichever bar is on stderr's current line (none: a no-op), so that other output
 * (an answer on the same terminal, a notice) starts on a clean line; the bar's next update
 * draws it again below. */
void cli_progress_break(void);

/* The bar's line for a terminal of cols columns: at most cols - 1 characters (the last
 * column stays free: writing it makes some terminals wrap). Parts go, least useful first,
 * when they do not fit: the rate, the counts, then the bar narrows (10 cells at least) and
 * finally the text is cut. eta: "6h02m", "--", ... Returns the length written. */
int cli_progress_line(char *buf, size_t cap, int cols, const char *verb, const char *unit, int64_t done, int64_t total,
                      double rate, const char *eta);
