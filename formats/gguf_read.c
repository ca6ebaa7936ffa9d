/* GGUF v2/v3 parser: one pass over the header that validates everything, then
 * hash indexes for keys and tensor names and an offset index for string arrays.
 * Nothing here trusts a count or length before checking it against the bytes left. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_impl.h"

/* Smallest encodings, used to reject counts that cannot fit before allocating. */
#define MIN_KV_BYTES 13u     /* key length (8) + value type (4) + a 1-byte value */
#define MIN_TENSOR_BYTES 32u /* name length (8) + n_dims (4) + ne[0] (8) + type (4) + offset (8) */
#define STR_HDR_BYTES 8u     /* u64 length prefix */


typedef struct cur {
    const uint8_t *b;
    size_t len;
    size_t pos; /* invariant: pos <= len */
    rk_err *err;
} cur;

static const rk_str no_name = {NULL, 0};

const char *rk_gguf_type_name(uint32_t t) {
    static const char *const names[RK_GGUF_TYPE_COUNT] = {
        [RK_GGUF_U8] = "u8",         [RK_GGUF_I8] = "i8",       [RK_GGUF_U16] = "u16", [RK_GGUF_I16] = "i16",
        [RK_GGUF_U32] = "u32",       [RK_GGUF_I32] = "i32",     [RK_GGUF_F32] = "f32", [RK_GGUF_BOOL] = "bool",
        [RK_GGUF_STRING] = "string", [RK_GGUF_ARRAY] = "array", [RK_GGUF_U64] = "u64", [RK_GGUF_I64] = "i64",
        [RK_GGUF_F64] = "f64",
    };
    return t < RK_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

/* GGML type ids we do not load, named so the message says what the file holds. */
static const char *ggml_type_hint(uint32_t t) {
    switch (t) {
    case 6: return "q5_0";
    case 7: return "q5_1";
    case 10: return "q2_K";
    case 11: return "q3_K";
    case 13: return "q5_K";
    case 16: return "iq2_xxs";
    case 17: return "iq2_xs";
    case 18: return "iq3_xxs";
    case 19: return "iq1_s";
    case 20: return "iq4_nl";
    case 21: return "iq3_s";
    case 22: return "iq2_s";
    case 23: return "iq4_xs";
    case 24: return "i8";
    case 25: return "i16";
    case 26: return "i32";
    case 27: return "i64";
    case 28: return "f64";
    case 29: return "iq1_m";
    case 34: return "tq1_0";
    case 35: return "tq2_0";
    case 39: return "mxfp4";
    default: return "unknown";
    }
}

bool rk_str_eq(rk_str s, const char *c) {
    if (!c) return false;
    size_t n = strlen(c);
    return s.len == n && (n == 0 || memcmp(s.ptr, c, n) == 0);
}

static uint64_t hash_bytes(const char *p, uint64_t n) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */
    for (uint64_t i = 0; i < n; i++) h = (h ^ (uint8_t)p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t sat_add(uint64_t a, uint64_t b) {
    uint64_t s;
    return rk_add_u64(a, b, &s) ? s : UINT64_MAX;
}

/* ---- cursor ----------------------------------------------------------- */

static size_t left(const cur *c) { return c->len - c->pos; }

static rk_status need(cur *c, size_t n, const char *what, rk_str who) {
    if (n <= left(c)) return RK_OK;
    char nb[RK_GGUF_NAME_BUF];
    return rk_err_set(c->err, RK_E_GGUF_TRUNCATED,
                      "gguf: truncated at offset %zu reading %s%s (need %zu bytes, %zu left)", c->pos, what,
                      rk_gguf_fmt_name(nb, who), n, left(c));
}

static rk_status rd_u32(cur *c, uint32_t *v, const char *what, rk_str who) {
    rk_status st = need(c, 4, what, who);
    if (st) return st;
    memcpy(v, c->b + c->pos, 4);
    c->pos += 4;
    return RK_OK;
}

static rk_status rd_u64(cur *c, uint64_t *v, const char *what, rk_str who) {
    rk_status st = need(c, 8, what, who);
    if (st) return st;
    memcpy(v, c->b + c->pos, 8);
    c->pos += 8;
    return RK_OK;
}

/* what/who name the string in messages ("key #3", "name of tensor #7", ...). */
static rk_status rd_str(cur *c, rk_str *s, const char *what, rk_str who) {
    uint64_t n;
    size_t at = c->pos;
    rk_status st = rd_u64(c, &n, what, who);
    if (st) return st;
    if (n > left(c)) {
        char nb[RK_GGUF_NAME_BUF];
        return rk_err_set(c->err, RK_E_GGUF_COUNT,
                          "gguf: %s%s at offset %zu has length %llu but only %zu bytes are left", what,
                          rk_gguf_fmt_name(nb, who), at, (unsigned long long)n, left(c));
    }
    s->ptr = (const char *)(c->b + c->pos);
    s->len = n;
    c->pos += (size_t)n;
    return RK_OK;
}

/* ---- name index --------------------------------------------------------- */

static uint64_t *table_new(uint64_t n, uint64_t *mask) {
    uint64_t cap = 8;
    while (cap < 2 * n) cap *= 2; /* n <= len / 13, so no overflow */
    *mask = cap - 1;
    return calloc((size_t)cap, sizeof(uint64_t));
}

/* Slot holding name s, or the empty slot where it would go. Entries are indexes
 * into base (element size stride, rk_str at name_off) plus one. */
static uint64_t table_probe(const uint64_t *slots, uint64_t mask, const void *base, size_t stride, size_t name_off,
                            const char *p, uint64_t n) {
    uint64_t i = hash_bytes(p, n) & mask;
    for (;;) {
        uint64_t e = slots[i];
        if (!e) return i;
        const rk_str *s = (const rk_str *)((const char *)base + (e - 1) * stride + name_off);
        if (s->len == n && (n == 0 || memcmp(s->ptr, p, (size_t)n) == 0)) return i;
        i = (i + 1) & mask;
    }
}

/* ---- key/value section -------------------------------------------------- */

static rk_status str_pool_reserve(rk_gguf *g, uint64_t more, rk_err *err) {
    uint64_t want = g->n_str + more; /* sum of counts already bounded by len / 8 */
    if (want <= g->cap_str) return RK_OK;
    uint64_t cap = g->cap_str ? g->cap_str : 64;
    while (cap < want) cap *= 2;
    uint64_t *p = realloc(g->str_off, (size_t)cap * sizeof *p);
    if (!p) return rk_err_set(err, RK_E_NOMEM, "gguf: out of memory indexing %llu strings", (unsigned long long)want);
    g->str_off = p;
    g->cap_str = cap;
    return RK_OK;
}

static rk_status parse_str_array(rk_gguf *g, cur *c, uint64_t ki) {
    rk_gguf_kv *kv = &g->kv[ki];
    char nb[RK_GGUF_NAME_BUF];
    if (kv->n > left(c) / STR_HDR_BYTES)
        return rk_err_set(c->err, RK_E_GGUF_COUNT,
                          "gguf: key%s: array of %llu strings at offset %zu cannot fit in the "
                          "%zu bytes left (8 bytes or more each)",
                          rk_gguf_fmt_name(nb, kv->key), (unsigned long long)kv->n, c->pos, left(c));
    rk_status st = str_pool_reserve(g, kv->n, c->err);
    if (st) return st;
    g->kv_str0[ki] = g->n_str;
    for (uint64_t i = 0; i < kv->n; i++) {
        uint64_t n;
        size_t at = c->pos;
        if (left(c) < STR_HDR_BYTES)
            return rk_err_set(c->err, RK_E_GGUF_TRUNCATED,
                              "gguf: truncated at offset %zu reading length of string %llu of "
                              "key%s (need 8 bytes, %zu left)",
                              at, (unsigned long long)i, rk_gguf_fmt_name(nb, kv->key), left(c));
        memcpy(&n, c->b + at, 8);
        c->pos += STR_HDR_BYTES;
        if (n > left(c))
            return rk_err_set(c->err, RK_E_GGUF_COUNT,
                              "gguf: key%s: string %llu at offset %zu has length %llu but only "
                              "%zu bytes are left",
                              rk_gguf_fmt_name(nb, kv->key), (unsigned long long)i, at, (unsigned long long)n, left(c));
        g->str_off[g->n_str++] = at;
        c->pos += (size_t)n;
    }
    return RK_OK;
}

static rk_status parse_value(rk_gguf *g, cur *c, uint64_t ki) {
    rk_gguf_kv *kv = &g->kv[ki];
    char nb[RK_GGUF_NAME_BUF];
    uint32_t t;
    size_t at = c->pos;
    rk_status st = rd_u32(c, &t, "value type of key", kv->key);
    if (st) return st;
    if (t >= RK_GGUF_TYPE_COUNT)
        return rk_err_set(c->err, RK_E_GGUF_TYPE,
                          "gguf: key%s has unknown value type %u at offset %zu (expected 0..%d)",
                          rk_gguf_fmt_name(nb, kv->key), t, at, RK_GGUF_TYPE_COUNT - 1);
    kv->type = t;
    kv->arr_type = t;
    kv->n = 1;
    if (t == RK_GGUF_STRING) {
        kv->data = c->b + c->pos;
        rk_str s;
        return rd_str(c, &s, "string value of key", kv->key);
    }
    if (t != RK_GGUF_ARRAY) {
        uint32_t size = rk_gguf_type_size(t);
        if ((st = need(c, size, "value of key", kv->key))) return st;
        kv->data = c->b + c->pos;
        c->pos += size;
        return RK_OK;
    }
    uint32_t et;
    at = c->pos;
    if ((st = rd_u32(c, &et, "array element type of key", kv->key))) return st;
    if (et >= RK_GGUF_TYPE_COUNT || et == RK_GGUF_ARRAY)
        return rk_err_set(c->err, RK_E_GGUF_TYPE, "gguf: key%s has %s array element type %u at offset %zu",
                          rk_gguf_fmt_name(nb, kv->key), et == RK_GGUF_ARRAY ? "unsupported (nested)" : "unknown", et,
                          at);
    if ((st = rd_u64(c, &kv->n, "array length of key", kv->key))) return st;
    kv->arr_type = et;
    kv->data = c->b + c->pos;
    if (et == RK_GGUF_STRING) return parse_str_array(g, c, ki);
    uint32_t size = rk_gguf_type_size(et);
    if (kv->n > left(c) / size)
        return rk_err_set(c->err, RK_E_GGUF_COUNT,
                          "gguf: key%s: array of %llu %s at offset %zu needs more than the %zu "
                          "bytes left",
                          rk_gguf_fmt_name(nb, kv->key), (unsigned long long)kv->n, rk_gguf_type_name(et), c->pos,
                          left(c));
    c->pos += (size_t)(kv->n * size);
    return RK_OK;
}

static rk_status parse_kvs(rk_gguf *g, cur *c) {
    char nb[RK_GGUF_NAME_BUF];
    char what[48];
    for (uint64_t i = 0; i < g->n_kv; i++) {
        rk_gguf_kv *kv = &g->kv[i];
        snprintf(what, sizeof what, "key #%llu", (unsigned long long)i);
        rk_status st = rd_str(c, &kv->key, what, no_name);
        if (st) return st;
        uint64_t s = table_probe(g->kv_slots, g->kv_mask, g->kv, sizeof *kv, offsetof(rk_gguf_kv, key), kv->key.ptr,
                                 kv->key.len);
        if (g->kv_slots[s])
            return rk_err_set(c->err, RK_E_GGUF_DUPLICATE, "gguf: duplicate key%s (entries #%llu and #%llu)",
                              rk_gguf_fmt_name(nb, kv->key), (unsigned long long)(g->kv_slots[s] - 1),
                              (unsigned long long)i);
        g->kv_slots[s] = i + 1;
        if ((st = parse_value(g, c, i))) return st;
    }
    return RK_OK;
}

static rk_status read_alignment(rk_gguf *g, rk_err *err) {
    g->alignment = RK_GGUF_DEFAULT_ALIGNMENT;
    const rk_gguf_kv *kv = rk_gguf_find_kv(g, RK_GGUF_ALIGNMENT_KEY);
    if (!kv) return RK_OK;
    if (kv->type != RK_GGUF_U32)
        return rk_err_set(err, RK_E_GGUF_ALIGN, "gguf: key '%s' has type %s (expected u32)", RK_GGUF_ALIGNMENT_KEY,
                          rk_gguf_type_name(kv->type));
    uint32_t a;
    memcpy(&a, kv->data, 4);
    if (!rk_gguf_is_pow2(a))
        return rk_err_set(err, RK_E_GGUF_ALIGN, "gguf: key '%s' is %u (expected a nonzero power of two)",
                          RK_GGUF_ALIGNMENT_KEY, a);
    g->alignment = a;
    return RK_OK;
}

/* ---- tensor infos ------------------------------------------------------- */

/* Shape, type and size of one tensor; n_bytes is set on success. */
static rk_status check_shape(rk_gguf_tensor *t, const uint64_t *ne, rk_err *err) {
    char nb[RK_GGUF_NAME_BUF];
    const char *nm = rk_gguf_fmt_name(nb, t->name);
    uint64_t nel = 1;
    for (uint32_t d = 0; d < t->n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX)
            return rk_err_set(err, RK_E_GGUF_DIM, "gguf: tensor%s ne[%u] = %lld (expected > 0)", nm, d,
                              (long long)ne[d]);
        if (!rk_mul_u64(nel, ne[d], &nel) || nel > (uint64_t)INT64_MAX)
            return rk_err_set(err, RK_E_GGUF_DIM, "gguf: tensor%s element count overflows at ne[%u] = %llu", nm, d,
                              (unsigned long long)ne[d]);
        t->ne[d] = (int64_t)ne[d];
    }
    const rk_dtype_traits *tr = rk_dtype_get(t->type);
    if (!tr)
        return rk_err_set(err, RK_E_GGUF_TYPE, "gguf: tensor%s has unsupported tensor type %u (%s)", nm, t->type,
                          ggml_type_hint(t->type));
    if (ne[0] % tr->blck_size)
        return rk_err_set(err, RK_E_GGUF_BLOCK,
                          "gguf: tensor%s row length ne[0] = %llu is not a multiple of the %s "
                          "block size %u",
                          nm, (unsigned long long)ne[0], tr->name, tr->blck_size);
    uint64_t row;
    if (!rk_dtype_row_bytes(t->type, ne[0], &row) || !rk_mul_u64(row, nel / ne[0], &t->n_bytes))
        return rk_err_set(err, RK_E_GGUF_DIM, "gguf: tensor%s byte size overflows (%s, %llu elements)", nm, tr->name,
                          (unsigned long long)nel);
    return RK_OK;
}

static rk_status parse_tensor(rk_gguf *g, cur *c, uint64_t i) {
    rk_gguf_tensor *t = &g->tensors[i];
    char nb[RK_GGUF_NAME_BUF];
    char what[48];
    snprintf(what, sizeof what, "name of tensor #%llu", (unsigned long long)i);
    rk_status st = rd_str(c, &t->name, what, no_name);
    if (st) return st;
    uint64_t s = table_probe(g->t_slots, g->t_mask, g->tensors, sizeof *t, offsetof(rk_gguf_tensor, name), t->name.ptr,
                             t->name.len);
    if (g->t_slots[s])
        return rk_err_set(c->err, RK_E_GGUF_DUPLICATE, "gguf: duplicate tensor%s (tensors #%llu and #%llu)",
                          rk_gguf_fmt_name(nb, t->name), (unsigned long long)(g->t_slots[s] - 1),
                          (unsigned long long)i);
    g->t_slots[s] = i + 1;
    if ((st = rd_u32(c, &t->n_dims, "n_dims of tensor", t->name))) return st;
    if (t->n_dims < 1 || t->n_dims > RK_GGUF_MAX_DIMS)
        return rk_err_set(c->err, RK_E_GGUF_DIM, "gguf: tensor%s has n_dims %u (expected 1..%u)",
                          rk_gguf_fmt_name(nb, t->name), t->n_dims, RK_GGUF_MAX_DIMS);
    uint64_t ne[RK_GGUF_MAX_DIMS];
    for (uint32_t d = 0; d < RK_GGUF_MAX_DIMS; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if ((st = rd_u64(c, &ne[d], "shape of tensor", t->name))) return st;
    if ((st = rd_u32(c, &t->type, "type of tensor", t->name))) return st;
    if ((st = rd_u64(c, &t->offset, "data offset of tensor", t->name))) return st;
    if ((st = check_shape(t, ne, c->err))) return st;
    if (t->offset % g->alignment)
        return rk_err_set(c->err, RK_E_GGUF_ALIGN, "gguf: tensor%s offset %llu is not a multiple of the alignment %u",
                          rk_gguf_fmt_name(nb, t->name), (unsigned long long)t->offset, g->alignment);
    return RK_OK;
}

static rk_status check_bounds(rk_gguf *g, rk_err *err) {
    char nb[RK_GGUF_NAME_BUF];
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        rk_gguf_tensor *t = &g->tensors[i];
        uint64_t len = g->len;
        if (g->data_offset > len || t->offset > len - g->data_offset || t->n_bytes > len - g->data_offset - t->offset) {
            uint64_t a = sat_add(g->data_offset, t->offset);
            return rk_err_set(err, RK_E_GGUF_BOUNDS, "gguf: tensor%s data [%llu, %llu) past end of file (len %zu)",
                              rk_gguf_fmt_name(nb, t->name), (unsigned long long)a,
                              (unsigned long long)sat_add(a, t->n_bytes), g->len);
        }
        t->data = g->bytes + g->data_offset + t->offset;
    }
    return RK_OK;
}

typedef struct span {
    uint64_t start, end, idx;
} span;

static int span_cmp(const void *a, const void *b) {
    const span *x = a, *y = b;
    return (x->start > y->start) - (x->start < y->start);
}

static rk_status check_overlap(rk_gguf *g, rk_err *err) {
    if (g->n_tensors < 2) return RK_OK;
    span *s = malloc((size_t)g->n_tensors * sizeof *s);
    if (!s) return rk_err_set(err, RK_E_NOMEM, "gguf: out of memory checking tensor overlap");
    for (uint64_t i = 0; i < g->n_tensors; i++)
        s[i] = (span){g->tensors[i].offset, g->tensors[i].offset + g->tensors[i].n_bytes, i};
    qsort(s, (size_t)g->n_tensors, sizeof *s, span_cmp);
    rk_status st = RK_OK;
    uint64_t far = 0; /* index into s of the span reaching furthest so far */
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        if (s[i].start < s[far].end) {
            const rk_gguf_tensor *a = &g->tensors[s[far].idx], *b = &g->tensors[s[i].idx];
            char na[RK_GGUF_NAME_BUF], nb[RK_GGUF_NAME_BUF];
            st = rk_err_set(err, RK_E_GGUF_OVERLAP,
                            "gguf: tensors%s [%llu, %llu) and%s [%llu, %llu) overlap "
                            "(offsets relative to the data section at %llu)",
                            rk_gguf_fmt_name(na, a->name), (unsigned long long)s[far].start,
                            (unsigned long long)s[far].end, rk_gguf_fmt_name(nb, b->name),
                            (unsigned long long)s[i].start, (unsigned long long)s[i].end,
                            (unsigned long long)g->data_offset);
            break;
        }
        if (s[i].end > s[far].end) far = i;
    }
    free(s);
    return st;
}

