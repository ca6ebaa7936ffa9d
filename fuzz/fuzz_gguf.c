/* libFuzzer target for the GGUF reader. Every input must give RK_OK or a GGUF
 * status with a message; on RK_OK every view the reader hands out must lie
 * inside the input, which this target checks and traps on otherwise. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok) {
    if (!ok) __builtin_trap();
}

static bool inside(const void *p, uint64_t n, const uint8_t *base, size_t len) {
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)base;
    return a >= b && a - b <= len && n <= len - (a - b);
}

static void walk_kv(const rk_gguf *g, const rk_gguf_kv *kv, const uint8_t *data, size_t size) {
    rk_err err;
    char key[256];
    check(inside(kv->key.ptr, kv->key.len, data, size));
    size_t n = kv->key.len < sizeof key - 1 ? (size_t)kv->key.len : sizeof key - 1;
    memcpy(key, kv->key.ptr, n);
    key[n] = 0;
    /* the index finds the first entry with this key (keys with NUL bytes aside) */
    if (n == kv->key.len && !memchr(key, 0, n)) check(rk_gguf_find_kv(g, key) == kv);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    bool b;
    rk_str s;
    (void)rk_gguf_get_u32(g, key, &u32, &err);
    (void)rk_gguf_get_u64(g, key, &u64, &err);
    (void)rk_gguf_get_i64(g, key, &i64, &err);
    (void)rk_gguf_get_f32(g, key, &f, &err);
    (void)rk_gguf_get_bool(g, key, &b, &err);
    if (rk_gguf_get_str(g, key, &s, &err) == RK_OK) check(inside(s.ptr, s.len, data, size));
    if (kv->type != RK_GGUF_ARRAY) return;
    check(kv->arr_type < RK_GGUF_TYPE_COUNT && kv->arr_type != RK_GGUF_ARRAY);
    for (uint64_t i = 0; i < kv->n; i++) {
        if (kv->arr_type == RK_GGUF_STRING) {
            check(rk_gguf_arr_str(g, kv, i, &s, &err) == RK_OK);
            check(inside(s.ptr, s.len, data, size));
        } else {
            (void)rk_gguf_arr_f32(kv, i, &f, &err);
            (void)rk_gguf_arr_i64(kv, i, &i64, &err);
        }
    }
    check(rk_gguf_arr_str(g, kv, kv->n, &s, &err) != RK_OK);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* a copy of exactly size bytes, so ASan catches any read past the end */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    if (size) memcpy(buf, data, size);
    rk_err err = {0};
    rk_gguf *g = NULL;
    rk_status st = rk_gguf_parse(buf, size, &g, &err);
    if (st != RK_OK) {
        check(!g && err.code == st && st >= RK_E_INVALID_ARG && st < RK_STATUS_COUNT);
        check(strncmp(err.msg, "gguf: ", 6) == 0);
        free(buf);
        return 0;
    }
    uint32_t a = rk_gguf_alignment(g);
    check(a && !(a & (a - 1)) && rk_gguf_data_offset(g) % a == 0);
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++) walk_kv(g, rk_gguf_kv_at(g, i), buf, size);
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        check(t->n_dims >= 1 && t->n_dims <= 4 && t->n_bytes > 0 && t->offset % a == 0);
        check(rk_dtype_get(t->type) != NULL);
        check(inside(t->data, t->n_bytes, buf, size));
        const uint8_t *d = t->data;
        volatile uint8_t sink = (uint8_t)(d[0] ^ d[t->n_bytes - 1]);
        (void)sink;
        check(inside(t->name.ptr, t->name.len, buf, size));
    }
    rk_gguf_destroy(g);
    free(buf);
    return 0;
}
