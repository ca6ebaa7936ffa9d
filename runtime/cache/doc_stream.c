/* The kept split stream of a cached document (rk_cache.h): <dir>/<key>.rkxs beside the
 * document cache's <key>.rkkv, so that a new question re-scores the document's bulk rows
 * Little-endian:
 *     0 "RKXS"  4 u32 version (1)  8 char key[64]  72 i64 row0  80 i64 n  88 u32 n_embd
 *    92 u32 split  96 u64 n_tokens of the entry (header 104 bytes)
 *   then n * n_embd f16 (the stream), n f32 (baseline attention), n u8 (the selection),
 *   then the SHA-256 of everything before it (32 bytes).
 * Written to a temporary file, fsync'd, renamed over the entry, directory fsync'd. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rk_cache.h"
#include "rk_io.h"

enum { HEAD = 104, VERSION = 1 };


static rk_status stream_path(const rk_doc_cache *c, const char *key, char *buf, size_t cap, rk_err *err) {
    if (!key || strlen(key) != 64 || strspn(key, "0123456789abcdef") != 64)
        return rk_err_set(err, RK_E_INVALID_ARG, "document stream: '%s' is not a key", key ? key : "");
    int w = snprintf(buf, cap, "%s/%s.rkxs", rk_doc_cache_dir(c), key);
    if (w < 0 || (size_t)w >= cap) return rk_err_set(err, RK_E_INVALID_ARG, "document stream: path too long");
    return RK_OK;
}

static rk_status write_all(int fd, const void *p, size_t n, const char *path, rk_err *err) {
    const uint8_t *b = p;
    while (n) {
        ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return rk_err_set(err, RK_E_IO, "document stream: cannot write %s (%s)", path, strerror(errno));
        b += w, n -= (size_t)w;
    }
    return RK_OK;
}

rk_status rk_doc_stream_save(rk_doc_cache *c, const char *key, const rk_session *s, rk_err *err) {
    rk_fill_stream fs;
    if (!rk_session_fill_stream(s, &fs)) return RK_OK; /* no question-aware selection: nothing to keep */
    char path[4096], tmp[4200];
    rk_status st = stream_path(c, key, path, sizeof path, err);
    if (st) return st;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    uint8_t h[HEAD] = {0};
    memcpy(h, "RKXS", 4);
    rk_le_put(h + 4, VERSION, 4);
    memcpy(h + 8, key, 64);
    rk_le_put(h + 72, (uint64_t)fs.row0, 8), rk_le_put(h + 80, (uint64_t)fs.n, 8);
    rk_le_put(h + 88, (uint32_t)fs.n_embd, 4), rk_le_put(h + 92, (uint32_t)fs.split, 4);
    rk_le_put(h + 96, (uint64_t)rk_session_n_past(s), 8);
    const size_t nx = (size_t)fs.n * (size_t)fs.n_embd;
    uint8_t *body = malloc(nx * 2 + (size_t)fs.n * 5);
    if (!body) return rk_err_set(err, RK_E_NOMEM, "document stream: no memory for %lld rows", (long long)fs.n);
    for (size_t i = 0; i < nx; i++) rk_le_put(body + 2 * i, fs.x[i], 2);
    for (int64_t j = 0; j < fs.n; j++) {
        uint32_t u;
        memcpy(&u, &fs.base[j], 4);
        rk_le_put(body + nx * 2 + 4 * (size_t)j, u, 4);
    }
    memcpy(body + nx * 2 + 4 * (size_t)fs.n, fs.keep, (size_t)fs.n);
    const size_t nbody = nx * 2 + (size_t)fs.n * 5;
    rk_sha256 sh;
    uint8_t dig[32];
    rk_sha256_init(&sh);
    rk_sha256_update(&sh, h, HEAD);
    rk_sha256_update(&sh, body, nbody);
    rk_sha256_final(&sh, dig);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) st = rk_err_set(err, RK_E_IO, "document stream: cannot create %s (%s)", tmp, strerror(errno));
    if (!st) st = write_all(fd, h, HEAD, tmp, err);
    if (!st) st = write_all(fd, body, nbody, tmp, err);
    if (!st) st = write_all(fd, dig, 32, tmp, err);
    if (!st && fsync(fd) != 0)
        st = rk_err_set(err, RK_E_IO, "document stream: cannot sync %s (%s)", tmp, strerror(errno));
    if (fd >= 0 && close(fd) != 0 && !st)
        st = rk_err_set(err, RK_E_IO, "document stream: cannot close %s (%s)", tmp, strerror(errno));
    free(body);
    if (!st && rename(tmp, path) != 0)
        st = rk_err_set(err, RK_E_IO, "document stream: cannot rename %s (%s)", tmp, strerror(errno));
    if (st) {
        unlink(tmp);
        return st;
    }
    int dfd = open(rk_doc_cache_dir(c), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd);
        close(dfd);
    }
    return RK_OK;
}

