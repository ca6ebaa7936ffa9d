/* The reading progress bar of ask: see progress.h. */
#include "progress.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "lineedit.h"
#include "rk.h"

static void fmt_eta(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 359999) snprintf(buf, cap, "--");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%.0fs", s);
}

static void draw(cli_progress *p, int64_t done, double now) {
    double dt = now - p->t0, rate = dt > 0 && done > 0 ? (double)done / dt : 0;
    char eta[32];
    fmt_eta(eta, sizeof eta, rate > 0 ? (double)(p->total - done) / rate : -1);
    int pct = p->total ? (int)(100 * done / p->total) : 100;
    if (done == 0) strcpy(eta, "--");
    if (p->tty) {
        char bar[31];
        int fill = p->total ? (int)(30 * done / p->total) : 30;
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\rreading [%s] %3d%% %lld/%lld tokens  %.1f tok/s  ETA %s\033[K", bar, pct, (long long)done,
                (long long)p->total, rate, eta);
    } else if (done == 0) {
        fprintf(stderr, "ridgekv %s: read 0/%lld tokens (0%%)\n", p->cmd, (long long)p->total);
    } else {
        fprintf(stderr, "ridgekv %s: read %lld/%lld tokens (%d%%), %.1f tok/s, ETA %s\n", p->cmd, (long long)done,
                (long long)p->total, pct, rate, eta);
    }
    fflush(stderr);
    p->last = now;
}

void cli_progress_start(cli_progress *p, const char *cmd, int64_t total) {
    *p = (cli_progress){.cmd = cmd, .tty = isatty(STDERR_FILENO), .total = total};
    p->t0 = rk_time_now();
    draw(p, 0, p->t0);
}

bool cli_progress_fn(void *ud, int64_t done, int64_t total) {
    cli_progress *p = ud;
    p->total = total;
    double now = rk_time_now();
    if (p->tty || done == total || now - p->last >= 2.0) draw(p, done, now);
    return !cli_sigint_pending();
}

void cli_progress_end(cli_progress *p) {
    if (p->tty) fputc('\n', stderr);
}
