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
#include "plan_impl.h"
#include "session_impl.h"

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

/* The file written through a 1 MiB buffer, hashed as it goes: a long document's stream is
 * never copied whole. */
typedef struct wbuf {
    int fd;
    const char *path;
    uint8_t *p;
    size_t n;
    rk_sha256 sh;
    rk_status st;
    rk_err *err;
} wbuf;
enum { WBUF = 1 << 20 };

/* k bytes (k <= HEAD) at the buffer's end; what fills the buffer is hashed and written first */
static uint8_t *wb_room(wbuf *w, size_t k) {
    if (w->n + k > WBUF) {
        rk_sha256_update(&w->sh, w->p, w->n);
        if (!w->st) w->st = write_all(w->fd, w->p, w->n, w->path, w->err);
        w->n = 0;
    }
    uint8_t *at = w->p + w->n;
    w->n += k;
    return at;
}

static void wb_end(wbuf *w) {
    rk_sha256_update(&w->sh, w->p, w->n);
    if (!w->st && w->n) w->st = write_all(w->fd, w->p, w->n, w->path, w->err);
    w->n = 0;
}

rk_status rk_doc_stream_save(rk_doc_cache *c, const char *key, const rk_session *s, rk_err *err) {
    rk_fill_stream fs;
    if (!rk_session_fill_stream(s, &fs)) return RK_OK; /* no question-aware selection: nothing to keep */
    char path[4096], tmp[4200];
    rk_status st = stream_path(c, key, path, sizeof path, err);
    if (st) return st;
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    wbuf w = {.fd = -1, .path = tmp, .p = malloc(WBUF), .err = err};
    if (!w.p) return rk_err_set(err, RK_E_NOMEM, "document stream: out of memory");
    rk_sha256_init(&w.sh);
    w.fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w.fd < 0) w.st = rk_err_set(err, RK_E_IO, "document stream: cannot create %s (%s)", tmp, strerror(errno));
    uint8_t *h = wb_room(&w, HEAD);
    memset(h, 0, HEAD);
    memcpy(h, "RKXS", 4);
    rk_le_put(h + 4, VERSION, 4);
    memcpy(h + 8, key, 64);
    rk_le_put(h + 72, (uint64_t)fs.row0, 8), rk_le_put(h + 80, (uint64_t)fs.n, 8);
    rk_le_put(h + 88, (uint32_t)fs.n_embd, 4), rk_le_put(h + 92, (uint32_t)fs.split, 4);
    rk_le_put(h + 96, (uint64_t)rk_session_n_past(s), 8);
    for (int64_t r = 0; r < fs.n && !w.st; r++) {
        const uint16_t *x = fs.x + (size_t)r * (size_t)fs.n_embd;
        for (int32_t i = 0; i < fs.n_embd; i++) rk_le_put(wb_room(&w, 2), x[i], 2);
        if ((r + 1) % 256 == 0 || r + 1 == fs.n) /* a stream in a file: its pages held a block at a time */
            rk_prefill_xs_release(s, r + 1);
    }
    for (int64_t j = 0; j < fs.n && !w.st; j++) {
        uint32_t u;
        memcpy(&u, &fs.base[j], 4);
        rk_le_put(wb_room(&w, 4), u, 4);
    }
    for (int64_t j = 0; j < fs.n && !w.st; j++) *wb_room(&w, 1) = fs.keep[j];
    wb_end(&w);
    uint8_t dig[32];
    rk_sha256_final(&w.sh, dig);
    st = w.st;
    if (!st) st = write_all(w.fd, dig, 32, tmp, err);
    if (!st && fsync(w.fd) != 0)
        st = rk_err_set(err, RK_E_IO, "document stream: cannot sync %s (%s)", tmp, strerror(errno));
    if (w.fd >= 0 && close(w.fd) != 0 && !st)
        st = rk_err_set(err, RK_E_IO, "document stream: cannot close %s (%s)", tmp, strerror(errno));
    free(w.p);
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

/* n bytes of f into dst, hashed (sh NULL: not) */
static bool rd(FILE *f, rk_sha256 *sh, void *dst, size_t n) {
    if (fread(dst, 1, n, f) != n) return false;
    if (sh) rk_sha256_update(sh, dst, n);
    return true;
}

/* Reads and checks the file into the session's kept stream (msg: why not): the header and
 * its sizes first, then the rows straight into the arrays the session keeps, the digest
 * compared before the session takes them. */
