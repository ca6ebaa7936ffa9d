/* ridgekv base: status codes and error messages, dtype traits, fp16/bf16,
 * read-only file mapping, bump arena. Everything else builds on this. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Marks a declaration of the library's API: exported from a shared build of it (which
 * compiles everything else with -fvisibility=hidden), a plain declaration otherwise. */
#if defined(_WIN32)
#define RK_API
#else
#define RK_API __attribute__((visibility("default")))
#endif

/* ---- status ---------------------------------------------------------- */
typedef enum rk_status {
    RK_OK = 0,
    RK_E_INVALID_ARG, /* caller passed something impossible */
    RK_E_NOMEM,
    RK_E_IO,          /* open/read/write/mmap failed (errno text in message) */
    RK_E_NOT_FOUND,   /* missing key, tensor, file */
    RK_E_UNSUPPORTED, /* architecture, tensor type, feature we do not handle */
    RK_E_CONTEXT,     /* prompt or request does not fit the context */
    RK_E_CHECKSUM,    /* hash mismatch */
    RK_E_MISMATCH,    /* file made for another model */
    /* GGUF failure classes: one each, so tests and tools can tell them apart */
    RK_E_GGUF_MAGIC,
    RK_E_GGUF_VERSION,
    RK_E_GGUF_TRUNCATED,
    RK_E_GGUF_COUNT,     /* absurd kv / tensor / array / string counts */
    RK_E_GGUF_DUPLICATE, /* duplicate key or tensor name */
    RK_E_GGUF_TYPE,      /* unknown value type or tensor type */
    RK_E_GGUF_ALIGN,     /* bad alignment value or misaligned tensor offset */
    RK_E_GGUF_OVERLAP,   /* two tensors share bytes */
    RK_E_GGUF_BOUNDS,    /* tensor data past the end of the file */
    RK_E_GGUF_DIM,       /* bad n_dims, non-positive or overflowing dimension */
    RK_E_GGUF_BLOCK,     /* row length not a multiple of the type's block */
    RK_E_INTERNAL,       /* broken invariant: a bug, reported instead of aborting */
    RK_E_CANCELLED,      /* a callback asked to stop */
    RK_E_FORMAT,         /* a block or record of ours that is truncated, corrupt or of another version */
    RK_STATUS_COUNT
} rk_status;

typedef struct rk_err {
    rk_status code;
    char msg[512];
} rk_err;

/* Records "<module>: <what> <where> (<expected> vs <got>)" in *err (may be NULL)
 * and returns code. Never fails. */
RK_API rk_status rk_err_set(rk_err *err, rk_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* Prefixes an existing message with more context ("loading X: <old msg>"). */
RK_API rk_status rk_err_wrap(rk_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
RK_API void rk_err_clear(rk_err *err);
/* Stable name such as "RK_E_GGUF_MAGIC". */
RK_API const char *rk_status_name(rk_status s);

/* Checked arithmetic for sizes read from files. Return false on overflow. */
/* Little-endian fields of the on-disk formats: n bytes of v at d, and back. */
static inline void rk_le_put(uint8_t *d, uint64_t v, int n) {
    for (int i = 0; i < n; i++) d[i] = (uint8_t)(v >> (8 * i));
}
static inline uint64_t rk_le_get(const uint8_t *d, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)d[i] << (8 * i);
    return v;
}
static inline bool rk_mul_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_mul_overflow(a, b, out); }
static inline bool rk_add_u64(uint64_t a, uint64_t b, uint64_t *out) { return !__builtin_add_overflow(a, b, out); }

/* ---- dtypes (numbering = GGML's, as stored in GGUF) ------------------ */
typedef enum rk_dtype {
    RK_DT_F32 = 0,
    RK_DT_F16 = 1,
    RK_DT_Q4_0 = 2,
    RK_DT_Q4_1 = 3,
    RK_DT_Q8_0 = 8,
    RK_DT_Q8_1 = 9,
    RK_DT_Q4_K = 12,
    RK_DT_Q6_K = 14,
    RK_DT_Q8_K = 15,
    RK_DT_BF16 = 30,
} rk_dtype;

typedef struct rk_dtype_traits {
    const char *name;   /* "q4_K" style, as llama.cpp prints */
    uint32_t blck_size; /* elements per block (1 for plain floats) */
    uint32_t type_size; /* bytes per block */
    bool weight_ok;     /* accepted as a tensor type in model files */
} rk_dtype_traits;

