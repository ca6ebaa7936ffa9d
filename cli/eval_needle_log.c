/* The results file of `ridgekv eval needle --results FILE` (eval_cli.h): a header line with
 * the run's settings and their fingerprint, then one JSON line per paired trial, appended
 * (one write + fsync each) as the trial ends, so that a long run can go in pieces and
 * resume. A torn last line (a killed process) is cut off; anything else malformed, a
 * foreign header or another run holding the file is refused by name. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "eval_cli.h"

#define LOG_MAGIC "ridgekv_needle_results"

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* FNV-1a of a whole file; false when it cannot be read. */
static bool file_hash(const char *path, uint64_t *out) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = fnv(h, buf, n);
    const bool ok = !ferror(f);
    fclose(f);
    *out = h;
    return ok;
}

static void hex(json_object *o, const char *key, uint64_t v) {
    char s[20];
    snprintf(s, sizeof s, "%016llx", (unsigned long long)v);
    ev_json_str(o, key, s);
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

void ev_json_lens_depths(json_object *j, const ev_needle_params *p) {
    json_object *a = json_object_new_array();
    for (int i = 0; i < p->n_lens; i++) json_object_array_add(a, json_object_new_int(p->lens[i]));
    json_object_object_add(j, "lengths", a);
    a = json_object_new_array();
    for (int i = 0; i < p->n_depths; i++) json_object_array_add(a, json_object_new_double(p->depths[i]));
    json_object_object_add(j, "depths", a);
}

json_object *cli_needle_settings(const cli_opts *o, const rk_model *m, const ev_needle_params *p, const ev_corpus *c,
                                 const char *modes, int split) {
    json_object *j = json_object_new_object();
    uint64_t h = 0;
    if (file_hash("/proc/self/exe", &h)) hex(j, "binary", h);
    else ev_json_str(j, "binary", "unknown");
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    ev_json_str(j, "model", rk_model_name(m));
    char mf[96];
    snprintf(mf, sizeof mf, "%s-%016llx-%016llx-%016llx", fp.arch, (unsigned long long)fp.tokenizer_hash,
             (unsigned long long)fp.weights_hash, (unsigned long long)fp.quant_hash);
    ev_json_str(j, "model_fingerprint", mf);
    if (o->ridgefill && file_hash(o->ridgefill, &h)) hex(j, "maps", h);
    else ev_json_str(j, "maps", o->ridgefill ? "unreadable" : "none");
    ev_json_str(j, "modes", modes);
    ev_json_int(j, "split", split);
    ev_json_int(j, "tail", o->tail);
    const rk_fill_params *f = &p->modes.fill;
    ev_json_num(j, "keep_share", f->keep_share);
    ev_json_int(j, "obs", f->obs);
    ev_json_int(j, "baseline", f->baseline);
    ev_json_int(j, "score_layers", f->score_layers);
    ev_json_int(j, "score_skip", f->score_skip);
    ev_json_int(j, "pool", f->pool);
    if (f->band) ev_json_int(j, "band", f->band);
    if (f->group) ev_json_int(j, "fill_group", f->group); /* absent: 0 (older files) */
    ev_json_lens_depths(j, p);
    ev_json_int(j, "gen", p->gen);
    ev_json_int(j, "seed", (int64_t)p->seed);
    ev_json_int(j, "wordings", p->n_wordings);
    if (p->n_distractors > 0) ev_json_int(j, "distractors", p->n_distractors); /* absent: 0 (older files) */
    json_object *a = json_object_new_array();
    for (int i = 0; i < c->n_docs; i++) { /* the haystacks by name, length and token hash */
        char d[300];
        snprintf(d, sizeof d, "%s:%zu:%016llx", base_name(c->docs[i].path), c->docs[i].n,
                 (unsigned long long)fnv(0xcbf29ce484222325ull, c->docs[i].ids, c->docs[i].n * sizeof(int32_t)));
        json_object_array_add(a, json_object_new_string(d));
    }
    json_object_object_add(j, "files", a);
    if (p->modes.by_kv) { /* the policies compared, as given (their defaults are the binary's) */
        a = json_object_new_array();
        for (int mi = 0; mi < p->modes.n; mi++)
            json_object_array_add(a, json_object_new_string(ev_modes_label(&p->modes, mi)));
        json_object_object_add(j, "kv_modes", a);
    } else ev_json_str(j, "kv", o->kv ? o->kv : "f16");
    ev_json_str(j, "backend", o->backend ? o->backend : "cpu");
    ev_json_int(j, "threads", o->n_threads);
    ev_json_int(j, "batch", o->n_batch);
    return j;
}

static const char *to_str(json_object *o) {
    return json_object_to_json_string_ext(o, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE);
}

static int fail(const char *path, const char *fmt, const char *a, long n) {
    fprintf(stderr, "ridgekv eval needle: results file %s: ", path);
    fprintf(stderr, fmt, a, n);
    fputc('\n', stderr);
    return RK_EXIT_USAGE;
}

/* Every trial line the file holds, checked against the modes; a torn last line is cut. */
static int read_lines(cli_needle_log *lg, const char *path, FILE *f, json_object *settings, const ev_modes *mo) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long no = 0;
    off_t good = 0; /* bytes up to the end of the last whole line */
    int rc = 0;
    while (!rc && (len = getline(&line, &cap, f)) > 0) {
        no++;
        const bool whole = line[len - 1] == '\n';
        if (!whole) { /* a killed run's half line (every record ends with its newline): dropped */
            fprintf(stderr,
                    "ridgekv eval needle: results file %s: line %ld is cut short (an interrupted run); "
                    "dropping it\n",
                    path, no);
            if (ftruncate(fileno(f), good))
                rc = fail(path, "cannot cut the torn line: %s (line %ld)", strerror(errno), no);
            break;
        }
        json_object *j = json_tokener_parse(line);
        if (!j || !json_object_is_type(j, json_type_object)) {
            json_object_put(j);
            rc = fail(path, "line %2$ld is not a JSON object%1$s", "", no);
            break;
        }
        if (no == 1) {
            json_object *mg = json_object_object_get(j, "format"), *st = json_object_object_get(j, "settings");
            if (!mg || strcmp(json_object_get_string(mg), LOG_MAGIC) || !st) {
                rc = fail(path, "the first line is not a needle results header%s (line %ld)", "", no);
            } else if (strcmp(to_str(st), to_str(settings))) {
                /* name what differs */
                char what[2048] = "";
                json_object_object_foreach(settings, k, v) {
                    json_object *w = json_object_object_get(st, k);
                    if (!w || strcmp(to_str(w), to_str(v)))
                        snprintf(what + strlen(what), sizeof what - strlen(what), "%s%s (file %s, now %s)",
                                 what[0] ? ", " : "", k, w ? to_str(w) : "missing", to_str(v));
                }
                fprintf(stderr,
                        "ridgekv eval needle: results file %s was written with other settings: %s; use another "
                        "file or the same binary, maps and flags\n",
                        path, what[0] ? what : "(extra keys)");
                rc = RK_EXIT_USAGE;
            }
            json_object_put(j);
            good += len;
            continue;
        }
        json_object *tj = json_object_object_get(j, "trial"), *an = json_object_object_get(j, "answers");
        const int64_t t = tj ? json_object_get_int64(tj) : -1;
        if (!tj || !json_object_is_type(tj, json_type_int) || t < 0 || t >= 1000000 || !an) {
            rc = fail(path, "line %2$ld is not a trial record (no trial index or answers)%1$s", "", no);
        } else {
            for (int mi = 0; mi < mo->n && !rc; mi++)
                if (!json_object_object_get(an, ev_modes_label(mo, mi)))
                    rc = fail(path, "line %2$ld lacks the answer of mode %1$s", ev_modes_label(mo, mi), no);
            for (int i = 0; i < lg->n && !rc; i++)
                if (json_object_get_int64(json_object_object_get(lg->rec[i], "trial")) == t)
                    rc = fail(path, "line %2$ld repeats trial %1$s", json_object_get_string(tj), no);
        }
        if (rc) {
            json_object_put(j);
            break;
        }
        json_object **grown = realloc(lg->rec, (size_t)(lg->n + 1) * sizeof *grown);
        if (!grown) {
            json_object_put(j);
            rc = fail(path, "out of memory at line %2$ld%1$s", "", no);
            break;
        }
        lg->rec = grown;
        lg->rec[lg->n++] = j;
        lg->max_trial = t > lg->max_trial ? (int)t : lg->max_trial;
        good += len;
    }
    free(line);
    if (!rc && no == 0) rc = -1; /* empty: the caller writes the header */
    return rc;
}

