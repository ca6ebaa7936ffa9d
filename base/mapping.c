#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rk_base.h"

static const char *file_kind(mode_t m) {
    return S_ISFIFO(m)   ? "a FIFO (named pipe)"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISDIR(m)  ? "a directory"
           : S_ISSOCK(m) ? "a socket"
                         : "a special file";
}

/* O_NONBLOCK: opening a FIFO for reading would wait for a writer; for a regular file the
 * flag does nothing, and it is cleared once fstat has said what the file is. */
rk_status rk_file_open_regular(const char *path, int *fd_out, size_t *len, rk_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0)
        return rk_err_set(err, errno == ENOENT ? RK_E_NOT_FOUND : RK_E_IO, "file: cannot open %s (%s)", path,
                          strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return rk_err_set(err, RK_E_IO, "file: cannot stat %s (%s)", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return rk_err_set(err, RK_E_IO, "file: %s is %s, not a regular file", path, file_kind(st.st_mode));
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    *fd_out = fd;
    *len = (size_t)st.st_size;
    return RK_OK;
}

rk_status rk_mapping_open(const char *path, rk_mapping *out, rk_err *err) {
    int fd = -1;
    size_t len = 0;
    rk_status st = rk_file_open_regular(path, &fd, &len, err);
    if (st != RK_OK) return st;
    rk_mapping m = {NULL, len};
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

#define RK_HUGE_PAGE ((size_t)2 << 20)
#ifdef MADV_COLLAPSE
#define RK_MADV_COLLAPSE MADV_COLLAPSE
#else
#define RK_MADV_COLLAPSE 25 /* Linux 6.1 uapi value; older kernels answer EINVAL */
#endif

/* The kernel hands out transparent huge pages to madvise'd memory. */
static bool thp_offered(void) {
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return false;
    char buf[128];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    return strstr(buf, "[always]") || strstr(buf, "[madvise]");
}

uint64_t rk_proc_kb_field(const char *path, const char *name) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[256];
    const size_t n = strlen(name);
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, name, n) && line[n] == ':' && sscanf(line + n + 1, " %llu kB", &kb) == 1) break;
    fclose(f);
    return (uint64_t)kb * 1024;
}

bool rk_mapping_huge_wanted(size_t len) {
    if (len < RK_HUGE_PAGE || !thp_offered()) return false;
    /* a private copy cannot be dropped under memory pressure the way mapped file pages can:
     * only when it takes at most half of what is available now */
    const uint64_t avail = rk_proc_kb_field("/proc/meminfo", "MemAvailable");
    return avail == 0 || (uint64_t)len <= avail / 2;
}

rk_status rk_mapping_open_huge(const char *path, rk_mapping *out, rk_err *err) {
    int fd = -1;
    size_t len = 0;
    rk_status st = rk_file_open_regular(path, &fd, &len, err);
    if (st != RK_OK) return st;
    if (!rk_mapping_huge_wanted(len)) {
        close(fd);
        return rk_mapping_open(path, out, err);
    }
    /* a 2 MiB-aligned anonymous range: over-allocate, trim both ends */
    const size_t pg = (size_t)sysconf(_SC_PAGESIZE), mlen = (len + pg - 1) / pg * pg, span = mlen + RK_HUGE_PAGE;
    char *r = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) { /* no room for a copy: the file mapping still works */
        close(fd);
        return rk_mapping_open(path, out, err);
    }
    char *a = (char *)(((uintptr_t)r + RK_HUGE_PAGE - 1) & ~(uintptr_t)(RK_HUGE_PAGE - 1));
    if (a > r) munmap(r, (size_t)(a - r));
    if (r + span > a + mlen) munmap(a + mlen, (size_t)(r + span - (a + mlen)));
    (void)madvise(a, mlen, MADV_HUGEPAGE); /* advice only: 4 KiB pages if refused */
    for (size_t off = 0; off < len;) {
        size_t want = len - off < ((size_t)1 << 30) ? len - off : ((size_t)1 << 30);
        ssize_t got = pread(fd, a + off, want, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            int e = got < 0 ? errno : 0;
            munmap(a, mlen);
            close(fd);
            return e ? rk_err_set(err, RK_E_IO, "file: cannot read %s at byte %zu (%s)", path, off, strerror(e))
                     : rk_err_set(err, RK_E_IO, "file: %s ended at byte %zu of %zu while being read (truncated?)", path,
                                  off, len);
        }
        off += (size_t)got;
    }
    close(fd);
    /* MADV_HUGEPAGE is advice: a fault that finds no free 2 MiB block (fragmented memory,
     * defrag off) gets 4 KiB pages silently. Where the copy came out short, ask the kernel to
     * collapse it now (MADV_COLLAPSE, Linux 6.1: synchronous, compacts memory; EINVAL before);
     * failing that the copy stays on whatever pages it got, the bytes are right either way. */
    const size_t huge_span = (len / RK_HUGE_PAGE) * RK_HUGE_PAGE;
    if (huge_span > 0 && rk_mapping_huge_bytes(&(rk_mapping){a, len}) < huge_span)
        (void)madvise(a, huge_span, RK_MADV_COLLAPSE);
    (void)mprotect(a, mlen, PROT_READ); /* read-only like the mapping; the copy is right either way */
    *out = (rk_mapping){a, len};
    return RK_OK;
}

size_t rk_mapping_huge_bytes(const rk_mapping *m) {
    if (!m || !m->data || m->len == 0) return 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    const uintptr_t lo = (uintptr_t)m->data, hi = lo + m->len;
    char line[512];
    bool in = false;
    unsigned long long total = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long a = 0, b = 0, kb = 0;
        /* a VMA header "start-end perms ..." (hex), then its "Key: N kB" lines */
        if (sscanf(line, "%llx-%llx ", &a, &b) == 2) {
            in = a < hi && b > lo;
            continue;
        }
        if (in &&
            (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 || sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1))
            total += kb * 1024;
    }
    fclose(f);
    return total > m->len ? m->len : (size_t)total;
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
