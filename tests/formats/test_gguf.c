/* GGUF reader/writer: round trips, writer refusals, every real GGUF in ../shared
 * and the default model. Broken files live in test_gguf_broken.c. */
#include <criterion/criterion.h>
#include <glob.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_fixtures.h"
#include "rk_gguf.h"
#include "tb.h"

static rk_gguf *parse_ok(const void *bytes, size_t len) {
    rk_err err = {0};
    rk_gguf *g = NULL;
    rk_status st = rk_gguf_parse(bytes, len, &g, &err);
    cr_assert_eq(st, RK_OK, "parse failed: %s: %s", rk_status_name(st), err.msg);
    cr_assert(g);
    return g;
}

static bool str_is(rk_str s, const char *c) { return rk_str_eq(s, c); }

/* ---- round trips ------------------------------------------------------------ */

Test(gguf_roundtrip, every_kv_type) {
    rk_err err = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(32, &w, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "k.u32", 4000000000u, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_i32(w, "k.i32", -7, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_u64(w, "k.u64", 0xfedcba9876543210ull, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_f32(w, "k.f32", 0.1f, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_f64(w, "k.f64", 1e300, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_bool(w, "k.bool", true, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "k.str", "h\xc3\xa9llo", &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "k.empty", "", &err), RK_OK);
    const uint8_t a_u8[] = {0, 255, 7};
    const int8_t a_i8[] = {-128, 127};
    const uint16_t a_u16[] = {65535, 1};
    const int16_t a_i16[] = {-32768, 5};
    const uint32_t a_u32[] = {1, 2, 4294967295u};
    const int32_t a_i32[] = {-2147483647 - 1, 3};
    const float a_f32[] = {-0.5f, 1e-7f, 3.25f};
    const uint8_t a_bool[] = {1, 0};
    const uint64_t a_u64[] = {18446744073709551615ull, 9};
    const int64_t a_i64[] = {-9007199254740993ll, 42};
    const double a_f64[] = {2.5, -1e-300};
    const char *const a_str[] = {"", "x", "two words", "\xe2\x96\x81the"};
    struct {
        const char *key;
        uint32_t t;
        const void *p;
        uint64_t n;
    } arrs[] = {
        {"a.u8", RK_GGUF_U8, a_u8, 3},    {"a.i8", RK_GGUF_I8, a_i8, 2},       {"a.u16", RK_GGUF_U16, a_u16, 2},
        {"a.i16", RK_GGUF_I16, a_i16, 2}, {"a.u32", RK_GGUF_U32, a_u32, 3},    {"a.i32", RK_GGUF_I32, a_i32, 2},
        {"a.f32", RK_GGUF_F32, a_f32, 3}, {"a.bool", RK_GGUF_BOOL, a_bool, 2}, {"a.u64", RK_GGUF_U64, a_u64, 2},
        {"a.i64", RK_GGUF_I64, a_i64, 2}, {"a.f64", RK_GGUF_F64, a_f64, 2},    {"a.none", RK_GGUF_I32, NULL, 0},
    };
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++)
        cr_assert_eq(rk_gguf_writer_set_arr(w, arrs[i].key, arrs[i].t, arrs[i].p, arrs[i].n, &err), RK_OK, "%s: %s",
                     arrs[i].key, err.msg);
    cr_assert_eq(rk_gguf_writer_set_arr_str(w, "a.str", a_str, 4, &err), RK_OK, "%s", err.msg);
    void *bytes = NULL;
    size_t len = 0;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &len, &err), RK_OK, "%s", err.msg);
    rk_gguf_writer_destroy(w);

    rk_gguf *g = parse_ok(bytes, len);
    cr_assert_eq(rk_gguf_version(g), 3);
    cr_assert_eq(rk_gguf_alignment(g), 32);
    cr_assert_eq(rk_gguf_n_tensors(g), 0);
    cr_assert_eq(rk_gguf_n_kv(g), 8 + 12 + 1);
    /* insertion order */
    cr_assert(str_is(rk_gguf_kv_at(g, 0)->key, "k.u32"));
    cr_assert(str_is(rk_gguf_kv_at(g, 7)->key, "k.empty"));
    cr_assert(str_is(rk_gguf_kv_at(g, 8)->key, "a.u8"));
    cr_assert(str_is(rk_gguf_kv_at(g, 20)->key, "a.str"));
    cr_assert_null(rk_gguf_kv_at(g, 21));

    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    rk_str s;
    cr_assert_eq(rk_gguf_get_u32(g, "k.u32", &u32, &err), RK_OK);
    cr_assert_eq(u32, 4000000000u);
    cr_assert_eq(rk_gguf_get_i64(g, "k.i32", &i64, &err), RK_OK);
    cr_assert_eq(i64, -7);
    cr_assert_eq(rk_gguf_get_u64(g, "k.u64", &u64, &err), RK_OK);
    cr_assert_eq(u64, 0xfedcba9876543210ull);
    cr_assert_eq(rk_gguf_get_f32(g, "k.f32", &f, &err), RK_OK);
    cr_assert_eq(f, 0.1f);
    cr_assert_eq(rk_gguf_get_f32(g, "k.f64", &f, &err), RK_OK);
    cr_assert(isinf(f), "1e300 as float is +inf, got %g", (double)f);
    cr_assert_eq(rk_gguf_get_bool(g, "k.bool", &b, &err), RK_OK);
    cr_assert(b);
    cr_assert_eq(rk_gguf_get_str(g, "k.str", &s, &err), RK_OK);
    cr_assert(str_is(s, "h\xc3\xa9llo"));
    cr_assert_eq(rk_gguf_get_str(g, "k.empty", &s, &err), RK_OK);
    cr_assert_eq(s.len, 0);

    /* conversions and refusals */
    cr_assert_eq(rk_gguf_get_u64(g, "k.u32", &u64, &err), RK_OK);
    cr_assert_eq(u64, 4000000000u);
    cr_assert_eq(rk_gguf_get_f32(g, "k.u32", &f, &err), RK_OK);
    cr_assert_eq(f, 4e9f);
    cr_assert_eq(rk_gguf_get_u32(g, "k.i32", &u32, &err), RK_E_GGUF_TYPE);
    cr_assert(strstr(err.msg, "'k.i32'") && strstr(err.msg, "-7"), "%s", err.msg);
    cr_assert_eq(rk_gguf_get_u32(g, "k.u64", &u32, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_get_i64(g, "k.u64", &i64, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_get_u32(g, "k.f32", &u32, &err), RK_E_GGUF_TYPE);
    cr_assert(strstr(err.msg, "'k.f32'") && strstr(err.msg, "f32"), "%s", err.msg);
    cr_assert_eq(rk_gguf_get_str(g, "k.u32", &s, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_get_bool(g, "k.u32", &b, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_get_str(g, "a.str", &s, &err), RK_E_GGUF_TYPE);
    cr_assert(strstr(err.msg, "array of string"), "%s", err.msg);
    cr_assert_eq(rk_gguf_get_u32(g, "no.such.key", &u32, &err), RK_E_NOT_FOUND);
    cr_assert(strstr(err.msg, "'no.such.key'"), "%s", err.msg);
    cr_assert_eq(u32, 4000000000u, "out-param written on failure");

    /* arrays, element by element */
    for (size_t i = 0; i < sizeof arrs / sizeof arrs[0]; i++) {
        const rk_gguf_kv *kv = rk_gguf_find_kv(g, arrs[i].key);
        cr_assert(kv, "%s missing", arrs[i].key);
        cr_assert_eq(kv->type, RK_GGUF_ARRAY);
        cr_assert_eq(kv->arr_type, arrs[i].t);
        cr_assert_eq(kv->n, arrs[i].n);
    }
    const rk_gguf_kv *kv;
    kv = rk_gguf_find_kv(g, "a.u8");
    cr_assert_eq(rk_gguf_arr_i64(kv, 1, &i64, &err), RK_OK);
    cr_assert_eq(i64, 255);
    kv = rk_gguf_find_kv(g, "a.i8");
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_OK);
    cr_assert_eq(i64, -128);
    kv = rk_gguf_find_kv(g, "a.u16");
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_OK);
    cr_assert_eq(i64, 65535);
    kv = rk_gguf_find_kv(g, "a.i16");
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_OK);
    cr_assert_eq(i64, -32768);
    kv = rk_gguf_find_kv(g, "a.u32");
    cr_assert_eq(rk_gguf_arr_i64(kv, 2, &i64, &err), RK_OK);
    cr_assert_eq(i64, 4294967295ll);
    kv = rk_gguf_find_kv(g, "a.i32");
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_OK);
    cr_assert_eq(i64, -2147483647ll - 1);
    cr_assert_eq(rk_gguf_arr_f32(kv, 1, &f, &err), RK_OK);
    cr_assert_eq(f, 3.0f);
    kv = rk_gguf_find_kv(g, "a.f32");
    for (uint64_t i = 0; i < 3; i++) {
        cr_assert_eq(rk_gguf_arr_f32(kv, i, &f, &err), RK_OK);
        cr_assert_eq(f, a_f32[i]);
    }
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_arr_f32(kv, 3, &f, &err), RK_E_INVALID_ARG);
    cr_assert(strstr(err.msg, "'a.f32'") && strstr(err.msg, "3"), "%s", err.msg);
    kv = rk_gguf_find_kv(g, "a.u64");
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_E_GGUF_TYPE, "u64 max does not fit i64");
    cr_assert_eq(rk_gguf_arr_i64(kv, 1, &i64, &err), RK_OK);
    cr_assert_eq(i64, 9);
    kv = rk_gguf_find_kv(g, "a.i64");
    cr_assert_eq(rk_gguf_arr_i64(kv, 0, &i64, &err), RK_OK);
    cr_assert_eq(i64, -9007199254740993ll);
    kv = rk_gguf_find_kv(g, "a.f64");
    cr_assert_eq(rk_gguf_arr_f32(kv, 0, &f, &err), RK_OK);
    cr_assert_eq(f, 2.5f);
    kv = rk_gguf_find_kv(g, "a.bool");
    cr_assert_eq(((const uint8_t *)kv->data)[0], 1);
    cr_assert_eq(((const uint8_t *)kv->data)[1], 0);
    kv = rk_gguf_find_kv(g, "a.str");
    for (uint64_t i = 0; i < 4; i++) {
        cr_assert_eq(rk_gguf_arr_str(g, kv, i, &s, &err), RK_OK, "%s", err.msg);
        cr_assert(str_is(s, a_str[i]), "element %llu", (unsigned long long)i);
    }
    cr_assert_eq(rk_gguf_arr_str(g, kv, 4, &s, &err), RK_E_INVALID_ARG);
    cr_assert_eq(rk_gguf_arr_str(g, rk_gguf_find_kv(g, "a.u8"), 0, &s, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_arr_str(g, rk_gguf_find_kv(g, "k.str"), 0, &s, &err), RK_E_GGUF_TYPE);
    rk_gguf_kv copy = *kv;
    cr_assert_eq(rk_gguf_arr_str(g, &copy, 0, &s, &err), RK_E_INVALID_ARG, "foreign kv refused");
    cr_assert_eq(rk_gguf_arr_f32(rk_gguf_find_kv(g, "k.u32"), 0, &f, &err), RK_E_GGUF_TYPE);
    rk_gguf_destroy(g);
    free(bytes);
}

