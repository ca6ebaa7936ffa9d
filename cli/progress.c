/* Progress and its ETA model: see progress.h. */
#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "lineedit.h"
#include "rk.h"

/* ---- the estimator -------------------------------------------------------------------- */
/* sum_{p=a}^{b-1} (pos0 + p) */
static double pos_sum(int64_t pos0, int64_t a, int64_t b) {
    const double n = (double)(b - a);
    return n * ((double)pos0 + 0.5 * (double)(a + b - 1));
}

void cli_eta_init(cli_eta *e, bool attention, int64_t pos0, double t) {
    *e = (cli_eta){.attention = attention, .pos0 = pos0, .last_t = t};
}

static void acc(cli_eta *e, double x1, double x2, double y, double sign) {
    e->s11 += sign * x1 * x1;
    e->s12 += sign * x1 * x2;
    e->s22 += sign * x2 * x2;
    e->s1y += sign * x1 * y;
    e->s2y += sign * x2 * y;
    e->sx += sign * x1;
    e->sy += sign * y;
}

void cli_eta_add(cli_eta *e, int64_t done, double t) {
    if (done <= e->last_done) return;
    const double x1 = (double)(done - e->last_done), x2 = pos_sum(e->pos0, e->last_done, done);
    const double y = t > e->last_t ? t - e->last_t : 0;
    e->last_done = done;
    e->last_t = t;
    if (e->n_obs == 0) {
        e->first[0] = x1, e->first[1] = x2, e->first[2] = y;
    }
    acc(e, x1, x2, y, 1.0);
    e->n_obs++;
    e->n_used++;
    /* the first step pays for cold caches and page faults: out once three others carry the fit */
    if (e->n_obs == 4) acc(e, e->first[0], e->first[1], e->first[2], -1.0), e->n_used--;
}

void cli_eta_prior(cli_eta *e, double kappa) { e->kappa = kappa > 0 ? kappa : 0; }

void cli_eta_cost_units(cli_eta *e) {
    e->attention = false;
    e->kappa = 0;
    e->cost_units = true;
}

double cli_attn_ratio(const rk_hparams *hp) {
    const double d = hp->n_embd, q = (double)hp->n_head * hp->head_dim, kv = (double)hp->n_head_kv * hp->head_dim;
    const double per_layer = d * q + 2 * d * kv + q * d + 3 * d * hp->n_ff;
    const double weights = hp->n_layer * per_layer + d * hp->n_vocab;
    /* CPU attention runs at about a third of the matrix kernels' FLOP rate: fitted beta /
     * alpha was 3.1x the FLOP ratio for SmolLM2-135M on one thread (RIDGEKV_PROGRESS_CLOCK=cpu,
     * ask -t 1 -b 256 on 4K tokens; docs/USAGE.md) */
    return weights > 0 ? 3.0 * 4.0 * hp->n_layer * q / (2.0 * weights) : 0;
}

void cli_eta_coef(const cli_eta *e, double *alpha, double *beta) {
    double a = 0, b = 0;
    if (e->s11 > 0) a = e->s1y / e->s11;
    if (e->cost_units && e->sx > 0) a = e->sy / e->sx; /* the time so far over the work so far */
    if (e->attention && e->kappa > 0 && e->n_used >= 1) {
        /* ridge toward beta = kappa * alpha: lam * (beta - kappa alpha)^2, lam worth two steps */
        const double k = e->kappa, lam = 2.0 * e->s22 / e->n_used;
        const double a11 = e->s11 + lam * k * k, a12 = e->s12 - lam * k, a22 = e->s22 + lam;
        const double det = a11 * a22 - a12 * a12;
        if (det > 0) {
            double ta = (e->s1y * a22 - e->s2y * a12) / det, tb = (e->s2y * a11 - e->s1y * a12) / det;
            if (ta >= 0 && tb >= 0) a = ta, b = tb;
            else if (tb < 0) a = e->s1y / e->s11, b = 0;
            else a = 0, b = e->s22 > 0 ? e->s2y / e->s22 : 0;
        }
    } else if (e->attention && e->n_obs >= 2) {
        /* scale the columns so the 2x2 system is well conditioned */
        const double det = e->s11 * e->s22 - e->s12 * e->s12;
        if (det > 1e-9 * e->s11 * e->s22) {
            double ta = (e->s1y * e->s22 - e->s2y * e->s12) / det;
            double tb = (e->s2y * e->s11 - e->s1y * e->s12) / det;
            if (ta >= 0 && tb >= 0) a = ta, b = tb;
            else if (tb < 0) a = e->s1y / e->s11, b = 0;      /* no growth seen: linear */
            else a = 0, b = e->s22 > 0 ? e->s2y / e->s22 : 0; /* all of it grows */
        }
    }
    *alpha = a > 0 ? a : 0;
    *beta = b > 0 ? b : 0;
}

