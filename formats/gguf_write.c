/* GGUF v3 writer. Key/values are serialised as they are set (so insertion order
 * is file order); tensors are copied and laid out at finish. Each entry is fully
 * validated and its space reserved before any byte is appended, so a failed call
 * leaves the writer unchanged. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_impl.h"

typedef struct wkey {
    uint64_t off; /* of the key bytes in kvs */
    uint64_t len;
} wkey;

typedef struct wtensor {
    char *name;
    uint64_t name_len;
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[RK_GGUF_MAX_DIMS];
    void *data; /* owned copy, n_bytes */
    uint64_t n_bytes;
} wtensor;

struct rk_gguf_writer {
    uint32_t alignment;
    uint8_t *kvs; /* serialised key/value section */
    uint64_t kvs_len, kvs_cap;
    wkey *keys;
    uint64_t n_kv, cap_kv;
    wtensor *t;
    uint64_t n_t, cap_t;
};

static void *grow(void *p, uint64_t *cap, uint64_t want, size_t elem) {
    if (want <= *cap) return p;
    uint64_t c = *cap ? *cap : 16;
    while (c < want) {
        if (c > UINT64_MAX / 2) return NULL;
        c *= 2;
    }
    uint64_t bytes;
    if (!rk_mul_u64(c, elem, &bytes) || bytes > SIZE_MAX) return NULL;
    void *q = realloc(p, (size_t)bytes);
    if (q) *cap = c;
    return q;
}

/* ---- key/values ------------------------------------------------------------ */

static rk_str cstr(const char *s) { return (rk_str){s, s ? strlen(s) : 0}; }

static bool is_alignment_key(rk_str k) { return k.ptr && rk_str_eq(k, RK_GGUF_ALIGNMENT_KEY); }

static bool key_exists(const rk_gguf_writer *w, rk_str key) {
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (w->keys[i].len == key.len &&
            (key.len == 0 || memcmp(w->kvs + w->keys[i].off, key.ptr, (size_t)key.len) == 0))
            return true;
    return false;
}

/* Validates the key and reserves room for it plus value_bytes. */
static rk_status kv_begin(rk_gguf_writer *w, rk_str key, uint32_t type, uint64_t value_bytes, rk_err *err) {
    char nb[RK_GGUF_NAME_BUF];
    if (!w || !key.ptr) return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: set needs a writer and a key");
    if (is_alignment_key(key) && type != RK_GGUF_U32)
        return rk_err_set(err, RK_E_GGUF_ALIGN, "gguf writer: key '%s' must be u32 (got %s)", RK_GGUF_ALIGNMENT_KEY,
                          rk_gguf_type_name(type));
    if (key_exists(w, key))
        return rk_err_set(err, RK_E_GGUF_DUPLICATE, "gguf writer: duplicate key%s", rk_gguf_fmt_name(nb, key));
    uint64_t need = 8 + 4, total;
    if (!rk_add_u64(need, key.len, &need) || !rk_add_u64(need, value_bytes, &need) ||
        !rk_add_u64(w->kvs_len, need, &total))
        return rk_err_set(err, RK_E_GGUF_COUNT, "gguf writer: key%s value too large", rk_gguf_fmt_name(nb, key));
    uint8_t *kvs = grow(w->kvs, &w->kvs_cap, total, 1);
    if (!kvs) goto nomem;
    w->kvs = kvs;
    wkey *keys = grow(w->keys, &w->cap_kv, w->n_kv + 1, sizeof *keys);
    if (!keys) goto nomem;
    w->keys = keys;
    return RK_OK;
nomem:
    return rk_err_set(err, RK_E_NOMEM, "gguf writer: out of memory adding key%s", rk_gguf_fmt_name(nb, key));
}

/* Only after kv_begin reserved the space. */
static void put(rk_gguf_writer *w, const void *p, uint64_t n) {
    if (n) memcpy(w->kvs + w->kvs_len, p, (size_t)n);
    w->kvs_len += n;
}