/* NULL for type ids we do not know. */
RK_API const rk_dtype_traits *rk_dtype_get(uint32_t type);
/* Name for any id ("type 17" style text is not returned; unknown -> "unknown"). */
RK_API const char *rk_dtype_name(uint32_t type);
/* Bytes of a row of n elements; false if n is not a multiple of the block or overflows. */
RK_API bool rk_dtype_row_bytes(uint32_t type, uint64_t n, uint64_t *out);

/* ---- half floats ----------------------------------------------------- */
/* IEEE binary16 <-> binary32, round to nearest even; exact for every half value. */
RK_API float rk_f16_to_f32(uint16_t h);
RK_API uint16_t rk_f32_to_f16(float x);
static inline float rk_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    __builtin_memcpy(&f, &u, 4);
    return f;
}
static inline uint16_t rk_f32_to_bf16(float x) {
    uint32_t u;
    __builtin_memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64); /* quiet NaN */
    return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

/* ---- read-only file mapping ----------------------------------------- */
typedef struct rk_mapping {
    const void *data; /* PROT_READ; NULL for an empty file */
    size_t len;
} rk_mapping;

/* Opens path for reading without blocking on a FIFO and refuses anything that is not a
 * regular file (FIFO, device, directory, socket: RK_E_IO naming the kind). *fd (the
 * caller closes it, blocking reads) and *len written only on success. */
RK_API rk_status rk_file_open_regular(const char *path, int *fd, size_t *len, rk_err *err);
/* Maps the whole file read-only (rk_file_open_regular's checks). Out-param written only
 * on success. */
RK_API rk_status rk_mapping_open(const char *path, rk_mapping *out, rk_err *err);
RK_API void rk_mapping_close(rk_mapping *m); /* accepts a zeroed or closed mapping */
/* Like rk_mapping_open, but for a file of at least 2 MiB, when the kernel offers
 * transparent huge pages (madvise or always) and at most half of the available memory
 * would hold it: the bytes are read into private anonymous memory on 2 MiB-aligned huge
 * pages (same RSS as a fully touched mapping; the page cache copy is reclaimable).
 * Streaming model weights from huge pages avoids a TLB miss per 4 KiB and lets the
 * prefetchers run across pages (decode GEMV bandwidth, docs/PERFORMANCE.md). Otherwise (or
 * when no such memory can be had) a plain mapping. Closed with rk_mapping_close. */
RK_API rk_status rk_mapping_open_huge(const char *path, rk_mapping *out, rk_err *err);
/* Whether rk_mapping_open_huge would copy a file of len bytes. */
RK_API bool rk_mapping_huge_wanted(size_t len);
/* Bytes of m that sit on huge pages now (AnonHugePages + FilePmdMapped of the memory
 * areas in /proc/self/smaps that overlap m, at most m->len: exact for a mapping of its own,
 * as rk_mapping_open_huge makes); 0 when that cannot be read. rk_mapping_open_huge uses
 * it to retry a copy that came out on 4 KiB pages with MADV_COLLAPSE. */
RK_API size_t rk_mapping_huge_bytes(const rk_mapping *m);

/* ---- bump arena ------------------------------------------------------ */
typedef struct rk_arena {
    uint8_t *base;
    size_t cap;
    size_t used;
} rk_arena;

RK_API rk_status rk_arena_init(rk_arena *a, size_t cap, rk_err *err);
RK_API void rk_arena_deinit(rk_arena *a);
/* 64-byte aligned; NULL when full (no growth: sizes are planned up front). */
RK_API void *rk_arena_alloc(rk_arena *a, size_t bytes);
RK_API void rk_arena_reset(rk_arena *a);

/* ---- misc ------------------------------------------------------------- */
RK_API double rk_time_now(void); /* monotonic seconds */

/* splitmix64: the one deterministic generator (sampler, eval drivers, tests). Advances
 * *state and returns the next 64 random bits. */
static inline uint64_t rk_splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Peak resident set size of this process in bytes (0 if unknown). */
RK_API uint64_t rk_peak_rss_bytes(void);
/* The "NAME: N kB" line of a /proc file (/proc/meminfo's MemAvailable, /proc/self/status's
 * VmHWM) in bytes; 0 when the file or the line cannot be read. */
RK_API uint64_t rk_proc_kb_field(const char *path, const char *name);
