/* The document KV cache in the CLI (doc_cache_cli.h). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doc_cache_cli.h"
#include "progress.h"
#include "rk_io.h"

int cli_kv_cache_dir(char *buf, size_t cap) {
    char dir[3072];
    if (cli_cache_dir(dir, sizeof dir)) return -1;
    int w = snprintf(buf, cap, "%s/kv", dir);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

rk_doc_cache *cli_doc_cache_open(const cli_opts *o, const char *cmd) { return cli_doc_cache_open_mode(o, cmd, false); }

rk_doc_cache *cli_doc_cache_open_mode(const cli_opts *o, const char *cmd, bool read_only) {
    char dir[3200];
    if (cli_kv_cache_dir(dir, sizeof dir)) {
        fprintf(stderr, "ridgekv %s: document cache off: neither XDG_CACHE_HOME nor HOME is set\n", cmd);
        return NULL;
    }
    rk_doc_cache_params p = rk_doc_cache_params_default();
    p.dir = dir;
    p.read_only = read_only;
    if (o->cache_level) p.io.zstd_level = o->cache_level; /* -1 (--cache-level 0): raw frames */
    const char *nu = getenv("RIDGEKV_NO_URING");
    if (nu && *nu && strcmp(nu, "0")) p.io.backend = RK_BS_THREADS;
    const char *fault = getenv("RIDGEKV_IO_FAULT");
    rk_err e = {0};
    if (fault && *fault && rk_bs_fault_parse(fault, &p.io.fault, &e)) {
        fprintf(stderr, "ridgekv %s: RIDGEKV_IO_FAULT ignored: %s\n", cmd, e.msg);
        p.io.fault = (rk_bs_fault){0};
    }
    rk_doc_cache *c = NULL;
    if (rk_doc_cache_open(&p, &c, &e)) {
        if (read_only) fprintf(stderr, "ridgekv %s: %s\n", cmd, e.msg);
        else fprintf(stderr, "ridgekv %s: document cache off: %s\n", cmd, e.msg);
        return NULL;
    }
    return c;
}

static size_t common(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t i = 0;
    while (i < na && i < nb && a[i] == b[i]) i++;
    return i;
}

static void verbose_io(const char *cmd, const char *what, const rk_doc_cache *c, const char *key) {
    rk_doc_cache_stats st;
    rk_doc_cache_last(c, &st);
    fprintf(stderr, "ridgekv %s: document cache: %s %.12s, %.1f MB of KV in a %.1f MB file in %.3f s (%s%s)\n", cmd,
            what, key, (double)st.raw_bytes / 1e6, (double)st.file_bytes / 1e6, st.io_s, rk_bs_backend_name(st.backend),
            st.direct ? ", O_DIRECT" : "");
}

/* RIDGEKV_CHECKPOINT: "0" no checkpoints, "N" every N seconds of reading, "Nc" every N chunks. */
static bool ckpt_params(const char *cmd, rk_doc_ckpt_params *p) {
    *p = rk_doc_ckpt_params_default();
    const char *v = getenv("RIDGEKV_CHECKPOINT");
    if (!v || !*v) return true;
    char *end = NULL;
    errno = 0;
    const double x = strtod(v, &end);
    const bool chunks = end && (*end == 'c' || *end == 'C') && !end[1];
    if (errno || end == v || (*end && !chunks) || !(x >= 0) || x > 1e9 || (chunks && x != (int)x)) {
        fprintf(stderr, "ridgekv %s: RIDGEKV_CHECKPOINT=%s ignored (0, SECONDS or CHUNKSc)\n", cmd, v);
        return true;
    }
    if (x == 0) return false;
    if (chunks) p->every_chunks = (int)x;
    else p->every_s = x;
    return true;
}

static void ckpt_note(void *ud, const char *msg) { fprintf(stderr, "ridgekv %s: %s\n", (const char *)ud, msg); }

