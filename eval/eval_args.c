/* Parsing of the eval flags (pure: errors go to rk_err, the CLI prints them). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rk_eval.h"

rk_status ev_take_flags(int argc, char **argv, const ev_flag *flags, int n_flags, char ***av, int *ac, rk_err *err) {
    char **out = calloc((size_t)argc + 1, sizeof *out);
    if (!out) return rk_err_set(err, RK_E_NOMEM, "eval: out of memory");
    int n = 0;
    for (int i = 0; i < argc; i++) {
        int f = -1;
        for (int j = 0; j < n_flags && f < 0; j++)
            if (!strcmp(argv[i], flags[j].name)) f = j;
        if (f < 0) {
            out[n++] = argv[i];
            continue;
        }
        if (i + 1 >= argc) {
            free(out);
            return rk_err_set(err, RK_E_INVALID_ARG, "%s needs a value", argv[i]);
        }
        *flags[f].val = argv[++i];
    }
    *av = out;
    *ac = n;
    return RK_OK;
}

rk_status ev_parse_int(const char *s, long lo, long hi, long *out, const char *flag, rk_err *err) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return rk_err_set(err, RK_E_INVALID_ARG, "%s expects an integer in [%ld, %ld] (got '%.64s')", flag, lo, hi, s);
    *out = v;
    return RK_OK;
}

rk_status ev_parse_double(const char *s, double lo, double hi, double *out, const char *flag, rk_err *err) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        return rk_err_set(err, RK_E_INVALID_ARG, "%s expects a number in [%g, %g] (got '%.64s')", flag, lo, hi, s);
    *out = v;
    return RK_OK;
}

/* Splits a comma list into items of at most 63 bytes; calls fn on each. */
static rk_status each_item(const char *s, rk_status (*fn)(const char *item, void *ud), void *ud, bool *bad_list) {
    for (const char *p = s;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) {
            *bad_list = true;
            return RK_E_INVALID_ARG;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        rk_status st = fn(item, ud);
        if (st) return st;
        if (!e) return RK_OK;
        p = e + 1;
    }
}

typedef struct list_ctx {
    const char *flag;
    double lo, hi;
    double *d;
    int *i;
    int max, n;
    rk_err *err;
    bool too_many;
} list_ctx;

static rk_status put_double(const char *item, void *ud) {
    list_ctx *c = ud;
    double v;
    if (c->n == c->max) return c->too_many = true, RK_E_INVALID_ARG;
    rk_status st = ev_parse_double(item, c->lo, c->hi, &v, c->flag, c->err);
    if (st) return st;
    c->d[c->n++] = v;
    return RK_OK;
}

static rk_status put_int(const char *item, void *ud) {
    list_ctx *c = ud;
    long v;
    if (c->n == c->max) return c->too_many = true, RK_E_INVALID_ARG;
    rk_status st = ev_parse_int(item, (long)c->lo, (long)c->hi, &v, c->flag, c->err);
    if (st) return st;
    c->i[c->n++] = (int)v;
    return RK_OK;
}

static rk_status list(const char *s, list_ctx *c, rk_status (*fn)(const char *, void *), const char *what, int *n) {
    bool bad = false;
    if (each_item(s, fn, c, &bad)) {
        if (bad || c->too_many)
            rk_err_set(c->err, RK_E_INVALID_ARG, "%s expects a comma list of at most %d %s (got '%.64s')", c->flag,
                       c->max, what, s);
        return RK_E_INVALID_ARG;
    }
    *n = c->n;
    return RK_OK;
}

rk_status ev_parse_ints(const char *s, int lo, int hi, int *out, int max, int *n, const char *flag, rk_err *err) {
    list_ctx c = {.flag = flag, .lo = lo, .hi = hi, .i = out, .max = max, .err = err};
    return list(s, &c, put_int, "integers", n);
}

rk_status ev_parse_doubles(const char *s, double lo, double hi, double *out, int max, int *n, const char *flag,
                           rk_err *err) {
    list_ctx c = {.flag = flag, .lo = lo, .hi = hi, .d = out, .max = max, .err = err};
    return list(s, &c, put_double, "numbers", n);
}

typedef struct mode_ctx {
    rk_fill_mode *modes;
    int max, n;
} mode_ctx;

static rk_status put_mode(const char *item, void *ud) {
    mode_ctx *c = ud;
    rk_fill_mode m;
    if (!rk_fill_mode_parse(item, &m) || c->n == c->max) return RK_E_INVALID_ARG;
    for (int i = 0; i < c->n; i++)
        if (c->modes[i] == m) return RK_OK; /* duplicates add nothing */
    c->modes[c->n++] = m;
    return RK_OK;
}

int ev_parse_modes(const char *s, rk_fill_mode *modes, int max, rk_err *err) {
    rk_fill_mode tmp[8];
    mode_ctx c = {.modes = tmp, .max = 8};
    bool bad = false;
    if (max < 2 || each_item(s, put_mode, &c, &bad)) {
        rk_err_set(err, RK_E_INVALID_ARG, "--fill expects a comma list of off, speed, quality, identity, plumb "
                                          "(got '%.64s')", s);
        return -1;
    }
    int n = 0;
    modes[n++] = RK_FILL_OFF;
    for (int i = 0; i < c.n && n < max; i++)
        if (tmp[i] != RK_FILL_OFF) modes[n++] = tmp[i];
    return n;
}
