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
} cli_progress;

/* A prefill of total tokens (attention term on, pos0 0): cli_progress_begin(p, cmd,
 * "read", "tokens", total, true). Drawn at 0 now. */
void cli_progress_start(cli_progress *p, const char *cmd, int64_t total);
/* Any work: verb and unit name what is counted; attention for work whose step cost grows
 * with the position (a prefill), false for work of even steps (a download, eval windows). */
void cli_progress_begin(cli_progress *p, const char *cmd, const char *verb, const char *unit, int64_t total,
                        bool attention);
/* Rows already in the cache before the first unit (the attention term starts there). */
void cli_progress_set_pos0(cli_progress *p, int64_t pos0);
/* done of total now (total may change); redraws on a terminal, else at most every few
 * seconds and at the end. */
void cli_progress_update(cli_progress *p, int64_t done, int64_t total);
/* rk_progress_fn over cli_progress_update; returns false (cancel) when Ctrl-C is pending. */
bool cli_progress_fn(void *ud, int64_t done, int64_t total);
/* Ends the bar's line on a terminal. */
void cli_progress_end(cli_progress *p);
