/* Re-scoring kept bulk rows for a new question (prefill.c, cache/doc_stream.c):
 * a document evaluated alone, then a question; the question re-selects the document's
 * exact rows. The answer logits must not depend on how the document got into the session
 * (fresh, after another question, or from the document cache with its stream file), and
 * must differ from keeping the document's own selection. Generated tiny models, KV f16. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_cache.h"
#include "rk_ext.h"
#include "tb.h"

enum { N_DOC = 200, N_Q = 24, TAIL = 64, SPLIT = 3, BATCH = 48 };

static rk_model *load_tiny(void) {
    char p[1024];
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2, .n_layer = 6, .n_ctx_train = 512, .seed = 41};
    cr_assert(tb_tiny_model(&spec, p, sizeof p), "%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    remove(p);
    return m;
}

static void fill_ids(const rk_model *m, int32_t *ids, size_t n, uint64_t seed) {
    const int32_t nv = rk_model_hparams(m)->n_vocab;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)nv);
}

static rk_fill_params fill(bool keep_selection) {
    return (rk_fill_params){.mode = RK_FILL_IDENTITY,
                            .tail = TAIL,
                            .split = SPLIT,
                            .question_aware = true,
                            .keep_share = 0.25f,
                            .obs = 16,
                            .score_layers = 2,
                            .pool = 2,
                            .baseline = 16,
                            .keep_selection = keep_selection};
}

static rk_session *session(const rk_model *m, bool keep_selection) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = BATCH, sp.n_threads = 1;
    sp.kv.kind = RK_KV_F16;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_fill_params fp = fill(keep_selection);
    cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    return s;
}

static void eval(rk_session *s, const int32_t *ids, size_t n, float *lg) {
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, n, lg, false, &e), RK_OK, "%s", e.msg);
}

/* the question's last-row logits, then one decode step's (it reads every cache row) */
static void ask(rk_session *s, const int32_t *q, float *lg, size_t nv) {
    eval(s, q, N_Q, lg);
    eval(s, q, 1, lg + nv);
}

static double max_diff(const float *a, const float *b, size_t n) {
    double d = 0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d;
}

static char *tmp_dir(void) {
    char *d = strdup("/tmp/rk_rescore_XXXXXX");
    cr_assert(mkdtemp(d));
    return d;
}

static void rm_dir(char *d) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", d);
    cr_expect_eq(system(cmd), 0);
    free(d);
}

