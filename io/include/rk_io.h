/* io: whole-file helpers and SHA-256. Later: the block store (io_uring + zstd). */
#pragma once
#include "rk_base.h"

typedef struct rk_sha256 {
    uint32_t h[8];
    uint64_t n_bytes;
    uint8_t buf[64];
    uint32_t n_buf;
} rk_sha256;

void rk_sha256_init(rk_sha256 *s);
void rk_sha256_update(rk_sha256 *s, const void *data, size_t len);
void rk_sha256_final(rk_sha256 *s, uint8_t out[32]);
/* Lowercase hex of a 32-byte digest into hex[65]. */
void rk_sha256_hex(const uint8_t digest[32], char hex[65]);
/* SHA-256 of a whole file (streamed, not mapped). */
rk_status rk_sha256_file(const char *path, char hex[65], rk_err *err);

/* Reads a whole regular file into a malloc'd, NUL-terminated buffer (owned by the caller).
 * A FIFO, device or directory is refused without blocking (rk_file_open_regular). */
rk_status rk_io_read_file(const char *path, char **data, size_t *len, rk_err *err);
/* The same, refusing a file of more than max_bytes (its size from fstat, before any byte
 * is read or memory taken) with RK_E_INVALID_ARG. */
rk_status rk_io_read_file_max(const char *path, size_t max_bytes, char **data, size_t *len, rk_err *err);
/* Writes to path.tmp.<pid>, fsyncs, renames over path: readers never see half a file.
 * On failure (disk full included) the old file is untouched and the temp is removed. */
rk_status rk_io_write_file_atomic(const char *path, const void *data, size_t len, rk_err *err);
/* Creates a directory and its parents (mode 0755); existing ones are fine. */
rk_status rk_io_mkdir_p(const char *path, rk_err *err);

/* Array held in a file: len bytes of data written to a new file in dir (mkstemp, unlinked at
 * once, so it goes with the mapping) and mapped read-only into *out. Its bytes then live in
 * the file system's cache, and the pages a reader touches count as the process's memory
 * only until rk_io_map_release drops them (advice: the next read maps them again). RK_E_IO
 * naming dir when the file cannot be made, written (a full disk) or mapped, or when dir is
 * itself in memory (tmpfs, ramfs: the bytes would stay in memory); nothing is left. */
rk_status rk_io_map_copy(const char *dir, const void *data, size_t len, const void **out, rk_err *err);
/* A read-only map of the first len bytes of the open file fd (the file itself, as it is),
 * released the same way; RK_E_IO when it cannot be mapped. */
rk_status rk_io_map_fd(int fd, size_t len, const void **out, rk_err *err);
/* Drops the process's hold on the pages wholly inside [off, off + len) of such a map of
 * map_len bytes (its last page too when the range reaches the end). */
void rk_io_map_release(const void *map, size_t off, size_t len, size_t map_len);
void rk_io_map_free(const void *map, size_t len);