/* Reads and checks the file; on success *buf holds it (header, body, digest). */
static rk_status read_checked(const char *path, const char *key, uint8_t **buf, size_t *len, char *msg, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        snprintf(msg, cap, "cannot open (%s)", strerror(errno));
        return errno == ENOENT ? RK_E_NOT_FOUND : RK_E_IO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || sb.st_size < HEAD + 32) {
        fclose(f);
        snprintf(msg, cap, "%lld bytes, shorter than a header", (long long)sb.st_size);
        return RK_E_FORMAT;
    }
    const size_t n = (size_t)sb.st_size;
    uint8_t *b = malloc(n);
    if (!b) {
        fclose(f);
        snprintf(msg, cap, "no memory for %zu bytes", n);
        return RK_E_NOMEM;
    }
    const size_t got = fread(b, 1, n, f);
    fclose(f);
    rk_status st = RK_OK;
    if (got != n) snprintf(msg, cap, "read %zu of %zu bytes", got, n), st = RK_E_IO;
    else if (memcmp(b, "RKXS", 4)) snprintf(msg, cap, "not a stream file (magic)"), st = RK_E_FORMAT;
    else if (rk_le_get(b + 4, 4) != VERSION)
        snprintf(msg, cap, "version %llu, this build reads %d", (unsigned long long)rk_le_get(b + 4, 4), VERSION),
            st = RK_E_FORMAT;
    else if (memcmp(b + 8, key, 64)) snprintf(msg, cap, "written for another entry"), st = RK_E_FORMAT;
    if (!st) {
        const uint64_t rows = rk_le_get(b + 80, 8), d = rk_le_get(b + 88, 4);
        /* the sizes first (no overflow: both below 2^32 and the file's length) */
        if (rows == 0 || d == 0 || rows > n || d > 1u << 20 || rows * (d * 2 + 5) + HEAD + 32 != n)
            snprintf(msg, cap, "%zu bytes do not hold %llu rows of %llu values", n, (unsigned long long)rows,
                     (unsigned long long)d),
                st = RK_E_FORMAT;
    }
    if (!st) {
        rk_sha256 sh;
        uint8_t dig[32];
        rk_sha256_init(&sh);
        rk_sha256_update(&sh, b, n - 32);
        rk_sha256_final(&sh, dig);
        if (memcmp(dig, b + n - 32, 32)) snprintf(msg, cap, "checksum mismatch (corrupt file)"), st = RK_E_FORMAT;
    }
    if (st) {
        free(b);
        return st;
    }
    *buf = b, *len = n;
    return RK_OK;
}

rk_status rk_doc_stream_load(rk_doc_cache *c, const char *key, rk_session *s, rk_err *err) {
    char path[4096], msg[512] = "";
    rk_status st = stream_path(c, key, path, sizeof path, err);
    if (st) return st;
    uint8_t *b = NULL;
    size_t n = 0;
    st = read_checked(path, key, &b, &n, msg, sizeof msg);
    if (st == RK_E_NOT_FOUND) return rk_err_set(err, st, "document stream: no stream for entry %.12s", key);
    if (!st && rk_le_get(b + 96, 8) != (uint64_t)rk_session_n_past(s)) {
        snprintf(msg, sizeof msg, "written for %llu tokens, the session holds %lld",
                 (unsigned long long)rk_le_get(b + 96, 8), (long long)rk_session_n_past(s));
        st = RK_E_FORMAT;
    }
    if (st) {
        free(b);
        if (st == RK_E_FORMAT) unlink(path);
        return rk_err_set(err, st, "document stream: %s is unusable (%s)%s", path, msg,
                          st == RK_E_FORMAT ? "; removed" : "");
    }
    const int64_t rows = (int64_t)rk_le_get(b + 80, 8), d = (int64_t)rk_le_get(b + 88, 4);
    uint16_t *x = malloc((size_t)(rows * d) * sizeof(uint16_t));
    float *base = malloc((size_t)rows * sizeof(float));
    if (!x || !base) {
        free(b), free(x), free(base);
        return rk_err_set(err, RK_E_NOMEM, "document stream: no memory for %lld rows", (long long)rows);
    }
    const uint8_t *p = b + HEAD;
    for (int64_t i = 0; i < rows * d; i++) x[i] = (uint16_t)rk_le_get(p + 2 * i, 2);
    p += 2 * rows * d;
    for (int64_t j = 0; j < rows; j++) {
        const uint32_t u = (uint32_t)rk_le_get(p + 4 * j, 4);
        memcpy(&base[j], &u, 4);
    }
    p += 4 * rows;
    const rk_fill_stream fs = {
        (int64_t)rk_le_get(b + 72, 8), rows, (int32_t)d, (int32_t)rk_le_get(b + 92, 4), x, base, p};
    st = rk_session_fill_stream_set(s, &fs, err);
    free(b), free(x), free(base);
    if (st) return rk_err_wrap(err, "document stream: entry %.12s", key);
    return RK_OK;
}

rk_status rk_doc_stream_remove(rk_doc_cache *c, const char *key, rk_err *err) {
    char path[4096];
    rk_status st = stream_path(c, key, path, sizeof path, err);
    if (st) return st;
    if (unlink(path) != 0 && errno != ENOENT)
        return rk_err_set(err, RK_E_IO, "document stream: cannot remove %s (%s)", path, strerror(errno));
    return RK_OK;
}