/* ---- parse ---------------------------------------------------------------- */

static rk_status parse_header(rk_gguf *g, cur *c) {
    static const uint8_t magic[4] = {'G', 'G', 'U', 'F'};
    rk_status st = need(c, 4, "magic", no_name);
    if (st) return st;
    if (memcmp(c->b, magic, 4) != 0)
        return rk_err_set(c->err, RK_E_GGUF_MAGIC,
                          "gguf: bad magic at offset 0 (expected 47 47 55 46 \"GGUF\" vs got "
                          "%02x %02x %02x %02x)",
                          c->b[0], c->b[1], c->b[2], c->b[3]);
    c->pos = 4;
    if ((st = rd_u32(c, &g->version, "version", no_name))) return st;
    if (g->version == 1)
        return rk_err_set(c->err, RK_E_GGUF_VERSION,
                          "gguf: GGUF version 1 is unsupported (old format with 32-bit counts); "
                          "re-convert the model with a current llama.cpp to get GGUF v3");
    if (g->version != 2 && g->version != 3) {
        uint32_t sw = __builtin_bswap32(g->version);
        return rk_err_set(c->err, RK_E_GGUF_VERSION, "gguf: unsupported GGUF version %u (expected 2 or 3)%s",
                          g->version, (sw >= 1 && sw <= 3) ? "; this looks like a big-endian file" : "");
    }
    if ((st = rd_u64(c, &g->n_tensors, "tensor count", no_name))) return st;
    if ((st = rd_u64(c, &g->n_kv, "key/value count", no_name))) return st;
    uint64_t rest = left(c);
    if (g->n_kv > rest / MIN_KV_BYTES)
        return rk_err_set(c->err, RK_E_GGUF_COUNT,
                          "gguf: n_kv %llu cannot fit in the %llu bytes after offset %zu "
                          "(absurd count or truncated file)",
                          (unsigned long long)g->n_kv, (unsigned long long)rest, c->pos);
    rest -= g->n_kv * MIN_KV_BYTES;
    if (g->n_tensors > rest / MIN_TENSOR_BYTES)
        return rk_err_set(c->err, RK_E_GGUF_COUNT,
                          "gguf: n_tensors %llu cannot fit in the %zu bytes after offset %zu "
                          "with %llu keys (absurd count or truncated file)",
                          (unsigned long long)g->n_tensors, left(c), c->pos, (unsigned long long)g->n_kv);
    return RK_OK;
}

