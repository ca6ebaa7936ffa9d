#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "rk_io.h"

rk_status rk_io_read_file(const char *path, char **data, size_t *len, rk_err *err) {
    return rk_io_read_file_max(path, SIZE_MAX - 1, data, len, err);
}

rk_status rk_io_read_file_max(const char *path, size_t max_bytes, char **data, size_t *len, rk_err *err) {
    int fd = -1;
    size_t n = 0;
    rk_status st = rk_file_open_regular(path, &fd, &n, err);
    if (st) return st;
    if (n > max_bytes) {
        close(fd);
        return rk_err_set(err, RK_E_INVALID_ARG, "io: %s is %zu bytes (at most %zu)", path, n, max_bytes);
    }
    char *buf = malloc(n + 1);
    if (!buf) {
        close(fd);
        return rk_err_set(err, RK_E_NOMEM, "io: cannot allocate %zu bytes for %s", n + 1, path);
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = errno;
            free(buf);
            close(fd);
            return rk_err_set(err, RK_E_IO, "io: read of %s failed at byte %zu (%s)", path, got,
                              r == 0 ? "unexpected end of file" : strerror(e));
        }
        got += (size_t)r;
    }
    close(fd);
    buf[n] = '\0';
    *data = buf;
    *len = n;
    return RK_OK;
}

rk_status rk_io_write_file_atomic(const char *path, const void *data, size_t len, rk_err *err) {
    char tmp[4096];
    int w = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    if (w < 0 || (size_t)w >= sizeof tmp) return rk_err_set(err, RK_E_INVALID_ARG, "io: path too long: %s", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return rk_err_set(err, RK_E_IO, "io: cannot create %s (%s)", tmp, strerror(errno));
    const char *p = data;
    size_t done = 0;
    while (done < len) {
        ssize_t r = write(fd, p + done, len - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : ENOSPC;
            close(fd);
            unlink(tmp);
            return rk_err_set(err, RK_E_IO, "io: write to %s failed after %zu of %zu bytes (%s)", tmp, done, len,
                              strerror(e));
        }
        done += (size_t)r;
    }
    if (fsync(fd) != 0 || close(fd) != 0) {
        int e = errno;
        unlink(tmp);
        return rk_err_set(err, RK_E_IO, "io: cannot flush %s (%s)", tmp, strerror(e));
    }
    if (rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return rk_err_set(err, RK_E_IO, "io: cannot rename %s to %s (%s)", tmp, path, strerror(e));
    }
    return RK_OK;
}

rk_status rk_io_mkdir_p(const char *path, rk_err *err) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) return rk_err_set(err, RK_E_INVALID_ARG, "io: bad directory path '%s'", path);
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char c = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return rk_err_set(err, RK_E_IO, "io: cannot create directory %s (%s)", buf, strerror(errno));
            buf[i] = c;
        }
    }
    return RK_OK;
}

rk_status rk_io_map_copy(const char *dir, const void *data, size_t len, const void **out, rk_err *err) {
    *out = NULL;
    char path[4096];
    if (snprintf(path, sizeof path, "%s/ridgekv-array.XXXXXX", dir && *dir ? dir : "/tmp") >= (int)sizeof path)
        return rk_err_set(err, RK_E_IO, "array file: the directory name is too long (%.80s...)", dir);
    const int fd = mkstemp(path);
    if (fd < 0) return rk_err_set(err, RK_E_IO, "array file: cannot create one in %s (%s)", dir, strerror(errno));
    unlink(path);
    struct statfs fs;
    if (fstatfs(fd, &fs) == 0 && (fs.f_type == 0x01021994 || fs.f_type == 0x858458f6)) { /* tmpfs, ramfs */
        close(fd);
        return rk_err_set(err, RK_E_IO, "array file: %s is held in memory (tmpfs): a file there saves none", dir);
    }
    const uint8_t *b = data;
    for (size_t n = len; n;) {
        const ssize_t w = write(fd, b, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            const int e = w < 0 ? errno : ENOSPC;
            close(fd);
            return rk_err_set(err, RK_E_IO, "array file: cannot write %zu bytes in %s (%s)", len, dir, strerror(e));
        }
        b += w, n -= (size_t)w;
    }
    void *m = mmap(NULL, len ? len : 1, PROT_READ, MAP_SHARED, fd, 0);
    const int e = errno;
    close(fd);
    if (m == MAP_FAILED)
        return rk_err_set(err, RK_E_IO, "array file: cannot map %zu bytes in %s (%s)", len, dir, strerror(e));
    *out = m;
    return RK_OK;
}

rk_status rk_io_map_fd(int fd, size_t len, const void **out, rk_err *err) {
    void *m = mmap(NULL, len ? len : 1, PROT_READ, MAP_SHARED, fd, 0);
    *out = m == MAP_FAILED ? NULL : m;
    return m == MAP_FAILED ? rk_err_set(err, RK_E_IO, "cannot map %zu bytes of a file (%s)", len, strerror(errno))
                           : RK_OK;
}

void rk_io_map_release(const void *map, size_t off, size_t len, size_t map_len) {
    const uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), a = (uintptr_t)map + off, b = a + len;
    const uintptr_t a2 = (a + pg - 1) / pg * pg, b2 = off + len >= map_len ? (b + pg - 1) / pg * pg : b / pg * pg;
    if (map && b2 > a2) (void)madvise((void *)a2, b2 - a2, MADV_DONTNEED); /* advice: refused, the pages stay */
}

void rk_io_map_free(const void *map, size_t len) {
    if (map) munmap((void *)map, len ? len : 1);
}
