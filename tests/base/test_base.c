/* base: error messages (formatting, wrapping, truncation), status names, dtype
 * traits against the block layouts, row bytes with overflow, f16/bf16 conversion,
 * read-only mapping, the bump arena and checked arithmetic. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "rk_base.h"
#include "tb.h"

/* ---- errors ------------------------------------------------------------------- */

Test(base, err_set_formats_and_returns_the_code) {
    rk_err e = {0};
    rk_status s = rk_err_set(&e, RK_E_GGUF_DIM, "gguf: tensor '%s' dim %d (expected > 0 vs got %lld)", "w", 1, -5LL);
    cr_expect_eq(s, RK_E_GGUF_DIM);
    cr_expect_eq(e.code, RK_E_GGUF_DIM);
    cr_expect_str_eq(e.msg, "gguf: tensor 'w' dim 1 (expected > 0 vs got -5)");
    cr_expect_eq(rk_err_set(NULL, RK_E_IO, "x %d", 1), RK_E_IO, "NULL err still returns the code");
    rk_err_clear(&e);
    cr_expect_eq(e.code, RK_OK);
    cr_expect_str_empty(e.msg);
    rk_err_clear(NULL);
}

Test(base, err_set_truncates_long_messages) {
    rk_err e;
    memset(&e, 'z', sizeof e);
    char big[2000];
    memset(big, 'a', sizeof big - 1);
    big[sizeof big - 1] = 0;
    big[0] = '<';
    rk_err_set(&e, RK_E_INVALID_ARG, "%s", big);
    cr_expect_eq(strlen(e.msg), sizeof e.msg - 1, "cut at the buffer, NUL-terminated");
    cr_expect_eq(e.msg[0], '<');
    cr_expect_eq(e.msg[sizeof e.msg - 2], 'a');
}

Test(base, err_wrap_prefixes_context) {
    rk_err e = {0};
    rk_err_set(&e, RK_E_NOT_FOUND, "model: tensor 'x' is missing");
    cr_expect_eq(rk_err_wrap(&e, "loading %s", "m.gguf"), RK_E_NOT_FOUND);
    cr_expect_str_eq(e.msg, "loading m.gguf: model: tensor 'x' is missing");
    cr_expect_eq(e.code, RK_E_NOT_FOUND);
    /* a long prefix keeps the buffer's size and its start */
    char big[700];
    memset(big, 'p', sizeof big - 1);
    big[sizeof big - 1] = 0;
    rk_err_wrap(&e, "%s", big);
    cr_expect_eq(strlen(e.msg), sizeof e.msg - 1);
    cr_expect_eq(e.msg[0], 'p');
    /* a long old message is cut at the end, the prefix stays whole */
    rk_err_set(&e, RK_E_IO, "%s", big);
    rk_err_wrap(&e, "ctx");
    cr_expect(strncmp(e.msg, "ctx: ppp", 8) == 0, "%.16s", e.msg);
    cr_expect_eq(strlen(e.msg), sizeof e.msg - 1);
    cr_expect_eq(rk_err_wrap(NULL, "x"), RK_E_INTERNAL);
}

Test(base, status_names_are_distinct_and_stable) {
    cr_expect_str_eq(rk_status_name(RK_OK), "RK_OK");
    cr_expect_str_eq(rk_status_name(RK_E_GGUF_MAGIC), "RK_E_GGUF_MAGIC");
    cr_expect_str_eq(rk_status_name(RK_E_CANCELLED), "RK_E_CANCELLED");
    cr_expect_str_eq(rk_status_name(RK_STATUS_COUNT), "RK_E_UNKNOWN");
    cr_expect_str_eq(rk_status_name((rk_status)-1), "RK_E_UNKNOWN");
    for (int i = 0; i < RK_STATUS_COUNT; i++) {
        const char *a = rk_status_name((rk_status)i);
        cr_expect(strncmp(a, "RK_", 3) == 0 && strcmp(a, "RK_E_UNKNOWN") != 0, "status %d has no name", i);
        for (int j = 0; j < i; j++) cr_expect_str_neq(a, rk_status_name((rk_status)j), "%d and %d", i, j);
    }
}

