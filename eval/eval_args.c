/* Parsing of the eval flags (pure: errors go to rk_err, the CLI prints them). */
#include <errno.h>
#include <stdio.h>
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
        rk_err_set(err, RK_E_INVALID_ARG,
                   "--fill expects a comma list of off, speed, quality, identity, plumb "
                   "(got '%.64s')",
                   s);
        return -1;
    }
    int n = 0;
    modes[n++] = RK_FILL_OFF;
    for (int i = 0; i < c.n && n < max; i++)
        if (tmp[i] != RK_FILL_OFF) modes[n++] = tmp[i];
    return n;
}

typedef struct variant_ctx {
    ev_modes *m;
    int min_tail;
    rk_err *err;
} variant_ctx;

static rk_status put_variant(const char *item, void *ud) {
    variant_ctx *c = ud;
    ev_modes *m = c->m;
    char buf[64];
    snprintf(buf, sizeof buf, "%s", item);
    char *save = NULL, *name = strtok_r(buf, ":", &save);
    rk_fill_mode mode = RK_FILL_OFF;
    const bool dflt = name && !strcmp(name, "default");
    if (dflt && strcmp(item, "default"))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "--fill: default takes no settings (item '%s')", item);
    if (!name || (!dflt && !rk_fill_mode_parse(name, &mode)))
        return rk_err_set(c->err, RK_E_INVALID_ARG,
                          "--fill: '%s' is not off, speed, quality, identity, plumb or default "
                          "(item '%s')",
                          name ? name : "", item);
    unsigned char set = dflt ? EV_SET_DEFAULT : 0;
    float share = 0;
    int32_t band = 0, tail = 0, group = 0;
    for (char *kv = strtok_r(NULL, ":", &save); kv; kv = strtok_r(NULL, ":", &save)) {
        char *eq = strchr(kv, '=');
        if (!eq) return rk_err_set(c->err, RK_E_INVALID_ARG, "--fill: '%s' in '%s' is not key=value", kv, item);
        *eq = '\0';
        const char *v = eq + 1;
        double d;
        long l;
        rk_status st;
        if (!strcmp(kv, "share")) {
            if ((st = ev_parse_double(v, 0, 1, &d, "--fill share", c->err))) return st;
            share = (float)d, set |= EV_SET_SHARE;
        } else if (!strcmp(kv, "band")) {
            if ((st = ev_parse_int(v, 0, 1 << 24, &l, "--fill band", c->err))) return st;
            band = (int32_t)l, set |= EV_SET_BAND;
        } else if (!strcmp(kv, "tail")) {
            if ((st = ev_parse_int(v, c->min_tail, 1 << 24, &l, "--fill tail", c->err))) return st;
            tail = (int32_t)l, set |= EV_SET_TAIL;
        } else if (!strcmp(kv, "group")) {
            if ((st = ev_parse_int(v, 0, 4096, &l, "--fill group", c->err))) return st;
            group = (int32_t)l, set |= EV_SET_GROUP;
        } else if (!strcmp(kv, "sparse")) {
            if ((st = ev_parse_int(v, 0, 1, &l, "--fill sparse", c->err))) return st;
            if (l) set |= EV_SET_SPARSE;
        } else
            return rk_err_set(c->err, RK_E_INVALID_ARG,
                              "--fill: unknown setting '%s' in '%s' (share, band, tail, group, sparse)", kv, item);
    }
    if (mode == RK_FILL_OFF && !dflt && (set & ~EV_SET_SPARSE))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "--fill: off takes no settings but sparse (item '%s')", item);
    if (mode == RK_FILL_OFF && !set) return RK_OK; /* off is always first */
    for (int i = 0; i < m->n; i++)
        if (!strcmp(ev_modes_label(m, i), item)) return RK_OK; /* repeated items add nothing */
    if (m->n == EV_MAX_MODES)
        return rk_err_set(c->err, RK_E_INVALID_ARG, "--fill: at most %d modes with off (item '%s')", EV_MAX_MODES,
                          item);
    const int k = m->n++;
    m->mode[k] = mode, m->set[k] = set, m->share[k] = share, m->band[k] = band, m->tail[k] = tail, m->group[k] = group;
    snprintf(m->label[k], sizeof m->label[k], "%s", set ? item : "");
    return RK_OK;
}