static void put_u32(rk_gguf_writer *w, uint32_t v) { put(w, &v, 4); }

static void put_u64(rk_gguf_writer *w, uint64_t v) { put(w, &v, 8); }

static void put_key(rk_gguf_writer *w, rk_str key, uint32_t type) {
    put_u64(w, key.len);
    w->keys[w->n_kv++] = (wkey){w->kvs_len, key.len};
    put(w, key.ptr, key.len);
    put_u32(w, type);
}

static rk_status set_scalar(rk_gguf_writer *w, const char *key, uint32_t type, const void *v, rk_err *err) {
    uint32_t size = rk_gguf_type_size(type);
    rk_status st = kv_begin(w, cstr(key), type, size, err);
    if (st) return st;
    put_key(w, cstr(key), type);
    put(w, v, size);
    return RK_OK;
}

rk_status rk_gguf_writer_set_u32(rk_gguf_writer *w, const char *key, uint32_t v, rk_err *err) {
    if (w && is_alignment_key(cstr(key)) && v != w->alignment)
        return rk_err_set(err, RK_E_GGUF_ALIGN,
                          "gguf writer: key '%s' = %u differs from the writer's alignment %u "
                          "(pass it to rk_gguf_writer_create)",
                          key, v, w->alignment);
    return set_scalar(w, key, RK_GGUF_U32, &v, err);
}

rk_status rk_gguf_writer_set_i32(rk_gguf_writer *w, const char *key, int32_t v, rk_err *err) {
    return set_scalar(w, key, RK_GGUF_I32, &v, err);
}

rk_status rk_gguf_writer_set_u64(rk_gguf_writer *w, const char *key, uint64_t v, rk_err *err) {
    return set_scalar(w, key, RK_GGUF_U64, &v, err);
}

rk_status rk_gguf_writer_set_f32(rk_gguf_writer *w, const char *key, float v, rk_err *err) {
    return set_scalar(w, key, RK_GGUF_F32, &v, err);
}

rk_status rk_gguf_writer_set_f64(rk_gguf_writer *w, const char *key, double v, rk_err *err) {
    return set_scalar(w, key, RK_GGUF_F64, &v, err);
}

rk_status rk_gguf_writer_set_bool(rk_gguf_writer *w, const char *key, bool v, rk_err *err) {
    uint8_t b = v ? 1 : 0;
    return set_scalar(w, key, RK_GGUF_BOOL, &b, err);
}

rk_status rk_gguf_writer_set_str(rk_gguf_writer *w, const char *key, const char *v, rk_err *err) {
    if (!v) return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: key '%s' has a NULL string", key ? key : "(null)");
    uint64_t n = strlen(v);
    rk_status st = kv_begin(w, cstr(key), RK_GGUF_STRING, 8 + n, err);
    if (st) return st;
    put_key(w, cstr(key), RK_GGUF_STRING);
    put_u64(w, n);
    put(w, v, n);
    return RK_OK;
}

rk_status rk_gguf_writer_set_arr(rk_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n,
                                 rk_err *err) {
    const char *k = key ? key : "(null)";
    uint32_t size = rk_gguf_type_size(elem_type);
    if (!size)
        return rk_err_set(err, RK_E_GGUF_TYPE,
                          "gguf writer: key '%s' array element type %u (%s) is not a fixed-size "
                          "type",
                          k, elem_type, rk_gguf_type_name(elem_type));
    if (!data && n) return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: key '%s' has NULL array data", k);
    uint64_t bytes;
    if (!rk_mul_u64(n, size, &bytes) || !rk_add_u64(bytes, 12, &bytes))
        return rk_err_set(err, RK_E_GGUF_COUNT, "gguf writer: key '%s' array of %llu is too large", k,
                          (unsigned long long)n);
    rk_status st = kv_begin(w, cstr(key), RK_GGUF_ARRAY, bytes, err);
    if (st) return st;
    put_key(w, cstr(key), RK_GGUF_ARRAY);
    put_u32(w, elem_type);
    put_u64(w, n);
    put(w, data, bytes - 12);
    return RK_OK;
}

