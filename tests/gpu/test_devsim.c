/* The session's device path (activations and KV in backend memory, only the
 * logits row downloaded) on a machine without a GPU: "devsim" is a backend
 * with memory of its own whose addresses the host cannot dereference (tagged
 * non-canonical pointers: any host read or write of them faults), running the
 * cpu backend's kernels behind the tags. A session on it must give the cpu
 * backend's logits bit for bit, read and export KV rows through downloads
 * (import through uploads), run RidgeFill's plan (row gathers and scatters, the
 * ridge-map GEMMs, the layer-major split stream, the question-aware selection) on
 * backend memory with the cpu session's logits bit for bit, and refuse what still
 * needs host rows (the eval splice) with a reason. --kv lowram runs its decode attention
 * as the fused LR_ATTN over a device copy of the codec's state (runtime/kv/lowram_dev.c)
 * and gives the cpu lowram session's logits within a stated tolerance. */
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
#include "tb_counters.h"

#include "devsim.h"

Test(devsim, session_matches_cpu_bit_for_bit) {
    char path[1024];
    model_path(path, sizeof path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    const int nv = rk_model_hparams(m)->n_vocab;
    const char *kvs[] = {"f32", "f16"};
    for (int k = 0; k < 2; k++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_status st;
        rk_session *a = session_on(m, cpu, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_session *b = session_on(m, &ds->be, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        cr_assert_gt(ds->n_alloc, 10, "activations and KV in backend memory");
        int32_t ids[40];
        uint64_t r = 9;
        for (int i = 0; i < 40; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
        float *la = malloc((size_t)40 * nv * sizeof(float)), *lb = malloc((size_t)40 * nv * sizeof(float));
        /* prefill 30 tokens (2 chunks), all rows; then 10 decode steps, last row each */
        cr_assert_eq(rk_session_eval(a, ids, 30, la, true, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(b, ids, 30, lb, true, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)30 * nv * sizeof(float)) == 0, "kv %s: prefill logits differ", kvs[k]);
        for (int t = 30; t < 40; t++) {
            size_t before = ds->n_down;
            cr_assert_eq(rk_session_eval(a, ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(b, ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: decode %d logits differ", kvs[k], t);
            /* the only transfer back of a decode step: one logits row */
            cr_expect_eq(ds->n_down - before, (size_t)nv * sizeof(float), "kv %s step %d: %zu bytes came back", kvs[k],
                         t, ds->n_down - before);
        }
        /* KV rows as attention sees them, through downloads */
        const int64_t kvd = (int64_t)rk_model_hparams(m)->n_head_kv * rk_model_hparams(m)->head_dim;
        float *ra = malloc((size_t)40 * kvd * sizeof(float)), *rb = malloc((size_t)40 * kvd * sizeof(float));
        cr_assert_eq(rk_session_kv_rows(a, 1, true, false, 0, 40, ra, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_rows(b, 1, true, false, 0, 40, rb, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(ra, rb, (size_t)40 * kvd * sizeof(float)) == 0, "kv %s: KV rows differ", kvs[k]);
        /* truncate + re-eval stays equal */
        cr_assert_eq(rk_session_truncate(a, 20, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_truncate(b, 20, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(a, ids + 25, 5, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(b, ids + 25, 5, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: after truncate", kvs[k]);
        /* export through downloads: the cpu session's block, byte for byte; imported into a
         * fresh device session, the next step's logits are the original's */
        void *ba = NULL, *bb = NULL;
        size_t na = 0, nb = 0;
        cr_assert_eq(rk_session_kv_export(a, 0, 25, &ba, &na, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_export(b, 0, 25, &bb, &nb, &err), RK_OK, "%s", err.msg);
        cr_expect(na == nb && memcmp(ba, bb, na) == 0, "kv %s: exported blocks differ (%zu vs %zu bytes)", kvs[k], na,
                  nb);
        rk_session *c = session_on(m, &ds->be, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_kv_import(c, bb, nb, &err), RK_OK, "%s", err.msg);
        cr_expect_eq(rk_session_n_past(c), 25);
        float *lc = malloc((size_t)nv * sizeof(float));
        cr_assert_eq(rk_session_truncate(a, 25, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(a, ids + 25, 1, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(c, ids + 25, 1, lc, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lc, (size_t)nv * sizeof(float)) == 0, "kv %s: logits after import differ", kvs[k]);
        /* a block cut short is refused, nothing changed */
        cr_expect_neq(rk_session_kv_import(c, bb, nb - 7, &err), RK_OK);
        cr_expect_eq(rk_session_n_past(c), 26);
        free(lc), free(ba), free(bb);
        rk_session_destroy(c);
        free(ra), free(rb), free(la), free(lb);
        rk_session_destroy(a);
        rk_session_destroy(b);
        cr_expect_eq(ds->n_alloc, 0, "kv %s: %d blocks leaked", kvs[k], ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    rk_model_destroy(m);
}

Test(devsim, host_only_features_are_refused) {
    char path[1024];
    model_path(path, sizeof path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    devsim *ds = devsim_create();
    rk_status st;
    rk_session *s = session_on(m, &ds->be, "f16", &err, &st);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    rk_session *x = session_on(m, &ds->be, "f16", &err, &st);
    cr_assert_eq(st, RK_OK, "%s", err.msg);
    cr_expect_eq(rk_session_set_splice(s, x, 0, 1, true, true, &err), RK_E_UNSUPPORTED);
    cr_expect(strstr(err.msg, "splice") && strstr(err.msg, "devsim"), "%s", err.msg);
    rk_session_destroy(x);
    rk_session_destroy(s);
    rk_backend_destroy(&ds->be);
    rk_model_destroy(m);
}

/* ---- RidgeFill on backend memory ------------------------------------------------ */

/* A map file for m with random maps near the identity (W = I + N(0, 0.02^2), small
 * biases; K/V maps: N(0, 0.1^2) entries), weights of type wt, written to path. */
static void write_maps(const rk_model *m, int split, uint32_t wt, bool normalized, bool kv, char *path, size_t cap) {
    const rk_hparams *hp = rk_model_hparams(m);
    const int d = hp->n_embd, L = hp->n_layer, dout = kv ? 2 * hp->n_head_kv * hp->head_dim : d;
    rk_err e = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(32, &w, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.type", "ridgekv.ridge_maps", &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "ridge.split", (uint32_t)split, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_fingerprint_write(w, "ridge.model", m, &e), RK_OK, "%s", e.msg);
    if (normalized) cr_assert_eq(rk_gguf_writer_set_str(w, "ridge.space", "normalized", &e), RK_OK, "%s", e.msg);
    if (kv) cr_assert_eq(rk_gguf_writer_set_str(w, "ridge.target", "kv", &e), RK_OK, "%s", e.msg);
    float *wf = malloc((size_t)d * dout * sizeof(float)), *b = malloc((size_t)dout * sizeof(float));
    uint16_t *wh = malloc((size_t)d * dout * sizeof(uint16_t));
    cr_assert(wf && b && wh);
    uint64_t r = 77;
    for (int l = split + 1; l < L; l++) {
        for (int o = 0; o < dout; o++) {
            b[o] = 0.01f * (float)tb_rand_normal(&r);
            for (int i = 0; i < d; i++) {
                float v = (kv ? 0.1f : 0.02f) * (float)tb_rand_normal(&r) + (!kv && i == o ? 1.0f : 0.0f);
                wf[(size_t)o * d + i] = v;
                wh[(size_t)o * d + i] = rk_f32_to_f16(v);
            }
        }
        char nm[64];
        int64_t ne[2] = {d, dout};
        snprintf(nm, sizeof nm, "ridge.%d.weight", l);
        const bool f16 = wt == RK_DT_F16;
        cr_assert_eq(rk_gguf_writer_add_tensor(w, nm, wt, 2, ne, f16 ? (void *)wh : (void *)wf,
                                               (uint64_t)d * dout * (f16 ? 2 : 4), &e),
                     RK_OK, "%s", e.msg);
        snprintf(nm, sizeof nm, "ridge.%d.bias", l);
        int64_t nb[1] = {dout};
        cr_assert_eq(rk_gguf_writer_add_tensor(w, nm, RK_DT_F32, 1, nb, b, (uint64_t)dout * 4, &e), RK_OK, "%s", e.msg);
    }
    void *bytes;
    size_t n;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &n, &e), RK_OK, "%s", e.msg);
    rk_gguf_writer_destroy(w);
    cr_assert(tb_tmp_path(path, cap, "rk_devsim", ".maps.gguf"), "%s", path);
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, n, &e), RK_OK, "%s", e.msg);
    free(bytes), free(wf), free(wh), free(b);
}

/* Every fill mode and map kind: a devsim session gives the cpu session's logits bit for
 * bit (all rows of a 70-token prompt in 16-row chunks: bulk chunks, a chunk crossing
 * into the tail, filled rows NaN), the same work counters and selection, then the same
 * decode steps over the filled cache; nothing read on the host (devsim faults). */
Test(devsim, fill_session_matches_cpu_bit_for_bit, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.arch = TB_ARCH_QWEN2, .n_layer = 5, .seed = 21}); /* QKV bias, NEOX */
    rk_err err = {0};
    const int nv = rk_model_hparams(m)->n_vocab, L = rk_model_hparams(m)->n_layer, split = 2;
    enum { N = 70, DEC = 4, TAIL = 20 };
    struct {
        const char *name;
        rk_fill_mode mode;
        int maps; /* 0 none, 1 f32 input maps, 2 f16 normalised input maps, 3 K/V maps */
        bool question_aware, layer_major;
    } cases[] = {
        {"identity", RK_FILL_IDENTITY, 0, false, false},
        {"plumb", RK_FILL_PLUMB, 0, false, false},
        {"speed f32 maps", RK_FILL_SPEED, 1, false, false},
        {"speed f16 normalised maps, layer-major", RK_FILL_SPEED, 2, false, true},
        {"speed K/V maps", RK_FILL_SPEED, 3, false, false},
        {"quality (question-aware, layer-major) f32 maps", RK_FILL_QUALITY, 1, true, true},
        {"quality K/V maps", RK_FILL_QUALITY, 3, true, true},
    };
    char mp[3][512];
    rk_ridge_maps *maps[3] = {NULL};
    for (int k = 0; k < 3; k++) {
        write_maps(m, split, k == 1 ? RK_DT_F16 : RK_DT_F32, k == 1, k == 2, mp[k], sizeof mp[k]);
        cr_assert_eq(rk_ridge_maps_load(mp[k], m, &maps[k], NULL, 0, &err), RK_OK, "%s", err.msg);
    }
    int32_t ids[N + DEC];
    uint64_t r = 3;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    float *la = malloc((size_t)N * nv * sizeof(float)), *lb = malloc((size_t)N * nv * sizeof(float));
    cr_assert(la && lb);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_status st;
        rk_session *a = session_on(m, cpu, "f16", &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_session *b = session_on(m, &ds->be, "f16", &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_fill_params f = {.mode = cases[c].mode,
                            .tail = TAIL,
                            .split = split,
                            .obs = 8,
                            .baseline = 4,
                            .keep_share = 0.25f,
                            .layer_major = cases[c].layer_major,
                            .question_aware = cases[c].question_aware};
        if (cases[c].maps) f.maps = maps[cases[c].maps - 1];
        cr_assert_eq(rk_session_set_fill(a, &f, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_assert_eq(rk_session_set_fill(b, &f, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_assert_eq(rk_session_eval(a, ids, N, la, true, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_assert_eq(rk_session_eval(b, ids, N, lb, true, &err), RK_OK, "%s: %s", cases[c].name, err.msg);
        cr_expect(memcmp(la, lb, (size_t)N * nv * sizeof(float)) == 0, "%s: prefill logits differ", cases[c].name);
        /* the fill did happen: bulk rows filled at every late layer, the tail exact */
        const tb_counters cnt_a = tb_counters_get(a, L), cnt_b = tb_counters_get(b, L), *cb = &cnt_b;
        cr_expect(tb_counters_eq(&cnt_a, &cnt_b), "%s: work counters differ", cases[c].name);
        if (cases[c].mode != RK_FILL_PLUMB) {
            cr_expect_gt(cb->filled_rows[L - 1], 0, "%s: no row was filled", cases[c].name);
            int n_nan = 0; /* filled rows have no logits (quality keeps the sinks and its selection) */
            for (int i = 0; i < N - TAIL; i++) n_nan += isnan(lb[(size_t)i * nv]);
            cr_expect_gt(n_nan, 0, "%s: every bulk row has logits", cases[c].name);
        }
        cr_expect(!isnan(lb[(size_t)(N - 1) * nv]), "%s: the last row has no logits", cases[c].name);
        if (cases[c].question_aware) {
            cr_expect_eq(rk_session_fill_kept(a, 0, N), rk_session_fill_kept(b, 0, N), "%s: selections differ",
                         cases[c].name);
            cr_expect_gt(rk_session_fill_kept(b, 0, N), 0, "%s: nothing kept", cases[c].name);
        }
        /* decode over the filled cache */
        for (int t = N; t < N + DEC; t++) {
            cr_assert_eq(rk_session_eval(a, ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(b, ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "%s: decode %d differs", cases[c].name, t);
        }
        rk_session_destroy(a);
        rk_session_destroy(b);
        cr_expect_eq(ds->n_alloc, 0, "%s: %d blocks leaked", cases[c].name, ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    for (int k = 0; k < 3; k++) rk_ridge_maps_destroy(maps[k]), unlink(mp[k]);
    free(la), free(lb);
    rk_model_destroy(m);
}

/* ---- host-memory KV policies behind a device session ----------------------------- */

/* q8 blocks and the memory tiers (--kv-budget: every cold chunk spilled to the block store
 * and read back for attention) keep their rows on the host: the layer loop downloads K, V
 * and q and uploads the attention output. Same logits as the cpu session, bit for bit,
 * over a prompt long enough to spill, then decode steps. */
Test(devsim, host_kv_policies_match_cpu_bit_for_bit, .timeout = 120) {
    rk_model *m = load_tiny((tb_tiny_spec){.n_layer = 2, .seed = 9});
    rk_err err = {0};
    const int nv = rk_model_hparams(m)->n_vocab;
    enum { N = 1300, DEC = 3 };
    int32_t *ids = malloc((N + DEC) * sizeof(int32_t));
    uint64_t r = 5;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    char dir[512];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk_devsim_spill"), "%s", dir);
    const struct {
        const char *kv;
        uint64_t budget;
    } cases[] = {{"q8", 0}, {"f16", 1}, {"q8", 1}};
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = 1536;
            p.ctx_overflow_ok = true;
            p.n_batch = 256;
            p.n_threads = 1;
            p.shared_backend = k ? &ds->be : cpu;
            cr_assert_eq(rk_kv_params_parse(cases[c].kv, &p.kv, &err), RK_OK, "%s", err.msg);
            p.kv.budget = cases[c].budget;
            p.kv.spill_dir = dir;
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s %s", cases[c].kv, err.msg);
        }
        cr_assert_eq(rk_session_eval(ss[0], ids, N, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(ss[1], ids, N, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s budget %llu: prefill logits differ",
                  cases[c].kv, (unsigned long long)cases[c].budget);
        for (int t = N; t < N + DEC; t++) {
            cr_assert_eq(rk_session_eval(ss[0], ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(ss[1], ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s budget %llu: decode %d differs",
                      cases[c].kv, (unsigned long long)cases[c].budget, t);
        }
        if (cases[c].budget) { /* the rows did go to the store and came back */
            rk_kv_tier_stats t;
            rk_session_kv_tier_stats(ss[1], &t);
            cr_expect(t.on && t.bytes_spilled > 0 && t.bytes_read > 0, "kv %s: spilled %llu, read %llu", cases[c].kv,
                      (unsigned long long)t.bytes_spilled, (unsigned long long)t.bytes_read);
        }
        rk_session_destroy(ss[0]);
        rk_session_destroy(ss[1]);
        cr_expect_eq(ds->n_alloc, 0, "kv %s: %d blocks leaked", cases[c].kv, ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    rmdir(dir);
    free(la), free(lb), free(ids);
    rk_model_destroy(m);
}

/* ---- GPU KV tiers (runtime/kv/kv_dev.c) ------------------------------------------- */

/* A backend without the entries (cpu) serves the same calls: zeroed 64-byte aligned heap
 * blocks, lane copies as synchronous upload / download, join and sync no-ops. */
Test(devsim, lane_calls_fall_back_on_host_backends) {
    rk_backend *cpu = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
    float *h = NULL, *d = NULL;
    cr_assert_eq(rk_backend_host_alloc(cpu, 1000 * sizeof(float), (void **)&h, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_alloc(cpu, 1000 * sizeof(float), (void **)&d, &err), RK_OK, "%s", err.msg);
    cr_expect(((uintptr_t)h & 63) == 0 && h[0] == 0 && h[999] == 0);
    for (int i = 0; i < 1000; i++) h[i] = (float)i;
    cr_assert_eq(rk_backend_lane_copy(cpu, d, h, 1000 * sizeof(float), true, &err), RK_OK, "%s", err.msg);
    cr_expect(d[999] == 999.0f, "the copy up ran at once");
    d[5] = -1;
    cr_assert_eq(rk_backend_lane_copy(cpu, h, d, 1000 * sizeof(float), false, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_lane_join(cpu, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_backend_lane_sync(cpu, &err), RK_OK, "%s", err.msg);
    cr_expect(h[5] == -1.0f && h[6] == 6.0f, "the copy down ran at once");
    cr_expect_eq(rk_backend_lane_copy(cpu, NULL, h, 4, true, &err), RK_E_INVALID_ARG);
    cr_expect(strstr(err.msg, "NULL pointer"), "%s", err.msg);
    rk_backend_free(cpu, d);
    rk_backend_host_free(cpu, h);
    rk_backend_host_free(cpu, NULL);
    rk_backend_destroy(cpu);
}

/* --kv lowram on devsim: prefill through the host codec (staged rows), the fit at commit on
 * the host, then every decode step's attention is the fused LR_ATTN (cpu_ref's kernel behind
 * the tags) over the device copy of the codec's state: chosen chunks' keys rebuilt, summaries,
 * sinks and the window ring (rows appended by CPY_ROWS on the device). Against the cpu
 * lowram session (the codec's own sparse path): the same selection rule and formulas, f32
 * sums in other orders and rebuilt keys summed in double vs f32 before their f16 rounding,
 * so the logits agree to a few f32 roundings per layer, amplified by the layers: the bound is
 * 1e-3 of the logit range (measured: ~1e-6), and the greedy token of every step is the same.
 * A truncation (the device copy dropped and uploaded again) and a second decode run agree
 * too. */
Test(devsim, lowram_session_matches_cpu, .timeout = 120) {
    rk_model *m = load_tiny(
        (tb_tiny_spec){.arch = TB_ARCH_QWEN2, .n_layer = 4, .n_embd = 64, .n_head = 4, .n_head_kv = 2, .seed = 21});
    rk_err err = {0};
    const int nv = rk_model_hparams(m)->n_vocab, n_layer = rk_model_hparams(m)->n_layer;
    enum { N = 300, DEC = 40 };
    int32_t ids[N + DEC];
    uint64_t r = 17;
    for (int i = 0; i < N + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    /* The fused op rounds its rebuilt keys as the codec's key cache holds them: f16 rows
     * (kcache=f16) or int8 rows with an f16 scale per row and head (kcache=int8, the
     * default: key_int8). An option the op lacks (bound) takes the host codec on a device:
     * the last spec checks that fallback against the CPU. */
    /* The fused op reads int8 residuals (rtype=int8); unset, a session on a device takes
     * int8 (the CPU int4): the last spec leaves it unset on devsim and names int8 on the CPU,
     * so it matches and fuses only if the device session resolved it to int8. */
    const char *specs[] = {"lowram:window=32,budget=64,kcache=f16,summ,rtype=int8",
                           "lowram:window=48,budget=96,nosumm,evict=0.3,kcache=f16,rtype=int8",
                           "lowram:window=32,budget=64,summ,rtype=int8",
                           "lowram:window=48,budget=96,nosumm,evict=0.3,rtype=int8",
                           "lowram:window=32,budget=64,bound,rtype=int8",
                           "lowram:window=32,budget=64",
                           "lowram:window=32,budget=64,rtype=int8,vpin=4,full=0",
                           "lowram:window=32,budget=64,rtype=int8,vpin=0,full=1"};
    /* pinned chunks and full layers unset are none on a device (its fused op selects by
     * landmarks alone, one chunk count for every layer), 4 and 2 on the CPU: the CPU twins
     * name vpin=0,full=0; an explicit vpin takes the host path on the device */
    const char *cpu_specs[] = {"lowram:window=32,budget=64,kcache=f16,summ,rtype=int8,vpin=0,full=0",
                               "lowram:window=48,budget=96,nosumm,evict=0.3,kcache=f16,rtype=int8,vpin=0,full=0",
                               "lowram:window=32,budget=64,summ,rtype=int8,vpin=0,full=0",
                               "lowram:window=48,budget=96,nosumm,evict=0.3,rtype=int8,vpin=0,full=0",
                               "lowram:window=32,budget=64,bound,rtype=int8,vpin=0,full=0",
                               "lowram:window=32,budget=64,rtype=int8,vpin=0,full=0",
                               specs[6],
                               specs[7]};
    const bool fused[] = {true, true, true, true, false, true, false, false}; /* full layers: the host path */
    for (size_t c = 0; c < sizeof specs / sizeof specs[0]; c++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        rk_session *ss[2] = {NULL, NULL};
        for (int k = 0; k < 2; k++) {
            rk_session_params p = rk_session_params_default();
            p.n_ctx = 512;
            p.ctx_overflow_ok = true;
            p.n_batch = 64;
            p.n_threads = 1;
            p.shared_backend = k ? &ds->be : cpu;
            cr_assert_eq(rk_kv_params_parse(k ? specs[c] : cpu_specs[c], &p.kv, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_create(m, &p, &ss[k], &err), RK_OK, "%s: %s", specs[c], err.msg);
        }
        float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
        double worst = 0;
        for (int pass = 0; pass < 2; pass++) {
            const int t0 = pass ? N + DEC / 2 : N; /* pass 1: after a truncation back to t0 */
            if (pass) {
                cr_assert_eq(rk_session_truncate(ss[0], t0, &err), RK_OK, "%s", err.msg);
                cr_assert_eq(rk_session_truncate(ss[1], t0, &err), RK_OK, "%s", err.msg);
            } else {
                cr_assert_eq(rk_session_eval(ss[0], ids, N, la, false, &err), RK_OK, "%s", err.msg);
                cr_assert_eq(rk_session_eval(ss[1], ids, N, lb, false, &err), RK_OK, "%s", err.msg);
                cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "%s: prefill logits differ", specs[c]);
            }
            for (int t = t0; t < N + DEC; t++) {
                cr_assert_eq(rk_session_eval(ss[0], ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
                const size_t down0 = ds->n_down;
                cr_assert_eq(rk_session_eval(ss[1], ids + t, 1, lb, false, &err), RK_OK, "%s step %d: %s", specs[c], t,
                             err.msg);
                /* a fused step downloads the logits row and, once, every layer's pending K / V rows (4 slots
                 * each of K and V, f32): nothing per layer (the first step after a sync may also upload) */
                const size_t kvd = (size_t)rk_model_hparams(m)->n_head_kv * rk_model_hparams(m)->head_dim;
                if (fused[c])
                    cr_expect_eq(ds->n_down - down0, (size_t)nv * 4 + (size_t)n_layer * 8 * kvd * 4,
                                 "%s step %d: %zu bytes down", specs[c], t, ds->n_down - down0);
                float lo = la[0], hi = la[0];
                int aa = 0, ab = 0;
                double d = 0;
                for (int i = 0; i < nv; i++) {
                    lo = la[i] < lo ? la[i] : lo, hi = la[i] > hi ? la[i] : hi;
                    d = fmax(d, fabs((double)la[i] - lb[i]));
                    if (la[i] > la[aa]) aa = i;
                    if (lb[i] > lb[ab]) ab = i;
                }
                const double rel = d / (hi - lo);
                worst = rel > worst ? rel : worst;
                cr_expect(rel <= 1e-3, "%s step %d: logits differ by %.3g of their range", specs[c], t, rel);
                cr_expect_eq(aa, ab, "%s step %d: greedy token %d vs %d", specs[c], t, aa, ab);
            }
        }
        const rk_session_counters *k = rk_session_get_counters(ss[1]);
        /* every decode step of every layer ran the fused op (or, with an option it lacks, none
         * did): 40 + 20 steps */
        const uint64_t steps = (uint64_t)(DEC + DEC / 2) * (uint64_t)n_layer;
        cr_expect(fused[c] ? k->lowram_dev_attn == steps : k->lowram_host_attn >= steps, "%s: %llu fused, %llu host",
                  specs[c], (unsigned long long)k->lowram_dev_attn, (unsigned long long)k->lowram_host_attn);
        if (!fused[c])
            cr_expect_eq(k->lowram_dev_attn, 0, "%s: %llu fused", specs[c], (unsigned long long)k->lowram_dev_attn);
        rk_lowram_stats st;
        rk_session_lowram_stats(ss[1], &st);
        cr_expect(st.fitted && st.rank_min > 0, "%s: the codec fitted", specs[c]);
        fprintf(stderr, "devsim lowram %s: worst logit difference %.3g of the range\n", specs[c], worst);
        rk_session_destroy(ss[0]);
        rk_session_destroy(ss[1]);
        cr_expect_eq(ds->n_alloc, 0, "%s: %d blocks leaked", specs[c], ds->n_alloc);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
        free(la), free(lb);
    }
    rk_model_destroy(m);
}

/* ---- recorded decode steps (rk_session_params.cuda_graphs) ---------------------------- */

/* With cuda_graphs each decode step is recorded and run as one unit by the
 * backend (devsim keeps the ops and runs them at step_end, as a CUDA graph launch would):
 * the logits stay the cpu session's bit for bit, prefill chunks are never recorded, and a
 * recording that breaks (every 4th here) runs again unrecorded with the same result. A
 * host-memory KV policy (q8) is never recorded (its appends download). */
Test(devsim, recorded_decode_steps_match_cpu_bit_for_bit) {
    char path[1024];
    model_path(path, sizeof path);
    rk_model *m = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_model_load(path, &m, &err), RK_OK, "%s", err.msg);
    const int nv = rk_model_hparams(m)->n_vocab;
    enum { P = 30, DEC = 12 };
    int32_t ids[P + DEC];
    uint64_t r = 11;
    for (int i = 0; i < P + DEC; i++) ids[i] = 3 + (int32_t)(tb_rand_u64(&r) % (uint64_t)(nv - 3));
    float *la = malloc((size_t)nv * sizeof(float)), *lb = malloc((size_t)nv * sizeof(float));
    const char *kvs[] = {"f16", "f32", "q8"};
    for (int k = 0; k < 3; k++) {
        rk_backend *cpu = NULL;
        cr_assert_eq(rk_backend_cpu_create(1, &cpu, &err), RK_OK, "%s", err.msg);
        devsim *ds = devsim_create();
        ds->fail_every = 4;
        rk_status st;
        rk_session *a = session_on(m, cpu, kvs[k], &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        rk_session *b = session_on_graphs(m, &ds->be, kvs[k], true, &err, &st);
        cr_assert_eq(st, RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(a, ids, P, la, false, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_session_eval(b, ids, P, lb, false, &err), RK_OK, "%s", err.msg);
        cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: prefill differs", kvs[k]);
        cr_expect_eq(ds->n_steps, 0, "kv %s: a prefill chunk was recorded", kvs[k]);
        for (int t = P; t < P + DEC; t++) {
            cr_assert_eq(rk_session_eval(a, ids + t, 1, la, false, &err), RK_OK, "%s", err.msg);
            cr_assert_eq(rk_session_eval(b, ids + t, 1, lb, false, &err), RK_OK, "%s", err.msg);
            cr_expect(memcmp(la, lb, (size_t)nv * sizeof(float)) == 0, "kv %s: decode %d differs", kvs[k], t);
        }
        const rk_session_counters *c = rk_session_get_counters(b);
        if (k < 2) {
            cr_expect_eq(ds->n_steps, DEC, "kv %s: %d steps recorded", kvs[k], ds->n_steps);
            cr_expect_eq(c->graph_fallbacks, DEC / 4, "kv %s: %llu fallbacks", kvs[k],
                         (unsigned long long)c->graph_fallbacks);
            cr_expect_eq(c->graph_steps, DEC - DEC / 4, "kv %s: %llu recorded steps", kvs[k],
                         (unsigned long long)c->graph_steps);
            cr_expect_eq((int)c->graph_steps, ds->n_ran);
            const int nl = rk_model_hparams(m)->n_layer;
            const tb_counters cnt_a = tb_counters_get(a, nl), cnt_b = tb_counters_get(b, nl);
            cr_expect(memcmp(cnt_a.exact_rows, cnt_b.exact_rows, sizeof cnt_a.exact_rows) == 0,
                      "kv %s: a rerun step counted twice", kvs[k]);
        } else {
            cr_expect_eq(ds->n_steps, 0, "kv q8: recorded");
            cr_expect_eq(c->graph_steps, 0);
        }
        rk_session_destroy(a);
        rk_session_destroy(b);
        rk_backend_destroy(&ds->be);
        rk_backend_destroy(cpu);
    }
    free(la), free(lb);
    rk_model_destroy(m);
}
