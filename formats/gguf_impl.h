/* Private helpers shared by the GGUF reader and writer (formats/ only). */
#pragma once
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "rk_gguf.h"

/* Values are read and written with memcpy in host order. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF I/O assumes a little-endian host");

#define RK_GGUF_DEFAULT_ALIGNMENT 32u
#define RK_GGUF_MAX_DIMS 4u
#define RK_GGUF_ALIGNMENT_KEY "general.alignment"

/* Bytes of one fixed-size value; 0 for STRING, ARRAY and unknown ids. */
static inline uint32_t rk_gguf_type_size(uint32_t t) {
    static const uint8_t size[RK_GGUF_TYPE_COUNT] = {
        [RK_GGUF_U8] = 1,  [RK_GGUF_I8] = 1,  [RK_GGUF_U16] = 2, [RK_GGUF_I16] = 2,
        [RK_GGUF_U32] = 4, [RK_GGUF_I32] = 4, [RK_GGUF_F32] = 4, [RK_GGUF_BOOL] = 1,
        [RK_GGUF_U64] = 8, [RK_GGUF_I64] = 8, [RK_GGUF_F64] = 8,
    };
    return t < RK_GGUF_TYPE_COUNT ? size[t] : 0;
}

static inline bool rk_gguf_is_pow2(uint64_t a) { return a != 0 && (a & (a - 1)) == 0; }

/* Parsed file: the reader fills it (gguf_read.c), the getters read it (gguf_get.c). */
struct rk_gguf {
    const uint8_t *bytes; /* borrowed */
    size_t len;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* may exceed len when there are no tensors (vocab-only files) */
    uint64_t n_kv;
    uint64_t n_tensors;
    rk_gguf_kv *kv;          /* (n_kv) */
    rk_gguf_tensor *tensors; /* (n_tensors) */
    uint64_t *kv_str0;       /* (n_kv) first str_off entry of a string array */
    uint64_t *str_off;       /* (n_str) file offset of each string-array element's length */
    uint64_t n_str, cap_str;
    uint64_t *kv_slots; /* open addressing, entry = index + 1, 0 = empty */
    uint64_t kv_mask;
    uint64_t *t_slots;
    uint64_t t_mask;
};

/* " 'name'" for messages: at most 80 bytes shown, control bytes as '?'. */
#define RK_GGUF_NAME_BUF 96
static inline const char *rk_gguf_fmt_name(char *buf, rk_str s) {
    if (!s.ptr) {
        buf[0] = 0;
        return buf;
    }
    size_t n = s.len > 80 ? 80 : (size_t)s.len;
    size_t o = 0;
    buf[o++] = ' ';
    buf[o++] = '\'';
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[o++] = (ch < 0x20 || ch == 0x7f) ? '?' : (char)ch;
    }
    if (s.len > n) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o++] = '\'';
    buf[o] = 0;
    return buf;
}