rk_status rk_gguf_writer_set_arr_str(rk_gguf_writer *w, const char *key, const char *const *strs, uint64_t n,
                                     rk_err *err) {
    const char *k = key ? key : "(null)";
    if (!strs && n) return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: key '%s' has NULL array data", k);
    uint64_t bytes = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: key '%s' string %llu is NULL", k,
                              (unsigned long long)i);
        if (!rk_add_u64(bytes, 8 + (uint64_t)strlen(strs[i]), &bytes))
            return rk_err_set(err, RK_E_GGUF_COUNT, "gguf writer: key '%s' strings too large", k);
    }
    rk_status st = kv_begin(w, cstr(key), RK_GGUF_ARRAY, bytes, err);
    if (st) return st;
    put_key(w, cstr(key), RK_GGUF_ARRAY);
    put_u32(w, RK_GGUF_STRING);
    put_u64(w, n);
    for (uint64_t i = 0; i < n; i++) {
        uint64_t len = strlen(strs[i]);
        put_u64(w, len);
        put(w, strs[i], len);
    }
    return RK_OK;
}

rk_status rk_gguf_writer_set_kv(rk_gguf_writer *w, const rk_gguf_kv *kv, rk_err *err) {
    char nb[RK_GGUF_NAME_BUF];
    if (!w || !kv || !kv->key.ptr || (!kv->data && kv->n))
        return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: set_kv needs a writer and a kv");
    uint64_t bytes = 0; /* of the value after the type (after the array header for arrays) */
    if (kv->type == RK_GGUF_STRING) {
        memcpy(&bytes, kv->data, 8);
        bytes += 8; /* parsed, so in bounds and small */
    } else if (kv->type == RK_GGUF_ARRAY && kv->arr_type == RK_GGUF_STRING) {
        const uint8_t *p = kv->data;
        for (uint64_t i = 0; i < kv->n; i++) {
            uint64_t n;
            memcpy(&n, p + bytes, 8);
            bytes += 8 + n;
        }
    } else if (kv->type == RK_GGUF_ARRAY && rk_gguf_type_size(kv->arr_type)) {
        if (!rk_mul_u64(kv->n, rk_gguf_type_size(kv->arr_type), &bytes))
            return rk_err_set(err, RK_E_GGUF_COUNT, "gguf writer: key%s array too large",
                              rk_gguf_fmt_name(nb, kv->key));
    } else if (kv->type != RK_GGUF_ARRAY && rk_gguf_type_size(kv->type)) {
        bytes = rk_gguf_type_size(kv->type);
    } else {
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf writer: key%s has type %s / %s", rk_gguf_fmt_name(nb, kv->key),
                          rk_gguf_type_name(kv->type), rk_gguf_type_name(kv->arr_type));
    }
    if (is_alignment_key(kv->key) && kv->type == RK_GGUF_U32) {
        uint32_t a;
        memcpy(&a, kv->data, 4);
        if (a != w->alignment)
            return rk_err_set(err, RK_E_GGUF_ALIGN, "gguf writer: key '%s' = %u differs from the writer's alignment %u",
                              RK_GGUF_ALIGNMENT_KEY, a, w->alignment);
        if (key_exists(w, kv->key)) return RK_OK; /* written by create */
    }
    bool arr = kv->type == RK_GGUF_ARRAY;
    rk_status st = kv_begin(w, kv->key, kv->type, bytes + (arr ? 12 : 0), err);
    if (st) return st;
    put_key(w, kv->key, kv->type);
    if (arr) {
        put_u32(w, kv->arr_type);
        put_u64(w, kv->n);
    }
    put(w, kv->data, bytes);
    return RK_OK;
}

/* ---- tensors ----------------------------------------------------------------- */

