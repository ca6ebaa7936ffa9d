/* Checkpoints of a long read (runtime/cache/doc_ckpt.c): a document read interrupted through
 * the progress callback at several points, each read resuming from the last checkpoint,
 * ends with the logits of an uninterrupted read bit for bit (and so does the question read
 * after it, which sees every layer's KV, the selection and the kept stream); a corrupt
 * checkpoint is named, removed and the older one used; a full disk turns checkpoints off with
 * one note and changes nothing. Generated tiny models; question-aware layer-major fill with
 * grouped filled rows (what quality mode runs) on f16, plain chunk-major reads on q8. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk.h"
#include "rk_cache.h"
#include "rk_ext.h"
#include "rk_fitters.h"
#include "rk_io.h"
#include "tb.h"

enum { N_DOC = 300, N_Q = 20, BATCH = 32 };

static rk_model *load_tiny(void) {
    char p[1024];
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2, .n_layer = 6, .n_ctx_train = 512, .seed = 77};
    cr_assert(tb_tiny_model(&spec, p, sizeof p), "%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    remove(p);
    return m;
}

/* Quality mode itself (rk_fill_params_default()) when set: maps fitted on the tiny model. */
static rk_ridge_maps *g_maps;

static rk_session *session(const rk_model *m, rk_kv_kind kind, bool fill) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = BATCH, sp.n_threads = 1;
    sp.kv.kind = kind;
    rk_session *s = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    if (fill && g_maps) {
        rk_fill_params fp = rk_fill_params_default();
        fp.maps = g_maps, fp.tail = 64; /* the library's quality mode, a tail short enough for 300 rows */
        cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    } else if (fill) {
        /* quality mode's machinery without maps: question-aware selection (layer-major), groups */
        rk_fill_params fp = {.mode = RK_FILL_IDENTITY,
                             .tail = 64,
                             .split = 3,
                             .question_aware = true,
                             .keep_share = 0.25f,
                             .obs = 16,
                             .score_layers = 2,
                             .pool = 2,
                             .baseline = 16,
                             .group = 4,
                             .stream_file = 1}; /* the kept stream in a file from 1 KiB: checkpoints read it there */
        cr_assert_eq(rk_session_set_fill(s, &fp, &e), RK_OK, "%s", e.msg);
    }
    return s;
}

typedef struct stop {
    int calls, at; /* progress calls so far; stop at this one (0: never) */
} stop;
static bool stop_fn(void *ud, int64_t done, int64_t total) {
    stop *t = ud;
    (void)done, (void)total;
    return !(t->at && ++t->calls >= t->at);
}

typedef struct notes {
    char text[4096];
    int n;
} notes;
static void note_fn(void *ud, const char *msg) {
    notes *t = ud;
    const size_t l = strlen(t->text);
    snprintf(t->text + l, sizeof t->text - l, "%s\n", msg);
    t->n++;
}

typedef struct world {
    rk_model *m;
    int32_t doc[N_DOC], q[N_Q];
    int32_t nv;
    float *ref; /* the document's last logits, then the question's */
    char dir[512];
    rk_doc_cache *c;
    rk_kv_kind kind;
    bool fill;
    char key[65];
} world;