static void roundtrip_tensors(uint32_t alignment) {
    struct {
        const char *name;
        uint32_t type;
        uint32_t n_dims;
        int64_t ne[4];
    } ts[] = {
        {"t.f32", RK_DT_F32, 2, {3, 5, 1, 1}},     {"t.f16", RK_DT_F16, 3, {7, 2, 2, 1}},
        {"t.bf16", RK_DT_BF16, 1, {9, 1, 1, 1}},   {"t.q8_0", RK_DT_Q8_0, 2, {64, 3, 1, 1}},
        {"t.q4_0", RK_DT_Q4_0, 4, {32, 2, 1, 2}},  {"t.q4_1", RK_DT_Q4_1, 2, {96, 1, 1, 1}},
        {"t.q4_k", RK_DT_Q4_K, 2, {256, 2, 1, 1}}, {"t.q6_k", RK_DT_Q6_K, 1, {512, 1, 1, 1}},
    };
    enum { NT = sizeof ts / sizeof ts[0] };
    rk_err err = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(alignment, &w, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.architecture", "test", &err), RK_OK);
    uint8_t *data[NT];
    uint64_t n_bytes[NT];
    uint64_t seed = alignment;
    for (int i = 0; i < NT; i++) {
        uint64_t rows = (uint64_t)(ts[i].ne[1] * ts[i].ne[2] * ts[i].ne[3]), row;
        cr_assert(rk_dtype_row_bytes(ts[i].type, (uint64_t)ts[i].ne[0], &row));
        n_bytes[i] = row * rows;
        data[i] = malloc(n_bytes[i]);
        for (uint64_t j = 0; j < n_bytes[i]; j++) data[i][j] = (uint8_t)tb_rand_u64(&seed);
        cr_assert_eq(
            rk_gguf_writer_add_tensor(w, ts[i].name, ts[i].type, ts[i].n_dims, ts[i].ne, data[i], n_bytes[i], &err),
            RK_OK, "%s: %s", ts[i].name, err.msg);
    }
    void *bytes = NULL;
    size_t len = 0;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &len, &err), RK_OK, "%s", err.msg);
    rk_gguf_writer_destroy(w);

    rk_gguf *g = parse_ok(bytes, len);
    uint32_t a = alignment ? alignment : 32;
    cr_assert_eq(rk_gguf_alignment(g), a);
    cr_assert_eq(rk_gguf_data_offset(g) % a, 0);
    cr_assert_eq(rk_gguf_n_kv(g), a == 32 ? 1 : 2, "general.alignment written iff not 32");
    cr_assert_eq(rk_gguf_n_tensors(g), NT);
    for (int i = 0; i < NT; i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, (uint64_t)i);
        cr_assert(str_is(t->name, ts[i].name));
        cr_assert_eq(rk_gguf_find_tensor(g, ts[i].name), t);
        cr_assert_eq(t->type, ts[i].type);
        cr_assert_eq(t->n_dims, ts[i].n_dims);
        for (int d = 0; d < 4; d++) cr_assert_eq(t->ne[d], ts[i].ne[d], "%s ne[%d]", ts[i].name, d);
        cr_assert_eq(t->n_bytes, n_bytes[i]);
        cr_assert_eq(t->offset % a, 0);
        cr_assert_eq((const uint8_t *)t->data, (const uint8_t *)bytes + rk_gguf_data_offset(g) + t->offset);
        cr_assert_eq(memcmp(t->data, data[i], n_bytes[i]), 0, "%s data", ts[i].name);
        free(data[i]);
    }
    cr_assert_null(rk_gguf_find_tensor(g, "t.none"));
    cr_assert_null(rk_gguf_tensor_at(g, NT));
    rk_gguf_destroy(g);
    free(bytes);
}

