/* Test helpers shared by every suite. */
#pragma once
#include <stddef.h>
#include <stdint.h>

/* Directory of ../shared (RK_SHARED_DIR, set by meson), or NULL when it is absent. */
const char *tb_shared_dir(void);
/* Joins the shared dir and a relative path into buf; returns NULL (and leaves a
 * reason in buf) when the shared dir or the file is missing. */
const char *tb_shared_path(char *buf, size_t cap, const char *rel);
/* Reads a whole file into a malloc'd buffer; NULL on failure. */
void *tb_read_file(const char *path, size_t *len);
/* The default model in the cache (RIDGEKV_MODEL or ${XDG_CACHE_HOME:-~/.cache}/ridgekv/...),
 * NULL when absent. */
const char *tb_default_model(char *buf, size_t cap);
/* Deterministic pseudo-random numbers (splitmix64). */
uint64_t tb_rand_u64(uint64_t *state);
float tb_rand_normal(uint64_t *state);
/* Path of the decompressed F32 twin golden/models/<name>.f32-twin.gguf, made once with
 * `xz -dc` under $TMPDIR/ridgekv-twins-<uid>/ (atomic rename, so parallel tests are safe).
 * NULL (and a reason in buf) when the .xz or xz itself is absent. */
const char *tb_twin_path(const char *name, char *buf, size_t cap);
/* Reads n floats from a raw little-endian f32 file into a malloc'd array. */
float *tb_read_f32(const char *path, size_t *n);

/* Result of running the ridgekv binary ($RK_BIN) through sh. */
typedef struct tb_result {
    int code;         /* exit status, -1 when killed */
    char *out, *err;  /* captured stdout / stderr (malloc'd, NUL-terminated) */
} tb_result;
/* Runs `<env> '$RK_BIN' <args>` with stdin from /dev/null; env may be NULL (e.g.
 * "env -u X Y=1"). code is -2 when RK_BIN is unset. */
tb_result tb_run(const char *env, const char *args);
void tb_result_free(tb_result *r);
