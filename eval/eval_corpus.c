/* Corpus files and random windows for the eval drivers: see rk_eval.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "rk_eval.h"
#include "rk_io.h"

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

rk_status ev_corpus_load(ev_corpus *c, const rk_model *m, const char *files, const char *corpus_dir, rk_err *err) {
    memset(c, 0, sizeof *c);
    c->bos = rk_model_add_bos(m) && rk_model_token_bos(m) >= 0 ? rk_model_token_bos(m) : -1;
    rk_status st = RK_OK;
    for (const char *p = files; *p && !st;) {
        const char *comma = strchr(p, ',');
        size_t len = comma ? (size_t)(comma - p) : strlen(p);
        char name[2048], path[4096];
        if (len == 0 || len >= sizeof name) {
            st = rk_err_set(err, RK_E_INVALID_ARG, "--files expects a comma list of text files (got '%.64s')", files);
            break;
        }
        memcpy(name, p, len);
        name[len] = '\0';
        p = comma ? comma + 1 : p + len;
        snprintf(path, sizeof path, "%s", name);
        if (!file_exists(path) && !strchr(name, '/') && corpus_dir)
            snprintf(path, sizeof path, "%s/%s", corpus_dir, name);
        char *text = NULL;
        size_t n_text = 0;
        if ((st = rk_io_read_file(path, &text, &n_text, err))) {
            if (!strchr(name, '/'))
                rk_err_wrap(err, "'%s' not found here nor in the corpus dir '%s' (--corpus DIR or $RIDGEKV_CORPUS)",
                            name, corpus_dir ? corpus_dir : "(none)");
            break;
        }
        ev_doc d = {0};
        st = rk_model_tokenize(m, text, n_text, false, false, &d.ids, &d.n, err);
        free(text);
        ev_doc *nd = st ? NULL : realloc(c->docs, ((size_t)c->n_docs + 1) * sizeof *nd);
        d.path = nd ? strdup(path) : NULL;
        if (st || !nd || !d.path) {
            if (!st) st = rk_err_set(err, RK_E_NOMEM, "eval: out of memory reading %s", path);
            if (nd) c->docs = nd;
            free(d.ids);
            free(d.path);
            break;
        }
        c->docs = nd;
        c->docs[c->n_docs++] = d;
    }
    if (!st && c->n_docs == 0) st = rk_err_set(err, RK_E_INVALID_ARG, "--files names no file");
    if (st) ev_corpus_deinit(c);
    return st;
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
