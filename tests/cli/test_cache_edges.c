/* The document cache's edges and checkpoints through the binary, on a generated tiny model
 * (no ../shared): `cache ls` on a read-only directory lists, `gc` and `rm` say why they remove
 * nothing; an entry whose name is not its key is reported and collected; an entry holding
 * another document of the same token count is detected by its tokens and replaced; a regular
 * file where the directory should be is named as such; and `ask` killed (SIGKILL) at random
 * points of a checkpointed read resumes and answers what an uninterrupted --no-cache run
 * answers. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rk.h"
#include "rk_cache.h"
#include "tb.h"

typedef struct fixture {
    char model[1024], dir[512], doc[600], doc2[600], kv[700];
} fixture;

/* n sentences of plain words; variant changes one letter in the middle (same token count:
 * every letter of the vocab is one token and no merge covers 'q' or 'z') */
static void write_doc(const char *path, int n, int variant) {
    FILE *d = fopen(path, "w");
    cr_assert(d, "%s", path);
    static const char *const w[] = {"the", "ball", "park", "dog", "red", "pond", "day", "jumped", "into", "back"};
    uint64_t seed = 9;
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < 8; k++) fprintf(d, "%s ", w[tb_rand_u64(&seed) % 10]);
        fputs(i == n / 2 ? (variant ? "zq" : "qz") : "ok", d);
        fputs(".\n", d);
    }
    fclose(d);
}

static void setup(fixture *f, int n_sentences) {
    tb_tiny_spec spec = {.arch = TB_ARCH_LLAMA, .n_layer = 3, .n_ctx_train = 4096, .seed = 23};
    cr_assert(tb_tiny_model(&spec, f->model, sizeof f->model), "%s", f->model);
    cr_assert(tb_tmp_dir(f->dir, sizeof f->dir, "rk-cache-edges"), "%s", f->dir);
    snprintf(f->doc, sizeof f->doc, "%s/d1.txt", f->dir);
    snprintf(f->doc2, sizeof f->doc2, "%s/d2.txt", f->dir);
    write_doc(f->doc, n_sentences, 0);
    write_doc(f->doc2, n_sentences, 1);
    snprintf(f->kv, sizeof f->kv, "%s/xdg/ridgekv/kv", f->dir);
}

static void teardown(fixture *f) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s' 2>/dev/null; rm -rf '%s'", f->dir, f->dir);
    cr_assert(system(cmd) == 0);
    remove(f->model);
}

static const char *Q = "Where did the dog go?";

static tb_result ask(const fixture *f, const char *env, const char *extra, const char *doc) {
    char e[1400], a[3000];
    snprintf(e, sizeof e, "env XDG_CACHE_HOME='%s/xdg' %s", f->dir, env ? env : "");
    snprintf(a, sizeof a, "ask -m '%s' -n 6 -b 32 %s --doc '%s' '%s'", f->model, extra ? extra : "", doc, Q);
    return tb_run(e, a);
}

static tb_result cache_cmd(const fixture *f, const char *prefix, const char *args) {
    char e[1400];
    snprintf(e, sizeof e, "env XDG_CACHE_HOME='%s/xdg' %s", f->dir, prefix ? prefix : "");
    return tb_run(e, args);
}

static char *answer(const fixture *f, const char *doc) {
    tb_result r = ask(f, NULL, "--no-cache", doc);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    char *out = r.out;
    r.out = NULL;
    tb_result_free(&r);
    return out;
}

/* The names of the cache's files with this ending; returns how many. */
static int files(const fixture *f, const char *ending, char names[][80], int cap) {
    DIR *d = opendir(f->kv);
    if (!d) return 0;
    int n = 0;
    struct dirent *de;
    const size_t le = strlen(ending);
    while ((de = readdir(d))) {
        const size_t l = strlen(de->d_name);
        if (l < le || strcmp(de->d_name + l - le, ending)) continue;
        if (n < cap) snprintf(names[n], 80, "%.79s", de->d_name);
        n++;
    }
    closedir(d);
    return n;
}

Test(cache_edges, read_only_directory_lists_and_gc_rm_say_why) {
    fixture f;
    setup(&f, 20);
    tb_result r = cache_cmd(&f, NULL, "cache ls"); /* no directory yet: nothing to list */
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "0 entries"), "%s", r.err);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, f.doc);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    char names[4][80];
    cr_assert_eq(files(&f, ".rkkv", names, 4), 1);
    /* read-only: a read-only bind mount for root (which ignores modes), the modes otherwise */
    char ro[2400];
    if (geteuid() == 0)
        snprintf(ro, sizeof ro, "unshare -m sh -c 'mount --bind -o ro \"%s\" \"%s\" && exec \"$0\" \"$@\"'", f.kv,
                 f.kv);
    else {
        cr_assert_eq(chmod(f.kv, 0555), 0);
        ro[0] = '\0';
    }
    r = cache_cmd(&f, ro, "cache ls");
    cr_expect_eq(r.code, 0, "ls on a read-only cache: %s", r.err);
    cr_expect(strstr(r.out, "tokens") && !strncmp(r.out, names[0], 16), "ls: %s", r.out);
    cr_expect(strstr(r.err, "1 entry"), "%s", r.err);
    tb_result_free(&r);
    r = cache_cmd(&f, ro, "cache gc");
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "nothing collected") && (strstr(r.err, "read-only") || strstr(r.err, "not writable")),
              "gc: %s", r.err);
    tb_result_free(&r);
    r = cache_cmd(&f, ro, "cache rm --all");
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "cannot remove") && (strstr(r.err, "read-only") || strstr(r.err, "not writable")), "rm: %s",
              r.err);
    tb_result_free(&r);
    chmod(f.kv, 0755);
    cr_expect_eq(files(&f, ".rkkv", names, 4), 1, "the entry is still there");
    teardown(&f);
}