static uint64_t filled_rows(const rk_session *s, int n_layer) {
    uint64_t n = 0, f;
    for (int l = 0; l < n_layer; l++) rk_session_layer_rows(s, l, NULL, &f), n += f;
    return n;
}

rk_status cli_doc_prefix(const cli_opts *o, const char *cmd, rk_doc_cache *c, const rk_model *m, rk_session *s,
                         const char *system, const rk_doc *docs, size_t n_docs, const int32_t *ids, size_t n_ids,
                         rk_progress_fn progress, void *ud, cli_prefix *out, rk_err *err) {
    memset(out, 0, sizeof *out);
    size_t p = 0;
    rk_status st = rk_doc_ask_prefix(m, s, system, docs, n_docs, ids, n_ids, &p, err);
    if (st) return st;
    if (p < 1) return RK_OK;
    out->n_prefix = (int64_t)p;
    if (o->verbose)
        fprintf(stderr,
                "ridgekv %s: the documents are the first %zu prompt tokens: read (or loaded) apart from the "
                "question\n",
                cmd, p);
    char label[256] = "";
    for (size_t i = 0; i < n_docs; i++) {
        const size_t l = strlen(label);
        snprintf(label + l, sizeof label - l, "%s%s", i ? ", " : "", docs[i].name ? docs[i].name : "(unnamed)");
    }
    char key[65] = "";
    const double t0 = rk_time_now();
    if (c) {
        /* the key of the rows as this session computes them: its KV policy, fill and maps */
        rk_err e = {0};
        if (rk_doc_cache_session_key(s, ids, p, key, &e)) {
            fprintf(stderr, "ridgekv %s: document cache not used: %s\n", cmd, e.msg);
            c = NULL;
        }
    }
    if (c) {
        int64_t n = 0;
        rk_err e = {0};
        rk_status ls = rk_doc_cache_load_tokens(c, key, ids, p, s, &n, &e);
        if (!ls && n == (int64_t)p) {
            out->reused = true;
            out->read_s = rk_time_now() - t0;
            if (progress) progress(ud, (int64_t)p, (int64_t)n_ids);
            cli_progress_break();
            fprintf(stderr, "ridgekv %s: reused cached KV for %s (%lld tokens)\n", cmd, label, (long long)n);
            if (rk_doc_stream_load(c, key, s, &e) && e.code != RK_E_NOT_FOUND)
                fprintf(stderr, "ridgekv %s: %s\n", cmd, e.msg);
            if (o->verbose) verbose_io(cmd, "loaded", c, key);
            return RK_OK;
        }
        if (ls && ls != RK_E_NOT_FOUND) fprintf(stderr, "ridgekv %s: %s; reading the documents again\n", cmd, e.msg);
        rk_session_reset(s);
    }
    /* the documents' own prefill: keep what the session holds of them */
    const int32_t *held = rk_session_tokens(s);
    size_t keep = held ? common(held, (size_t)rk_session_n_past(s), ids, p) : 0;
    if (keep < (size_t)rk_session_n_past(s)) {
        if ((st = rk_session_truncate(s, (int64_t)keep, err))) return st;
    }
    /* checkpoints of a read from row 0, so that an interrupted one resumes (rk_doc_ckpt_open) */
    rk_doc_ckpt *ck = NULL;
    rk_doc_ckpt_params cp;
    if (c && keep == 0 && ckpt_params(cmd, &cp)) {
        char why[256];
        rk_err e = {0};
        cp.note = ckpt_note, cp.ud = (void *)cmd;
        if (rk_doc_ckpt_open(c, key, s, ids, p, &cp, &ck, why, sizeof why, &e))
            fprintf(stderr, "ridgekv %s: no checkpoints: %s\n", cmd, e.msg);
        else if (!ck && o->verbose) fprintf(stderr, "ridgekv %s: the read is not checkpointed: %s\n", cmd, why);
        if (rk_doc_ckpt_resume_at(ck) > 0)
            fprintf(stderr, "ridgekv %s: resuming from token %lld of %zu (a checkpoint of an interrupted read)\n", cmd,
                    (long long)rk_doc_ckpt_resume_at(ck), p);
    }
    cli_prefix_progress pp = {progress, ud, (int64_t)keep, (int64_t)n_ids};
    rk_session_set_progress(s, progress ? cli_prefix_progress_fn : NULL, &pp);
    const int n_layer = rk_model_hparams(m)->n_layer;
    const uint64_t f0 = filled_rows(s, n_layer);
    st = keep < p ? rk_session_eval(s, ids + keep, p - keep, NULL, false, err) : RK_OK;
    rk_session_set_progress(s, NULL, NULL);
    if (o->verbose && ck)
        fprintf(stderr, "ridgekv %s: %d checkpoint%s written during the read%s\n", cmd, rk_doc_ckpt_written(ck),
                rk_doc_ckpt_written(ck) == 1 ? "" : "s", rk_doc_ckpt_resumed(ck) ? " (resumed)" : "");
    if (st) {
        rk_doc_ckpt_close(ck, false); /* kept for the next read */
        return st;
    }
    out->filled = filled_rows(s, n_layer) - f0;
    out->n_read = (int64_t)(p - keep); /* of them read by this run: a resumed read less what it resumed */
    if (rk_doc_ckpt_resumed(ck)) out->n_read -= rk_doc_ckpt_resume_at(ck);
    out->read_s = rk_time_now() - t0;
    if (c) {
        rk_err e = {0};
        if (rk_doc_cache_save(c, key, m, NULL, s, (int64_t)p, label, &e))
            fprintf(stderr, "ridgekv %s: %s; the answer does not depend on it\n", cmd, e.msg);
        else if (o->verbose) verbose_io(cmd, "saved", c, key);
        rk_doc_ckpt_close(ck, true); /* the read completed: the entry replaces its checkpoints */
        if (rk_doc_stream_save(c, key, s, &e))
            fprintf(stderr, "ridgekv %s: %s; the answer does not depend on it\n", cmd, e.msg);
    }
    return RK_OK;
}

