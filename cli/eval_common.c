/* Helpers of `ridgekv eval needle|nll|splice`: see eval_common.h. */
#include "eval_common.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "rk_io.h"

/* ---- random numbers --------------------------------------------------------- */
uint64_t ev_rand(uint64_t *state) { return rk_splitmix64(state); }

uint64_t ev_rand_below(uint64_t *state, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t lim = UINT64_MAX - UINT64_MAX % n; /* reject the partial last block */
    uint64_t r;
    do r = ev_rand(state);
    while (r >= lim);
    return r % n;
}

/* ---- statistics -------------------------------------------------------------- */
double ev_nll_row(const float *row, int32_t n_vocab, int32_t target) {
    if (target < 0 || target >= n_vocab) return NAN;
    double mx = -INFINITY;
    for (int32_t v = 0; v < n_vocab; v++) {
        if (isnan(row[v])) return NAN;
        if (row[v] > mx) mx = row[v];
    }
    double sum = 0;
    for (int32_t v = 0; v < n_vocab; v++) sum += exp((double)row[v] - mx);
    return log(sum) + mx - (double)row[target];
}

double ev_mcnemar_p(int64_t b, int64_t c) {
    int64_t n = b + c, k = b < c ? b : c;
    if (n <= 0) return 1.0;
    /* P(X <= k) for X ~ Bin(n, 1/2), summed in log space so large n cannot overflow */
    double lp0 = -(double)n * log(2.0), acc = 0;
    for (int64_t i = 0; i <= k; i++) {
        double lc = lgamma((double)n + 1) - lgamma((double)i + 1) - lgamma((double)(n - i) + 1);
        acc += exp(lc + lp0);
    }
    double p = 2 * acc;
    return p > 1.0 ? 1.0 : p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double ev_quantile(double *v, size_t n, double q) {
    if (n == 0) return NAN;
    qsort(v, n, sizeof *v, cmp_double);
    double pos = q * (double)(n - 1);
    size_t i = (size_t)pos;
    if (i + 1 >= n) return v[n - 1];
    double f = pos - (double)i;
    return v[i] * (1 - f) + v[i + 1] * f;
}

ev_ci ev_bootstrap_ratio(const double *num, const double *den, int n, int n_boot, uint64_t seed, double level) {
    ev_ci ci = {NAN, NAN, NAN};
    double sn = 0, sd = 0;
    for (int i = 0; i < n; i++) sn += num[i], sd += den ? den[i] : 1.0;
    if (n <= 0 || sd == 0) return ci;
    ci.est = sn / sd;
    double *stat = n_boot > 0 ? malloc((size_t)n_boot * sizeof *stat) : NULL;
    if (!stat) return ci;
    size_t k = 0;
    uint64_t rng = seed;
    for (int b = 0; b < n_boot; b++) {
        double a = 0, d = 0;
        for (int i = 0; i < n; i++) {
            int j = (int)ev_rand_below(&rng, (uint64_t)n);
            a += num[j], d += den ? den[j] : 1.0;
        }
        if (d != 0) stat[k++] = a / d;
    }
    if (k > 0) {
        double alpha = (1 - level) / 2;
        ci.lo = ev_quantile(stat, k, alpha);
        ci.hi = ev_quantile(stat, k, 1 - alpha);
    }
    free(stat);
    return ci;
}

/* ---- flags -------------------------------------------------------------------- */
int ev_take_flags(int argc, char **argv, const ev_flag *flags, int n_flags, char ***av, int *ac, const char *cmd) {
    char **out = calloc((size_t)argc + 1, sizeof *out);
    if (!out) return RK_EXIT_ERROR;
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
            fprintf(stderr, "ridgekv %s: %s needs a value\n", cmd, argv[i]);
            free(out);
            return RK_EXIT_USAGE;
        }
        *flags[f].val = argv[++i];
    }
    *av = out;
    *ac = n;
    return 0;
}

bool ev_parse_int(const char *s, long lo, long hi, long *out, const char *cmd, const char *flag) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ridgekv %s: %s expects an integer in [%ld, %ld] (got '%s')\n", cmd, flag, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

bool ev_parse_double(const char *s, double lo, double hi, double *out, const char *cmd, const char *flag) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ridgekv %s: %s expects a number in [%g, %g] (got '%s')\n", cmd, flag, lo, hi, s);
        return false;
    }
    *out = v;
    return true;
}

/* Splits a comma list into items of at most 63 bytes; calls fn on each. */
static bool each_item(const char *s, bool (*fn)(const char *item, void *ud), void *ud) {
    for (const char *p = s;;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char item[64];
        if (len == 0 || len >= sizeof item) return false;
        memcpy(item, p, len);
        item[len] = '\0';
        if (!fn(item, ud)) return false;
        if (!e) return true;
        p = e + 1;
    }
}

typedef struct list_ctx {
    const char *cmd, *flag;
    double lo, hi;
    double *d;
    int *i;
    int max, n;
    bool bad_item;
} list_ctx;

