/* GPU KV tiers on devsim (devsim.h): --kv-budget on a device backend keeps whole layers in
 * device memory and the others in pinned host memory, moved on the copy lane a layer ahead,
 * and past the host budget on to the block store's spill file; the logits stay the plain
 * session's bit for bit. */
#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>
#include "rk.h"
#include "rk_ext.h"
#include "rk_gguf.h"
#include "rk_io.h"
#include "rk_kernels.h"
#include "tb.h"

#include "devsim.h"

/* The 4-layer generated model both tests use, and n random token ids for it. */
static rk_model *tier_model(int32_t *ids, int n, int *nv, int64_t *kvd) {
    rk_model *m = load_tiny((tb_tiny_spec){.n_layer = 4, .seed = 13});
    const rk_hparams *hp = rk_model_hparams(m);
    *nv = hp->n_vocab;
    *kvd = (int64_t)hp->n_head_kv * hp->head_dim;
    uint64_t r = 17;
    for (int i = 0; i < n; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(*nv - 3));
    return m;
}

/* --kv-budget on a device backend, f16 / f32: whole layers in device memory, the others in
 * pinned host blocks moved on the copy lane (prefetched one layer ahead). Budgets of 2 and
 * 3 layers of a 4-layer model (0 / 1 resident layers, 4 / 3 cold ones sharing two device
 * slots), the lane's copies run at once or only at the next join / sync (deferred: a missed
 * join reads a stale slot). Against the unbudgeted device session and the cpu session: the
 * same ATTN over the same rows, so the logits are bit for bit the same through a chunked
 * prefill, decode steps, a truncation and more decode; KV rows read back, the exported
 * block and an import agree too. The moves happen (bytes up and down, prefetched layers)
 * and the device holds exactly the resident layers and the two slots: the budgeted
 * session's backend memory is the plain one's less (n_layer - resident - 2) layers (the
 * budget leaves no room for chunk frames: kv_budget_chunks_on_device_match_plain has them). */
/* The budgeted session s holds what ref holds: both parts of a first and a last layer's
 * first n rows, and the block each exports; then s is reset and imports that block back. */