Test(gguf_roundtrip, tensors_default_alignment) { roundtrip_tensors(0); }
Test(gguf_roundtrip, tensors_align_32) { roundtrip_tensors(32); }
Test(gguf_roundtrip, tensors_align_1) { roundtrip_tensors(1); }
Test(gguf_roundtrip, tensors_align_256) { roundtrip_tensors(256); }

Test(gguf_writer, refusals_leave_writer_usable) {
    rk_err err = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(24, &w, &err), RK_E_GGUF_ALIGN);
    cr_assert(strstr(err.msg, "24"), "%s", err.msg);
    cr_assert_null(w);
    cr_assert_eq(rk_gguf_writer_create(64, &w, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "a", 1, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "a", "x", &err), RK_E_GGUF_DUPLICATE);
    cr_assert(strstr(err.msg, "'a'"), "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "general.alignment", 64, &err), RK_E_GGUF_DUPLICATE);
    cr_assert_eq(rk_gguf_writer_set_u32(w, "general.alignment", 32, &err), RK_E_GGUF_ALIGN);
    cr_assert_eq(rk_gguf_writer_set_u64(w, "general.alignment", 64, &err), RK_E_GGUF_ALIGN);
    cr_assert_eq(rk_gguf_writer_set_arr(w, "s", RK_GGUF_STRING, "x", 1, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_writer_set_arr(w, "s", RK_GGUF_ARRAY, "x", 1, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_writer_set_arr(w, "s", 99, "x", 1, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_writer_set_arr(w, "s", RK_GGUF_U8, NULL, 1, &err), RK_E_INVALID_ARG);
    cr_assert_eq(rk_gguf_writer_set_arr(w, "s", RK_GGUF_U64, "x", UINT64_MAX / 4, &err), RK_E_GGUF_COUNT);
    const char *strs[] = {"a", NULL};
    cr_assert_eq(rk_gguf_writer_set_arr_str(w, "s", strs, 2, &err), RK_E_INVALID_ARG);
    cr_assert_eq(rk_gguf_writer_set_str(w, "s", NULL, &err), RK_E_INVALID_ARG);

    float f[64] = {0};
    const int64_t ne[] = {8, 2}, ne_bad[] = {0, 2}, ne_huge[] = {1ll << 40, 1ll << 40};
    const int64_t ne_q[] = {33, 1};
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "t", RK_DT_F32, 2, ne, f, 64, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "t", RK_DT_F32, 2, ne, f, 64, &err), RK_E_GGUF_DUPLICATE);
    cr_assert(strstr(err.msg, "'t'"), "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_F32, 2, ne, f, 60, &err), RK_E_INVALID_ARG);
    cr_assert(strstr(err.msg, "'u'") && strstr(err.msg, "60") && strstr(err.msg, "64"), "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_F32, 2, ne_bad, f, 0, &err), RK_E_GGUF_DIM);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_F32, 0, ne, f, 64, &err), RK_E_GGUF_DIM);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_F32, 5, ne, f, 64, &err), RK_E_GGUF_DIM);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_Q4_K, 2, ne_huge, f, 64, &err), RK_E_GGUF_DIM);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", 6, 2, ne, f, 64, &err), RK_E_GGUF_TYPE);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_Q8_0, 2, ne_q, f, 34, &err), RK_E_GGUF_BLOCK);
    cr_assert(strstr(err.msg, "'u'") && strstr(err.msg, "33"), "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "u", RK_DT_F32, 2, ne, NULL, 64, &err), RK_E_INVALID_ARG);

    void *bytes = NULL;
    size_t len = 0;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &len, &err), RK_OK, "%s", err.msg);
    rk_gguf_writer_destroy(w);
    rk_gguf *g = parse_ok(bytes, len);
    cr_assert_eq(rk_gguf_n_kv(g), 2, "general.alignment and a");
    cr_assert_eq(rk_gguf_n_tensors(g), 1);
    cr_assert_eq(rk_gguf_alignment(g), 64);
    rk_gguf_destroy(g);
    free(bytes);
    rk_gguf_writer_destroy(NULL);
    rk_gguf_destroy(NULL);
}