static rk_status tensor_bytes(const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne, uint64_t *out,
                              rk_err *err) {
    if (n_dims < 1 || n_dims > RK_GGUF_MAX_DIMS || !ne)
        return rk_err_set(err, RK_E_GGUF_DIM, "gguf writer: tensor '%s' n_dims %u (expected 1..%u)", name, n_dims,
                          RK_GGUF_MAX_DIMS);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] <= 0)
            return rk_err_set(err, RK_E_GGUF_DIM, "gguf writer: tensor '%s' ne[%u] = %lld (expected > 0)", name, d,
                              (long long)ne[d]);
        if (!rk_mul_u64(nel, (uint64_t)ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return rk_err_set(err, RK_E_GGUF_DIM, "gguf writer: tensor '%s' element count overflows", name);
    }
    const rk_dtype_traits *tr = rk_dtype_get(type);
    if (!tr) return rk_err_set(err, RK_E_GGUF_TYPE, "gguf writer: tensor '%s' has unknown type %u", name, type);
    if ((uint64_t)ne[0] % tr->blck_size)
        return rk_err_set(err, RK_E_GGUF_BLOCK,
                          "gguf writer: tensor '%s' row length %lld is not a multiple of the %s "
                          "block size %u",
                          name, (long long)ne[0], tr->name, tr->blck_size);
    uint64_t row;
    if (!rk_dtype_row_bytes(type, (uint64_t)ne[0], &row) || !rk_mul_u64(row, nel / (uint64_t)ne[0], out))
        return rk_err_set(err, RK_E_GGUF_DIM, "gguf writer: tensor '%s' byte size overflows", name);
    return RK_OK;
}

rk_status rk_gguf_writer_add_tensor(rk_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const int64_t *ne, const void *data, uint64_t n_bytes, rk_err *err) {
    if (!w || !name) return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: add_tensor needs a writer and a name");
    uint64_t want = 0;
    rk_status st = tensor_bytes(name, type, n_dims, ne, &want, err);
    if (st) return st;
    if (n_bytes != want)
        return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: tensor '%s' has %llu bytes (expected %llu for %s)", name,
                          (unsigned long long)n_bytes, (unsigned long long)want, rk_dtype_name(type));
    if (!data) return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: tensor '%s' has NULL data", name);
    size_t n = strlen(name);
    for (uint64_t i = 0; i < w->n_t; i++)
        if (w->t[i].name_len == n && memcmp(w->t[i].name, name, n) == 0)
            return rk_err_set(err, RK_E_GGUF_DUPLICATE, "gguf writer: duplicate tensor '%s'", name);
    if (n_bytes > SIZE_MAX) goto nomem;
    wtensor *t = grow(w->t, &w->cap_t, w->n_t + 1, sizeof *t);
    if (!t) goto nomem;
    w->t = t;
    wtensor nt = {.name = malloc(n + 1),
                  .name_len = n,
                  .type = type,
                  .n_dims = n_dims,
                  .data = malloc((size_t)n_bytes),
                  .n_bytes = n_bytes};
    if (!nt.name || !nt.data) {
        free(nt.name);
        free(nt.data);
        goto nomem;
    }
    memcpy(nt.name, name, n + 1);
    memcpy(nt.data, data, (size_t)n_bytes);
    for (uint32_t d = 0; d < RK_GGUF_MAX_DIMS; d++) nt.ne[d] = d < n_dims ? ne[d] : 1;
    w->t[w->n_t++] = nt;
    return RK_OK;
nomem:
    return rk_err_set(err, RK_E_NOMEM, "gguf writer: out of memory adding tensor '%s' (%llu bytes)", name,
                      (unsigned long long)n_bytes);
}

/* ---- create / finish --------------------------------------------------------- */

