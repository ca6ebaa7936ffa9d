#include "tb.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tb_shared_dir(void) {
    const char *no = getenv("RK_NO_SHARED");
    if (no && *no && strcmp(no, "0") != 0) return NULL;
    const char *d = getenv("RK_SHARED_DIR");
    struct stat st;
    if (!d || stat(d, &st) != 0 || !S_ISDIR(st.st_mode)) return NULL;
    return d;
}

const char *tb_shared_path(char *buf, size_t cap, const char *rel) {
    const char *d = tb_shared_dir();
    if (!d) {
        snprintf(buf, cap, "../shared not found (RK_SHARED_DIR unset or missing, or RK_NO_SHARED set)");
        return NULL;
    }
    snprintf(buf, cap, "%s/%s", d, rel);
    struct stat st;
    if (stat(buf, &st) != 0) {
        char tmp[1024];
        snprintf(tmp, sizeof tmp, "%s", buf);
        snprintf(buf, cap, "missing shared file %s", tmp);
        return NULL;
    }
    return buf;
}

void *tb_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    if (fseek(f, 0, SEEK_END) != 0) {
        fclose(f);
        return NULL;
    }
    long n = ftell(f);
    if (n < 0 || fseek(f, 0, SEEK_SET) != 0) {
        fclose(f);
        return NULL;
    }
    void *buf = malloc((size_t)n + 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        ((char *)buf)[n] = 0;
        *len = (size_t)n;
    }
    return buf;
}

const char *tb_default_model(char *buf, size_t cap) {
    const char *no = getenv("RK_NO_SHARED");
    if (no && *no && strcmp(no, "0") != 0) return NULL;
    const char *env = getenv("RIDGEKV_MODEL");
    if (env && *env) {
        snprintf(buf, cap, "%s", env);
    } else {
        const char *xdg = getenv("XDG_CACHE_HOME");
        const char *home = getenv("HOME");
        if (xdg && *xdg) snprintf(buf, cap, "%s/ridgekv/SmolLM2-135M-Instruct.Q4_1.gguf", xdg);
        else if (home) snprintf(buf, cap, "%s/.cache/ridgekv/SmolLM2-135M-Instruct.Q4_1.gguf", home);
        else return NULL;
    }
    struct stat st;
    return stat(buf, &st) == 0 ? buf : NULL;
}

uint64_t tb_rand_u64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float tb_rand_normal(uint64_t *s) {
    double u1 = ((double)(tb_rand_u64(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = ((double)(tb_rand_u64(s) >> 11) + 0.5) / 9007199254740992.0;
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

const char *tb_twin_path(const char *name, char *buf, size_t cap) {
    char rel[256], xzpath[1024];
    snprintf(rel, sizeof rel, "golden/models/%s.f32-twin.gguf.xz", name);
    if (!tb_shared_path(xzpath, sizeof xzpath, rel)) {
        snprintf(buf, cap, "%s", xzpath);
        return NULL;
    }
    const char *tmp = getenv("TMPDIR");
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ridgekv-twins-%u", tmp && *tmp ? tmp : "/tmp", (unsigned)getuid());
    mkdir(dir, 0700);
    snprintf(buf, cap, "%s/%s.f32-twin.gguf", dir, name);
    struct stat st;
    if (stat(buf, &st) == 0) return buf;
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "xz -dc '%s' > '%s.%d.part' && mv '%s.%d.part' '%s'", xzpath, buf, (int)getpid(), buf,
             (int)getpid(), buf);
    if (system(cmd) != 0 || stat(buf, &st) != 0) {
        snprintf(buf, cap, "could not decompress %s with xz", xzpath);
        return NULL;
    }
    return buf;
}

float *tb_read_f32(const char *path, size_t *n) {
    size_t len;
    void *p = tb_read_file(path, &len);
    if (!p) return NULL;
    *n = len / sizeof(float);
    return p;
}

tb_result tb_run(const char *env, const char *args) {
    tb_result r = {-2, NULL, NULL};
    const char *bin = getenv("RK_BIN");
    char dir[512];
    if (!bin || !tb_tmp_dir(dir, sizeof dir, "rkrun")) return r;
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "%s '%s' %s >'%s/out' 2>'%s/err' </dev/null", env ? env : "", bin, args, dir, dir);
    int st = system(cmd);
    r.code = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    char p[600];
    size_t len;
    snprintf(p, sizeof p, "%s/out", dir);
    r.out = tb_read_file(p, &len);
    unlink(p);
    snprintf(p, sizeof p, "%s/err", dir);
    r.err = tb_read_file(p, &len);
    unlink(p);
    rmdir(dir);
    if (!r.out) r.out = calloc(1, 1);
    if (!r.err) r.err = calloc(1, 1);
    return r;
}

void tb_result_free(tb_result *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

static const char *tmp_root(void) {
    const char *t = getenv("TMPDIR");
    return t && *t ? t : "/tmp";
}

const char *tb_tmp_path(char *buf, size_t cap, const char *stem, const char *suffix) {
    if (!suffix) suffix = "";
    int n = snprintf(buf, cap, "%s/%s-XXXXXX%s", tmp_root(), stem, suffix);
    if (n < 0 || (size_t)n >= cap) {
        snprintf(buf, cap, "temporary path for %s does not fit", stem);
        return NULL;
    }
    int fd = mkstemps(buf, (int)strlen(suffix));
    if (fd < 0) {
        snprintf(buf, cap, "mkstemps under %s failed", tmp_root());
        return NULL;
    }
    close(fd);
    return buf;
}

bool tb_flip_byte(const char *path, long off, int mask) {
    FILE *f = fopen(path, "r+b");
    if (!f) return false;
    if (off < 0 && (fseek(f, 0, SEEK_END) != 0 || (off = ftell(f) / 2) < 0)) off = -1;
    int ch = off >= 0 && fseek(f, off, SEEK_SET) == 0 ? fgetc(f) : EOF;
    const bool ok = ch != EOF && fseek(f, off, SEEK_SET) == 0 && fputc(ch ^ mask, f) != EOF;
    return fclose(f) == 0 && ok;
}

const char *tb_tmp_dir(char *buf, size_t cap, const char *stem) {
    int n = snprintf(buf, cap, "%s/%s-XXXXXX", tmp_root(), stem);
    if (n < 0 || (size_t)n >= cap) {
        snprintf(buf, cap, "temporary directory for %s does not fit", stem);
        return NULL;
    }
    if (!mkdtemp(buf)) {
        snprintf(buf, cap, "mkdtemp under %s failed", tmp_root());
        return NULL;
    }
    return buf;
}