static bool put_double(const char *item, void *ud) {
    list_ctx *c = ud;
    double v;
    if (c->n == c->max) return false;
    if (!ev_parse_double(item, c->lo, c->hi, &v, c->cmd, c->flag)) {
        c->bad_item = true;
        return false;
    }
    if (c->d) c->d[c->n] = v;
    else c->i[c->n] = (int)v;
    c->n++;
    return true;
}

static bool put_int(const char *item, void *ud) {
    list_ctx *c = ud;
    long v;
    if (c->n == c->max) return false;
    if (!ev_parse_int(item, (long)c->lo, (long)c->hi, &v, c->cmd, c->flag)) {
        c->bad_item = true;
        return false;
    }
    c->i[c->n++] = (int)v;
    return true;
}

bool ev_parse_ints(const char *s, int lo, int hi, int *out, int max, int *n, const char *cmd, const char *flag) {
    list_ctx c = {.cmd = cmd, .flag = flag, .lo = lo, .hi = hi, .i = out, .max = max};
    if (!each_item(s, put_int, &c)) {
        if (!c.bad_item)
            fprintf(stderr, "ridgekv %s: %s expects a comma list of at most %d integers (got '%s')\n", cmd, flag, max,
                    s);
        return false;
    }
    *n = c.n;
    return true;
}

bool ev_parse_doubles(const char *s, double lo, double hi, double *out, int max, int *n, const char *cmd,
                      const char *flag) {
    list_ctx c = {.cmd = cmd, .flag = flag, .lo = lo, .hi = hi, .d = out, .max = max};
    if (!each_item(s, put_double, &c)) {
        if (!c.bad_item)
            fprintf(stderr, "ridgekv %s: %s expects a comma list of at most %d numbers (got '%s')\n", cmd, flag, max,
                    s);
        return false;
    }
    *n = c.n;
    return true;
}

typedef struct mode_ctx {
    rk_fill_mode *modes;
    int max, n;
} mode_ctx;

static bool put_mode(const char *item, void *ud) {
    mode_ctx *c = ud;
    rk_fill_mode m;
    if (!rk_fill_mode_parse(item, &m) || c->n == c->max) return false;
    for (int i = 0; i < c->n; i++)
        if (c->modes[i] == m) return true; /* duplicates add nothing */
    c->modes[c->n++] = m;
    return true;
}

int ev_parse_modes(const char *s, rk_fill_mode *modes, int max, const char *cmd) {
    rk_fill_mode tmp[8];
    mode_ctx c = {.modes = tmp, .max = 8};
    if (max < 2 || !each_item(s, put_mode, &c)) {
        fprintf(stderr, "ridgekv %s: --fill expects a comma list of off, speed, quality, identity, plumb (got '%s')\n",
                cmd, s);
        return -1;
    }
    int n = 0;
    modes[n++] = RK_FILL_OFF;
    for (int i = 0; i < c.n && n < max; i++)
        if (tmp[i] != RK_FILL_OFF) modes[n++] = tmp[i];
    return n;
}

/* ---- corpus ------------------------------------------------------------------ */
/* (cli_print_error lives in args.c, which this library does not link) */
static void print_err(const rk_err *e) {
    fprintf(stderr, "ridgekv: error: %s [%s]\n", e->msg[0] ? e->msg : "unknown error", rk_status_name(e->code));
}

void ev_corpus_deinit(ev_corpus *c) {
    for (int i = 0; i < c->n_docs; i++) {
        free(c->docs[i].path);
        free(c->docs[i].ids);
    }
    free(c->docs);
    memset(c, 0, sizeof *c);
}