Test(cache_edges, entry_named_for_another_key_is_reported_and_collected) {
    fixture f;
    setup(&f, 20);
    tb_result r = ask(&f, NULL, NULL, f.doc);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    char names[4][80], cmd[2400];
    cr_assert_eq(files(&f, ".rkkv", names, 4), 1);
    const char *other = "abababababababababababababababababababababababababababababababab.rkkv";
    snprintf(cmd, sizeof cmd, "cp '%s/%s' '%s/%s'", f.kv, names[0], f.kv, other);
    cr_assert(system(cmd) == 0);
    r = cache_cmd(&f, NULL, "cache ls");
    cr_expect_eq(r.code, 0, "%s", r.err);
    const char *line = strstr(r.out, "abababababababab");
    cr_expect(line && strstr(line, "unreadable") && strstr(line, "named for entry"), "ls: %s", r.out);
    tb_result_free(&r);
    r = cache_cmd(&f, NULL, "cache gc");
    cr_expect(r.code == 0 && strstr(r.err, "removed 1 file"), "gc: %s", r.err);
    tb_result_free(&r);
    cr_expect_eq(files(&f, ".rkkv", names, 4), 1);
    cr_expect(strncmp(names[0], "abab", 4), "gc kept the misnamed entry");
    teardown(&f);
}

Test(cache_edges, entry_holding_another_document_is_detected_and_replaced) {
    fixture f;
    setup(&f, 20);
    char *want = answer(&f, f.doc2);
    char names[4][80], key_a[65] = "", key_b[65] = "";
    tb_result r = ask(&f, NULL, NULL, f.doc);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    cr_assert_eq(files(&f, ".rkkv", names, 4), 1);
    snprintf(key_a, sizeof key_a, "%.64s", names[0]);
    r = ask(&f, NULL, NULL, f.doc2);
    cr_assert_eq(r.code, 0, "%s", r.err);
    const long na = strtol(strstr(r.err, "read 0/") + 7, NULL, 10); /* the second document's prompt */
    tb_result_free(&r);
    cr_assert_eq(files(&f, ".rkkv", names, 4), 2);
    snprintf(key_b, sizeof key_b, "%.64s", strncmp(names[0], key_a, 64) ? names[0] : names[1]);
    /* the first document's rows saved under the second's key, header and all */
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(f.model, &m, &e), RK_OK, "%s", e.msg);
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 4096, sp.n_batch = 32;
    rk_session *s = NULL;
    cr_assert_eq(rk_session_create(m, &sp, &s, &e), RK_OK, "%s", e.msg);
    rk_doc_cache_params cp = rk_doc_cache_params_default();
    cp.dir = f.kv;
    rk_doc_cache *c = NULL;
    cr_assert_eq(rk_doc_cache_open(&cp, &c, &e), RK_OK, "%s", e.msg);
    int64_t n = 0;
    cr_assert_eq(rk_doc_cache_load(c, key_a, s, &n, &e), RK_OK, "%s", e.msg);
    r = ask(&f, NULL, NULL, f.doc); /* the first document's prompt: as long as the second's */
    cr_expect_eq(strtol(strstr(r.err, "read 0/") + 7, NULL, 10), na, "both prompts have %ld tokens", na);
    tb_result_free(&r);
    cr_assert_eq(rk_doc_cache_save(c, key_b, m, NULL, s, n, "d2.txt", &e), RK_OK, "%s", e.msg);
    rk_doc_cache_close(c);
    rk_session_destroy(s);
    rk_model_destroy(m);
    /* detected by content, reported as such, read again: the second document's answer */
    r = ask(&f, NULL, NULL, f.doc2);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "holds another document") && strstr(r.err, "reading the documents again"), "%s", r.err);
    cr_expect(!strstr(r.err, "reused"), "%s", r.err);
    cr_expect_str_eq(r.out, want);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, f.doc2); /* replaced: reused now, same answer */
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "reused cached KV"), "%s", r.err);
    cr_expect_str_eq(r.out, want);
    tb_result_free(&r);
    free(want);
    teardown(&f);
}