Test(gguf_writer, set_kv_copies_and_checks_alignment) {
    size_t len = 0;
    rk_err err = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(64, &w, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "s", "abc", &err), RK_OK);
    const char *strs[] = {"x", "", "yz"};
    cr_assert_eq(rk_gguf_writer_set_arr_str(w, "as", strs, 3, &err), RK_OK);
    void *bytes = NULL;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &len, &err), RK_OK);
    rk_gguf_writer_destroy(w);
    rk_gguf *g = parse_ok(bytes, len);
    const rk_gguf_kv *align = rk_gguf_find_kv(g, "general.alignment");
    cr_assert(align && align->type == RK_GGUF_U32);

    cr_assert_eq(rk_gguf_writer_create(32, &w, &err), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_kv(w, align, &err), RK_E_GGUF_ALIGN);
    cr_assert(strstr(err.msg, "general.alignment") && strstr(err.msg, "64"), "%s", err.msg);
    rk_gguf_writer_destroy(w);

    cr_assert_eq(rk_gguf_writer_create(64, &w, &err), RK_OK);
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++)
        cr_assert_eq(rk_gguf_writer_set_kv(w, rk_gguf_kv_at(g, i), &err), RK_OK, "%s", err.msg);
    cr_assert_eq(rk_gguf_writer_set_kv(w, rk_gguf_find_kv(g, "s"), &err), RK_E_GGUF_DUPLICATE);
    void *copy = NULL;
    size_t copy_len = 0;
    cr_assert_eq(rk_gguf_writer_finish(w, &copy, &copy_len, &err), RK_OK);
    rk_gguf_writer_destroy(w);
    cr_assert_eq(copy_len, len);
    cr_assert_eq(memcmp(copy, bytes, len), 0, "copy equals the original");
    rk_gguf_destroy(g);
    free(copy);
    free(bytes);
}