/* ---- dtypes ------------------------------------------------------------------- */

Test(base, dtype_traits_match_the_block_layouts) {
    const struct {
        uint32_t type;
        const char *name;
        uint32_t blck, bytes;
        bool weight;
    } want[] = {
        {RK_DT_F32, "f32", 1, 4, true},
        {RK_DT_F16, "f16", 1, 2, true},
        {RK_DT_BF16, "bf16", 1, 2, true},
        {RK_DT_Q4_0, "q4_0", 32, 2 + 32 / 2, true},                        /* f16 d + nibbles */
        {RK_DT_Q4_1, "q4_1", 32, 2 + 2 + 32 / 2, true},                    /* f16 d, m + nibbles */
        {RK_DT_Q8_0, "q8_0", 32, 2 + 32, true},                            /* f16 d + int8 */
        {RK_DT_Q8_1, "q8_1", 32, 2 + 2 + 32, false},                       /* f16 d, s + int8 */
        {RK_DT_Q4_K, "q4_K", 256, 2 + 2 + 12 + 256 / 2, true},             /* d, dmin, 6-bit scales, nibbles */
        {RK_DT_Q6_K, "q6_K", 256, 256 / 2 + 256 / 4 + 256 / 16 + 2, true}, /* ql, qh, scales, d */
        {RK_DT_Q8_K, "q8_K", 256, 4 + 256 + 2 * 256 / 16, false},          /* f32 d, int8, bsums */
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const rk_dtype_traits *t = rk_dtype_get(want[i].type);
        cr_assert_not_null(t, "type %u", want[i].type);
        cr_expect_str_eq(t->name, want[i].name);
        cr_expect_str_eq(rk_dtype_name(want[i].type), want[i].name);
        cr_expect_eq(t->blck_size, want[i].blck, "%s", want[i].name);
        cr_expect_eq(t->type_size, want[i].bytes, "%s", want[i].name);
        cr_expect_eq(t->weight_ok, want[i].weight, "%s", want[i].name);
    }
    /* GGML ids we do not know (removed Q4_2/Q4_3/Q5 types, IQ types, out of range) */
    const uint32_t unknown[] = {4, 5, 6, 7, 10, 11, 13, 16, 29, 31, 1000, UINT32_MAX};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        cr_expect_null(rk_dtype_get(unknown[i]), "type %u", unknown[i]);
        cr_expect_str_eq(rk_dtype_name(unknown[i]), "unknown");
        uint64_t out = 77;
        cr_expect_not(rk_dtype_row_bytes(unknown[i], 256, &out));
    }
}

Test(base, row_bytes_checks_blocks_and_overflow) {
    uint64_t b = 0;
    cr_expect(rk_dtype_row_bytes(RK_DT_F32, 10, &b) && b == 40);
    cr_expect(rk_dtype_row_bytes(RK_DT_Q8_0, 64, &b) && b == 68);
    cr_expect(rk_dtype_row_bytes(RK_DT_Q4_K, 512, &b) && b == 288);
    cr_expect(rk_dtype_row_bytes(RK_DT_Q6_K, 0, &b) && b == 0);
    cr_expect_not(rk_dtype_row_bytes(RK_DT_Q8_0, 33, &b), "not a multiple of 32");
    cr_expect_not(rk_dtype_row_bytes(RK_DT_Q4_K, 128, &b), "not a multiple of 256");
    /* 2^62 f32 elements are 2^64 bytes: overflow, not 0 */
    cr_expect_not(rk_dtype_row_bytes(RK_DT_F32, 1ull << 62, &b));
    cr_expect(rk_dtype_row_bytes(RK_DT_F32, (1ull << 62) - 1, &b) && b == UINT64_MAX - 3);
    /* the largest multiple of 32: n/32 * 34 overflows */
    cr_expect_not(rk_dtype_row_bytes(RK_DT_Q8_0, UINT64_MAX & ~31ull, &b));
    cr_expect(rk_dtype_row_bytes(RK_DT_F16, UINT64_MAX / 2, &b) && b == UINT64_MAX - 1);
}