Test(cache_edges, regular_file_in_place_of_the_directory_is_named) {
    fixture f;
    setup(&f, 10);
    char parent[800];
    snprintf(parent, sizeof parent, "%s/xdg/ridgekv", f.dir);
    char cmd[1800];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && echo x > '%s'", parent, f.kv);
    cr_assert(system(cmd) == 0);
    tb_result r = cache_cmd(&f, NULL, "cache ls");
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "is a regular file, not a directory") && !strstr(r.err, "Permission denied"), "%s", r.err);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, f.doc);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "document cache off") && strstr(r.err, "regular file"), "%s", r.err);
    tb_result_free(&r);
    teardown(&f);
}

/* ---- checkpoints: kill -9 at random points, then resume ------------------------------- */

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ask in the background with checkpoints every chunk; SIGKILL after delay_s (< 0: never).
 * Returns 1 when it was killed, 0 when it finished with exit 0; *err its stderr. */
static int ask_killed(const fixture *f, double delay_s, char **err, char **out) {
    char cmd[4000], ef[700], of[700];
    snprintf(ef, sizeof ef, "%s/err.txt", f->dir);
    snprintf(of, sizeof of, "%s/out.txt", f->dir);
    snprintf(cmd, sizeof cmd,
             "exec env XDG_CACHE_HOME='%s/xdg' RIDGEKV_CHECKPOINT=1c '%s' ask -m '%s' -n 6 -b 32 --doc '%s' '%s' "
             ">'%s' 2>'%s' </dev/null",
             f->dir, getenv("RK_BIN"), f->model, f->doc, Q, of, ef);
    const pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    const double t0 = now_s();
    int status = 0, killed = 0;
    for (;;) {
        const pid_t w = waitpid(pid, &status, WNOHANG);
        if (w == pid) break;
        if (delay_s >= 0 && now_s() - t0 >= delay_s) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
            break;
        }
        usleep(2000);
    }
    if (!killed) cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "ask failed (status %d)", status);
    size_t n;
    *err = tb_read_file(ef, &n);
    *out = tb_read_file(of, &n);
    cr_assert(*err && *out);
    return killed;
}

Test(cache_edges, ask_killed_during_a_checkpointed_read_resumes_with_the_same_answer, .timeout = 280) {
    fixture f;
    setup(&f, 40);
    cr_assert(getenv("RK_BIN"));
    char *want = answer(&f, f.doc);
    /* one full checkpointed read for its duration, then a clean cache */
    char *err, *out;
    double t0 = now_s();
    cr_assert_eq(ask_killed(&f, -1, &err, &out), 0);
    const double full = now_s() - t0;
    cr_expect_str_eq(out, want);
    free(err), free(out);
    tb_result r = cache_cmd(&f, NULL, "cache rm --all");
    tb_result_free(&r);
    char names[8][80];
    int resumes = 0, kills = 0;
    uint64_t seed = 1234;
    for (int i = 0; i < 5; i++) {
        const double frac = 0.1 + 0.4 * (double)(tb_rand_u64(&seed) % 1000) / 1000.0;
        const int killed = ask_killed(&f, frac * full, &err, &out);
        resumes += strstr(err, "resuming from token") != NULL;
        kills += killed;
        if (!killed) { /* it finished first: start over */
            cr_expect_str_eq(out, want);
            r = cache_cmd(&f, NULL, "cache rm --all");
            tb_result_free(&r);
        } else if (files(&f, ".rkkv", names, 8) > 0) {
            /* the kill came after the read (a busy machine reads at another pace than the
             * timed run): its entry must be whole, reused as it is, with the same answer */
            char *e2, *o2;
            cr_assert_eq(ask_killed(&f, -1, &e2, &o2), 0);
            cr_expect(strstr(e2, "reused cached KV") != NULL, "a killed read left an entry ask does not reuse: %s", e2);
            cr_expect_str_eq(o2, want, "the entry a killed ask left answers otherwise");
            free(e2), free(o2);
            r = cache_cmd(&f, NULL, "cache rm --all");
            tb_result_free(&r);
        }
        free(err), free(out);
    }
    cr_assert(kills > 0, "no run was killed while reading (%.2f s a read)", full);
    const bool has = files(&f, ".rkck", names, 8) + files(&f, ".rkck.old", names, 8) > 0;
    cr_assert_eq(ask_killed(&f, -1, &err, &out), 0);
    resumes += strstr(err, "resuming from token") != NULL;
    cr_expect(!has || strstr(err, "resuming from token"), "a checkpoint was there: %s", err);
    cr_expect(resumes > 0, "no read resumed (%d killed)", kills);
    cr_expect_str_eq(out, want, "the resumed read answers what --no-cache answers");
    free(err), free(out);
    cr_expect_eq(files(&f, ".rkck", names, 8), 0, "the completed read left its checkpoint");
    cr_expect_eq(files(&f, ".rkkv", names, 8), 1);
    free(want);
    teardown(&f);
}
