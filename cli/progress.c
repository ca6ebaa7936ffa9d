/* Progress and its ETA model: see progress.h. */
#include "progress.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
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

/* The terminal's width in columns: asked at every redraw (TIOCGWINSZ), so a resized
 * window (SIGWINCH) gets a bar of its new width at the next redraw; 80 when unknown. */
static int term_cols(void) {
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    const int v = c ? atoi(c) : 0;
    return v > 0 && v < 10000 ? v : 80;
}

int cli_progress_line(char *buf, size_t cap, int cols, const char *verb, const char *unit, int64_t done, int64_t total,
                      double rate, const char *eta) {
    if (!cap) return 0;
    const int avail = cols > 1 ? cols - 1 : 1;
    const int pct = total > 0 ? (int)(100 * (done < total ? done : total) / total) : 100;
    const char *ru = unit[0] == 't' ? "tok" : unit;
    /* the counts padded to the total's width, so the bar keeps its width as they grow */
    char tot[24];
    const int w = snprintf(tot, sizeof tot, "%lld", (long long)total);
    char tails[3][160];
    snprintf(tails[0], sizeof tails[0], " %3d%% %*lld/%s %s  %6.1f %s/s  ETA %s", pct, w, (long long)done, tot, unit,
             rate, ru, eta);
    snprintf(tails[1], sizeof tails[1], " %3d%% %*lld/%s %s  ETA %s", pct, w, (long long)done, tot, unit, eta);
    snprintf(tails[2], sizeof tails[2], " %3d%% ETA %s", pct, eta);
    const int head = (int)strlen(verb) + 3; /* "verb [" ... "]" */
    /* each level takes a narrower bar before giving up a part: rate, then counts */
    static const int min_cells[3] = {20, 12, 10};
    int level = 0, cells = 0;
    for (; level < 3; level++) {
        cells = avail - head - (int)strlen(tails[level]);
        if (cells > 30) cells = 30;
        if (cells >= min_cells[level]) break;
    }
    if (level == 3) level = 2, cells = 0;
    char line[512];
    if (cells >= 10) {
        char bar[31];
        const int fill = total > 0 ? (int)(cells * (done < total ? done : total) / total) : cells;
        for (int i = 0; i < cells; i++) bar[i] = i < fill ? '#' : '.';
        bar[cells] = 0;
        snprintf(line, sizeof line, "%s [%s]%s", verb, bar, tails[level]);
    } else {
        snprintf(line, sizeof line, "%s%s", verb, tails[2]);
    }
    int n = (int)strlen(line);
    if (n > avail) n = avail;
    if ((size_t)n >= cap) n = (int)cap - 1;
    memcpy(buf, line, (size_t)n);
    buf[n] = 0;
    return n;
}

/* The bar on stderr's current line (NULL: none). stderr is one per process, and so is the
 * line a bar is drawn on: whoever prints next ends it first (cli_progress_break). */
static cli_progress *g_on_line;

/* Ends the bar's line: erased, or kept with a newline. */
static void end_line(cli_progress *p, bool erase) {
    if (!p->on_line) return;
    if (erase) fputs("\r\033[K", stderr);
    else fputc('\n', stderr);
    fflush(stderr);
    p->on_line = false;
    if (g_on_line == p) g_on_line = NULL;
}

/* Erased, not kept: the next update draws the bar again below the other output, so a kept
 * line would be a stale copy of it. */
void cli_progress_break(void) {
    if (g_on_line) end_line(g_on_line, true);
}

static void draw(cli_progress *p, int64_t done, double now) {
    double dt = now - p->t0, rate = dt > 0 && done > 0 ? (double)done / dt : 0;
    char eta[32];
    fmt_eta(eta, sizeof eta, done > 0 ? cli_eta_left(&p->eta, done, p->total) : -1);
    int pct = p->total ? (int)(100 * done / p->total) : 100;
    if (p->tty) {
        if (g_on_line && g_on_line != p) end_line(g_on_line, true);
        char line[512];
        cli_progress_line(line, sizeof line, term_cols(), p->verb, p->unit, done, p->total, rate, eta);
        fprintf(stderr, "\r%s\033[K", line);
        p->on_line = true;
        g_on_line = p;
        if (p->total > 0 && done >= p->total) {
            end_line(p, p->erase);
            p->ended = true;
        }
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

void cli_progress_begin_late(cli_progress *p, const char *cmd, int64_t total, double after_s) {
    *p = (cli_progress){.cmd = cmd,
                        .verb = "read",
                        .unit = "tokens",
                        .tty = isatty(STDERR_FILENO),
                        .total = total,
                        .every = 2.0,
                        .erase = true,
                        .tty_only = true,
                        .after_s = after_s};
    p->t0 = clock_now();
    cli_eta_init(&p->eta, true, 0, p->t0);
}

void cli_progress_start(cli_progress *p, const char *cmd, int64_t total) {
    cli_progress_begin(p, cmd, "read", "tokens", total, true);
}

void cli_progress_set_pos0(cli_progress *p, int64_t pos0) { p->eta.pos0 = pos0; }

void cli_progress_update(cli_progress *p, int64_t done, int64_t total) {
    p->total = total;
    double now = clock_now();
    cli_eta_add(&p->eta, done, now);
    if (p->ended || (p->tty_only && !p->tty)) return;
    /* late bars: nothing while the work is quick, nothing once it is done */
    if (p->after_s > 0 && !p->on_line && (now - p->t0 < p->after_s || done >= total)) return;
    if (p->tty || done == total || now - p->last >= p->every) draw(p, done, now);
}

bool cli_progress_fn(void *ud, int64_t done, int64_t total) {
    cli_progress_update(ud, done, total);
    return !cli_sigint_pending();
}

void cli_progress_end(cli_progress *p) {
    end_line(p, p->erase);
    p->ended = true;
}