static rk_status load_checked(const char *path, const char *key, rk_session *s, char *msg, size_t cap) {
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
    uint8_t b[HEAD];
    rk_sha256 sh;
    rk_sha256_init(&sh);
    rk_status st = RK_OK;
    if (!rd(f, &sh, b, HEAD)) snprintf(msg, cap, "cannot read the header (%s)", strerror(errno)), st = RK_E_IO;
    else if (memcmp(b, "RKXS", 4)) snprintf(msg, cap, "not a stream file (magic)"), st = RK_E_FORMAT;
    else if (rk_le_get(b + 4, 4) != VERSION)
        snprintf(msg, cap, "version %llu, this build reads %d", (unsigned long long)rk_le_get(b + 4, 4), VERSION),
            st = RK_E_FORMAT;
    else if (memcmp(b + 8, key, 64)) snprintf(msg, cap, "written for another entry"), st = RK_E_FORMAT;
    const uint64_t rows = st ? 0 : rk_le_get(b + 80, 8), d = st ? 0 : rk_le_get(b + 88, 4);
    /* the sizes first (no overflow: both below 2^32 and the file's length) */
    if (!st && (rows == 0 || d == 0 || rows > n || d > 1u << 20 || rows * (d * 2 + 5) + HEAD + 32 != n))
        snprintf(msg, cap, "%zu bytes do not hold %llu rows of %llu values", n, (unsigned long long)rows,
                 (unsigned long long)d),
            st = RK_E_FORMAT;
    if (!st && rk_le_get(b + 96, 8) != (uint64_t)rk_session_n_past(s))
        snprintf(msg, cap, "written for %llu tokens, the session holds %lld", (unsigned long long)rk_le_get(b + 96, 8),
                 (long long)rk_session_n_past(s)),
            st = RK_E_FORMAT;
    uint16_t *x = NULL;
    float *base = NULL;
    uint8_t *keep = NULL, dig[32], want[32];
    const uint16_t one = 1;
    const bool le = *(const uint8_t *)&one == 1;
    /* the rows: on a little-endian host read where they lie in the file, mapped (the
     * session holds their pages only while it reads them), else into memory */
    const void *map = NULL;
    const size_t nx = (size_t)(rows * d) * 2;
    if (!st && le && rk_io_map_fd(fileno(f), n, &map, &(rk_err){0}) == RK_OK) {
        x = (uint16_t *)((const uint8_t *)map + HEAD);
        for (size_t o = 0; o < nx; o += WBUF) {
            const size_t k = nx - o < WBUF ? nx - o : WBUF;
            rk_sha256_update(&sh, (const uint8_t *)x + o, k);
            rk_io_map_release(map, 0, HEAD + o + k, n);
        }
        rk_io_map_release(map, 0, n, n); /* the whole file: only the rows are read through the map */
        if (fseeko(f, (off_t)(HEAD + nx), SEEK_SET) != 0)
            snprintf(msg, cap, "cannot seek past its rows (%s)", strerror(errno)), st = RK_E_IO;
    }
    if (!st) {
        if (!map) x = malloc(nx);
        base = malloc((size_t)rows * sizeof(float));
        keep = malloc((size_t)rows);
        if (!x || !base || !keep)
            snprintf(msg, cap, "no memory for %llu rows", (unsigned long long)rows), st = RK_E_NOMEM;
    }
    if (!st && ((!map && !rd(f, &sh, x, nx)) || !rd(f, &sh, base, (size_t)rows * 4) ||
                !rd(f, &sh, keep, (size_t)rows) || !rd(f, NULL, want, 32)))
        snprintf(msg, cap, "cannot read its %zu bytes (%s)", n, ferror(f) ? strerror(errno) : "short file"),
            st = RK_E_IO;
    fclose(f);
    if (!st) {
        rk_sha256_final(&sh, dig);
        if (memcmp(dig, want, 32)) snprintf(msg, cap, "checksum mismatch (corrupt file)"), st = RK_E_FORMAT;
    }
    if (!st && !le) { /* the file is little-endian */
        for (uint64_t i = 0; i < rows * d; i++) x[i] = (uint16_t)rk_le_get((const uint8_t *)&x[i], 2);
        for (uint64_t j = 0; j < rows; j++) {
            const uint32_t u = (uint32_t)rk_le_get((const uint8_t *)&base[j], 4);
            memcpy(&base[j], &u, 4);
        }
    }
    if (st) {
        if (map) rk_io_map_free(map, n);
        else free(x);
        free(base), free(keep);
        return st;
    }
    rk_err e = {0};
    if ((st = rk_session_fill_stream_adopt(s, (int64_t)rk_le_get(b + 72, 8), (int64_t)rows,
                                           (int32_t)rk_le_get(b + 92, 4), x, base, keep, map, n, &e)))
        snprintf(msg, cap, "%s", e.msg);
    return st;
}

rk_status rk_doc_stream_load(rk_doc_cache *c, const char *key, rk_session *s, rk_err *err) {
    char path[4096], msg[512] = "";
    rk_status st = stream_path(c, key, path, sizeof path, err);
    if (st) return st;
    st = load_checked(path, key, s, msg, sizeof msg);
    if (st == RK_E_NOT_FOUND) return rk_err_set(err, st, "document stream: no stream for entry %.12s", key);
    if (st == RK_E_MISMATCH || st == RK_E_NOMEM)
        return rk_err_set(err, st, "document stream: entry %.12s: %s", key, msg);
    if (st) {
        if (st == RK_E_FORMAT) unlink(path);
        return rk_err_set(err, st, "document stream: %s is unusable (%s)%s", path, msg,
                          st == RK_E_FORMAT ? "; removed" : "");
    }
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