static void setup(world *w, rk_kv_kind kind, bool fill, const char *fault) {
    memset(w, 0, sizeof *w);
    w->m = load_tiny();
    w->kind = kind, w->fill = fill;
    w->nv = rk_model_hparams(w->m)->n_vocab;
    uint64_t seed = 5;
    for (int i = 0; i < N_DOC; i++) w->doc[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)w->nv);
    for (int i = 0; i < N_Q; i++) w->q[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)w->nv);
    cr_assert(tb_tmp_dir(w->dir, sizeof w->dir, "rk-ckpt"), "%s", w->dir);
    rk_doc_cache_params cp = rk_doc_cache_params_default();
    cp.dir = w->dir;
    rk_err e = {0};
    if (fault) cr_assert_eq(rk_bs_fault_parse(fault, &cp.io.fault, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_doc_cache_open(&cp, &w->c, &e), RK_OK, "%s", e.msg);
    /* the uninterrupted read, then the question */
    rk_session *s = session(w->m, kind, fill);
    cr_assert_eq(rk_doc_cache_session_key(s, w->doc, N_DOC, w->key, &e), RK_OK, "%s", e.msg);
    w->ref = malloc(2 * (size_t)w->nv * sizeof(float));
    cr_assert_eq(rk_session_eval(s, w->doc, N_DOC, w->ref, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(s, w->q, N_Q, w->ref + w->nv, false, &e), RK_OK, "%s", e.msg);
    rk_session_destroy(s);
}

static void teardown(world *w) {
    rk_doc_cache_close(w->c);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", w->dir);
    cr_assert(system(cmd) == 0);
    free(w->ref);
    rk_model_destroy(w->m);
}

static bool exists(const world *w, const char *ext) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s.%s", w->dir, w->key, ext);
    return access(p, F_OK) == 0;
}

/* One read with checkpoints every chunk, stopped at progress call `at` (0: to the end).
 * Returns the status; *resumed_at what the checkpoint it found held. */
static rk_status read_doc(world *w, int at, notes *nt, int64_t *resumed_at, bool *resumed, float *out) {
    rk_session *s = session(w->m, w->kind, w->fill);
    rk_doc_ckpt_params p = rk_doc_ckpt_params_default();
    p.every_chunks = 1, p.note = note_fn, p.ud = nt;
    p.block_rows = 7; /* several blocks of KV rows, the last one shorter */
    rk_doc_ckpt *ck = NULL;
    char why[256];
    rk_err e = {0};
    cr_assert_eq(rk_doc_ckpt_open(w->c, w->key, s, w->doc, N_DOC, &p, &ck, why, sizeof why, &e), RK_OK, "%s", e.msg);
    cr_assert(ck, "not checkpointed: %s", why);
    *resumed_at = rk_doc_ckpt_resume_at(ck);
    stop t = {0, at};
    rk_session_set_progress(s, stop_fn, &t);
    float lg[2048];
    cr_assert(w->nv <= 1024);
    rk_status st = rk_session_eval(s, w->doc, N_DOC, lg, false, &e);
    rk_session_set_progress(s, NULL, NULL);
    *resumed = rk_doc_ckpt_resumed(ck);
    if (st == RK_OK) {
        cr_assert_eq(rk_doc_ckpt_written(ck) > 0 || *resumed, true);
        rk_doc_ckpt_close(ck, true);
        cr_assert_eq(rk_session_eval(s, w->q, N_Q, lg + w->nv, false, &e), RK_OK, "%s", e.msg);
        memcpy(out, lg, 2 * (size_t)w->nv * sizeof(float));
    } else {
        cr_assert_eq(st, RK_E_CANCELLED, "%s", e.msg);
        rk_doc_ckpt_close(ck, false);
    }
    rk_session_destroy(s);
    return st;
}

/* Stops at each of stops (progress calls of that read), each read resuming from the last. */
static void interrupted(world *w, const int *stops, int n_stops, notes *nt) {
    int64_t last = 0, at = 0;
    bool resumed = false;
    float out[2048];
    for (int i = 0; i < n_stops; i++) {
        cr_assert_eq(read_doc(w, stops[i], nt, &at, &resumed, out), RK_E_CANCELLED);
        cr_expect(at >= last, "read %d resumed from %lld, before the last %lld", i, (long long)at, (long long)last);
        cr_expect_eq(resumed, i > 0, "read %d", i);
        cr_expect(exists(w, "rkck"), "no checkpoint after read %d", i);
        last = at;
    }
}