Test(base, checked_arithmetic) {
    uint64_t r;
    cr_expect(rk_mul_u64(1ull << 32, (1ull << 32) - 1, &r) && r == UINT64_MAX - 0xffffffffull);
    cr_expect_not(rk_mul_u64(1ull << 32, 1ull << 32, &r));
    cr_expect(rk_add_u64(UINT64_MAX - 1, 1, &r) && r == UINT64_MAX);
    cr_expect_not(rk_add_u64(UINT64_MAX, 1, &r));
}

/* ---- half floats ---------------------------------------------------------------- */

/* Every one of the 65536 halves converts to f32 and back to itself (NaNs stay NaN). */
Test(base, f16_round_trips_every_half) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = rk_f16_to_f32((uint16_t)h);
        bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu);
        if (nan) {
            cr_expect(isnan(f), "%04x", h);
            cr_expect(isnan(rk_f16_to_f32(rk_f32_to_f16(f))), "%04x", h);
        } else if (rk_f32_to_f16(f) != h) {
            cr_expect_fail("half %04x -> %a -> %04x", h, (double)f, rk_f32_to_f16(f));
            break;
        }
    }
}

Test(base, f16_rounds_to_nearest_even) {
    cr_expect_eq(rk_f32_to_f16(1.0f), 0x3c00);
    cr_expect_eq(rk_f32_to_f16(-2.0f), 0xc000);
    cr_expect_eq(rk_f32_to_f16(65504.0f), 0x7bff);  /* largest half */
    cr_expect_eq(rk_f32_to_f16(65519.99f), 0x7bff); /* below the midpoint */
    cr_expect_eq(rk_f32_to_f16(65520.0f), 0x7c00);  /* midpoint, rounds to inf */
    cr_expect_eq(rk_f32_to_f16(INFINITY), 0x7c00);
    cr_expect_eq(rk_f32_to_f16(-INFINITY), 0xfc00);
    cr_expect_eq(rk_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);            /* tie -> even (down) */
    cr_expect_eq(rk_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);        /* tie -> even (up) */
    cr_expect_eq(rk_f32_to_f16(1.0f + 0x1p-11f + 0x1p-20f), 0x3c01); /* above the tie */
    cr_expect_eq(rk_f32_to_f16(0x1p-24f), 0x0001);                   /* smallest subnormal */
    cr_expect_eq(rk_f32_to_f16(0x1p-25f), 0x0000);                   /* tie -> even (0) */
    cr_expect_eq(rk_f32_to_f16(0x1.8p-24f), 0x0002);                 /* 1.5 ulp: tie -> even (2) */
    cr_expect_eq(rk_f32_to_f16(0x1.8p-25f), 0x0001);                 /* 0.75 ulp rounds up */
    cr_expect_eq(rk_f32_to_f16(0x1p-14f - 0x1p-25f), 0x0400);        /* rounds up into the normals */
    cr_expect_eq(rk_f32_to_f16(-0.0f), 0x8000);
    cr_expect_eq(rk_f32_to_f16(1e-10f), 0x0000);
    cr_expect(isnan(rk_f16_to_f32(rk_f32_to_f16(NAN))));
    cr_expect_eq(rk_f16_to_f32(0x0001), 0x1p-24f);
    cr_expect_eq(rk_f16_to_f32(0x03ff), 0x3ffp-24f);
    cr_expect_eq(rk_f16_to_f32(0x3555), 0x1.554p-2f);
}

Test(base, bf16_rounds_to_nearest_even) {
    cr_expect_eq(rk_f32_to_bf16(1.0f), 0x3f80);
    cr_expect_eq(rk_bf16_to_f32(0x3f80), 1.0f);
    cr_expect_eq(rk_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);     /* tie -> even (down) */
    cr_expect_eq(rk_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82); /* tie -> even (up) */
    cr_expect_eq(rk_f32_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);
    cr_expect_eq(rk_f32_to_bf16(-INFINITY), 0xff80);
    uint16_t n = rk_f32_to_bf16(NAN);
    cr_expect(isnan(rk_bf16_to_f32(n)) && (n & 0x40), "quiet NaN: %04x", n);
    for (uint32_t h = 0; h < 65536; h++) {
        bool nan = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu);
        if (!nan && rk_f32_to_bf16(rk_bf16_to_f32((uint16_t)h)) != h) {
            cr_expect_fail("bf16 %04x does not round-trip", h);
            break;
        }
    }
}

