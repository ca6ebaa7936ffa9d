/* GGUF v2/v3 reader and writer over (bytes, len). No file I/O, no printing.
 * The reader validates everything before returning: every key, every array and
 * string length, every tensor's dims, type, alignment, bounds and overlap.
 * Views returned point into the caller's bytes, which must outlive the rk_gguf. */
#pragma once
#include "rk_base.h"

typedef enum rk_gguf_type {
    RK_GGUF_U8 = 0,
    RK_GGUF_I8 = 1,
    RK_GGUF_U16 = 2,
    RK_GGUF_I16 = 3,
    RK_GGUF_U32 = 4,
    RK_GGUF_I32 = 5,
    RK_GGUF_F32 = 6,
    RK_GGUF_BOOL = 7,
    RK_GGUF_STRING = 8,
    RK_GGUF_ARRAY = 9,
    RK_GGUF_U64 = 10,
    RK_GGUF_I64 = 11,
    RK_GGUF_F64 = 12,
    RK_GGUF_TYPE_COUNT
} rk_gguf_type;

/* A byte string inside the file; not NUL-terminated. */
typedef struct rk_str {
    const char *ptr;
    uint64_t len;
} rk_str;

typedef struct rk_gguf_kv {
    rk_str key;
    uint32_t type;       /* rk_gguf_type */
    uint32_t arr_type;   /* element type when type == ARRAY */
    uint64_t n;          /* array length (1 for scalars) */
    const uint8_t *data; /* first byte of the value (after the array header) */
} rk_gguf_kv;

typedef struct rk_gguf_tensor {
    rk_str name;
    uint32_t n_dims; /* 1..4 */
    int64_t ne[4];   /* ne[0] = row length (innermost); unused dims = 1 */
    uint32_t type;   /* rk_dtype */
    uint64_t offset; /* relative to the data section */
    uint64_t n_bytes;
    const void *data; /* view into the bytes */
} rk_gguf_tensor;

typedef struct rk_gguf rk_gguf;

/* Parses and validates. *out owns only its index; it borrows bytes. */
rk_status rk_gguf_parse(const void *bytes, size_t len, rk_gguf **out, rk_err *err);
void rk_gguf_destroy(rk_gguf *g);

uint32_t rk_gguf_version(const rk_gguf *g);
uint32_t rk_gguf_alignment(const rk_gguf *g);
/* Start of the data section (tensor offsets are relative to it). It may lie past the
 * end of the bytes when the file has no tensors (vocab-only files end unpadded). */
uint64_t rk_gguf_data_offset(const rk_gguf *g);
uint64_t rk_gguf_n_kv(const rk_gguf *g);
uint64_t rk_gguf_n_tensors(const rk_gguf *g);
const rk_gguf_kv *rk_gguf_kv_at(const rk_gguf *g, uint64_t i);
const rk_gguf_tensor *rk_gguf_tensor_at(const rk_gguf *g, uint64_t i);
/* NULL when absent. */
const rk_gguf_kv *rk_gguf_find_kv(const rk_gguf *g, const char *key);
const rk_gguf_tensor *rk_gguf_find_tensor(const rk_gguf *g, const char *name);

/* Typed getters. Any integer type converts when the value fits; F32/F64 both read
 * as float. Errors name the key and the stored type: RK_E_NOT_FOUND when absent,
 * RK_E_GGUF_TYPE when the stored type does not convert. */
rk_status rk_gguf_get_u32(const rk_gguf *g, const char *key, uint32_t *out, rk_err *err);
rk_status rk_gguf_get_u64(const rk_gguf *g, const char *key, uint64_t *out, rk_err *err);
rk_status rk_gguf_get_i64(const rk_gguf *g, const char *key, int64_t *out, rk_err *err);
rk_status rk_gguf_get_f32(const rk_gguf *g, const char *key, float *out, rk_err *err);
rk_status rk_gguf_get_bool(const rk_gguf *g, const char *key, bool *out, rk_err *err);
rk_status rk_gguf_get_str(const rk_gguf *g, const char *key, rk_str *out, rk_err *err);
/* Array element access. kv must be an ARRAY; index < kv->n. For fixed-size element
 * types, *out gets the value converted; for strings, the view. */
rk_status rk_gguf_arr_str(const rk_gguf *g, const rk_gguf_kv *kv, uint64_t i, rk_str *out, rk_err *err);
rk_status rk_gguf_arr_f32(const rk_gguf_kv *kv, uint64_t i, float *out, rk_err *err);
rk_status rk_gguf_arr_i64(const rk_gguf_kv *kv, uint64_t i, int64_t *out, rk_err *err);

/* Compares a view with a C string. */
bool rk_str_eq(rk_str s, const char *c);
/* "u8", "string", "array", ... for a value type id; "unknown" otherwise. */
const char *rk_gguf_type_name(uint32_t type);

/* ---- writer ----------------------------------------------------------
 * Builds a v3 file in memory. Keys and tensors are written in insertion order;
 * tensor data is copied. Duplicate keys/tensors are refused. */
typedef struct rk_gguf_writer rk_gguf_writer;

/* alignment: a power of two, or 0 for the GGUF default 32; written as general.alignment
 * when not 32. */
rk_status rk_gguf_writer_create(uint32_t alignment, rk_gguf_writer **out, rk_err *err);
void rk_gguf_writer_destroy(rk_gguf_writer *w);
rk_status rk_gguf_writer_set_u32(rk_gguf_writer *w, const char *key, uint32_t v, rk_err *err);
rk_status rk_gguf_writer_set_i32(rk_gguf_writer *w, const char *key, int32_t v, rk_err *err);
rk_status rk_gguf_writer_set_u64(rk_gguf_writer *w, const char *key, uint64_t v, rk_err *err);
rk_status rk_gguf_writer_set_f32(rk_gguf_writer *w, const char *key, float v, rk_err *err);
rk_status rk_gguf_writer_set_f64(rk_gguf_writer *w, const char *key, double v, rk_err *err);
rk_status rk_gguf_writer_set_bool(rk_gguf_writer *w, const char *key, bool v, rk_err *err);
rk_status rk_gguf_writer_set_str(rk_gguf_writer *w, const char *key, const char *v, rk_err *err);
/* Array of fixed-size elements (elem_type not STRING/ARRAY); data holds n elements. */
rk_status rk_gguf_writer_set_arr(rk_gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n,
                                 rk_err *err);
rk_status rk_gguf_writer_set_arr_str(rk_gguf_writer *w, const char *key, const char *const *strs, uint64_t n,
                                     rk_err *err);
/* Copies a key/value from a parsed file, any type (string arrays too); kv must come
 * from rk_gguf_parse. A general.alignment equal to the writer's is accepted (and not
 * written twice); a different one is refused. */
rk_status rk_gguf_writer_set_kv(rk_gguf_writer *w, const rk_gguf_kv *kv, rk_err *err);
/* ne[0] is the row length; n_bytes must equal the size implied by type and ne. */
rk_status rk_gguf_writer_add_tensor(rk_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                    const int64_t *ne, const void *data, uint64_t n_bytes, rk_err *err);
/* Serialises; *bytes is malloc'd and owned by the caller. */
rk_status rk_gguf_writer_finish(rk_gguf_writer *w, void **bytes, size_t *len, rk_err *err);
