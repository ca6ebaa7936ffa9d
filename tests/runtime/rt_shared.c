#include <math.h>
#include "rt_shared.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "tb.h"

rk_model *rt_load_shared(const char *rel) {
    char p[1024];
    if (!tb_shared_path(p, sizeof p, rel)) cr_skip_test("%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    return m;
}

int32_t *rt_story_ids(const rk_model *m, size_t want) {
    char p[1024];
    if (!tb_shared_path(p, sizeof p, "golden/perplexity/tinystories_sample_clean.txt")) cr_skip_test("%s", p);
    size_t len, n;
    char *txt = tb_read_file(p, &len);
    cr_assert(txt);
    rk_err e = {0};
    int32_t *ids;
    cr_assert_eq(rk_model_tokenize(m, txt, len, true, false, &ids, &n, &e), RK_OK, "%s", e.msg);
    free(txt);
    cr_assert(n >= want, "only %zu tokens", n);
    return ids;
}

double rt_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

double rt_mean_kl(const float *ref, const float *lg, int rows, int nv) {
    double tot = 0;
    for (int r = 0; r < rows; r++) {
        const float *a = ref + (size_t)r * nv, *b = lg + (size_t)r * nv;
        double ma = -INFINITY, mb = -INFINITY, sa = 0, sb = 0, kl = 0;
        for (int v = 0; v < nv; v++) ma = fmax(ma, a[v]), mb = fmax(mb, b[v]);
        for (int v = 0; v < nv; v++) sa += exp(a[v] - ma), sb += exp(b[v] - mb);
        for (int v = 0; v < nv; v++) {
            double la = a[v] - ma - log(sa), lb = b[v] - mb - log(sb);
            kl += exp(la) * (la - lb);
        }
        tot += kl;
    }
    return tot / rows;
}

rk_model *rt_tiny_loaded(const tb_tiny_spec *spec) {
    char p[1024];
    cr_assert(tb_tiny_model(spec, p, sizeof p), "%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    remove(p);
    return m;
}

rk_model *rt_stories_like(uint64_t seed) {
    const tb_tiny_spec spec = tb_tiny_stories_spec(seed);
    return rt_tiny_loaded(&spec);
}

int32_t *rt_random_ids(const rk_model *m, size_t n, uint64_t seed) {
    int32_t *ids = malloc(n * sizeof *ids);
    cr_assert(ids);
    const uint64_t nv = (uint64_t)rk_model_hparams(m)->n_vocab;
    for (size_t i = 0; i < n; i++) ids[i] = (int32_t)(tb_rand_u64(&seed) % nv);
    return ids;
}

rk_session *rt_lowram_session(const rk_model *m, const char *spec, int n_batch) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.n_threads = 2;
    if (n_batch > 0) sp.n_batch = n_batch;
    sp.kv.kind = RK_KV_LOWRAM;
    rk_err e = {0};
    cr_assert_eq(rk_lowram_parse(spec, &sp.kv.lowram, &e), RK_OK, "%s", e.msg);
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    return s;
}

float *rt_decode_trace(rk_session *s, const int32_t *ids, int n_p, int n_dec, int nv) {
    float *lg = malloc((size_t)n_dec * nv * sizeof(float));
    cr_assert(lg);
    rk_err e = {0};
    cr_assert_eq(rk_session_eval(s, ids, (size_t)n_p, NULL, false, &e), RK_OK, "%s", e.msg);
    for (int i = 0; i < n_dec; i++)
        cr_assert_eq(rk_session_eval(s, &ids[n_p + i], 1, lg + (size_t)i * nv, false, &e), RK_OK, "%s", e.msg);
    return lg;
}
