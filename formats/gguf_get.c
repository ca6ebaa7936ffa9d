/* Typed getters over a parsed GGUF. Values live in the caller's bytes, possibly
 * unaligned, so every read goes through memcpy. */
#include <stdint.h>
#include <string.h>

#include "gguf_impl.h"

/* An integer value widened without loss: neg ? i : u. */
typedef struct wide {
    bool neg;
    uint64_t u;
    int64_t i;
} wide;

static bool is_int_type(uint32_t t) {
    switch (t) {
    case RK_GGUF_U8:
    case RK_GGUF_I8:
    case RK_GGUF_U16:
    case RK_GGUF_I16:
    case RK_GGUF_U32:
    case RK_GGUF_I32:
    case RK_GGUF_U64:
    case RK_GGUF_I64: return true;
    default: return false;
    }
}

/* t must satisfy is_int_type. */
static wide load_int(uint32_t t, const uint8_t *p) {
    wide w = {false, 0, 0};
    switch (t) {
    case RK_GGUF_U8: w.u = p[0]; return w;
    case RK_GGUF_I8: w.i = (int8_t)p[0]; break;
    case RK_GGUF_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        w.u = v;
        return w;
    }
    case RK_GGUF_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        w.i = v;
        break;
    }
    case RK_GGUF_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        w.u = v;
        return w;
    }
    case RK_GGUF_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        w.i = v;
        break;
    }
    case RK_GGUF_U64: memcpy(&w.u, p, 8); return w;
    default: memcpy(&w.i, p, 8); break; /* I64 */
    }
    if (w.i < 0) w.neg = true;
    else w.u = (uint64_t)w.i;
    return w;
}

/* t must be an integer or float type. */
static double load_num(uint32_t t, const uint8_t *p) {
    if (t == RK_GGUF_F32) {
        float f;
        memcpy(&f, p, 4);
        return f;
    }
    if (t == RK_GGUF_F64) {
        double d;
        memcpy(&d, p, 8);
        return d;
    }
    wide w = load_int(t, p);
    return w.neg ? (double)w.i : (double)w.u;
}

static rk_status find(const rk_gguf *g, const char *key, const rk_gguf_kv **kv, rk_err *err) {
    if (!g || !key) return rk_err_set(err, RK_E_INVALID_ARG, "gguf: get needs a parsed file and a key");
    *kv = rk_gguf_find_kv(g, key);
    if (!*kv) return rk_err_set(err, RK_E_NOT_FOUND, "gguf: key '%s' not found", key);
    return RK_OK;
}

static rk_status wrong_type(const rk_gguf_kv *kv, const char *want, rk_err *err) {
    char nb[RK_GGUF_NAME_BUF];
    if (kv->type == RK_GGUF_ARRAY)
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s is an array of %s (expected %s)",
                          rk_gguf_fmt_name(nb, kv->key), rk_gguf_type_name(kv->arr_type), want);
    return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s is %s (expected %s)", rk_gguf_fmt_name(nb, kv->key),
                      rk_gguf_type_name(kv->type), want);
}

static rk_status get_int(const rk_gguf *g, const char *key, wide *w, rk_err *err) {
    const rk_gguf_kv *kv;
    rk_status st = find(g, key, &kv, err);
    if (st) return st;
    if (!is_int_type(kv->type)) return wrong_type(kv, "an integer", err);
    *w = load_int(kv->type, kv->data);
    return RK_OK;
}

static rk_status no_fit(const char *key, wide w, const char *to, rk_err *err) {
    if (w.neg)
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key '%s' value %lld does not fit %s", key, (long long)w.i, to);
    return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key '%s' value %llu does not fit %s", key, (unsigned long long)w.u,
                      to);
}

rk_status rk_gguf_get_u32(const rk_gguf *g, const char *key, uint32_t *out, rk_err *err) {
    wide w = {false, 0, 0};
    rk_status st = get_int(g, key, &w, err);
    if (st) return st;
    if (w.neg || w.u > UINT32_MAX) return no_fit(key, w, "u32", err);
    *out = (uint32_t)w.u;
    return RK_OK;
}

rk_status rk_gguf_get_u64(const rk_gguf *g, const char *key, uint64_t *out, rk_err *err) {
    wide w = {false, 0, 0};
    rk_status st = get_int(g, key, &w, err);
    if (st) return st;
    if (w.neg) return no_fit(key, w, "u64", err);
    *out = w.u;
    return RK_OK;
}

rk_status rk_gguf_get_i64(const rk_gguf *g, const char *key, int64_t *out, rk_err *err) {
    wide w = {false, 0, 0};
    rk_status st = get_int(g, key, &w, err);
    if (st) return st;
    if (!w.neg && w.u > (uint64_t)INT64_MAX) return no_fit(key, w, "i64", err);
    *out = w.neg ? w.i : (int64_t)w.u;
    return RK_OK;
}