/* ---- real files ---------------------------------------------------------------- */

/* Invariants every parsed file must satisfy, checked independently of the index. */
static void check_invariants(const rk_gguf *g, const uint8_t *bytes, size_t len, const char *what) {
    rk_err err = {0};
    uint32_t a = rk_gguf_alignment(g);
    cr_assert(a && !(a & (a - 1)), "%s: alignment %u", what, a);
    cr_assert_eq(rk_gguf_data_offset(g) % a, 0, "%s", what);
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++) {
        const rk_gguf_kv *kv = rk_gguf_kv_at(g, i);
        char key[256];
        cr_assert_lt(kv->key.len, sizeof key, "%s: long key", what);
        memcpy(key, kv->key.ptr, kv->key.len);
        key[kv->key.len] = 0;
        cr_assert_eq(rk_gguf_find_kv(g, key), kv, "%s: find_kv('%s')", what, key);
        if (kv->type != RK_GGUF_ARRAY || kv->arr_type != RK_GGUF_STRING) continue;
        /* walk the encoded strings by hand and compare with the index */
        const uint8_t *p = kv->data;
        for (uint64_t j = 0; j < kv->n; j++) {
            uint64_t n;
            memcpy(&n, p, 8);
            rk_str s;
            cr_assert_eq(rk_gguf_arr_str(g, kv, j, &s, &err), RK_OK, "%s", err.msg);
            cr_assert(s.ptr == (const char *)p + 8 && s.len == n, "%s: %s[%llu]", what, key, (unsigned long long)j);
            p += 8 + n;
        }
        cr_assert_leq(p, bytes + len);
    }
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        char name[256];
        cr_assert_lt(t->name.len, sizeof name);
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = 0;
        cr_assert_eq(rk_gguf_find_tensor(g, name), t, "%s: find_tensor('%s')", what, name);
        cr_assert_eq(t->offset % a, 0, "%s: %s", what, name);
        uint64_t row, rows = 1;
        for (uint32_t d = 1; d < 4; d++) rows *= (uint64_t)t->ne[d];
        cr_assert(rk_dtype_row_bytes(t->type, (uint64_t)t->ne[0], &row), "%s: %s", what, name);
        cr_assert_eq(t->n_bytes, row * rows, "%s: %s", what, name);
        cr_assert_eq((const uint8_t *)t->data, bytes + rk_gguf_data_offset(g) + t->offset);
        cr_assert_leq(rk_gguf_data_offset(g) + t->offset + t->n_bytes, len, "%s: %s", what, name);
    }
}

/* Copies g with the writer (set_kv + add_tensor) and checks the copy parses to the
 * same keys, values, tensors and data. Returns whether the copy is byte-identical
 * (the checks above it say what differs when it is not). */
