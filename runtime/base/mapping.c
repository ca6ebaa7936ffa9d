#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rk_base.h"

rk_status rk_mapping_open(const char *path, rk_mapping *out, rk_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return rk_err_set(err, errno == ENOENT ? RK_E_NOT_FOUND : RK_E_IO,
                                  "file: cannot open %s (%s)", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return rk_err_set(err, RK_E_IO, "file: cannot stat %s (%s)", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return rk_err_set(err, RK_E_IO, "file: %s is not a regular file", path);
    }
    rk_mapping m = {NULL, (size_t)st.st_size};
    if (m.len > 0) {
        void *p = mmap(NULL, m.len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            return rk_err_set(err, RK_E_IO, "file: cannot map %s (%s)", path, strerror(e));
        }
        m.data = p;
    }
    close(fd);
    *out = m;
    return RK_OK;
}

void rk_mapping_close(rk_mapping *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->len);
    m->data = NULL;
    m->len = 0;
}

rk_status rk_arena_init(rk_arena *a, size_t cap, rk_err *err) {
    a->base = NULL;
    a->cap = a->used = 0;
    if (cap == 0) return RK_OK;
    cap = (cap + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, cap);
    if (!p) return rk_err_set(err, RK_E_NOMEM, "arena: cannot allocate %zu bytes", cap);
    a->base = p;
    a->cap = cap;
    return RK_OK;
}

void rk_arena_deinit(rk_arena *a) {
    if (!a) return;
    free(a->base);
    a->base = NULL;
    a->cap = a->used = 0;
}

void *rk_arena_alloc(rk_arena *a, size_t bytes) {
    size_t need = (bytes + 63) & ~(size_t)63;
    if (need < bytes || need > a->cap - a->used) return NULL;
    void *p = a->base + a->used;
    a->used += need;
    return p;
}

void rk_arena_reset(rk_arena *a) { a->used = 0; }

double rk_time_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

uint64_t rk_peak_rss_bytes(void) {
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) != 0) return 0;
    return (uint64_t)ru.ru_maxrss * 1024u;
}