rk_status ev_parse_variants(const char *s, int min_tail, ev_modes *out, rk_err *err) {
    ev_modes m = out ? *out : (ev_modes){0};
    m.n = 1, m.mode[0] = RK_FILL_OFF, m.set[0] = 0, m.label[0][0] = '\0';
    variant_ctx c = {.m = &m, .min_tail = min_tail, .err = err};
    bool bad = false;
    rk_status st = each_item(s, put_variant, &c, &bad);
    if (st) {
        if (bad) rk_err_set(err, RK_E_INVALID_ARG, "--fill expects a comma list of modes (got '%.64s')", s);
        return RK_E_INVALID_ARG;
    }
    *out = m;
    return RK_OK;
}

void ev_modes_params(const ev_modes *m, int mi, rk_fill_params *out) {
    rk_fill_params f = m->fill;
    f.mode = m->mode[mi];
    if (m->set[mi] & EV_SET_SHARE) f.keep_share = m->share[mi];
    if (m->set[mi] & EV_SET_BAND) f.band = m->band[mi];
    if (m->set[mi] & EV_SET_TAIL) f.tail = m->tail[mi];
    if (m->set[mi] & EV_SET_GROUP) f.group = m->group[mi];
    f.sparse = m->set[mi] & EV_SET_SPARSE ? m->sparse : (rk_sparse_params){0};
    *out = f;
}

const char *ev_modes_label(const ev_modes *m, int mi) {
    return m->label[mi][0] ? m->label[mi] : rk_fill_mode_name(m->mode[mi]);
}

bool ev_modes_have_variants(const ev_modes *m) {
    for (int i = 0; i < m->n; i++)
        if (m->set[i] & ~EV_SET_DEFAULT) return true;
    return false;
}

rk_status ev_parse_kv_modes(const char *const *items, int n_items, ev_modes *out, rk_err *err) {
    if (n_items < 1) return rk_err_set(err, RK_E_INVALID_ARG, "--kv-modes expects a list of KV policies (none given)");
    if (n_items > EV_MAX_MODES)
        return rk_err_set(err, RK_E_INVALID_ARG, "--kv-modes: at most %d policies (got %d)", EV_MAX_MODES, n_items);
    ev_modes m = *out;
    m.n = 0, m.by_kv = true;
    for (int i = 0; i < n_items; i++) {
        const char *item = items[i];
        rk_err e = {0};
        if (strlen(item) >= EV_LABEL_BYTES - 4) /* room for "#k" */
            return rk_err_set(err, RK_E_INVALID_ARG, "--kv-modes: item '%.48s...' is longer than %d bytes", item,
                              EV_LABEL_BYTES - 5);
        if (rk_kv_params_parse(item, &m.kv[i], &e))
            return rk_err_set(err, RK_E_INVALID_ARG, "--kv-modes: item '%s': %s", item, e.msg);
        int times = 1; /* a repeat is labelled ITEM#k: answers are keyed by label */
        for (int j = 0; j < i; j++) times += !strcmp(items[j], item);
        if (times > 1) snprintf(m.label[i], sizeof m.label[i], "%s#%d", item, times);
        else snprintf(m.label[i], sizeof m.label[i], "%s", item);
        m.mode[i] = RK_FILL_OFF, m.set[i] = 0, m.share[i] = 0, m.band[i] = 0, m.tail[i] = 0, m.group[i] = 0;
        m.n++;
    }
    *out = m;
    return RK_OK;
}