static bool rewrite_matches(const rk_gguf *g, const uint8_t *bytes, size_t len, const char *what) {
    rk_err err = {0};
    rk_gguf_writer *w = NULL;
    cr_assert_eq(rk_gguf_writer_create(rk_gguf_alignment(g), &w, &err), RK_OK, "%s", err.msg);
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++)
        cr_assert_eq(rk_gguf_writer_set_kv(w, rk_gguf_kv_at(g, i), &err), RK_OK, "%s: %s", what, err.msg);
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        char name[256];
        memcpy(name, t->name.ptr, t->name.len);
        name[t->name.len] = 0;
        cr_assert_eq(rk_gguf_writer_add_tensor(w, name, t->type, t->n_dims, t->ne, t->data, t->n_bytes, &err), RK_OK,
                     "%s: %s", what, err.msg);
    }
    void *out = NULL;
    size_t out_len = 0;
    cr_assert_eq(rk_gguf_writer_finish(w, &out, &out_len, &err), RK_OK, "%s", err.msg);
    rk_gguf_writer_destroy(w);
    rk_gguf *h = parse_ok(out, out_len);
    cr_assert_eq(rk_gguf_n_kv(h), rk_gguf_n_kv(g), "%s", what);
    cr_assert_eq(rk_gguf_n_tensors(h), rk_gguf_n_tensors(g), "%s", what);
    cr_assert_eq(rk_gguf_alignment(h), rk_gguf_alignment(g), "%s", what);
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++) {
        const rk_gguf_kv *a = rk_gguf_kv_at(g, i), *b = rk_gguf_kv_at(h, i);
        cr_assert(a->key.len == b->key.len && !memcmp(a->key.ptr, b->key.ptr, a->key.len));
        cr_assert(a->type == b->type && a->arr_type == b->arr_type && a->n == b->n, "%s", what);
        /* value bytes: up to the next key (or the tensor infos) in both files */
        const uint8_t *ea = i + 1 < rk_gguf_n_kv(g) ? (const uint8_t *)rk_gguf_kv_at(g, i + 1)->key.ptr - 8 : NULL;
        const uint8_t *eb = i + 1 < rk_gguf_n_kv(h) ? (const uint8_t *)rk_gguf_kv_at(h, i + 1)->key.ptr - 8 : NULL;
        if (ea && eb) {
            cr_assert_eq(ea - a->data, eb - b->data, "%s: key %llu size", what, (unsigned long long)i);
            cr_assert_eq(memcmp(a->data, b->data, (size_t)(ea - a->data)), 0, "%s: key %llu", what,
                         (unsigned long long)i);
        }
    }
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *a = rk_gguf_tensor_at(g, i), *b = rk_gguf_tensor_at(h, i);
        cr_assert(a->name.len == b->name.len && !memcmp(a->name.ptr, b->name.ptr, a->name.len));
        cr_assert(a->type == b->type && a->n_dims == b->n_dims && a->n_bytes == b->n_bytes);
        for (int d = 0; d < 4; d++) cr_assert_eq(a->ne[d], b->ne[d]);
        cr_assert_eq(memcmp(a->data, b->data, (size_t)a->n_bytes), 0, "%s: tensor %llu", what, (unsigned long long)i);
    }
    bool same = out_len == len && memcmp(out, bytes, len) == 0;
    rk_gguf_destroy(h);
    free(out);
    return same;
}

typedef struct known {
    const char *rel;
    const char *arch;
    uint32_t block_count, n_embd;
    uint64_t n_kv, n_tensors, n_tok;
    const char *tok0, *tok_last;
    const char *tensor0; /* first tensor, NULL for vocab-only files */
    uint32_t tensor0_type;
    int64_t ne0, ne1;
} known;

static const known known_files[] = {
    {"models/stories260K/stories260K-f32.gguf", "llama", 5, 64, 18, 48, 512, "<unk>", "\xe2\x80\x8a",
     "token_embd.weight", RK_DT_F32, 64, 512},
    {"models/aidreams260K/aidreams260K-f32.gguf", "llama", 4, 64, 18, 38, 512, "<unk>", "\xce\xbc", "token_embd.weight",
     RK_DT_F32, 64, 512},
    {"golden/models/llama-tiny-q4_0.gguf", "llama", 3, 256, 23, 30, 512, "<unk>", "\xe2\x80\x8a", "output.weight",
     RK_DT_Q6_K, 256, 512},
    {"golden/models/llama-tiny-q4_1.gguf", "llama", 3, 256, 23, 30, 512, "<unk>", "\xe2\x80\x8a", "output.weight",
     RK_DT_Q6_K, 256, 512},
    {"golden/models/llama-tiny-q4_k_m.gguf", "llama", 3, 256, 23, 30, 512, "<unk>", "\xe2\x80\x8a", "output.weight",
     RK_DT_Q6_K, 256, 512},
    {"golden/models/qwen2-tiny-q8_0.gguf", "qwen2", 3, 256, 23, 39, 512, "<unk>", "\xe2\x80\x8a", "output.weight",
     RK_DT_Q8_0, 256, 512},
    {"golden/models/qwen3-tiny-f16.gguf", "qwen3", 4, 256, 22, 46, 512, "<unk>", "\xe2\x80\x8a", "token_embd.weight",
     RK_DT_F16, 256, 512},
    {"golden/tokenizer/ggml-vocab-gpt-2.gguf", "gpt2", 12, 768, 16, 0, 50257, "!", "<|endoftext|>", NULL, 0, 0, 0},
    {"golden/tokenizer/ggml-vocab-llama-spm.gguf", "llama", 32, 4096, 22, 0, 32000, "<unk>", "\xe7\xbb\x99", NULL, 0, 0,
     0},
    {"golden/tokenizer/ggml-vocab-starcoder.gguf", "starcoder2", 30, 3072, 19, 0, 49152, "<|endoftext|>", "sdb", NULL,
     0, 0, 0},
};