bool cli_prefix_progress_fn(void *ud, int64_t done, int64_t total) {
    const cli_prefix_progress *p = ud;
    (void)total;
    return p->fn ? p->fn(p->ud, p->off + done, p->total ? p->total : p->off + total) : true;
}

bool cli_parse_size(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    if (!s || !*s || *s == '-') return false;
    double v = strtod(s, &end);
    if (errno || end == s || !(v >= 0)) return false;
    double mul = 1;
    if (*end) {
        const char *u = "KMGT";
        const char *q = strchr(u, end[0] >= 'a' ? end[0] - 32 : end[0]);
        if (!q || !*q) return false;
        for (const char *x = u; x <= q; x++) mul *= 1024;
        end++;
        if (*end == 'i') end++;
        if (*end == 'B' || *end == 'b') end++;
        if (*end) return false;
    }
    if (v * mul > 1.8e19) return false;
    *out = (uint64_t)(v * mul);
    return true;
}

void cli_kv_tier_params(const cli_opts *o, rk_kv_params *kv) {
    uint64_t b = 0;
    if (o->kv_budget && cli_parse_size(o->kv_budget, &b)) kv->budget = b ? b : 1;
    if (o->kv_host_budget && cli_parse_size(o->kv_host_budget, &b)) kv->host_budget = b ? b : 1;
    const char *td = getenv("TMPDIR");
    kv->spill_dir = td && *td ? td : "/tmp";
    const char *nu = getenv("RIDGEKV_NO_URING");
    kv->spill_backend = nu && *nu && strcmp(nu, "0") ? 2 : 0;
    const char *sb = getenv("RIDGEKV_SPILL_BUFFERED"); /* docs/TIERS.md: no O_DIRECT for the spill file */
    kv->spill_buffered = sb && *sb && strcmp(sb, "0");
    const char *bw = getenv("RIDGEKV_BUDGET_WHOLE"); /* docs/TIERS.md: lowram budget over the whole state */
    kv->budget_whole = bw && *bw && strcmp(bw, "0");
    const char *sl = getenv("RIDGEKV_SPILL_LEVEL"); /* docs/TIERS.md: zstd level of spilled blocks, 0 raw */
    if (sl && *sl) {
        const long v = strtol(sl, NULL, 10);
        kv->spill_level = v <= 0 ? -1 : v > 19 ? 19 : (int32_t)v;
    }
}