/* ---- mapping -------------------------------------------------------------------- */

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

/* rk_mapping_open_huge: the same bytes as the file whichever way it went (huge-page
 * copy where the kernel offers THP, a plain mapping otherwise), a copy aligned to 2 MiB,
 * the same bytes as rk_mapping_open's plain mapping (what a model loaded without
 * huge_pages gets), errors as rk_mapping_open's. */
Test(base, mapping_on_huge_pages) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-base-huge", ".bin"), "%s", path);
    const size_t n = ((size_t)3 << 20) + 4099; /* not a multiple of any page */
    unsigned char *data = malloc(n);
    cr_assert(data);
    for (size_t i = 0; i < n; i++) data[i] = (unsigned char)(i * 131 + (i >> 12));
    write_bytes(path, data, n);
    rk_err e = {0};
    for (int off = 0; off < 2; off++) {
        const bool copy = !off && rk_mapping_huge_wanted(n);
        rk_mapping m = {0};
        cr_assert_eq(off ? rk_mapping_open(path, &m, &e) : rk_mapping_open_huge(path, &m, &e), RK_OK, "%s", e.msg);
        cr_expect_eq(m.len, n);
        cr_expect(m.data && memcmp(m.data, data, n) == 0, "bytes differ (copy %d)", copy);
        if (copy) cr_expect_eq((uintptr_t)m.data % ((uintptr_t)2 << 20), 0, "copy not 2 MiB aligned");
        /* whole huge pages of this range only (the kernel may or may not have given them) */
        const size_t hb = rk_mapping_huge_bytes(&m);
        cr_expect(hb <= n && hb % ((size_t)2 << 20) == 0, "huge bytes %zu of %zu", hb, n);
        rk_mapping_close(&m);
        cr_expect(m.data == NULL && m.len == 0);
    }
    cr_expect(!rk_mapping_huge_wanted(4096), "a small file is copied");
    /* a file larger than half the available memory stays mapped (when /proc/meminfo tells) */
    FILE *mi = fopen("/proc/meminfo", "r");
    if (mi) {
        fclose(mi);
        cr_expect(!rk_mapping_huge_wanted((size_t)1 << 50), "a 1 PiB file would be copied into memory");
    }
    /* a small file: a plain mapping, same bytes */
    write_bytes(path, data, 5000);
    rk_mapping m = {0};
    cr_assert_eq(rk_mapping_open_huge(path, &m, &e), RK_OK, "%s", e.msg);
    cr_expect(m.len == 5000 && memcmp(m.data, data, 5000) == 0);
    rk_mapping_close(&m);
    unlink(path);
    rk_mapping keep = {(const void *)data, 1234};
    cr_expect_eq(rk_mapping_open_huge(path, &keep, &e), RK_E_NOT_FOUND);
    cr_expect(strstr(e.msg, path), "%s", e.msg);
    cr_expect(keep.data == data && keep.len == 1234, "out-param written on failure");
    free(data);
}

/* rk_mapping_huge_bytes counts only the range it is given: memory advised off huge
 * pages has none, and neither has nothing. */
Test(base, mapping_huge_bytes_of_a_range) {
    cr_expect_eq(rk_mapping_huge_bytes(NULL), 0);
    cr_expect_eq(rk_mapping_huge_bytes(&(rk_mapping){NULL, 0}), 0);
    const size_t len = (size_t)8 << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert(p != MAP_FAILED);
    cr_assert_eq(madvise(p, len, MADV_NOHUGEPAGE), 0);
    memset(p, 7, len);
    cr_expect_eq(rk_mapping_huge_bytes(&(rk_mapping){p, len}), 0, "4 KiB pages counted as huge");
    /* where the kernel collapses the range on request (MADV_COLLAPSE, Linux 6.1), all of it
     * is counted, and none of the next 2 MiB outside it */
    char *a = (char *)(((uintptr_t)p + ((size_t)2 << 20) - 1) & ~(((uintptr_t)2 << 20) - 1));
    const size_t alen = (size_t)4 << 20; /* [a, a + 4 MiB) lies inside p's 8 MiB */
    if (madvise(a, alen, MADV_HUGEPAGE) == 0 && madvise(a, alen, 25 /* MADV_COLLAPSE */) == 0) {
        cr_expect_eq(rk_mapping_huge_bytes(&(rk_mapping){a, alen}), alen, "a collapsed range");
        cr_expect_eq(rk_mapping_huge_bytes(&(rk_mapping){a + alen, (size_t)2 << 20}), 0, "beyond the range");
        cr_expect_eq(a[12345], 7, "collapse kept the bytes");
    }
    munmap(p, len);
}