static void check_known(const known *k, const char *path) {
    size_t len = 0;
    uint8_t *bytes = tb_read_file(path, &len);
    cr_assert(bytes, "cannot read %s", path);
    rk_gguf *g = parse_ok(bytes, len);
    rk_err err = {0};
    cr_assert_eq(rk_gguf_version(g), 3, "%s", k->rel);
    cr_assert_eq(rk_gguf_n_kv(g), k->n_kv, "%s", k->rel);
    cr_assert_eq(rk_gguf_n_tensors(g), k->n_tensors, "%s", k->rel);
    rk_str s;
    cr_assert_eq(rk_gguf_get_str(g, "general.architecture", &s, &err), RK_OK, "%s", err.msg);
    cr_assert(rk_str_eq(s, k->arch), "%s: arch '%.*s'", k->rel, (int)s.len, s.ptr);
    char key[96];
    uint32_t u;
    snprintf(key, sizeof key, "%s.block_count", k->arch);
    cr_assert_eq(rk_gguf_get_u32(g, key, &u, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(u, k->block_count, "%s: %s", k->rel, key);
    snprintf(key, sizeof key, "%s.embedding_length", k->arch);
    cr_assert_eq(rk_gguf_get_u32(g, key, &u, &err), RK_OK, "%s", err.msg);
    cr_assert_eq(u, k->n_embd, "%s: %s", k->rel, key);
    const rk_gguf_kv *tok = rk_gguf_find_kv(g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->type == RK_GGUF_ARRAY && tok->arr_type == RK_GGUF_STRING, "%s", k->rel);
    cr_assert_eq(tok->n, k->n_tok, "%s", k->rel);
    cr_assert_eq(rk_gguf_arr_str(g, tok, 0, &s, &err), RK_OK);
    cr_assert(rk_str_eq(s, k->tok0), "%s: token 0 '%.*s'", k->rel, (int)s.len, s.ptr);
    cr_assert_eq(rk_gguf_arr_str(g, tok, k->n_tok - 1, &s, &err), RK_OK);
    cr_assert(rk_str_eq(s, k->tok_last), "%s: last token '%.*s'", k->rel, (int)s.len, s.ptr);
    if (k->tensor0) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, 0);
        cr_assert(rk_str_eq(t->name, k->tensor0), "%s: tensor 0", k->rel);
        cr_assert_eq(t->type, k->tensor0_type, "%s", k->rel);
        cr_assert(t->ne[0] == k->ne0 && t->ne[1] == k->ne1 && t->n_dims == 2, "%s", k->rel);
    }
    check_invariants(g, bytes, len, k->rel);
    /* llama.cpp lays files out exactly as our writer does: same order, same padding */
    cr_assert(rewrite_matches(g, bytes, len, k->rel), "%s: writer copy differs", k->rel);
    rk_gguf_destroy(g);
    free(bytes);
}

Test(gguf_real_shared, known_shared_files) {
    char buf[1024];
    int found = 0;
    for (size_t i = 0; i < sizeof known_files / sizeof known_files[0]; i++) {
        const char *path = tb_shared_path(buf, sizeof buf, known_files[i].rel);
        if (!path) continue;
        check_known(&known_files[i], path);
        found++;
    }
    if (!found) cr_skip_test("no shared GGUF files: %s", buf);
}

Test(gguf_real_shared, stories260K_values) {
    char buf[1024];
    const char *path = tb_shared_path(buf, sizeof buf, "models/stories260K/stories260K-f32.gguf");
    if (!path) cr_skip_test("%s", buf);
    size_t len = 0;
    uint8_t *bytes = tb_read_file(path, &len);
    cr_assert(bytes);
    rk_gguf *g = parse_ok(bytes, len);
    rk_err err = {0};
    float eps;
    cr_assert_eq(rk_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &eps, &err), RK_OK);
    cr_assert_eq(eps, 1e-5f);
    uint32_t heads, kv_heads;
    cr_assert_eq(rk_gguf_get_u32(g, "llama.attention.head_count", &heads, &err), RK_OK);
    cr_assert_eq(rk_gguf_get_u32(g, "llama.attention.head_count_kv", &kv_heads, &err), RK_OK);
    cr_assert(heads == 8 && kv_heads == 4);
    const rk_gguf_tensor *t = rk_gguf_find_tensor(g, "token_embd.weight");
    cr_assert(t);
    cr_assert_eq(t->n_bytes, 64 * 512 * 4);
    cr_assert(rk_gguf_find_tensor(g, "output.weight"), "stories260K has a separate output");
    cr_assert(rk_gguf_find_tensor(g, "blk.4.ffn_down.weight"));
    cr_assert_null(rk_gguf_find_tensor(g, "blk.5.ffn_down.weight"));
    const rk_gguf_kv *tt = rk_gguf_find_kv(g, "tokenizer.ggml.token_type");
    int64_t ty;
    cr_assert_eq(rk_gguf_arr_i64(tt, 0, &ty, &err), RK_OK);
    cr_assert_eq(ty, 2, "token 0 is UNKNOWN");
    cr_assert_eq(rk_gguf_arr_i64(tt, 3, &ty, &err), RK_OK);
    cr_assert_eq(ty, 6, "token 3 is BYTE");
    rk_gguf_destroy(g);
    free(bytes);
}