static bool file_exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int ev_corpus_load(ev_corpus *c, const rk_model *m, const char *files, const char *corpus_dir, const char *cmd) {
    memset(c, 0, sizeof *c);
    rk_err e = {0};
    c->bos = rk_model_add_bos(m) && rk_model_token_bos(m) >= 0 ? rk_model_token_bos(m) : -1;
    int rc = 0;
    for (const char *p = files; *p && !rc;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[2048], path[4096];
        if (len == 0 || len >= sizeof name) {
            fprintf(stderr, "ridgekv %s: --files expects a comma list of text files (got '%s')\n", cmd, files);
            rc = RK_EXIT_USAGE;
            break;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        p = comma ? comma + 1 : p + len;
        snprintf(path, sizeof path, "%s", name);
        if (!file_exists(path) && !strchr(name, '/') && corpus_dir) snprintf(path, sizeof path, "%s/%s", corpus_dir, name);
        char *text = NULL;
        size_t n_text = 0;
        if (rk_io_read_file(path, &text, &n_text, &e)) {
            print_err(&e);
            if (!strchr(name, '/'))
                fprintf(stderr, "ridgekv %s: '%s' not found here nor in the corpus dir '%s' (--corpus DIR or "
                                "$RIDGEKV_CORPUS)\n", cmd, name, corpus_dir ? corpus_dir : "(none)");
            rc = RK_EXIT_IO;
            break;
        }
        ev_doc d = {0};
        rk_status st = rk_model_tokenize(m, text, n_text, false, false, &d.ids, &d.n, &e);
        free(text);
        ev_doc *nd = st ? NULL : realloc(c->docs, ((size_t)c->n_docs + 1) * sizeof *nd);
        d.path = nd ? strdup(path) : NULL;
        if (st || !nd || !d.path) {
            if (st) print_err(&e);
            else fprintf(stderr, "ridgekv %s: out of memory\n", cmd);
            if (nd) c->docs = nd;
            free(d.ids);
            free(d.path);
            rc = st == RK_E_NOMEM || !st ? RK_EXIT_ERROR : RK_EXIT_IO;
            break;
        }
        c->docs = nd;
        c->docs[c->n_docs++] = d;
    }
    if (!rc && c->n_docs == 0) {
        fprintf(stderr, "ridgekv %s: --files names no file\n", cmd);
        rc = RK_EXIT_USAGE;
    }
    if (rc) ev_corpus_deinit(c);
    return rc;
}

bool ev_corpus_pick(const ev_corpus *c, size_t n, int n_win, uint64_t *rng, ev_window *out) {
    uint64_t total = 0;
    for (int i = 0; i < c->n_docs; i++)
        if (c->docs[i].n >= n) total += c->docs[i].n - n + 1;
    if (total == 0) return false;
    for (int w = 0; w < n_win; w++) {
        ev_window pick = {0};
        for (int attempt = 0; attempt < 64; attempt++) {
            uint64_t r = ev_rand_below(rng, total);
            int d = 0;
            for (; d < c->n_docs; d++) {
                uint64_t starts = c->docs[d].n >= n ? c->docs[d].n - n + 1 : 0;
                if (r < starts) break;
                r -= starts;
            }
            pick = (ev_window){d, (size_t)r};
            bool overlap = false;
            for (int j = 0; j < w && !overlap; j++)
                overlap = out[j].doc == d && out[j].off < pick.off + n && pick.off < out[j].off + n;
            if (!overlap) break;
        }
        out[w] = pick;
    }
    return true;
}

size_t ev_window_doc_tokens(const ev_corpus *c, size_t n) { return c->bos >= 0 && n > 0 ? n - 1 : n; }

void ev_window_ids(const ev_corpus *c, ev_window w, size_t n, int32_t *out) {
    size_t k = 0;
    if (c->bos >= 0 && n > 0) out[k++] = c->bos;
    memcpy(out + k, c->docs[w.doc].ids + w.off, (n - k) * sizeof *out);
}

bool ev_nll_rows(const float *logits, int32_t n_vocab, const int32_t *ids, int64_t row0, int64_t n_rows,
                 double *out) {
    for (int64_t j = 0; j < n_rows; j++) {
        out[j] = ev_nll_row(logits + (size_t)(row0 + j) * (size_t)n_vocab, n_vocab, ids[row0 + j + 1]);
        if (isnan(out[j])) return false;
    }
    return true;
}

/* ---- output ------------------------------------------------------------------- */
void ev_json_num(json_object *o, const char *key, double v) {
    json_object_object_add(o, key, isfinite(v) ? json_object_new_double(v) : NULL);
}

void ev_json_ci(json_object *o, const char *key, ev_ci ci) {
    json_object *c = json_object_new_object();
    ev_json_num(c, "est", ci.est);
    ev_json_num(c, "lo", ci.lo);
    ev_json_num(c, "hi", ci.hi);
    json_object_object_add(o, key, c);
}

void ev_json_str(json_object *o, const char *key, const char *v) {
    json_object_object_add(o, key, v ? json_object_new_string(v) : NULL);
}

void ev_json_int(json_object *o, const char *key, int64_t v) { json_object_object_add(o, key, json_object_new_int64(v)); }

void ev_json_print(json_object *o, bool pretty) {
    int flags = JSON_C_TO_STRING_NOSLASHESCAPE | (pretty ? JSON_C_TO_STRING_PRETTY : JSON_C_TO_STRING_PLAIN);
    printf("%s\n", json_object_to_json_string_ext(o, flags));
    fflush(stdout);
    json_object_put(o);
}

void ev_progress_init(ev_progress *p) {
    p->t0 = rk_time_now();
    p->tty = isatty(2);
}

void ev_progress_line(ev_progress *p, const char *what, int64_t k, int64_t n, const char *detail) {
    double el = rk_time_now() - p->t0;
    double eta = k > 0 ? el / (double)k * (double)(n - k) : 0;
    fprintf(stderr, "%s%s %lld/%lld  %s  elapsed %.0f s, ETA %.0f s%s", p->tty ? "\r" : "", what, (long long)k,
            (long long)n, detail ? detail : "", el, eta, p->tty ? (k == n ? "   \n" : "   ") : "\n");
}
