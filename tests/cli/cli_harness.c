/* The CLI suites' harness (cli_harness.h). */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli_harness.h"
#include "tb.h"

/* Every CLI test runs with XDG_CACHE_HOME in a temporary directory, so that `ask`'s
 * document KV cache (ridgekv/kv) never lands in the real ~/.cache: its ridgekv/ holds
 * links to the real cache's entries (the pulled models) except kv. A test that sets
 * XDG_CACHE_HOME itself overrides it. Removed when the process that made it exits. */
static char g_xdg[64];
static pid_t g_xdg_pid;

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

__attribute__((constructor)) static void private_cache_home(void) {
    char real[2048];
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    if (xdg && *xdg) snprintf(real, sizeof real, "%s/ridgekv", xdg);
    else if (home && *home) snprintf(real, sizeof real, "%s/.cache/ridgekv", home);
    else real[0] = 0;
    snprintf(g_xdg, sizeof g_xdg, "/tmp/rkxdgXXXXXX");
    if (!mkdtemp(g_xdg)) {
        g_xdg[0] = 0;
        return;
    }
    g_xdg_pid = getpid();
    char dir[128], src[4096], dst[4096];
    snprintf(dir, sizeof dir, "%s/ridgekv", g_xdg);
    mkdir(dir, 0700);
    DIR *d = real[0] ? opendir(real) : NULL;
    for (struct dirent *de; d && (de = readdir(d));) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, "kv")) continue;
        snprintf(src, sizeof src, "%s/%s", real, de->d_name);
        snprintf(dst, sizeof dst, "%s/%s", dir, de->d_name);
        if (symlink(src, dst) != 0) continue;
    }
    if (d) closedir(d);
    setenv("XDG_CACHE_HOME", g_xdg, 1);
}

__attribute__((destructor)) static void private_cache_home_rm(void) {
    if (g_xdg[0] && getpid() == g_xdg_pid) nftw(g_xdg, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

const char *bin(void) {
    const char *b = getenv("RK_BIN");
    cr_assert(b, "RK_BIN not set (meson sets it)");
    return b;
}

const char *stories(char *buf, size_t cap) {
    if (!tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    return buf;
}

char *sample(char *buf, size_t cap, const char *name) {
    const char *src = getenv("RK_SOURCE_DIR");
    cr_assert(src, "RK_SOURCE_DIR not set (meson sets it)");
    snprintf(buf, cap, "%s/samples/docs/%s", src, name);
    cr_assert(access(buf, R_OK) == 0, "missing sample document %s", buf);
    return buf;
}

/* A fresh directory for a test's files (mkdtemp), name in buf. */
char *tmp_dir(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/rkcliXXXXXX");
    cr_assert(mkdtemp(buf), "mkdtemp: %s", strerror(errno));
    return buf;
}

void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    cr_assert(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a child on a pseudo-terminal ------------------------------------------------ */

void term_start(term *t, char *const argv[]) {
    memset(t, 0, sizeof *t);
    struct winsize ws = {.ws_row = 40, .ws_col = 200};
    t->pid = forkpty(&t->fd, NULL, NULL, &ws);
    cr_assert(t->pid >= 0, "forkpty: %s", strerror(errno));
    if (t->pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    t->cap = 1 << 16;
    t->buf = calloc(1, t->cap);
}

/* Reads what is there, waiting at most ms for the first byte. */
void term_pump(term *t, int ms) {
    struct pollfd p = {.fd = t->fd, .events = POLLIN};
    if (t->eof || poll(&p, 1, ms) <= 0) return;
    char tmp[4096];
    ssize_t n = read(t->fd, tmp, sizeof tmp);
    if (n <= 0) {
        t->eof = true; /* EIO: the child closed the terminal */
        return;
    }
    if (t->len + (size_t)n + 1 > t->cap) {
        t->cap = (t->len + (size_t)n + 1) * 2;
        t->buf = realloc(t->buf, t->cap);
    }
    memcpy(t->buf + t->len, tmp, (size_t)n);
    t->len += (size_t)n;
    t->buf[t->len] = 0;
}

/* Waits until needle shows up at or after offset from; false on timeout or EOF. */
bool term_expect(term *t, size_t from, const char *needle, double timeout_s) {
    double end = now_s() + timeout_s;
    while (!(from <= t->len && strstr(t->buf + from, needle))) {
        if (t->eof || now_s() > end) return false;
        term_pump(t, 20);
    }
    return true;
}

/* Reads until the child has been quiet for ms. Typing right after the prompt appears can
 * land before libedit has switched the terminal to raw mode; the terminal then echoes the
 * line once itself and libedit a second time, which would confuse the checks below. */
void term_settle(term *t, int ms) {
    double quiet = now_s();
    size_t len = t->len;
    while (!t->eof && now_s() - quiet < ms / 1000.0) {
        term_pump(t, 10);
        if (t->len != len) len = t->len, quiet = now_s();
    }
}

void term_send(term *t, const char *s) { cr_assert_eq(write(t->fd, s, strlen(s)), (ssize_t)strlen(s)); }

/* Waits for the child to exit (draining the terminal); returns its exit code or -1. */
int term_wait(term *t, double timeout_s) {
    double end = now_s() + timeout_s;
    int st = 0;
    for (;;) {
        term_pump(t, 20);
        pid_t r = waitpid(t->pid, &st, WNOHANG);
        if (r == t->pid) break;
        if (now_s() > end) {
            kill(t->pid, SIGKILL);
            waitpid(t->pid, &st, 0);
            return -1;
        }
    }
    close(t->fd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
/* ---- children on pipes / files ------------------------------------------------ */

/* Runs ridgekv with argv (NULL-terminated, without the binary), stdin from a string. */
result run_argv(const char *input, char *const args[]) {
    char dir[] = "/tmp/rkchatXXXXXX";
    cr_assert(mkdtemp(dir));
    char in[64], out[64], err[64];
    snprintf(in, sizeof in, "%s/in", dir);
    snprintf(out, sizeof out, "%s/out", dir);
    snprintf(err, sizeof err, "%s/err", dir);
    FILE *f = fopen(in, "w");
    cr_assert(f);
    fputs(input ? input : "", f);
    fclose(f);
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)bin();
    while (args[n - 1] && n < 31) argv[n] = args[n - 1], n++;
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int i0 = open(in, O_RDONLY), o = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0600),
            e = open(err, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (i0 < 0 || o < 0 || e < 0) _exit(127);
        dup2(i0, 0), dup2(o, 1), dup2(e, 2);
        setsid(); /* no controlling terminal: stdin and stdout are plain files */
        execv(argv[0], argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, NULL, NULL};
    size_t len;
    r.out = tb_read_file(out, &len);
    r.err = tb_read_file(err, &len);
    unlink(in), unlink(out), unlink(err), rmdir(dir);
    cr_assert(r.out && r.err);
    /* the child's sanitizer reports (ASan build) land in its stderr, not the test's */
    cr_expect(!strstr(r.err, "ERROR: AddressSanitizer") && !strstr(r.err, "ERROR: LeakSanitizer") &&
                  !strstr(r.err, "runtime error:"),
              "sanitizer report from ridgekv %s: %s", args[0], r.err);
    return r;
}

void done(result *r) {
    free(r->out);
    free(r->err);
}

/* The number after `key` in text, or -1. */
long num_after(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}