rk_status rk_gguf_writer_create(uint32_t alignment, rk_gguf_writer **out, rk_err *err) {
    rk_status st;
    rk_gguf_writer *w = NULL;
    if (!out) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: create needs an out pointer");
        goto fail;
    }
    if (alignment == 0) alignment = RK_GGUF_DEFAULT_ALIGNMENT;
    if (!rk_gguf_is_pow2(alignment)) {
        st = rk_err_set(err, RK_E_GGUF_ALIGN, "gguf writer: alignment %u is not a power of two", alignment);
        goto fail;
    }
    w = calloc(1, sizeof *w);
    if (!w) {
        st = rk_err_set(err, RK_E_NOMEM, "gguf writer: out of memory");
        goto fail;
    }
    w->alignment = alignment;
    /* Readers assume 32 when the key is absent. */
    if (alignment != RK_GGUF_DEFAULT_ALIGNMENT &&
        (st = rk_gguf_writer_set_u32(w, RK_GGUF_ALIGNMENT_KEY, alignment, err)))
        goto fail;
    *out = w;
    return RK_OK;
fail:
    rk_gguf_writer_destroy(w);
    return st;
}

void rk_gguf_writer_destroy(rk_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_t; i++) {
        free(w->t[i].name);
        free(w->t[i].data);
    }
    free(w->t);
    free(w->kvs);
    free(w->keys);
    free(w);
}

static bool align_up(uint64_t x, uint64_t a, uint64_t *out) {
    if (!rk_add_u64(x, a - 1, out)) return false;
    *out = *out / a * a;
    return true;
}

static uint8_t *emit(uint8_t *p, const void *v, uint64_t n) {
    if (n) memcpy(p, v, (size_t)n);
    return p + n;
}

rk_status rk_gguf_writer_finish(rk_gguf_writer *w, void **bytes, size_t *len, rk_err *err) {
    if (!w || !bytes || !len)
        return rk_err_set(err, RK_E_INVALID_ARG, "gguf writer: finish needs a writer and outputs");
    const uint64_t a = w->alignment;
    /* header (magic, version, n_tensors, n_kv) + key/values + tensor infos */
    uint64_t head = 24 + w->kvs_len, data = 0, total;
    bool ok = true;
    for (uint64_t i = 0; i < w->n_t && ok; i++) {
        const wtensor *t = &w->t[i];
        ok = rk_add_u64(head, 8 + t->name_len + 4 + 8ull * t->n_dims + 4 + 8, &head) &&
             rk_add_u64(data, t->n_bytes, &data) && align_up(data, a, &data);
    }
    uint64_t data_start = head;
    ok = ok && (!w->n_t || align_up(head, a, &data_start)) && rk_add_u64(data_start, data, &total) && total <= SIZE_MAX;
    if (!ok) return rk_err_set(err, RK_E_GGUF_COUNT, "gguf writer: file size overflows");
    uint8_t *buf = calloc((size_t)total ? (size_t)total : 1, 1); /* zeroed padding */
    if (!buf)
        return rk_err_set(err, RK_E_NOMEM, "gguf writer: out of memory for %llu bytes", (unsigned long long)total);
    uint8_t *p = emit(buf, "GGUF", 4);
    uint32_t version = 3;
    p = emit(p, &version, 4);
    p = emit(p, &w->n_t, 8);
    p = emit(p, &w->n_kv, 8);
    p = emit(p, w->kvs, w->kvs_len);
    uint64_t off = 0;
    for (uint64_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        p = emit(p, &t->name_len, 8);
        p = emit(p, t->name, t->name_len);
        p = emit(p, &t->n_dims, 4);
        for (uint32_t d = 0; d < t->n_dims; d++) p = emit(p, &t->ne[d], 8);
        p = emit(p, &t->type, 4);
        p = emit(p, &off, 8);
        memcpy(buf + data_start + off, t->data, (size_t)t->n_bytes);
        off = (off + t->n_bytes + a - 1) / a * a; /* fits: checked above */
    }
    *bytes = buf;
    *len = (size_t)total;
    return RK_OK;
}