Test(base, mapping_of_a_file_an_empty_file_and_a_missing_one) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-base-map", ".bin"), "%s", path);
    unsigned char data[5000];
    for (size_t i = 0; i < sizeof data; i++) data[i] = (unsigned char)(i * 7 + 3);
    write_bytes(path, data, sizeof data);
    rk_mapping m = {0};
    rk_err e = {0};
    cr_assert_eq(rk_mapping_open(path, &m, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(m.len, sizeof data);
    cr_expect(m.data && memcmp(m.data, data, sizeof data) == 0);
    rk_mapping_close(&m);
    cr_expect(m.data == NULL && m.len == 0);
    rk_mapping_close(&m); /* twice is fine */
    rk_mapping_close(NULL);
    /* empty file: OK, no data */
    write_bytes(path, data, 0);
    m.len = 99;
    cr_assert_eq(rk_mapping_open(path, &m, &e), RK_OK, "%s", e.msg);
    cr_expect(m.data == NULL && m.len == 0);
    rk_mapping_close(&m);
    unlink(path);
    /* missing: RK_E_NOT_FOUND naming the path; out untouched */
    rk_mapping keep = {(const void *)data, 1234};
    cr_expect_eq(rk_mapping_open(path, &keep, &e), RK_E_NOT_FOUND);
    cr_expect(strstr(e.msg, path), "%s", e.msg);
    cr_expect(keep.data == data && keep.len == 1234, "out-param written on failure");
    /* a directory: RK_E_IO */
    char dir[512];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-base-dir"), "%s", dir);
    cr_expect_eq(rk_mapping_open(dir, &keep, &e), RK_E_IO, "%s", e.msg);
    cr_expect(strstr(e.msg, "not a regular file"), "%s", e.msg);
    rmdir(dir);
}

/* ---- arena ---------------------------------------------------------------------- */

Test(base, arena_aligns_fills_and_resets) {
    rk_arena a;
    rk_err e = {0};
    cr_assert_eq(rk_arena_init(&a, 1000, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(a.cap, 1024, "capacity rounded up to 64");
    void *p = rk_arena_alloc(&a, 1), *q = rk_arena_alloc(&a, 65);
    cr_expect(((uintptr_t)p & 63) == 0 && ((uintptr_t)q & 63) == 0);
    cr_expect_eq((char *)q - (char *)p, 64);
    cr_expect_eq(a.used, 64 + 128);
    cr_expect_not_null(rk_arena_alloc(&a, 1024 - 192), "exactly full");
    cr_expect_null(rk_arena_alloc(&a, 1), "no growth");
    cr_expect_null(rk_arena_alloc(&a, SIZE_MAX), "rounding overflow refused");
    rk_arena_reset(&a);
    cr_expect_eq(rk_arena_alloc(&a, 10), p, "reset starts over");
    rk_arena_deinit(&a);
    rk_arena_deinit(&a);
    rk_arena_deinit(NULL);
    cr_assert_eq(rk_arena_init(&a, 0, &e), RK_OK);
    cr_expect(a.base == NULL && a.cap == 0);
    cr_expect_null(rk_arena_alloc(&a, 1));
    rk_arena_deinit(&a);
}

Test(base, clock_and_rss) {
    double t0 = rk_time_now();
    usleep(2000);
    double t1 = rk_time_now();
    cr_expect(t1 - t0 >= 1.9e-3 && t1 - t0 < 5.0, "%g s", t1 - t0);
    cr_expect_gt(rk_peak_rss_bytes(), 1u << 20);
}