static void finish(world *w, notes *nt, bool expect_resume) {
    int64_t at = 0;
    bool resumed = false;
    float out[2048];
    cr_assert_eq(read_doc(w, 0, nt, &at, &resumed, out), RK_OK);
    cr_expect_eq(resumed, expect_resume, "resumed %d from %lld (notes: %s)", resumed, (long long)at, nt->text);
    if (expect_resume) cr_expect(at > 0 && at < N_DOC, "resumed from token %lld of %d", (long long)at, N_DOC);
    int bad = -1;
    for (int i = 0; i < 2 * w->nv && bad < 0; i++)
        if (memcmp(&out[i], &w->ref[i], sizeof(float))) bad = i;
    cr_expect_eq(bad, -1, "logit %d: %.9g vs %.9g uninterrupted", bad, bad >= 0 ? out[bad] : 0.0,
                 bad >= 0 ? w->ref[bad] : 0.0);
    cr_expect(!exists(w, "rkck") && !exists(w, "rkck.old"), "the completed read left its checkpoints");
}

/* f16 KV, question-aware layer-major fill with groups: stops in the first pass, across the
 * selection, in the late pass. 300 rows of 32: 11 chunks a pass (the bulk ends at row 236). */
Test(doc_ckpt, interrupted_layer_major_fill_reads_resume_bit_identical) {
    world w;
    setup(&w, RK_KV_F16, true, NULL);
    notes nt = {0};
    const int stops[] = {3, 4, 6, 5};
    interrupted(&w, stops, 4, &nt);
    finish(&w, &nt, true);
    cr_expect_eq(nt.n, 0, "notes: %s", nt.text);
    teardown(&w);
}

Test(doc_ckpt, interrupted_chunk_major_q8_reads_resume_bit_identical) {
    world w;
    setup(&w, RK_KV_Q8, false, NULL);
    notes nt = {0};
    const int stops[] = {2, 3, 4};
    interrupted(&w, stops, 3, &nt);
    finish(&w, &nt, true);
    teardown(&w);
}

/* A corrupt newest checkpoint: named, removed, the older one resumes; both corrupt: a fresh
 * read. The answer is the uninterrupted one either way. */
static void corrupt(const world *w, const char *ext) {
    char p[800];
    snprintf(p, sizeof p, "%s/%s.%s", w->dir, w->key, ext);
    FILE *f = fopen(p, "r+b");
    cr_assert(f, "%s", p);
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, n * 2 / 3, SEEK_SET);
    const int ch = fgetc(f);
    fseek(f, n * 2 / 3, SEEK_SET);
    fputc(ch ^ 0x5a, f);
    fclose(f);
}

Test(doc_ckpt, corrupt_checkpoint_is_ignored_for_the_older_one_or_a_fresh_read) {
    world w;
    setup(&w, RK_KV_F16, true, NULL);
    notes nt = {0};
    const int stops[] = {8};
    interrupted(&w, stops, 1, &nt);
    cr_assert(exists(&w, "rkck.old"));
    corrupt(&w, "rkck");
    finish(&w, &nt, true);
    cr_expect_eq(nt.n, 1, "notes: %s", nt.text);
    cr_expect(strstr(nt.text, "unusable") && strstr(nt.text, "ignored"), "%s", nt.text);

    nt = (notes){0};
    interrupted(&w, stops, 1, &nt);
    corrupt(&w, "rkck");
    corrupt(&w, "rkck.old");
    finish(&w, &nt, false);
    cr_expect_eq(nt.n, 2, "notes: %s", nt.text);
    teardown(&w);
}