static void expect_same_kv_then_reimport(rk_session *ref, rk_session *s, int64_t n, int64_t kvd, float *ra, float *rb,
                                         const char *what) {
    rk_err err = {0};
    for (int l = 0; l < 4; l += 3)
        for (int part = 0; part < 2; part++) {
            cr_assert_eq(rk_session_kv_rows(ref, l, part, false, 0, n, ra, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_kv_rows(s, l, part, false, 0, n, rb, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(ra, rb, (size_t)n * (size_t)kvd * sizeof(float)) == 0, "%s: layer %d part %d rows differ",
                      what, l, part);
        }
    void *ba = NULL, *bb = NULL;
    size_t na = 0, nb = 0;
    cr_assert_eq(rk_session_kv_export(ref, 0, n, &ba, &na, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_session_kv_export(s, 0, n, &bb, &nb, &err), RK_OK, "%s", err.msg);
    cr_expect(na == nb && memcmp(ba, bb, na) == 0, "%s: exported blocks differ", what);
    rk_session_reset(s);
    cr_assert_eq(rk_session_kv_import(s, bb, nb, &err), RK_OK, "%s", err.msg);
    free(ba), free(bb);
}

Test(devsim, kv_budget_device_tiers_match_plain, .timeout = 120) {
    enum { N = 300, DEC = 8 };
    int32_t ids[N + DEC];
    int nv;
    int64_t kvd;
    rk_model *m = tier_model(ids, N + DEC, &nv, &kvd);
    rk_err err = {0};
    const int64_t n_ctx = 512;
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float)),
          *lc = malloc((size_t)nv * sizeof(float));
    float *ra = malloc((size_t)N * kvd * sizeof(float)), *rb = malloc((size_t)N * kvd * sizeof(float));
    const char *kvs[] = {"f16", "f32"};
    for (int c = 0; c < 8; c++) {
        const char *kv = kvs[c & 1];
        const int fit = 2 + ((c >> 1) & 1); /* layers the budget buys */
        const bool defer = (c >> 2) & 1;
        const uint64_t layer = 2ull * (uint64_t)n_ctx * (uint64_t)kvd * (c & 1 ? 4 : 2);
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *dp = devsim_create(), *dt = devsim_create();
        dt->lane_defer = defer;
        rk_session *ss[3] = {NULL, NULL, NULL};
        rk_backend *bes[3] = {cpu, &dp->be, &dt->be};
        for (int k = 0; k < 3; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = n_ctx;
            p.ctx_overflow_ok = true;
            p.n_batch = 64; /* 5 prefill chunks */
            p.n_threads = 1;
            p.shared_backend = bes[k];
            cr_assert_eq(rk_kv_params_parse(kv, &p.kv, &err), RK_OK, "%s", err.msg);
            if (k == 2) p.kv.budget = (uint64_t)fit * layer + 31; /* less than a chunk frame past the layers */
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s %s", kv, err.msg);
        }
        const int res = fit - 2;
        /* device bytes: the plain session's less the layers that are not there */
        cr_expect_eq(dp->live - dt->live, (size_t)(4 - res - 2) * layer, "kv %s fit %d: device bytes %zu vs plain %zu",
                     kv, fit, dt->live, dp->live);
        cr_expect_eq(dt->n_host, 2 * (4 - res), "kv %s fit %d: %d pinned host blocks", kv, fit, dt->n_host);
        float *ls[3] = {la, lb, lc};
        for (int k = 0; k < 3; k++)
            cr_assert_eq(rk_session_eval(ss[k], ids, N, ls[k], false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0 && memcmp(la, lc, (size_t)nv * sizeof(float)) == 0,
                  "kv %s fit %d defer %d: prefill logits differ", kv, fit, defer);
        for (int round = 0; round < 2; round++) {
            for (int t = N; t < N + DEC; t++) {
                for (int k = 0; k < 3; k++)
                    cr_assert_eq(rk_session_eval(ss[k], ids + t, 1, ls[k], false, &err), RK_OK, "%s", err.msg);
                cr_expect(memcmp(la, lc, (size_t)nv * sizeof(float)) == 0 &&
                              memcmp(lb, lc, (size_t)nv * sizeof(float)) == 0,
                          "kv %s fit %d defer %d round %d: decode %d differs", kv, fit, defer, round, t);
            }
            for (int k = 0; k < 3; k++) cr_assert_eq(rk_session_truncate(ss[k], N + 2, &err), RK_OK, "%s", err.msg);
        }
        rk_kv_tier_stats t;
        rk_session_kv_tier_stats(ss[2], &t);
        /* every cold layer's rows went down once per append, and up for every pass but what
         * the slots held: well over a prompt's worth each way */
        const uint64_t cold_rows_bytes = (uint64_t)(4 - res) * 2ull * N * (uint64_t)kvd * (c & 1 ? 4 : 2);
        cr_expect(t.on && t.bytes_spilled >= cold_rows_bytes && t.bytes_read > cold_rows_bytes,
                  "kv %s fit %d: down %llu, up %llu (a prompt's cold rows: %llu)", kv, fit,
                  (unsigned long long)t.bytes_spilled, (unsigned long long)t.bytes_read,
                  (unsigned long long)cold_rows_bytes);
        cr_expect(t.bytes_read == dt->lane_up && t.bytes_spilled == dt->lane_down,
                  "kv %s: counters vs the lane's bytes", kv);
        /* hits: appends of resident layers (none when the budget buys only the two slots) */
        cr_expect(t.misses > 0 && t.prefetched > 0 && t.prefetched <= t.misses && (res ? t.hits > 0 : t.hits == 0),
                  "kv %s fit %d: hits %llu misses %llu prefetched %llu", kv, fit, (unsigned long long)t.hits,
                  (unsigned long long)t.misses, (unsigned long long)t.prefetched);
        cr_expect_eq(t.resident_bytes, (uint64_t)fit * layer, "kv %s fit %d: resident %llu", kv, fit,
                     (unsigned long long)t.resident_bytes);
        cr_expect(t.resident_bytes <= t.budget);
        cr_expect(dt->n_joins > 0, "no lane join");
        /* rows read back (a cold and a resident layer), the exported block, and imported into
         * the budgeted session after a reset: the next step as the cpu's */
        expect_same_kv_then_reimport(ss[0], ss[2], N, kvd, ra, rb, kv);
        cr_assert_eq(rk_session_truncate(ss[0], N, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[0], ids + N, 1, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[2], ids + N, 1, lc, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lc, (size_t)nv * sizeof(float)) == 0, "kv %s fit %d: logits after import differ", kv, fit);
        for (int k = 0; k < 3; k++) rk_session_destroy(ss[k]);
        cr_expect(dp->n_alloc == 0 && dt->n_alloc == 0 && dt->n_host == 0, "kv %s: blocks leaked", kv);
        rk_backend_destroy(&dp->be);
        rk_backend_destroy(&dt->be);
        rk_backend_destroy(cpu);
    }
    free(la), free(lb), free(lc), free(ra), free(rb);
    rk_model_destroy(m);
}

/* The disk step of the GPU KV tiers: a host budget of one or two pinned layers for four
 * cold layers, so the others go on to the spill file (the block store) and come back when
 * their slot is filled or their new rows go down. Same logits bit for bit as the plain
 * devsim session through a chunked prefill, decode, a truncation and more decode; rows read
 * back equal; pinned host blocks bounded by the host budget; disk writes and reads happen.
 * Faults: a spill directory that does not exist fails at create, naming it; a file size
 * limit (a full disk, for the store: EFBIG) fails an eval with the spill file named, no
 * abort, and the session is destroyed cleanly. */
Test(devsim, kv_budget_disk_step_matches_plain, .timeout = 120) {
    enum { N = 300, DEC = 8 };
    int32_t ids[N + DEC];
    int nv;
    int64_t kvd;
    rk_model *m = tier_model(ids, N + DEC, &nv, &kvd);
    rk_err err = {0};
    const int64_t n_ctx = 512;
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    float *ra = malloc((size_t)N * kvd * sizeof(float)), *rb = malloc((size_t)N * kvd * sizeof(float));
    char dir[] = "/tmp/rk-devtier-XXXXXX";
    cr_assert(mkdtemp(dir));
    const uint64_t layer = 2ull * (uint64_t)n_ctx * (uint64_t)kvd * 2; /* f16 */
    for (int c = 0; c < 3; c++) {
        const int n_pin = 1 + (c & 1);
        devsim *dp = devsim_create(), *dt = devsim_create();
        dt->lane_defer = c == 2;
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = n_ctx;
            p.ctx_overflow_ok = true;
            p.n_batch = 64;
            p.n_threads = 1;
            p.shared_backend = k ? &dt->be : &dp->be;
            cr_assert_eq(rk_kv_params_parse("f16", &p.kv, &err), RK_OK, "%s", err.msg);
            if (k) {
                p.kv.budget = 2 * layer; /* the two slots: every layer cold */
                p.kv.host_budget = (uint64_t)n_pin * layer + layer / 3;
                p.kv.spill_dir = dir;
                p.kv.spill_backend = c == 1 ? 2 : 0;
            }
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s", err.msg);
        }
        cr_expect_eq(dt->n_host, 2 * n_pin, "pin %d: %d pinned host blocks", n_pin, dt->n_host);
        cr_assert_eq(rk_session_eval(ss[0], ids, N, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[1], ids, N, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "pin %d: prefill logits differ", n_pin);
        for (int round = 0; round < 2; round++) {
            for (int t = N; t < N + DEC; t++) {
                cr_assert_eq(rk_session_eval(ss[0], ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
                cr_assert_eq(rk_session_eval(ss[1], ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
                cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "pin %d round %d: decode %d differs", n_pin,
                          round, t);
            }
            for (int k = 0; k < 2; k++) cr_assert_eq(rk_session_truncate(ss[k], N + 2, &err), RK_OK, "%s", err.msg);
        }
        rk_kv_tier_stats t;
        rk_session_kv_tier_stats(ss[1], &t);
        const uint64_t cold_rows_bytes = 2ull * N * (uint64_t)kvd * 2; /* one layer's prompt rows */
        cr_expect(t.host_bytes == (uint64_t)n_pin * layer && t.host_bytes <= (uint64_t)n_pin * layer + layer / 3,
                  "host bytes %llu", (unsigned long long)t.host_bytes);
        cr_expect(t.disk_writes > 0 && t.disk_reads > 0 && t.disk_bytes_written >= cold_rows_bytes &&
                      t.disk_bytes_read >= cold_rows_bytes,
                  "pin %d: disk writes %llu (%llu B), reads %llu (%llu B)", n_pin, (unsigned long long)t.disk_writes,
                  (unsigned long long)t.disk_bytes_written, (unsigned long long)t.disk_reads,
                  (unsigned long long)t.disk_bytes_read);
        cr_expect(t.resident_bytes == 2 * layer && dp->live - dt->live == 2 * layer, "device bytes %zu vs %zu",
                  dt->live, dp->live);
        for (int l = 0; l < 4; l++) {
            cr_assert_eq(rk_session_kv_rows(ss[0], l, true, false, 0, N, ra, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_kv_rows(ss[1], l, true, false, 0, N, rb, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(ra, rb, (size_t)N * kvd * sizeof(float)) == 0, "pin %d: layer %d values differ", n_pin, l);
        }
        for (int k = 0; k < 2; k++) rk_session_destroy(ss[k]);
        cr_expect(dp->n_alloc == 0 && dt->n_alloc == 0 && dt->n_host == 0, "blocks leaked");
        rk_backend_destroy(&dp->be);
        rk_backend_destroy(&dt->be);
    }
    /* faults: no such directory; a full file (RLIMIT_FSIZE, pread/pwrite threads) */
    for (int f = 0; f < 2; f++) {
        devsim *dt = devsim_create();
        rk_session_params p = rk_session_params_default();
        p.n_ctx = n_ctx;
        p.ctx_overflow_ok = true;
        p.n_batch = 64;
        p.n_threads = 1;
        p.shared_backend = &dt->be;
        cr_assert_eq(rk_kv_params_parse("f16", &p.kv, &err), RK_OK, "%s", err.msg);
        p.kv.budget = 2 * layer;
        p.kv.host_budget = layer;
        p.kv.spill_backend = 2;
        p.kv.spill_buffered = true;
        p.kv.spill_dir = f ? dir : "/nonexistent-rk-dir";
        rk_session *s = NULL;
        rk_status st = rk_session_create(m, &p, &s, &err);
        if (!f) {
            cr_expect(st != RK_OK && strstr(err.msg, "/nonexistent-rk-dir"), "create: %d %s", st, err.msg);
            rk_session_destroy(s);
        } else {
            cr_assert_eq(st, RK_OK, "%s", err.msg);
            signal(SIGXFSZ, SIG_IGN);
            struct rlimit rl = {4096, 4096};
            cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
            st = rk_session_eval(s, ids, N, la, false, &err);
            cr_expect(st != RK_OK && strstr(err.msg, "spill file"), "full: %d %s", st, err.msg);
            rk_session_destroy(s);
        }
        cr_expect(dt->n_alloc == 0 && dt->n_host == 0, "fault %d: blocks leaked", f);
        rk_backend_destroy(&dt->be);
    }
    rmdir(dir);
    free(la), free(lb), free(ra), free(rb);
    rk_model_destroy(m);
}

/* Residency by chunk: the budget past the resident layer and the two slots buys chunk frames
 * (64 rows of K and V here: n_ctx / 8) on the device for each cold layer, which hold its hot
 * chunks (the sinks' chunk 0 and the newest); a slot is assembled from them (device to device)
 * and from the pinned host block (the other chunks). A 4-layer model at n_ctx 512 with a
 * budget of 3 layers and 7 frames less a byte: 1 resident layer, 3 cold ones with 2 frames
 * each. Against the plain devsim session, bit for bit: a 100-row prefill in 48-row batches
 * (2 chunks: both hot, so nothing goes up from the host), decode across the chunk boundary
 * at 128 (from then on exactly chunk 1 goes up per slot fill), truncations into chunk 1 and
 * into the sinks' chunk, more decode, rows read back, the exported block and an import. The
 * device holds the resident layer, the two slots and the 6 frames, within the budget. Then
 * with the disk step: 4 cold layers, 1 frame each (the sinks), one pinned host layer. */
Test(devsim, kv_budget_chunks_on_device_match_plain, .timeout = 120) {
    enum { NMAX = 320 };
    int32_t ids[NMAX];
    int nv;
    int64_t kvd;
    rk_model *m = tier_model(ids, NMAX, &nv, &kvd);
    rk_err err = {0};
    const int64_t n_ctx = 512, C = n_ctx / 8;
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    float *ra = malloc((size_t)NMAX * kvd * sizeof(float)), *rb = malloc((size_t)NMAX * kvd * sizeof(float));
    char dir[] = "/tmp/rk-devchunk-XXXXXX";
    cr_assert(mkdtemp(dir));
    for (int c = 0; c < 5; c++) {
        const bool disk = c == 4, f32 = c & 1, defer = c & 2;
        const size_t row = (size_t)kvd * (f32 ? 4 : 2);
        const uint64_t layer = 2ull * (uint64_t)n_ctx * row, frame = 2ull * (uint64_t)C * row;
        const int res = disk ? 0 : 1, n_cold = 4 - res, h = disk ? 1 : 2;
        devsim *dp = devsim_create(), *dt = devsim_create();
        dt->lane_defer = defer;
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = n_ctx;
            p.ctx_overflow_ok = true;
            p.n_batch = 48;
            p.n_threads = 1;
            p.shared_backend = k ? &dt->be : &dp->be;
            cr_assert_eq(rk_kv_params_parse(f32 ? "f32" : "f16", &p.kv, &err), RK_OK, "%s", err.msg);
            if (k) {
                p.kv.budget = (uint64_t)(res + 2) * layer + (uint64_t)(n_cold * h + 1) * frame - 1;
                if (disk) p.kv.host_budget = layer, p.kv.spill_dir = dir;
            }
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s", err.msg);
        }
        rk_kv_tier_stats t0, t1;
        rk_session_kv_tier_stats(ss[1], &t0);
        cr_expect(t0.on && t0.dev_chunk_rows == C && t0.dev_chunk_bytes == (uint64_t)(n_cold * h) * frame,
                  "case %d: chunk rows %d, frame bytes %llu", c, t0.dev_chunk_rows,
                  (unsigned long long)t0.dev_chunk_bytes);
        /* device bytes: the plain session's less the layers that are not there, plus the frames */
        cr_expect_eq(dp->live + (size_t)(n_cold * h) * frame, dt->live + (size_t)(4 - res - 2) * layer,
                     "case %d: device bytes %zu vs plain %zu", c, dt->live, dp->live);
        cr_expect(
            t0.resident_bytes == (uint64_t)(res + 2) * layer + t0.dev_chunk_bytes && t0.resident_bytes <= t0.budget,
            "case %d: resident %llu of %llu", c, (unsigned long long)t0.resident_bytes, (unsigned long long)t0.budget);
        int64_t at = 0;
#define STEP(n_rows, what)                                                                                          \
    do {                                                                                                            \
        for (int k = 0; k < 2; k++)                                                                                 \
            cr_assert_eq(rk_session_eval(ss[k], ids + at, n_rows, k ? lb : la, false, &err), RK_OK, "%s", err.msg); \
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "case %d: %s at %lld: logits differ", c, what,   \
                  (long long)at);                                                                                   \
        at += n_rows;                                                                                               \
    } while (0)
#define CUT(n)                                                                                               \
    do {                                                                                                     \
        for (int k = 0; k < 2; k++) cr_assert_eq(rk_session_truncate(ss[k], n, &err), RK_OK, "%s", err.msg); \
        at = n;                                                                                              \
    } while (0)
        if (!disk) {
            STEP(100, "prefill");
            rk_session_kv_tier_stats(ss[1], &t1);
            /* two chunks held, both hot: every slot came from the frames, none from the host */
            cr_expect(t1.bytes_read == 0 && t1.bytes_dev > 0 && t1.dev_chunks == (uint64_t)(n_cold * 2),
                      "case %d: 2 hot chunks: up %llu, device %llu, %llu chunks", c, (unsigned long long)t1.bytes_read,
                      (unsigned long long)t1.bytes_dev, (unsigned long long)t1.dev_chunks);
            while (at < 140) STEP(1, "decode");
            rk_session_kv_tier_stats(ss[1], &t0);
            for (int i = 0; i < 10; i++) STEP(1, "decode");
            rk_session_kv_tier_stats(ss[1], &t1);
            /* 3 chunks: chunk 1 is cold now, and only its 64 rows go up, once per cold layer and step */
            const uint64_t want = 10ull * (uint64_t)n_cold * 2ull * (uint64_t)C * row;
            cr_expect(t1.bytes_read - t0.bytes_read == want, "case %d: up %llu over 10 steps (want %llu)", c,
                      (unsigned long long)(t1.bytes_read - t0.bytes_read), (unsigned long long)want);
            CUT(120); /* into chunk 1: the newest again, its frame empty */
            for (int i = 0; i < 12; i++) STEP(1, "decode after a cut to 120");
            CUT(60); /* into the sinks' chunk */
            STEP(30, "prefill after a cut to 60");
            for (int i = 0; i < 6; i++) STEP(1, "decode after a cut to 60");
        } else {
            STEP(300, "prefill");
            for (int i = 0; i < 8; i++) STEP(1, "decode");
            CUT(250);
            for (int i = 0; i < 8; i++) STEP(1, "decode after a cut");
        }
#undef STEP
#undef CUT
        rk_session_kv_tier_stats(ss[1], &t1);
        cr_expect(t1.bytes_read == dt->lane_up && t1.bytes_spilled == dt->lane_down && t1.bytes_dev == dt->lane_d2d,
                  "case %d: counters vs the lane's bytes", c);
        cr_expect(t1.dev_chunks > 0 && t1.dev_chunks <= (uint64_t)(n_cold * h), "case %d: %llu chunks on the device", c,
                  (unsigned long long)t1.dev_chunks);
        if (disk)
            cr_expect(t1.host_bytes == layer && t1.disk_reads > 0 && t1.disk_writes > 0, "disk: host %llu, reads %llu",
                      (unsigned long long)t1.host_bytes, (unsigned long long)t1.disk_reads);
        char what[32];
        snprintf(what, sizeof what, "case %d", c);
        expect_same_kv_then_reimport(ss[0], ss[1], at, kvd, ra, rb, what);
        for (int i = 0; i < 3; i++) {
            cr_assert_eq(rk_session_eval(ss[0], ids + at + i, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(ss[1], ids + at + i, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "case %d: step %d after import differs", c, i);
        }
        for (int k = 0; k < 2; k++) rk_session_destroy(ss[k]);
        cr_expect(dp->n_alloc == 0 && dt->n_alloc == 0 && dt->n_host == 0, "case %d: blocks leaked", c);
        rk_backend_destroy(&dp->be);
        rk_backend_destroy(&dt->be);
    }
    rmdir(dir);
    free(la), free(lb), free(ra), free(rb);
    rk_model_destroy(m);
}

/* ---- LowRAM on backend memory --------------------------------------------------------- */