Test(rescore, new_question_reselects_the_same_way_fresh_after_another_question_and_from_the_cache) {
    rk_model *m = load_tiny();
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t doc[N_DOC], q1[N_Q], q2[N_Q];
    fill_ids(m, doc, N_DOC, 7), fill_ids(m, q1, N_Q, 8), fill_ids(m, q2, N_Q, 9);
    float *la = malloc(2 * nv * sizeof(float)), *lb = malloc(2 * nv * sizeof(float)),
          *lc = malloc(2 * nv * sizeof(float)), *ld = malloc(2 * nv * sizeof(float));
    const int64_t bulk = N_DOC - TAIL, n_keep = 4 + (int64_t)llround(0.25 * (double)(bulk - 4));
    rk_err e = {0};

    /* A: fresh, the document then q2 */
    rk_session *a = session(m, false);
    eval(a, doc, N_DOC, la);
    const int64_t kept_doc = rk_session_fill_kept(a, 0, bulk);
    uint64_t ex0, ex1;
    rk_session_layer_rows(a, SPLIT, &ex0, NULL);
    ask(a, q2, la, nv);
    rk_fill_rescore_stats ra;
    rk_session_fill_rescore_stats(a, &ra);
    cr_expect_eq(kept_doc, n_keep);
    cr_expect_eq(ra.calls, 1, "the question re-scored, the decode step did not (%lld)", (long long)ra.calls);
    cr_expect_eq(ra.scored, bulk - 4);
    cr_expect(ra.changed > 0, "q2 selects rows the document's own end did not");
    /* the document's selection stays; the question adds its rows (at most the keep share),
     * each run exactly once; nothing was added before, so nothing is refilled */
    cr_expect(ra.recomputed > 0 && ra.recomputed <= n_keep, "recomputed %lld", (long long)ra.recomputed);
    cr_expect_eq(ra.changed, ra.recomputed);
    cr_expect_eq(ra.refilled, 0, "refilled %lld", (long long)ra.refilled);
    cr_expect_eq(rk_session_fill_kept(a, 0, bulk), n_keep + ra.recomputed, "the document's rows and the question's");
    /* late layers ran exactly for the recomputed rows, the question and the decode row */
    rk_session_layer_rows(a, SPLIT, &ex1, NULL);
    cr_expect_eq(ex1 - ex0, (uint64_t)(ra.recomputed + N_Q + 1));

    /* B: the document, q1, back to the document, q2 */
    rk_session *b = session(m, false);
    eval(b, doc, N_DOC, lb);
    ask(b, q1, lb, nv);
    int64_t differ = 0; /* q1 chose other rows than q2: the second re-scoring has work to do */
    for (int64_t r = 0; r < bulk; r++) differ += rk_session_fill_kept(a, r, 1) != rk_session_fill_kept(b, r, 1);
    cr_expect(differ > 0, "q1 and q2 select the same rows");
    cr_assert_eq(rk_session_truncate(b, N_DOC, &e), RK_OK, "%s", e.msg);
    ask(b, q2, lb, nv);
    rk_fill_rescore_stats rb;
    rk_session_fill_rescore_stats(b, &rb);
    cr_expect(rb.refilled > 0, "q1's rows that q2 does not want go back to predicted K/V");
    cr_expect(max_diff(la, lb, 2 * nv) <= 1e-5, "after q1: differs by %g", max_diff(la, lb, 2 * nv));
    for (int64_t r = 0; r < bulk; r++)
        cr_expect_eq(rk_session_fill_kept(a, r, 1), rk_session_fill_kept(b, r, 1), "row %lld", (long long)r);

    /* C: the document from the document cache and its stream file, in a new session */
    char *dir = tmp_dir();
    rk_doc_cache_params cp = rk_doc_cache_params_default();
    cp.dir = dir;
    rk_doc_cache *c = NULL;
    cr_assert_eq(rk_doc_cache_open(&cp, &c, &e), RK_OK, "%s", e.msg);
    const char *key = "00000000000000000000000000000000000000000000000000000000000000ab";
    rk_session *w = session(m, false);
    eval(w, doc, N_DOC, lc);
    rk_kv_params kvp = rk_kv_params_default();
    kvp.kind = RK_KV_F16;
    cr_assert_eq(rk_doc_cache_save(c, key, m, &kvp, w, N_DOC, "doc", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_stream_save(c, key, w, &e), RK_OK, "%s", e.msg);
    rk_session_destroy(w);
    rk_session *r = session(m, false);
    int64_t nt = 0;
    cr_assert_eq(rk_doc_cache_load(c, key, r, &nt, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_stream_load(c, key, r, &e), RK_OK, "%s", e.msg);
    ask(r, q2, lc, nv);
    cr_expect(max_diff(la, lc, 2 * nv) <= 1e-5, "from the cache: differs by %g", max_diff(la, lc, 2 * nv));
    /* a flipped byte in the stream file's rows: refused by its digest and removed, the session
     * keeps no stream */
    char xs_path[4096];
    snprintf(xs_path, sizeof xs_path, "%s/%s.rkxs", dir, key);
    cr_assert(tb_flip_byte(xs_path, -1, 0x04));
    rk_session *rc = session(m, false);
    cr_assert_eq(rk_doc_cache_load(c, key, rc, &nt, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_doc_stream_load(c, key, rc, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "checksum mismatch") && strstr(e.msg, "removed"), "%s", e.msg);
    cr_expect(access(xs_path, F_OK) != 0, "the corrupt stream file is removed");
    rk_fill_stream none;
    cr_expect(!rk_session_fill_stream(rc, &none), "a refused stream file left a stream in the session");
    rk_session_destroy(rc);
    /* without the stream file the question cannot re-score: same as keeping the selection */
    cr_assert_eq(rk_doc_stream_remove(c, key, &e), RK_OK, "%s", e.msg);
    rk_session *r2 = session(m, false);
    cr_assert_eq(rk_doc_cache_load(c, key, r2, &nt, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_doc_stream_load(c, key, r2, &e), RK_E_NOT_FOUND);

    /* D: the document's own selection kept: other logits (else re-scoring did nothing) */
    rk_session *d = session(m, false);
    eval(d, doc, N_DOC, ld);
    rk_fill_params keep = fill(true);
    cr_assert_eq(rk_session_set_fill(d, &keep, &e), RK_OK, "%s", e.msg);
    ask(d, q2, ld, nv);
    rk_fill_rescore_stats rd;
    rk_session_fill_rescore_stats(d, &rd);
    cr_expect_eq(rd.calls, 0);
    cr_expect(max_diff(la, ld, 2 * nv) > 1e-4, "re-scoring changed nothing (%g)", max_diff(la, ld, 2 * nv));
    float *le = malloc(2 * nv * sizeof(float));
    ask(r2, q2, le, nv);
    cr_expect(max_diff(ld, le, 2 * nv) <= 1e-5, "cache without stream vs kept selection: %g", max_diff(ld, le, 2 * nv));

    /* E: the stream goes with its entry (rm), and gc sweeps a stream whose entry is gone */
    char sp_path[4096];
    snprintf(sp_path, sizeof sp_path, "%s/%s.rkxs", dir, key);
    cr_assert_eq(rk_doc_stream_save(c, key, r, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(access(sp_path, F_OK), 0);
    size_t n_rm = 0;
    cr_assert_eq(rk_doc_cache_remove(c, key, &n_rm, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(n_rm, 1);
    cr_expect_neq(access(sp_path, F_OK), 0, "rm left the stream file behind");
    cr_assert_eq(rk_doc_stream_save(c, key, r, &e), RK_OK, "%s", e.msg); /* an orphan: no entry */
    uint64_t left = 0;
    cr_assert_eq(rk_doc_cache_gc(c, 0, &n_rm, &left, &e), RK_OK, "%s", e.msg);
    cr_expect_neq(access(sp_path, F_OK), 0, "gc left an orphan stream file");

    rk_session_destroy(a), rk_session_destroy(b), rk_session_destroy(r), rk_session_destroy(r2), rk_session_destroy(d);
    rk_doc_cache_close(c);
    rm_dir(dir);
    free(la), free(lb), free(lc), free(ld), free(le);
    rk_model_destroy(m);
}

/* The resident bytes of this process's maps whose line in /proc/self/smaps names `name`
 * (-1: no such map). */
static long map_rss(const char *name) {
    FILE *f = fopen("/proc/self/smaps", "r");
    cr_assert(f);
    char line[4200];
    long rss = -1;
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        if (strchr(line, '-') && strchr(line, ' ') && strchr(line, '-') < strchr(line, ' ')) /* a map's first line */
            in = strstr(line, name) != NULL;
        long kb;
        if (in && sscanf(line, "Rss: %ld kB", &kb) == 1) rss = (rss < 0 ? 0 : rss) + kb * 1024;
    }
    fclose(f);
    return rss;
}

static rk_session *session_in(const rk_model *m, const char *spill_dir, int32_t stream_file) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = BATCH, sp.n_threads = 1;
    sp.kv.kind = RK_KV_F16, sp.kv.spill_dir = spill_dir;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_fill_params fp = fill(false);
    fp.stream_file = stream_file;
    cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    return s;
}

static size_t file_bytes(const char *path, uint8_t **out) {
    FILE *f = fopen(path, "rb");
    cr_assert(f, "%s", path);
    fseek(f, 0, SEEK_END);
    const size_t n = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc(n + 1);
    cr_assert_eq(fread(*out, 1, n, f), n);
    fclose(f);
    return n;
}

/* A kept stream moved into a file (stream_file KiB, from 1 KiB here) answers as one in
 * memory, bit for bit: the question's re-scoring and a decode step give the same logits and
 * the document cache's stream file the same bytes. The map is of an unlinked file in the
 * spill directory, and once the read, the save and the question have passed, the process
 * holds none of its pages. A spill directory that cannot take the file, or that is itself in
 * memory (/dev/shm, a tmpfs), leaves the stream in memory with the same answer. */
Test(rescore, a_stream_in_a_file_answers_as_one_in_memory) {
    rk_model *m = load_tiny();
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t doc[N_DOC], q2[N_Q];
    fill_ids(m, doc, N_DOC, 7), fill_ids(m, q2, N_Q, 9);
    char *dir = tmp_dir(), *spill = tmp_dir();
    rk_doc_cache_params cp = rk_doc_cache_params_default();
    cp.dir = dir;
    rk_doc_cache *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_doc_cache_open(&cp, &c, &e), RK_OK, "%s", e.msg);
    /* in memory; in a file; a spill directory that does not exist; one in memory (tmpfs) */
    enum { N_CASE = 4 };
    const char *keys[N_CASE] = {"00000000000000000000000000000000000000000000000000000000000000a1",
                                "00000000000000000000000000000000000000000000000000000000000000a2",
                                "00000000000000000000000000000000000000000000000000000000000000a3",
                                "00000000000000000000000000000000000000000000000000000000000000a4"};
    const char *spills[N_CASE] = {spill, spill, "/nonexistent/rk-spill", "/dev/shm"};
    const int32_t kib[N_CASE] = {-1, 1, 1, 1};
    rk_kv_params kvp = rk_kv_params_default();
    kvp.kind = RK_KV_F16;
    float *lg[N_CASE];
    uint8_t *xs[N_CASE];
    size_t n_xs[N_CASE];
    char mark[512];
    snprintf(mark, sizeof mark, "%s/ridgekv-array.", spill);
    for (int i = 0; i < N_CASE; i++) {
        rk_session *s = session_in(m, spills[i], kib[i]);
        lg[i] = malloc(2 * nv * sizeof(float));
        eval(s, doc, N_DOC, lg[i]);
        const long held = map_rss(mark);
        if (i == 1) {
            cr_expect(held >= 0, "the stream of %d rows did not move into a file in %s", N_DOC - TAIL, spill);
            cr_expect_eq(held, 0, "after the read the process holds %ld bytes of the stream's file", held);
        } else {
            cr_expect_eq(held, -1, "case %d: a stream file in %s", i, spill);
            cr_expect_eq(map_rss("/dev/shm/ridgekv-array."), -1, "case %d: a stream file in memory", i);
        }
        cr_assert_eq(rk_doc_stream_save(c, keys[i], s, &e), RK_OK, "%s", e.msg);
        if (i == 0) cr_assert_eq(rk_doc_cache_save(c, keys[0], m, &kvp, s, N_DOC, "doc", &e), RK_OK, "%s", e.msg);
        ask(s, q2, lg[i], nv);
        rk_fill_rescore_stats rs;
        rk_session_fill_rescore_stats(s, &rs);
        cr_expect(rs.recomputed > 0, "case %d: the question re-scored no row", i);
        if (i == 1) cr_expect_eq(map_rss(mark), 0, "after the save and the question: %ld bytes held", map_rss(mark));
        char path[4200];
        snprintf(path, sizeof path, "%s/%s.rkxs", dir, keys[i]);
        n_xs[i] = file_bytes(path, &xs[i]);
        rk_session_destroy(s);
        cr_expect_eq(map_rss(mark), -1, "the stream's map outlived its session");
    }
    /* loaded from the document cache, the stream is read where it lies in its file */
    rk_session *r = session_in(m, spill, -1);
    int64_t nt = 0;
    cr_assert_eq(rk_doc_cache_load(c, keys[0], r, &nt, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_stream_load(c, keys[0], r, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(map_rss(keys[0]), 0, "the loaded stream: %ld bytes held (-1: not mapped)", map_rss(keys[0]));
    float *lr = malloc(2 * nv * sizeof(float));
    ask(r, q2, lr, nv);
    cr_expect_eq(memcmp(lg[0], lr, 2 * nv * sizeof(float)), 0, "loaded: other logits (%g)",
                 max_diff(lg[0], lr, 2 * nv));
    /* at most the page where the question's last re-scored row ends */
    cr_expect(map_rss(keys[0]) >= 0 && map_rss(keys[0]) <= sysconf(_SC_PAGESIZE), "after the question: %ld bytes",
              map_rss(keys[0]));
    rk_session_destroy(r);
    cr_expect_eq(map_rss(keys[0]), -1, "the loaded stream's map outlived its session");
    free(lr);
    for (int i = 1; i < N_CASE; i++) {
        cr_expect_eq(memcmp(lg[0], lg[i], 2 * nv * sizeof(float)), 0, "case %d: other logits (%g)", i,
                     max_diff(lg[0], lg[i], 2 * nv));
        /* the files differ in their key (bytes 8..72) and so in their digest (the last 32) */
        cr_assert_eq(n_xs[i], n_xs[0]);
        cr_expect_eq(memcmp(xs[0] + 72, xs[i] + 72, n_xs[0] - 72 - 32), 0, "case %d: another stream file", i);
    }
    for (int i = 0; i < N_CASE; i++) free(lg[i]), free(xs[i]);
    rk_doc_cache_close(c);
    rm_dir(dir), rm_dir(spill);
    rk_model_destroy(m);
}

static void write_bytes(const char *path, const uint8_t *b, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

/* A stream file that is corrupt, cut short, another entry's, or for another session
 * length is refused by name and removed; the session keeps no stream. */
Test(rescore, stream_file_refuses_corrupt_short_foreign_and_stale) {
    rk_model *m = load_tiny();
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    int32_t doc[N_DOC];
    fill_ids(m, doc, N_DOC, 7);
    float *lg = malloc(nv * sizeof(float));
    char *dir = tmp_dir();
    rk_doc_cache_params cp = rk_doc_cache_params_default();
    cp.dir = dir;
    rk_doc_cache *c = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_doc_cache_open(&cp, &c, &e), RK_OK, "%s", e.msg);
    const char *key = "00000000000000000000000000000000000000000000000000000000000000cd",
               *other = "00000000000000000000000000000000000000000000000000000000000000ef";
    rk_session *s = session(m, false);
    eval(s, doc, N_DOC, lg);
    cr_assert_eq(rk_doc_stream_save(c, key, s, &e), RK_OK, "%s", e.msg);
    char path[512], opath[512];
    snprintf(path, sizeof path, "%s/%s.rkxs", dir, key);
    snprintf(opath, sizeof opath, "%s/%s.rkxs", dir, other);
    FILE *f = fopen(path, "rb");
    cr_assert(f);
    uint8_t *good = malloc(1 << 20);
    const size_t n = fread(good, 1, 1 << 20, f);
    fclose(f);
    cr_assert_gt(n, 104 + 32);
    cr_expect_eq(n, 104 + (size_t)(N_DOC - TAIL) * (rk_model_hparams(m)->n_embd * 2 + 5) + 32);
    rk_fill_stream fs;
    struct {
        const char *what, *msg;
        size_t len;
        size_t flip;
        const char *file, *k;
    } cases[] = {
        {"one bit flipped in the stream", "checksum", n, 200, path, key},
        {"cut short", "do not hold", n - 7, 0, path, key},
        {"header only", "shorter than a header", 50, 0, path, key},
        {"another entry's file", "another entry", n, 0, opath, other},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint8_t *b = malloc(n);
        memcpy(b, good, n);
        if (cases[i].flip) b[cases[i].flip] ^= 0x10;
        write_bytes(cases[i].file, b, cases[i].len);
        free(b);
        rk_err le = {0};
        /* a session holding the document without any stream */
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = 512, sp.n_batch = BATCH, sp.n_threads = 1, sp.kv.kind = RK_KV_F16;
        rk_session *u = NULL;
        cr_assert_eq(rk_session_create(m, &sp, &u, &e), RK_OK, "%s", e.msg);
        eval(u, doc, N_DOC, lg);
        cr_expect_eq(rk_doc_stream_load(c, cases[i].k, u, &le), RK_E_FORMAT, "%s", cases[i].what);
        cr_expect(strstr(le.msg, cases[i].msg) && strstr(le.msg, "removed"), "%s: '%s'", cases[i].what, le.msg);
        cr_expect(!rk_session_fill_stream(u, &fs), "%s: the session took a stream", cases[i].what);
        cr_expect_neq(access(cases[i].file, F_OK), 0, "%s: not removed", cases[i].what);
        rk_session_destroy(u);
    }
    /* the good file, loaded into a session that holds another number of tokens */
    write_bytes(path, good, n);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = BATCH, sp.n_threads = 1, sp.kv.kind = RK_KV_F16;
    rk_session *u = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &u, &e), RK_OK, "%s", e.msg);
    eval(u, doc, N_DOC - 10, lg);
    rk_err le = {0};
    cr_expect_eq(rk_doc_stream_load(c, key, u, &le), RK_E_FORMAT);
    cr_expect(strstr(le.msg, "written for 200 tokens, the session holds 190"), "'%s'", le.msg);
    /* and into the right one */
    write_bytes(path, good, n);
    rk_session_reset(u);
    eval(u, doc, N_DOC, lg);
    cr_expect_eq(rk_doc_stream_load(c, key, u, &le), RK_OK, "%s", le.msg);
    cr_expect(rk_session_fill_stream(u, &fs) && fs.row0 == 0 && fs.n == N_DOC - TAIL && fs.split == SPLIT);
    /* a truncate below the kept rows drops the stream */
    cr_assert_eq(rk_session_truncate(u, 100, &e), RK_OK);
    cr_expect(!rk_session_fill_stream(u, &fs));
    rk_session_destroy(u), rk_session_destroy(s);
    rk_doc_cache_close(c);
    rm_dir(dir);
    free(good), free(lg);
    rk_model_destroy(m);
}

/* A long document: a second question makes at most rescore_rows rows exact beside the
 * document's own selection (by default the work of 1024 rows at 2048 keys, fewer rows at
 * this length, of the 25 % share, 1,109 rows here), so the rows it
 * runs through the late layers, which the session counts, are bounded by that budget and not
 * by the document's length; the answer's logits are finite and a decode step follows. */
Test(rescore, long_document_reruns_at_most_the_row_budget) {
    char p[1024];
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2, .n_layer = 6, .n_ctx_train = 4608, .seed = 41};
    cr_assert(tb_tiny_model(&spec, p, sizeof p), "%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    remove(p);
    const size_t nv = (size_t)rk_model_hparams(m)->n_vocab;
    enum { N_LONG = 4500 };
    int32_t *doc = malloc(N_LONG * sizeof(int32_t)), q2[N_Q];
    fill_ids(m, doc, N_LONG, 17), fill_ids(m, q2, N_Q, 9);
    {
        rk_session_params sp = rk_session_params_default();
        sp.n_ctx = 4608, sp.n_batch = 256, sp.n_threads = 2;
        rk_session *s = NULL;
        cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
        rk_fill_params fp = fill(false);
        cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
        float *lg = malloc(2 * nv * sizeof(float));
        eval(s, doc, N_LONG, lg);
        const int64_t bulk = N_LONG - TAIL, n_keep = 4 + (int64_t)llround(0.25 * (double)(bulk - 4));
        /* the default budget: the late-layer work of 1024 rows attending to 2048 keys, each row
         * here attending to half the bulk rows on average (prefill.c, rescore_default) */
        const rk_hparams *hp = rk_model_hparams(m);
        const double d = hp->n_embd, qd = (double)hp->n_head * hp->head_dim, kvd = (double)hp->n_head_kv * hp->head_dim;
        const double mat = 2.0 * (2.0 * d * qd + 2.0 * d * kvd + 3.0 * d * hp->n_ff);
        const int64_t want = (int64_t)(1024.0 * (mat + 4.0 * qd * 1024.0) / (mat + 4.0 * qd * 0.5 * (double)bulk));
        cr_assert_lt(want, 1024, "a %lld-row document gets fewer than 1024 rows", (long long)bulk);
        cr_assert_gt(n_keep, want, "the share (%lld rows) must exceed the budget for the test to bind",
                     (long long)n_keep);
        uint64_t ex0, ex1;
        rk_session_layer_rows(s, SPLIT, &ex0, NULL);
        ask(s, q2, lg, nv);
        rk_session_layer_rows(s, SPLIT, &ex1, NULL);
        rk_fill_rescore_stats r;
        rk_session_fill_rescore_stats(s, &r);
        cr_log_info("budget %lld: scored %lld, re-ran %lld + %lld rows (late layers %llu rows with the question)",
                    (long long)want, (long long)r.scored, (long long)r.recomputed, (long long)r.refilled,
                    (unsigned long long)(ex1 - ex0));
        cr_expect_eq(r.calls, 1);
        cr_expect_eq(r.scored, bulk - 4);
        cr_expect(r.recomputed > 0 && r.recomputed <= want, "recomputed %lld of a budget of %lld",
                  (long long)r.recomputed, (long long)want);
        cr_expect_eq(r.refilled, 0);
        cr_expect_eq(ex1 - ex0, (uint64_t)(r.recomputed + N_Q + 1),
                     "late layers ran the added rows, the question "
                     "and the decode step only");
        cr_expect_eq(rk_session_fill_kept(s, 0, bulk), n_keep + r.recomputed);
        for (size_t i = 0; i < 2 * nv; i++) cr_assert(isfinite(lg[i]), "logit %zu: %g", i, (double)lg[i]);
        free(lg);
        rk_session_destroy(s);
    }
    free(doc);
    rk_model_destroy(m);
}