static int write_all(cli_needle_log *lg, const char *s, rk_err *err) {
    const size_t n = strlen(s);
    struct stat sb;
    const off_t before = fstat(lg->fd, &sb) == 0 ? sb.st_size : -1;
    size_t done = 0;
    while (done < n) {
        const ssize_t w = write(lg->fd, s + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int e = errno;
            if (before >= 0 && ftruncate(lg->fd, before)) { /* keep the file whole lines */
            }
            return rk_err_set(err, RK_E_IO, "results file %s: cannot append: %s (the trials before are kept)", lg->path,
                              w < 0 ? strerror(e) : "short write");
        }
        done += (size_t)w;
    }
    if (fsync(lg->fd)) return rk_err_set(err, RK_E_IO, "results file %s: fsync: %s", lg->path, strerror(errno));
    return RK_OK;
}

int cli_needle_log_open(cli_needle_log *lg, const char *path, json_object *settings, const ev_modes *mo) {
    memset(lg, 0, sizeof *lg);
    lg->fd = -1;
    lg->max_trial = -1;
    lg->path = path;
    lg->modes = *mo;
    lg->fd = open(path, O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (lg->fd < 0) {
        fprintf(stderr, "ridgekv eval needle: results file %s: %s\n", path, strerror(errno));
        return RK_EXIT_IO;
    }
    if (flock(lg->fd, LOCK_EX | LOCK_NB)) {
        fprintf(stderr, "ridgekv eval needle: results file %s is being written by another run\n", path);
        close(lg->fd);
        lg->fd = -1;
        return RK_EXIT_USAGE;
    }
    FILE *f = fdopen(dup(lg->fd), "r");
    if (!f) {
        fprintf(stderr, "ridgekv eval needle: results file %s: %s\n", path, strerror(errno));
        return RK_EXIT_IO;
    }
    int rc = read_lines(lg, path, f, settings, mo);
    fclose(f);
    if (rc == -1) { /* a new file: the header */
        json_object *h = json_object_new_object();
        ev_json_str(h, "format", LOG_MAGIC);
        json_object_object_add(h, "settings", json_object_get(settings));
        char *s = malloc(strlen(to_str(h)) + 2);
        rk_err e = {0};
        if (!s) rc = RK_EXIT_ERROR;
        else {
            sprintf(s, "%s\n", to_str(h));
            rc = write_all(lg, s, &e) ? (fprintf(stderr, "ridgekv eval needle: %s\n", e.msg), RK_EXIT_IO) : 0;
        }
        free(s);
        json_object_put(h);
    }
    return rc;
}

rk_status cli_needle_log_append(void *ud, const ev_needle_result *r, int t, rk_err *err) {
    cli_needle_log *lg = ud;
    const ev_needle_trial *tr = &r->trials[t];
    const ev_needle_params *p = lg->params;
    json_object *j = json_object_new_object(), *an = json_object_new_object();
    ev_json_int(j, "trial", t);
    ev_json_int(j, "length", p->lens[tr->len_i]);
    ev_json_num(j, "depth", p->depths[tr->depth_i]);
    ev_json_int(j, "wording", tr->wording);
    ev_json_int(j, "key", tr->key);
    ev_json_str(j, "file", base_name(lg->corpus->docs[tr->doc].path));
    ev_json_int(j, "offset", (int64_t)tr->off);
    ev_json_int(j, "needle_pos", tr->needle_pos);
    ev_json_int(j, "needle_len", tr->needle_len);
    ev_json_int(j, "bulk_end", tr->bulk_end);
    if (tr->n_distr) json_object_object_add(j, "distractors", cli_needle_distractors_json(tr));
    for (int mi = 0; mi < r->n_modes; mi++) {
        json_object *a = json_object_new_object();
        const size_t i = (size_t)t * (size_t)r->n_modes + (size_t)mi;
        ev_json_str(a, "answer", r->answers + i * EV_ANSWER_BYTES);
        json_object_object_add(a, "correct", json_object_new_boolean(r->correct[i]));
        if (tr->n_distr) json_object_object_add(a, "lured", json_object_new_boolean(r->lured[i]));
        if (r->kept[i] >= 0) ev_json_int(a, "needle_kept", r->kept[i]);
        ev_json_num(a, "prefill_s", r->trial_prefill_s[i]);
        json_object_object_add(an, ev_modes_label(&lg->modes, mi), a);
    }
    json_object_object_add(j, "answers", an);
    const char *s = to_str(j);
    char *line = malloc(strlen(s) + 2);
    rk_status st = RK_OK;
    if (!line) st = rk_err_set(err, RK_E_NOMEM, "results file %s: out of memory", lg->path);
    else {
        sprintf(line, "%s\n", s);
        st = write_all(lg, line, err);
    }
    free(line);
    json_object_put(j);
    if (!st) lg->appended++;
    return st;
}

json_object *cli_needle_distractors_json(const ev_needle_trial *tr) {
    json_object *a = json_object_new_array();
    for (int d = 0; d < tr->n_distr; d++) {
        json_object *o = json_object_new_object();
        ev_json_int(o, "key", tr->dkey[d]);
        ev_json_int(o, "wording", tr->dwording[d]);
        ev_json_int(o, "pos", tr->dpos[d]);
        ev_json_int(o, "len", tr->dlen[d]);
        json_object_array_add(a, o);
    }
    return a;
}

static int64_t get_i(json_object *o, const char *k) {
    json_object *v = json_object_object_get(o, k);
    return v ? json_object_get_int64(v) : -1;
}

/* The record's distractors are the ones this run builds for the trial (keys and positions). */
static bool same_distractors(json_object *j, const ev_needle_trial *tr) {
    json_object *a = json_object_object_get(j, "distractors");
    const size_t n = a && json_object_is_type(a, json_type_array) ? json_object_array_length(a) : 0;
    if (n != (size_t)tr->n_distr) return false;
    for (int d = 0; d < tr->n_distr; d++) {
        json_object *o = json_object_array_get_idx(a, (size_t)d);
        if (get_i(o, "key") != tr->dkey[d] || get_i(o, "pos") != tr->dpos[d]) return false;
    }
    return true;
}

int cli_needle_log_merge(cli_needle_log *lg, ev_needle_result *r) {
    for (int i = 0; i < lg->n; i++) {
        json_object *j = lg->rec[i];
        const int t = (int)get_i(j, "trial");
        if (t >= r->n_trials) continue;
        const ev_needle_trial *tr = &r->trials[t];
        json_object *fv = json_object_object_get(j, "file");
        const char *file = fv ? json_object_get_string(fv) : "";
        /* the trial as this run builds it must be the one the file recorded */
        if (get_i(j, "key") != tr->key || get_i(j, "offset") != (int64_t)tr->off ||
            get_i(j, "needle_pos") != tr->needle_pos || get_i(j, "wording") != tr->wording ||
            get_i(j, "length") != lg->params->lens[tr->len_i] ||
            strcmp(file, base_name(lg->corpus->docs[tr->doc].path)) || !same_distractors(j, tr))
            return fail(lg->path,
                        "trial %2$ld was made from another prompt than this run builds (key, haystack or "
                        "needle position differ)%1$s",
                        "", t);
        json_object *an = json_object_object_get(j, "answers");
        for (int mi = 0; mi < r->n_modes; mi++) {
            json_object *a = json_object_object_get(an, ev_modes_label(&lg->modes, mi));
            const size_t k = (size_t)t * (size_t)r->n_modes + (size_t)mi;
            json_object *ok = json_object_object_get(a, "correct"), *txt = json_object_object_get(a, "answer");
            if (!ok || !json_object_is_type(ok, json_type_boolean))
                return fail(lg->path, "trial %2$ld: mode %1$s has no correct: true/false",
                            ev_modes_label(&lg->modes, mi), t);
            r->correct[k] = json_object_get_boolean(ok);
            json_object *lu = json_object_object_get(a, "lured");
            r->lured[k] = lu && json_object_get_boolean(lu);
            snprintf(r->answers + k * EV_ANSWER_BYTES, EV_ANSWER_BYTES, "%s", txt ? json_object_get_string(txt) : "");
            r->kept[k] = json_object_object_get(a, "needle_kept") ? get_i(a, "needle_kept") : -1;
            json_object *ps = json_object_object_get(a, "prefill_s");
            r->trial_prefill_s[k] = ps ? json_object_get_double(ps) : 0.0;
        }
        r->done[t] = 1;
    }
    return 0;
}

void cli_needle_log_close(cli_needle_log *lg) {
    for (int i = 0; i < lg->n; i++) json_object_put(lg->rec[i]);
    free(lg->rec);
    if (lg->fd >= 0) close(lg->fd); /* releases the lock */
    memset(lg, 0, sizeof *lg);
    lg->fd = -1;
}