rk_status rk_gguf_parse(const void *bytes, size_t len, rk_gguf **out, rk_err *err) {
    rk_status st;
    rk_gguf *g = NULL;
    if (!out || (!bytes && len)) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "gguf: parse needs bytes and an out pointer");
        goto fail;
    }
    cur c = {bytes, len, 0, err};
    g = calloc(1, sizeof *g);
    if (!g) {
        st = rk_err_set(err, RK_E_NOMEM, "gguf: out of memory");
        goto fail;
    }
    g->bytes = bytes;
    g->len = len;
    if ((st = parse_header(g, &c))) goto fail;
    /* Counts are bounded by len above, so these sizes cannot overflow. */
    g->kv = calloc((size_t)g->n_kv + 1, sizeof *g->kv);
    g->kv_str0 = calloc((size_t)g->n_kv + 1, sizeof *g->kv_str0);
    g->tensors = calloc((size_t)g->n_tensors + 1, sizeof *g->tensors);
    g->kv_slots = table_new(g->n_kv, &g->kv_mask);
    g->t_slots = table_new(g->n_tensors, &g->t_mask);
    if (!g->kv || !g->kv_str0 || !g->tensors || !g->kv_slots || !g->t_slots) {
        st = rk_err_set(err, RK_E_NOMEM, "gguf: out of memory for %llu keys and %llu tensors",
                        (unsigned long long)g->n_kv, (unsigned long long)g->n_tensors);
        goto fail;
    }
    if ((st = parse_kvs(g, &c))) goto fail;
    if ((st = read_alignment(g, err))) goto fail;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if ((st = parse_tensor(g, &c, i))) goto fail;
    uint64_t a = g->alignment;
    g->data_offset = ((uint64_t)c.pos + a - 1) / a * a; /* pos <= len, a <= 2^31 */
    if ((st = check_bounds(g, err))) goto fail;
    if ((st = check_overlap(g, err))) goto fail;
    *out = g;
    return RK_OK;