double cli_eta_left(const cli_eta *e, int64_t done, int64_t total) {
    if (e->n_obs == 0) return -1;
    if (done >= total) return 0;
    double a, b;
    cli_eta_coef(e, &a, &b);
    return a * (double)(total - done) + b * pos_sum(e->pos0, done, total);
}

/* ---- the display ------------------------------------------------------------------------ */
/* Wall seconds; with RIDGEKV_PROGRESS_CLOCK=cpu the process's CPU seconds instead (all
 * threads): a measurement aid, so the cost model can be checked on a busy machine, where
 * other processes' load changes the wall time of a chunk but not its work. */
static double clock_now(void) {
    static int cpu = -1;
    if (cpu < 0) {
        const char *c = getenv("RIDGEKV_PROGRESS_CLOCK");
        cpu = c && !strcmp(c, "cpu");
    }
    if (!cpu) return rk_time_now();
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fmt_eta(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 359999) snprintf(buf, cap, "--");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%.0fs", s);
}

static void draw(cli_progress *p, int64_t done, double now) {
    double dt = now - p->t0, rate = dt > 0 && done > 0 ? (double)done / dt : 0;
    char eta[32];
    fmt_eta(eta, sizeof eta, done > 0 ? cli_eta_left(&p->eta, done, p->total) : -1);
    int pct = p->total ? (int)(100 * done / p->total) : 100;
    if (p->tty) {
        char bar[31];
        int fill = p->total ? (int)(30 * done / p->total) : 30;
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\r%s [%s] %3d%% %lld/%lld %s  %.1f %s/s  ETA %s\033[K", p->verb, bar, pct, (long long)done,
                (long long)p->total, p->unit, rate, p->unit[0] == 't' ? "tok" : p->unit, eta);
    } else if (done == 0) {
        fprintf(stderr, "ridgekv %s: %s 0/%lld %s (0%%)\n", p->cmd, p->verb, (long long)p->total, p->unit);
    } else {
        fprintf(stderr, "ridgekv %s: %s %lld/%lld %s (%d%%), %.1f %s/s, elapsed %.1f s, ETA %s\n", p->cmd, p->verb,
                (long long)done, (long long)p->total, p->unit, pct, rate, p->unit[0] == 't' ? "tok" : p->unit, dt, eta);
    }
    fflush(stderr);
    p->last = now;
}

void cli_progress_begin(cli_progress *p, const char *cmd, const char *verb, const char *unit, int64_t total,
                        bool attention) {
    *p = (cli_progress){
        .cmd = cmd, .verb = verb, .unit = unit, .tty = isatty(STDERR_FILENO), .total = total, .every = 2.0};
    const char *ev = getenv("RIDGEKV_PROGRESS_EVERY");
    if (ev && *ev) {
        char *end;
        double v = strtod(ev, &end);
        if (end != ev && !*end && v >= 0 && v <= 3600) p->every = v;
    }
    p->t0 = clock_now();
    cli_eta_init(&p->eta, attention, 0, p->t0);
    draw(p, 0, p->t0);
}

void cli_progress_start(cli_progress *p, const char *cmd, int64_t total) {
    cli_progress_begin(p, cmd, "read", "tokens", total, true);
}

void cli_progress_set_pos0(cli_progress *p, int64_t pos0) { p->eta.pos0 = pos0; }

void cli_progress_update(cli_progress *p, int64_t done, int64_t total) {
    p->total = total;
    double now = clock_now();
    cli_eta_add(&p->eta, done, now);
    if (p->tty || done == total || now - p->last >= p->every) draw(p, done, now);
}

bool cli_progress_fn(void *ud, int64_t done, int64_t total) {
    cli_progress_update(ud, done, total);
    return !cli_sigint_pending();
}

void cli_progress_end(cli_progress *p) {
    if (p->tty) fputc('\n', stderr);
}