/* Every write fails (ENOSPC): one note, no checkpoint, the read completes unchanged. */
Test(doc_ckpt, full_disk_turns_checkpoints_off_once) {
    world w;
    setup(&w, RK_KV_F16, true, "enospc@all");
    notes nt = {0};
    int64_t at = 0;
    bool resumed = false;
    float out[2048];
    rk_session *s = session(w.m, RK_KV_F16, true);
    rk_doc_ckpt_params p = rk_doc_ckpt_params_default();
    p.every_chunks = 1, p.note = note_fn, p.ud = &nt;
    rk_doc_ckpt *ck = NULL;
    char why[256];
    rk_err e = {0};
    cr_assert_eq(rk_doc_ckpt_open(w.c, w.key, s, w.doc, N_DOC, &p, &ck, why, sizeof why, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(s, w.doc, N_DOC, out, false, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_session_eval(s, w.q, N_Q, out + w.nv, false, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_doc_ckpt_written(ck), 0);
    rk_doc_ckpt_close(ck, true);
    rk_session_destroy(s);
    (void)at, (void)resumed;
    cr_expect_eq(nt.n, 1, "notes: %s", nt.text);
    cr_expect(strstr(nt.text, "without checkpoints") && strstr(nt.text, "space"), "%s", nt.text);
    cr_expect_eq(memcmp(out, w.ref, 2 * (size_t)w.nv * sizeof(float)), 0);
    cr_expect(!exists(&w, "rkck"));
    teardown(&w);
}

/* LowRAM keeps its rows compressed: not checkpointed, and said why. */
Test(doc_ckpt, lowram_sessions_are_not_checkpointed) {
    world w;
    setup(&w, RK_KV_F16, false, NULL);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512, sp.n_batch = BATCH, sp.n_threads = 1;
    sp.kv.kind = RK_KV_LOWRAM;
    rk_err e = {0};
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(w.m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_doc_ckpt *ck = NULL;
    char why[256];
    cr_assert_eq(rk_doc_ckpt_open(w.c, w.key, s, w.doc, N_DOC, NULL, &ck, why, sizeof why, &e), RK_OK, "%s", e.msg);
    cr_expect_null(ck);
    cr_expect(strstr(why, "compressed"), "%s", why);
    rk_session_destroy(s);
    teardown(&w);
}

/* The checkpoints of a read that never completed: rm counts them as the entry they would be,
 * gc keeps them (the read may resume), a completed entry's gc removes them. */
Test(doc_ckpt, rm_removes_the_checkpoints_of_an_unfinished_read) {
    world w;
    setup(&w, RK_KV_F16, false, NULL);
    notes nt = {0};
    const int stops[] = {4};
    interrupted(&w, stops, 1, &nt);
    cr_assert(exists(&w, "rkck") && exists(&w, "rkck.old"));
    size_t n = 0;
    uint64_t left = 0;
    rk_err e = {0};
    cr_assert_eq(rk_doc_cache_gc(w.c, 0, &n, &left, &e), RK_OK, "%s", e.msg);
    cr_expect(exists(&w, "rkck"), "gc removed the checkpoint of a read that may resume");
    cr_assert_eq(rk_doc_cache_remove(w.c, "", &n, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(n, 1);
    cr_expect(!exists(&w, "rkck") && !exists(&w, "rkck.old"));
    teardown(&w);
}

/* rk_fill_params_default() (quality mode: ridge maps, question-aware selection, grouped
 * filled rows) with maps fitted on the tiny model: stopped in both passes, resumed, equal. */
Test(doc_ckpt, interrupted_quality_mode_reads_resume_bit_identical) {
    rk_model *m = load_tiny();
    int32_t ids[1800];
    uint64_t seed = 11;
    for (int i = 0; i < 1800; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % (uint64_t)rk_model_hparams(m)->n_vocab);
    rk_calib_params cp = {.split = 3, .stride = 2, .seg_len = 256, .lambda = -1, .dtype = RK_DT_F32, .n_threads = 1};
    void *bytes = NULL;
    size_t nb = 0;
    rk_calib_report rep;
    rk_err e = {0};
    cr_assert_eq(rk_calibrate(m, ids, 1800, &cp, NULL, NULL, &bytes, &nb, &rep, &e), RK_OK, "%s", e.msg);
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-ckpt", ".maps.gguf"), "%s", path);
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, nb, &e), RK_OK, "%s", e.msg);
    free(bytes);
    cr_assert_eq(rk_ridge_maps_load(path, m, &g_maps, NULL, 0, &e), RK_OK, "%s", e.msg);
    remove(path);
    rk_model_destroy(m);
    world w;
    setup(&w, RK_KV_F16, true, NULL); /* loads the same model again: the maps fit it */
    notes nt = {0};
    const int stops[] = {5, 8, 4};
    interrupted(&w, stops, 3, &nt);
    finish(&w, &nt, true);
    cr_expect_eq(nt.n, 0, "notes: %s", nt.text);
    teardown(&w);
    rk_ridge_maps_destroy(g_maps);
    g_maps = NULL;
}