/* A share "25%" of the plain KV of n_tokens; keep when spec is no share. */
static uint64_t kv_share(const char *spec, const rk_model *m, const rk_kv_params *kv, int64_t n_tokens, uint64_t keep) {
    const size_t n = spec ? strlen(spec) : 0;
    if (!n || spec[n - 1] != '%') return keep;
    const double share = strtod(spec, NULL) / 100.0;
    const rk_hparams *hp = rk_model_hparams(m);
    const double per_value = kv->kind == RK_KV_F32  ? 4.0
                             : kv->kind == RK_KV_Q8 ? 34.0 / 32.0
                             : kv->kind == RK_KV_Q4 ? 18.0 / 32.0
                                                    : 2.0;
    const double bytes = (double)n_tokens * 2.0 * hp->n_layer * hp->n_head_kv * hp->head_dim * per_value;
    const uint64_t b = (uint64_t)(share * bytes);
    return b ? b : 1;
}

uint64_t cli_kv_budget_share(const cli_opts *o, const rk_model *m, const rk_kv_params *kv, int64_t n_tokens) {
    return kv_share(o->kv_budget, m, kv, n_tokens, kv->budget);
}

uint64_t cli_kv_host_budget_share(const cli_opts *o, const rk_model *m, const rk_kv_params *kv, int64_t n_tokens) {
    return kv_share(o->kv_host_budget, m, kv, n_tokens, kv->host_budget);
}

void cli_kv_tier_line(const char *cmd, const rk_kv_tier_stats *a, const rk_kv_tier_stats *b) {
    if (!b->on) return;
    const uint64_t hits = b->hits - a->hits, miss = b->misses - a->misses;
    fprintf(
        stderr,
        "%s: kv tier: budget %.1f MiB, resident %.1f MiB, spilled %.1f MiB; chunk reads: hit rate %.1f%% (%llu of %llu), "
        "%llu read ahead; read back %.1f MB (%.1f MB stored); stall %.3f s; %s%s\n",
        cmd, b->budget / 1048576.0, b->resident_bytes / 1048576.0, b->spilled_bytes / 1048576.0,
        hits + miss ? 100.0 * (double)hits / (double)(hits + miss) : 100.0, (unsigned long long)hits,
        (unsigned long long)(hits + miss), (unsigned long long)(b->prefetched - a->prefetched),
        (double)(b->bytes_read - a->bytes_read) / 1e6, (double)(b->bytes_read_stored - a->bytes_read_stored) / 1e6,
        b->stall_s - a->stall_s, b->backend, b->spill_errors ? " (spills failed: kept in memory)" : "");
    if (b->fixed_bytes)
        fprintf(stderr,
                "%s: kv tier: lowram: of the resident bytes %.1f MiB never move (per-step state: landmarks, "
                "bounds, bases, predictors, exact window, key cache); the movable rows resident: %.1f MiB now, "
                "%.1f MiB at most in decode (before a release)\n",
                cmd, b->fixed_bytes / 1048576.0,
                (b->resident_bytes > b->fixed_bytes ? b->resident_bytes - b->fixed_bytes : 0) / 1048576.0,
                b->budget_peak / 1048576.0);
    const uint64_t sel = b->sel_chunks - a->sel_chunks, rep = b->sel_repeat - a->sel_repeat;
    if (sel)
        fprintf(stderr,
                "%s: kv tier: lowram selection: %.1f%% of the chunks decode selected were selected by the same "
                "(layer, head) the step before (%llu of %llu)\n",
                cmd, 100.0 * (double)rep / (double)sel, (unsigned long long)rep, (unsigned long long)sel);
}
