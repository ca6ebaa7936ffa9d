/* GGUF test fixtures: a raw byte builder for hand-made (broken) files and a
 * small valid file made with the writer. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rk_gguf.h"

/* Growable byte buffer; every append aborts the test on out-of-memory. */
typedef struct bb {
    uint8_t *p;
    size_t len, cap;
} bb;

void bb_free(bb *b);
void bb_bytes(bb *b, const void *p, size_t n);
void bb_u32(bb *b, uint32_t v);
void bb_u64(bb *b, uint64_t v);
void bb_str(bb *b, const char *s);    /* u64 length + bytes */
void bb_pad(bb *b, size_t alignment); /* zero bytes up to a multiple */
void bb_header(bb *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv);
void bb_kv_u32(bb *b, const char *key, uint32_t v);
void bb_kv_str(bb *b, const char *key, const char *v);
/* Tensor info; ne has n_dims entries (written as stored, no checks). */
void bb_tensor(bb *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type, uint64_t offset);

/* A valid v3 file from the writer: 5 keys (string, u32, f32, string array, f32
 * array) and 3 tensors (F32 [8,4], Q8_0 [32,2], F16 [8]). malloc'd. */
void *tf_small_file(uint32_t alignment, size_t *len);

/* Parses a copy in a buffer of exactly len bytes (so ASan sees any over-read). */
rk_status tf_parse_exact(const void *bytes, size_t len, rk_err *err);