rk_status rk_gguf_get_f32(const rk_gguf *g, const char *key, float *out, rk_err *err) {
    const rk_gguf_kv *kv;
    rk_status st = find(g, key, &kv, err);
    if (st) return st;
    if (kv->type != RK_GGUF_F32 && kv->type != RK_GGUF_F64 && !is_int_type(kv->type))
        return wrong_type(kv, "a number", err);
    *out = (float)load_num(kv->type, kv->data);
    return RK_OK;
}

rk_status rk_gguf_get_bool(const rk_gguf *g, const char *key, bool *out, rk_err *err) {
    const rk_gguf_kv *kv;
    rk_status st = find(g, key, &kv, err);
    if (st) return st;
    if (kv->type != RK_GGUF_BOOL) return wrong_type(kv, "bool", err);
    *out = kv->data[0] != 0;
    return RK_OK;
}

rk_status rk_gguf_get_str(const rk_gguf *g, const char *key, rk_str *out, rk_err *err) {
    const rk_gguf_kv *kv;
    rk_status st = find(g, key, &kv, err);
    if (st) return st;
    if (kv->type != RK_GGUF_STRING) return wrong_type(kv, "string", err);
    uint64_t n;
    memcpy(&n, kv->data, 8);
    *out = (rk_str){(const char *)kv->data + 8, n};
    return RK_OK;
}

/* ---- arrays ---------------------------------------------------------------- */

static rk_status check_elem(const rk_gguf_kv *kv, uint64_t i, rk_err *err) {
    char nb[RK_GGUF_NAME_BUF];
    if (!kv) return rk_err_set(err, RK_E_INVALID_ARG, "gguf: array access needs a kv");
    if (kv->type != RK_GGUF_ARRAY)
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s is %s (expected an array)", rk_gguf_fmt_name(nb, kv->key),
                          rk_gguf_type_name(kv->type));
    if (i >= kv->n)
        return rk_err_set(err, RK_E_INVALID_ARG, "gguf: key%s index %llu out of range (n %llu)",
                          rk_gguf_fmt_name(nb, kv->key), (unsigned long long)i, (unsigned long long)kv->n);
    return RK_OK;
}

rk_status rk_gguf_arr_str(const rk_gguf *g, const rk_gguf_kv *kv, uint64_t i, rk_str *out, rk_err *err) {
    rk_status st = check_elem(kv, i, err);
    if (st) return st;
    /* kv must be one of g's own entries: the index of its strings lives in g. */
    uintptr_t p = (uintptr_t)kv, b = g ? (uintptr_t)g->kv : 0;
    if (!g || p < b || p >= b + g->n_kv * sizeof *kv || (p - b) % sizeof *kv)
        return rk_err_set(err, RK_E_INVALID_ARG, "gguf: kv passed to arr_str is not from this file");
    if (kv->arr_type != RK_GGUF_STRING) {
        char nb[RK_GGUF_NAME_BUF];
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s is an array of %s (expected string)",
                          rk_gguf_fmt_name(nb, kv->key), rk_gguf_type_name(kv->arr_type));
    }
    uint64_t off = g->str_off[g->kv_str0[(p - b) / sizeof *kv] + i];
    uint64_t n;
    memcpy(&n, g->bytes + off, 8);
    *out = (rk_str){(const char *)g->bytes + off + 8, n};
    return RK_OK;
}

rk_status rk_gguf_arr_f32(const rk_gguf_kv *kv, uint64_t i, float *out, rk_err *err) {
    rk_status st = check_elem(kv, i, err);
    if (st) return st;
    uint32_t t = kv->arr_type;
    if (t != RK_GGUF_F32 && t != RK_GGUF_F64 && !is_int_type(t)) {
        char nb[RK_GGUF_NAME_BUF];
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s is an array of %s (expected numbers)",
                          rk_gguf_fmt_name(nb, kv->key), rk_gguf_type_name(t));
    }
    *out = (float)load_num(t, kv->data + i * rk_gguf_type_size(t));
    return RK_OK;
}

rk_status rk_gguf_arr_i64(const rk_gguf_kv *kv, uint64_t i, int64_t *out, rk_err *err) {
    rk_status st = check_elem(kv, i, err);
    if (st) return st;
    char nb[RK_GGUF_NAME_BUF];
    uint32_t t = kv->arr_type;
    if (!is_int_type(t))
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s is an array of %s (expected integers)",
                          rk_gguf_fmt_name(nb, kv->key), rk_gguf_type_name(t));
    wide w = load_int(t, kv->data + i * rk_gguf_type_size(t));
    if (!w.neg && w.u > (uint64_t)INT64_MAX)
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: key%s element %llu = %llu does not fit i64",
                          rk_gguf_fmt_name(nb, kv->key), (unsigned long long)i, (unsigned long long)w.u);
    *out = w.neg ? w.i : (int64_t)w.u;
    return RK_OK;
}