fail:
    rk_gguf_destroy(g);
    return st;
}

void rk_gguf_destroy(rk_gguf *g) {
    if (!g) return;
    free(g->kv);
    free(g->kv_str0);
    free(g->tensors);
    free(g->str_off);
    free(g->kv_slots);
    free(g->t_slots);
    free(g);
}

/* ---- accessors ------------------------------------------------------------ */

uint32_t rk_gguf_version(const rk_gguf *g) { return g ? g->version : 0; }
uint32_t rk_gguf_alignment(const rk_gguf *g) { return g ? g->alignment : 0; }
uint64_t rk_gguf_data_offset(const rk_gguf *g) { return g ? g->data_offset : 0; }
uint64_t rk_gguf_n_kv(const rk_gguf *g) { return g ? g->n_kv : 0; }
uint64_t rk_gguf_n_tensors(const rk_gguf *g) { return g ? g->n_tensors : 0; }
const rk_gguf_kv *rk_gguf_kv_at(const rk_gguf *g, uint64_t i) { return g && i < g->n_kv ? &g->kv[i] : NULL; }
const rk_gguf_tensor *rk_gguf_tensor_at(const rk_gguf *g, uint64_t i) {
    return g && i < g->n_tensors ? &g->tensors[i] : NULL;
}

const rk_gguf_kv *rk_gguf_find_kv(const rk_gguf *g, const char *key) {
    if (!g || !key) return NULL;
    uint64_t s =
        table_probe(g->kv_slots, g->kv_mask, g->kv, sizeof *g->kv, offsetof(rk_gguf_kv, key), key, strlen(key));
    return g->kv_slots[s] ? &g->kv[g->kv_slots[s] - 1] : NULL;
}

const rk_gguf_tensor *rk_gguf_find_tensor(const rk_gguf *g, const char *name) {
    if (!g || !name) return NULL;
    uint64_t s = table_probe(g->t_slots, g->t_mask, g->tensors, sizeof *g->tensors, offsetof(rk_gguf_tensor, name),
                             name, strlen(name));
    return g->t_slots[s] ? &g->tensors[g->t_slots[s] - 1] : NULL;
}
