/* Non-finite values in files are refused at load, naming the file and the tensor: model
 * vectors (norms), RidgeFill maps, LowRAM predictor files. Each file is made valid by the
 * library's own writer, then one value is overwritten with NaN or Inf. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_fitters.h"
#include "rk_gguf.h"
#include "rk_io.h"
#include "rt_shared.h"

/* Writes bytes to a fresh path after putting bits (2 or 4 bytes) at element `at` of tensor
 * name, which must be f16 (2) or f32 (4). */
static void poison_to(void *bytes, size_t n, const char *name, int64_t at, uint32_t bits, const char *stem, char *path,
                      size_t cap) {
    rk_gguf *g = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_gguf_parse(bytes, n, &g, &e), RK_OK, "%s", e.msg);
    const rk_gguf_tensor *t = rk_gguf_find_tensor(g, name);
    cr_assert(t, "no tensor %s", name);
    cr_assert(t->type == RK_DT_F32 || t->type == RK_DT_F16, "%s: type %u", name, t->type);
    size_t off = (size_t)((const char *)t->data - (const char *)bytes);
    if (t->type == RK_DT_F32) {
        memcpy((char *)bytes + off + 4 * (size_t)at, &bits, 4);
    } else {
        uint16_t h = (uint16_t)bits;
        memcpy((char *)bytes + off + 2 * (size_t)at, &h, 2);
    }
    rk_gguf_destroy(g);
    cr_assert(tb_tmp_path(path, cap, stem, ".gguf"), "%s", path);
    cr_assert_eq(rk_io_write_file_atomic(path, bytes, n, &e), RK_OK, "%s", e.msg);
}

#define F32_NAN 0x7fc00000u
#define F32_INF 0x7f800000u
#define F16_NAN 0x7e00u

Test(finite, model_norm_with_nan_is_refused_by_tensor) {
    const tb_tiny_spec spec = tb_tiny_stories_spec(3);
    char why[256], path[1024];
    size_t n = 0;
    void *bytes = tb_tiny_gguf(&spec, &n, why, sizeof why);
    cr_assert(bytes, "%s", why);
    poison_to(bytes, n, "blk.1.ffn_norm.weight", 5, F32_INF, "rk_test_inf_model", path, sizeof path);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_expect_eq(rk_model_load(path, &m, &e), RK_E_FORMAT, "%s", e.msg);
    cr_expect(strstr(e.msg, "blk.1.ffn_norm.weight") && strstr(e.msg, "+Inf") && strstr(e.msg, path), "%s", e.msg);
    cr_expect_null(m);
    unlink(path);
    free(bytes);
}

Test(finite, ridge_map_with_nan_is_refused_by_tensor) {
    rk_model *m = rt_stories_like(1);
    int32_t *ids = rt_random_ids(m, 1200, 7);
    rk_calib_params cp = {.split = 2, .stride = 2, .seg_len = 256, .lambda = -1, .dtype = RK_DT_F16, .n_threads = 1};
    void *bytes = NULL;
    size_t n = 0;
    rk_calib_report rep;
    rk_err e = {0};
    cr_assert_eq(rk_calibrate(m, ids, 1200, &cp, NULL, NULL, &bytes, &n, &rep, &e), RK_OK, "%s", e.msg);
    char good[1024], bad[1024], bad_bias[1024];
    poison_to(bytes, n, "ridge.3.weight", 0, 0, "rk_test_ok_map", good, sizeof good); /* 0: a finite value */
    rk_ridge_maps *maps = NULL;
    cr_expect_eq(rk_ridge_maps_load(good, m, &maps, NULL, 0, &e), RK_OK, "%s", e.msg);
    rk_ridge_maps_destroy(maps);
    maps = NULL;
    poison_to(bytes, n, "ridge.4.weight", 17, F16_NAN, "rk_test_nan_map", bad, sizeof bad);
    cr_expect_eq(rk_ridge_maps_load(bad, m, &maps, NULL, 0, &e), RK_E_FORMAT, "%s", e.msg);
    cr_expect(strstr(e.msg, "ridge.4.weight") && strstr(e.msg, "NaN") && strstr(e.msg, bad), "%s", e.msg);
    cr_expect_null(maps);
    poison_to(bytes, n, "ridge.3.bias", 2, F32_NAN, "rk_test_nan_bias", bad_bias, sizeof bad_bias);
    cr_expect_eq(rk_ridge_maps_load(bad_bias, m, &maps, NULL, 0, &e), RK_E_FORMAT, "%s", e.msg);
    cr_expect(strstr(e.msg, "ridge.3.bias"), "%s", e.msg);
    unlink(good), unlink(bad), unlink(bad_bias);
    free(bytes), free(ids);
    rk_model_destroy(m);
}

Test(finite, lowram_predictor_with_nan_is_refused_by_tensor) {
    rk_model *m = rt_stories_like(1);
    int32_t *ids = rt_random_ids(m, 1200, 11);
    rk_lowram_calib_params cp = {.group = 3, .seg_len = 400, .stride = 1, .n_threads = 2};
    void *bytes = NULL;
    size_t n = 0;
    rk_err e = {0};
    cr_assert_eq(rk_lowram_calibrate(m, ids, 1200, &cp, NULL, NULL, &bytes, &n, &e), RK_OK, "%s", e.msg);
    char path[1024];
    poison_to(bytes, n, "lowram.0.basis", 3, F32_NAN, "rk_test_nan_pred", path, sizeof path);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 512;
    sp.ctx_overflow_ok = true;
    sp.kv.kind = RK_KV_LOWRAM;
    sp.kv.lowram.group = 3;
    snprintf(sp.kv.lowram.predictor, sizeof sp.kv.lowram.predictor, "%s", path);
    rk_session *s = NULL;
    rk_status st = rk_session_create(m, &sp, &s, &e);
    cr_expect_eq(st, RK_E_FORMAT, "%s: %s", rk_status_name(st), e.msg);
    cr_expect(strstr(e.msg, "lowram.0.basis") && strstr(e.msg, "NaN") && strstr(e.msg, path), "%s", e.msg);
    cr_expect_null(s);
    unlink(path);
    free(bytes), free(ids);
    rk_model_destroy(m);
}