/* Every real GGUF under the shared dirs parses, even ones not in the table above. */
Test(gguf_real_shared, every_shared_gguf_parses) {
    const char *dir = tb_shared_dir();
    if (!dir) cr_skip_test("../shared not found (RK_SHARED_DIR unset or missing)");
    const char *pats[] = {"models/*/*.gguf", "golden/models/*.gguf", "golden/tokenizer/*.gguf"};
    size_t n = 0;
    for (size_t p = 0; p < 3; p++) {
        char pat[1024];
        snprintf(pat, sizeof pat, "%s/%s", dir, pats[p]);
        glob_t gl;
        if (glob(pat, 0, NULL, &gl) != 0) continue;
        for (size_t i = 0; i < gl.gl_pathc; i++) {
            size_t len = 0;
            uint8_t *bytes = tb_read_file(gl.gl_pathv[i], &len);
            cr_assert(bytes, "cannot read %s", gl.gl_pathv[i]);
            rk_err err = {0};
            rk_gguf *g = NULL;
            rk_status st = rk_gguf_parse(bytes, len, &g, &err);
            cr_assert_eq(st, RK_OK, "%s: %s", gl.gl_pathv[i], err.msg);
            check_invariants(g, bytes, len, gl.gl_pathv[i]);
            rk_gguf_destroy(g);
            free(bytes);
            n++;
        }
        globfree(&gl);
    }
    if (!n) cr_skip_test("no .gguf files under %s", dir);
    cr_assert_geq(n, 3);
}

Test(gguf_real_shared, default_model) {
    char buf[1024];
    const char *path = tb_default_model(buf, sizeof buf);
    if (!path) cr_skip_test("default model not in the cache (run `ridgekv pull`)");
    rk_mapping m = {0};
    rk_err err = {0};
    cr_assert_eq(rk_mapping_open(path, &m, &err), RK_OK, "%s", err.msg);
    rk_gguf *g = parse_ok(m.data, m.len);
    cr_assert_eq(rk_gguf_n_tensors(g), 272);
    uint32_t u;
    cr_assert_eq(rk_gguf_get_u32(g, "llama.block_count", &u, &err), RK_OK);
    cr_assert_eq(u, 30);
    cr_assert_eq(rk_gguf_get_u32(g, "llama.embedding_length", &u, &err), RK_OK);
    cr_assert_eq(u, 576);
    cr_assert_eq(rk_gguf_get_u32(g, "llama.attention.head_count_kv", &u, &err), RK_OK);
    cr_assert_eq(u, 3);
    rk_str s;
    cr_assert_eq(rk_gguf_get_str(g, "tokenizer.ggml.model", &s, &err), RK_OK);
    cr_assert(rk_str_eq(s, "gpt2"));
    cr_assert_eq(rk_gguf_get_str(g, "tokenizer.chat_template", &s, &err), RK_OK);
    cr_assert(s.len > 14 && memcmp(s.ptr, "{% for message", 14) == 0);
    const rk_gguf_kv *tok = rk_gguf_find_kv(g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->n == 49152);
    cr_assert_eq(rk_gguf_arr_str(g, tok, 1, &s, &err), RK_OK);
    cr_assert(rk_str_eq(s, "<|im_start|>"));
    const rk_gguf_kv *merges = rk_gguf_find_kv(g, "tokenizer.ggml.merges");
    cr_assert(merges && merges->n == 48900);
    const rk_gguf_tensor *t = rk_gguf_find_tensor(g, "token_embd.weight");
    cr_assert(t && t->type == RK_DT_Q8_0 && t->ne[0] == 576 && t->ne[1] == 49152);
    check_invariants(g, m.data, m.len, path);
    cr_assert(rewrite_matches(g, m.data, m.len, path), "writer copy differs");
    rk_gguf_destroy(g);
    rk_mapping_close(&m);
}

/* rk_gguf_arr_str is an O(1) index lookup: a tokenizer calls it for every token. */
Test(gguf_real_shared, arr_str_is_constant_time) {
    char buf[1024];
    const char *path = tb_shared_path(buf, sizeof buf, "golden/tokenizer/ggml-vocab-gpt-2.gguf");
    if (!path) cr_skip_test("%s", buf);
    size_t len = 0;
    uint8_t *bytes = tb_read_file(path, &len);
    cr_assert(bytes);
    rk_gguf *g = parse_ok(bytes, len);
    const rk_gguf_kv *tok = rk_gguf_find_kv(g, "tokenizer.ggml.tokens");
    cr_assert(tok && tok->n == 50257);
    rk_err err = {0};
    uint64_t total = 0;
    double t0 = rk_time_now();
    /* 1M lookups, last index first: a linear walk would need ~2.5e10 steps */
    for (int r = 0; r < 20; r++)
        for (uint64_t i = tok->n; i-- > 0;) {
            rk_str s;
            if (rk_gguf_arr_str(g, tok, i, &s, &err) != RK_OK) cr_assert_fail("%s", err.msg);
            total += s.len;
        }
    double dt = rk_time_now() - t0;
    cr_assert_lt(dt, 2.0, "1M arr_str calls took %.3f s", dt);
    cr_assert_gt(total, 20 * 50257ull);
    rk_gguf_destroy(g);
    free(bytes);
}
