/* ridgekv ask and the document KV cache, end to end on stories260K: the second question
 * on the same document reuses the cached KV and answers the same; `ridgekv cache`
 * ls / rm / gc / path; and every cache fault, each detected, the documents
 * read again, the same greedy answer as without any cache, nothing of the user's lost:
 * short write, ENOSPC, EIO, a corrupt byte, a truncated file, another format version, an
 * entry of another model and of another KV policy, kill -9 during the save, an unusable
 * cache directory, io_uring unavailable (RIDGEKV_NO_URING=1). Faults come from the block
 * store's hook (RIDGEKV_IO_FAULT) or from editing the files. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tb.h"

static const char *stories(char *buf, size_t cap) {
    if (!tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    return buf;
}

typedef struct fixture {
    char model[1024], dir[512], doc[600], kv[700];
} fixture;

static void setup(fixture *f) {
    stories(f->model, sizeof f->model);
    cr_assert(tb_tmp_dir(f->dir, sizeof f->dir, "rk-cache"), "%s", f->dir);
    snprintf(f->doc, sizeof f->doc, "%s/notes.txt", f->dir);
    FILE *d = fopen(f->doc, "w");
    cr_assert(d);
    fputs("Lily had a red ball. She played with it in the park every day with her dog Max.\n"
          "One day the ball rolled into the pond and Max jumped in to get it back for her.\n",
          d);
    fclose(d);
    snprintf(f->kv, sizeof f->kv, "%s/xdg/ridgekv/kv", f->dir);
}

static void rm_rf(const char *path) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
    cr_assert(system(cmd) == 0);
}

/* ridgekv ask on the fixture's document with XDG_CACHE_HOME in the fixture (env: more). */
static tb_result ask(const fixture *f, const char *env, const char *extra, const char *question) {
    char e[1400], a[3000];
    snprintf(e, sizeof e, "env XDG_CACHE_HOME='%s/xdg' %s", f->dir, env ? env : "");
    snprintf(a, sizeof a, "ask -m '%s' -n 12 -c 512 --ctx-overflow-ok %s --doc '%s' '%s'", f->model, extra ? extra : "",
             f->doc, question);
    return tb_run(e, a);
}

static tb_result cache_cmd(const fixture *f, const char *args) {
    char e[700];
    snprintf(e, sizeof e, "env XDG_CACHE_HOME='%s/xdg'", f->dir);
    return tb_run(e, args);
}

/* Files in the cache directory: entries (*.rkkv) and temporary ones (*.tmp.*). */
static void count_files(const fixture *f, int *entries, int *tmps) {
    *entries = *tmps = 0;
    DIR *d = opendir(f->kv);
    if (!d) return;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (strstr(de->d_name, ".tmp.")) (*tmps)++;
        else if (strstr(de->d_name, ".rkkv")) (*entries)++;
    }
    closedir(d);
}

/* The path of the only entry. */
static void entry_path(const fixture *f, char *buf, size_t cap) {
    DIR *d = opendir(f->kv);
    cr_assert(d, "no cache directory %s", f->kv);
    struct dirent *de;
    buf[0] = '\0';
    while ((de = readdir(d)))
        if (strlen(de->d_name) == 69 && strstr(de->d_name, ".rkkv")) snprintf(buf, cap, "%s/%s", f->kv, de->d_name);
    closedir(d);
    cr_assert(buf[0], "no entry in %s", f->kv);
}

static const char *Q1 = "What did Lily have?", *Q2 = "Who jumped into the pond?";

/* The answer without any cache. */
static char *baseline(const fixture *f, const char *extra, const char *q) {
    char x[400];
    snprintf(x, sizeof x, "--no-cache %s", extra ? extra : "");
    tb_result r = ask(f, NULL, x, q);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_assert(strstr(r.err, "document cache off"), "%s", r.err);
    char *out = r.out;
    r.out = NULL;
    tb_result_free(&r);
    return out;
}

static long tokens_reused(const char *err) {
    const char *p = strstr(err, "reused cached KV for notes.txt (");
    return p ? strtol(p + strlen("reused cached KV for notes.txt ("), NULL, 10) : -1;
}

Test(cache, second_question_reuses_the_documents_and_answers_the_same) {
    fixture f;
    setup(&f);
    char *a1 = baseline(&f, NULL, Q1), *a2 = baseline(&f, NULL, Q2);
    int ne, nt;
    count_files(&f, &ne, &nt);
    cr_expect_eq(ne + nt, 0, "--no-cache writes nothing");
    tb_result r = ask(&f, NULL, NULL, Q1); /* cold: reads and saves */
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "reused"), "%s", r.err);
    cr_expect_str_eq(r.out, a1);
    count_files(&f, &ne, &nt);
    cr_expect(ne == 1 && nt == 0, "one entry, no temporary file (%d, %d)", ne, nt);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, Q2); /* another question on the same document */
    cr_assert_eq(r.code, 0, "%s", r.err);
    const long n = tokens_reused(r.err);
    cr_expect(n > 40, "reused line: %s", r.err);
    cr_expect_str_eq(r.out, a2, "the same greedy answer as without the cache");
    /* only the question was read: the prompt less the reused tokens */
    const char *p0 = strstr(r.err, "read 0/"), *rd = strstr(r.err, " tokens in ");
    cr_assert(p0 && rd, "%s", r.err);
    while (rd > r.err && rd[-1] >= '0' && rd[-1] <= '9') rd--;
    cr_expect_eq(strtol(rd, NULL, 10), strtol(p0 + 7, NULL, 10) - n, "%s", r.err);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, Q1);
    cr_expect_eq(tokens_reused(r.err), n);
    cr_expect_str_eq(r.out, a1);
    tb_result_free(&r);
    /* cache ls / path / rm / gc */
    r = cache_cmd(&f, "cache ls");
    cr_expect_eq(r.code, 0, "%s", r.err);
    char tok[64];
    snprintf(tok, sizeof tok, "%ld tokens", n);
    cr_expect(strstr(r.out, tok) && strstr(r.out, "notes.txt") && strstr(r.out, "f16"), "ls: %s", r.out);
    cr_expect(strstr(r.err, "1 entry"), "%s", r.err);
    tb_result_free(&r);
    r = cache_cmd(&f, "cache path");
    cr_expect(r.code == 0 && !strncmp(r.out, f.kv, strlen(f.kv)), "%s", r.out);
    tb_result_free(&r);
    r = cache_cmd(&f, "cache gc --max 1M");
    cr_expect_eq(r.code, 0, "%s", r.err);
    count_files(&f, &ne, &nt);
    cr_expect_eq(ne, 1, "gc under the cap keeps the entry");
    tb_result_free(&r);
    r = cache_cmd(&f, "cache gc --max 1K"); /* the entry is over 1K: LRU removes it */
    cr_expect(r.code == 0 && strstr(r.err, "removed 1 file"), "%s", r.err);
    count_files(&f, &ne, &nt);
    cr_expect_eq(ne, 0);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, Q1);
    tb_result_free(&r);
    r = cache_cmd(&f, "cache rm --all");
    cr_expect(r.code == 0 && strstr(r.err, "removed 1 entry"), "%s", r.err);
    tb_result_free(&r);
    r = cache_cmd(&f, "cache rm 00zz");
    cr_expect_neq(r.code, 0, "rm of a prefix that matches nothing fails");
    tb_result_free(&r);
    free(a1), free(a2);
    rm_rf(f.dir);
}

/* A save that fails: reported, nothing left behind, the answer unchanged. */
static void save_fault(const char *fault) {
    fixture f;
    setup(&f);
    char *a = baseline(&f, NULL, Q1), env[64];
    snprintf(env, sizeof env, "RIDGEKV_IO_FAULT=%s", fault);
    tb_result r = ask(&f, env, NULL, Q1);
    cr_assert_eq(r.code, 0, "%s: %s", fault, r.err);
    cr_expect(strstr(r.err, "cannot save entry"), "%s: %s", fault, r.err);
    cr_expect_str_eq(r.out, a, "%s", fault);
    int ne, nt;
    count_files(&f, &ne, &nt);
    cr_expect(ne == 0 && nt == 0, "%s: nothing left (%d entries, %d temporary)", fault, ne, nt);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, Q1); /* the next run saves normally */
    cr_expect(r.code == 0 && !strstr(r.err, "reused") && !strcmp(r.out, a), "%s", r.err);
    count_files(&f, &ne, &nt);
    cr_expect_eq(ne, 1);
    tb_result_free(&r);
    free(a);
    rm_rf(f.dir);
}

Test(cache, fault_short_write_on_save) { save_fault("short_write@all"); }
Test(cache, fault_enospc_on_save) { save_fault("enospc@1"); }

/* A load that fails: detected, the entry removed, the documents read again (and saved),
 * the same answer; the run after that reuses the new entry. */
static void load_fault(const char *env, void (*edit)(const char *path), const char *what) {
    fixture f;
    setup(&f);
    char *a = baseline(&f, NULL, Q1);
    tb_result r = ask(&f, NULL, NULL, Q1);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    char path[1200];
    entry_path(&f, path, sizeof path);
    if (edit) edit(path);
    r = ask(&f, env, NULL, Q1);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "is unusable") && strstr(r.err, what) && strstr(r.err, "reading the documents again"),
              "want '%s': %s", what, r.err);
    cr_expect(!strstr(r.err, "reused"), "%s", r.err);
    cr_expect_str_eq(r.out, a, "the same greedy answer after %s", what);
    tb_result_free(&r);
    r = ask(&f, NULL, NULL, Q1);
    cr_expect(tokens_reused(r.err) > 0, "rewritten entry reused: %s", r.err);
    cr_expect_str_eq(r.out, a);
    tb_result_free(&r);
    free(a);
    rm_rf(f.dir);
}

static void poke(const char *path, long off, int x) {
    FILE *fp = fopen(path, "r+b");
    cr_assert(fp, "%s", path);
    fseek(fp, off, SEEK_SET);
    int c = fgetc(fp);
    fseek(fp, off, SEEK_SET);
    fputc(c ^ x, fp);
    fclose(fp);
}
static void flip_payload_byte(const char *path) { poke(path, 4096 + 64 + 40, 0x01); } /* inside frame 1 */
static void bump_version(const char *path) { poke(path, 4, 0x02); }
static void cut_tail(const char *path) {
    struct stat st;
    cr_assert(stat(path, &st) == 0);
    cr_assert(truncate(path, st.st_size - 4096 - 7) == 0);
}

Test(cache, fault_eio_on_load) { load_fault("RIDGEKV_IO_FAULT=eio@1", NULL, "Input/output error"); }
Test(cache, fault_corrupt_byte_from_the_hook) { load_fault("RIDGEKV_IO_FAULT=corrupt@1", NULL, "corrupt"); }
Test(cache, fault_corrupt_byte_in_the_file) { load_fault(NULL, flip_payload_byte, "corrupt"); }
Test(cache, fault_truncated_file) { load_fault(NULL, cut_tail, "truncated"); }
Test(cache, fault_wrong_format_version) { load_fault(NULL, bump_version, "version 3"); }

/* An entry written for another model or KV policy, put under the key this run looks up. */
Test(cache, entry_of_another_model_or_kv_policy_is_refused) {
    fixture f;
    setup(&f);
    char other[1024];
    if (!tb_shared_path(other, sizeof other, "models/aidreams260K/aidreams260K-f32.gguf")) cr_skip_test("%s", other);
    char *a16 = baseline(&f, NULL, Q1), *a32 = baseline(&f, "--kv f32", Q1);
    tb_result r = ask(&f, NULL, "--kv f32", Q1);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    char p32[1200], p16[1200], cmd[3000];
    entry_path(&f, p32, sizeof p32);
    /* the f16 entry under the f32 key */
    snprintf(cmd, sizeof cmd, "mv '%s' '%s.keep'", p32, p32);
    cr_assert(system(cmd) == 0);
    r = ask(&f, NULL, NULL, Q1);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "reused"), "f16 never finds the f32 entry: %s", r.err);
    cr_expect_str_eq(r.out, a16);
    tb_result_free(&r);
    entry_path(&f, p16, sizeof p16);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", p16, p32);
    cr_assert(system(cmd) == 0);
    r = ask(&f, NULL, "--kv f32", Q1);
    cr_expect(strstr(r.err, "is unusable"), "%s", r.err);
    cr_expect_str_eq(r.out, a32);
    tb_result_free(&r);
    /* another model with the same document: its own key, never this entry */
    fixture g = f;
    snprintf(g.model, sizeof g.model, "%s", other);
    char *b = baseline(&g, NULL, Q1);
    r = ask(&g, NULL, NULL, Q1);
    cr_expect(r.code == 0 && !strstr(r.err, "reused"), "%s", r.err);
    cr_expect_str_eq(r.out, b);
    tb_result_free(&r);
    /* and the stories entry copied under the other model's key is refused */
    char pa[1200] = "";
    DIR *d = opendir(f.kv);
    struct dirent *de;
    while ((de = readdir(d))) {
        char full[1200];
        snprintf(full, sizeof full, "%s/%s", f.kv, de->d_name);
        if (strlen(de->d_name) == 69 && strcmp(full, p16) && strcmp(full, p32)) snprintf(pa, sizeof pa, "%s", full);
    }
    closedir(d);
    cr_assert(pa[0], "the other model's entry");
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", p16, pa);
    cr_assert(system(cmd) == 0);
    r = ask(&g, NULL, NULL, Q1);
    cr_expect(strstr(r.err, "is unusable"), "%s", r.err);
    cr_expect_str_eq(r.out, b);
    tb_result_free(&r);
    free(a16), free(a32), free(b);
    rm_rf(f.dir);
}

Test(cache, kill_9_during_save_leaves_no_half_entry) {
    fixture f;
    setup(&f);
    char *a = baseline(&f, NULL, Q1);
    tb_result r = ask(&f, "RIDGEKV_IO_FAULT=kill@1", NULL, Q1);
    cr_expect(r.code == -1 || r.code == 128 + 9, "the writer is killed (SIGKILL): %d %s", r.code, r.err);
    tb_result_free(&r);
    int ne, nt;
    count_files(&f, &ne, &nt);
    cr_expect(ne == 0 && nt == 1, "a temporary file, no entry (%d, %d)", ne, nt);
    r = ask(&f, NULL, NULL, Q1);
    cr_expect(r.code == 0 && !strstr(r.err, "reused") && !strstr(r.err, "unusable"), "%s", r.err);
    cr_expect_str_eq(r.out, a);
    tb_result_free(&r);
    count_files(&f, &ne, &nt);
    cr_expect(ne == 1 && nt == 0, "the save's gc removed the dead writer's file (%d, %d)", ne, nt);
    free(a);
    rm_rf(f.dir);
}

Test(cache, unusable_or_missing_cache_directory) {
    fixture f;
    setup(&f);
    char *a = baseline(&f, NULL, Q1);
    /* missing: created with its parents */
    tb_result r = ask(&f, NULL, NULL, Q1);
    cr_expect(r.code == 0 && !strcmp(r.out, a), "%s", r.err);
    struct stat st;
    cr_expect(stat(f.kv, &st) == 0 && S_ISDIR(st.st_mode));
    tb_result_free(&r);
    /* a file where the directory should be: the cache is off, the answer unchanged */
    char e[1400], args[3000];
    snprintf(e, sizeof e, "env XDG_CACHE_HOME='%s'", f.doc);
    snprintf(args, sizeof args, "ask -m '%s' -n 12 -c 512 --ctx-overflow-ok --doc '%s' '%s'", f.model, f.doc, Q1);
    r = tb_run(e, args);
    cr_expect(r.code == 0 && strstr(r.err, "document cache off") && !strcmp(r.out, a), "%s", r.err);
    tb_result_free(&r);
    /* read-only: a directory without write permission (root ignores it: then /sys, when it refuses) */
    char ro[700];
    snprintf(ro, sizeof ro, "%s/ro", f.dir);
    cr_assert(mkdir(ro, 0555) == 0);
    const char *dir = ro;
    if (geteuid() == 0) dir = access("/sys", W_OK) == 0 && mkdir("/sys/rk-probe", 0755) != 0 ? "/sys" : NULL;
    if (dir) {
        snprintf(e, sizeof e, "env XDG_CACHE_HOME='%s'", dir);
        r = tb_run(e, args);
        cr_expect(r.code == 0 && strstr(r.err, "document cache off") && !strcmp(r.out, a), "%s", r.err);
        tb_result_free(&r);
    }
    chmod(ro, 0755);
    free(a);
    rm_rf(f.dir);
}

Test(cache, io_uring_unavailable_uses_the_thread_pool) {
    fixture f;
    setup(&f);
    char *a = baseline(&f, NULL, Q1);
    tb_result r = ask(&f, "RIDGEKV_NO_URING=1", "-v", Q1);
    cr_expect(r.code == 0 && !strcmp(r.out, a), "%s", r.err);
    cr_expect(strstr(r.err, "document cache: saved") && strstr(r.err, "threads"), "%s", r.err);
    tb_result_free(&r);
    r = ask(&f, "RIDGEKV_NO_URING=1", "-v", Q1);
    cr_expect(tokens_reused(r.err) > 0 && strstr(r.err, "threads"), "%s", r.err);
    cr_expect_str_eq(r.out, a);
    tb_result_free(&r);
    r = ask(&f, NULL, "-v", Q1); /* the same entry through io_uring */
    cr_expect(tokens_reused(r.err) > 0, "%s", r.err);
    cr_expect_str_eq(r.out, a);
    tb_result_free(&r);
    free(a);
    rm_rf(f.dir);
}

/* serve's ask op: the second request on the same document reuses it and answers the same. */
Test(cache, serve_ask_reuses_the_documents) {
    fixture f;
    setup(&f);
    char req[] =
        "{\"id\":1,\"op\":\"ask\",\"docs\":[{\"name\":\"notes.txt\",\"text\":\"Lily had a red ball. She played "
        "with it in the park every day with her dog Max.\"}],\"question\":\"What did Lily have?\","
        "\"max_tokens\":6,\"temperature\":0,\"stream\":false}";
    char in[700], cmd[5200], e[700];
    snprintf(in, sizeof in, "%s/in.jsonl", f.dir);
    FILE *fp = fopen(in, "w");
    cr_assert(fp);
    fprintf(fp, "%s\n%s\n", req, req);
    fclose(fp);
    /* tb_run reads stdin from /dev/null: run the server with the requests on stdin here */
    const char *bin = getenv("RK_BIN");
    cr_assert(bin);
    snprintf(e, sizeof e, "%s/out", f.dir);
    snprintf(cmd, sizeof cmd, "env XDG_CACHE_HOME='%s/xdg' '%s' serve --jsonl -m '%s' < '%s' > '%s' 2> '%s/err'", f.dir,
             bin, f.model, in, e, f.dir);
    tb_result r = {system(cmd), NULL, NULL};
    size_t len;
    r.out = tb_read_file(e, &len);
    snprintf(e, sizeof e, "%s/err", f.dir);
    r.err = tb_read_file(e, &len);
    cr_assert(r.out && r.err);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "serve: reused cached KV for notes.txt ("), "%s", r.err);
    const char *a = strstr(r.out, "\"text\":"), *b = a ? strstr(a + 1, "\"text\":") : NULL;
    cr_assert(a && b, "two answers: %s", r.out);
    const size_t la = strcspn(a, ","), lb = strcspn(b, ",");
    cr_expect(la == lb && !strncmp(a, b, la), "the same answer: %s", r.out);
    tb_result_free(&r);
    rm_rf(f.dir);
}

/* chat with input lines on stdin (tb_run reads /dev/null): stdout and stderr. */
static tb_result chat_run(const fixture *f, const char *input) {
    char in[700], out[700], err[700], cmd[4200];
    snprintf(in, sizeof in, "%s/chat.in", f->dir);
    snprintf(out, sizeof out, "%s/chat.out", f->dir);
    snprintf(err, sizeof err, "%s/chat.err", f->dir);
    FILE *fp = fopen(in, "w");
    cr_assert(fp);
    fputs(input, fp);
    fclose(fp);
    const char *bin = getenv("RK_BIN");
    cr_assert(bin);
    snprintf(
        cmd, sizeof cmd,
        "env XDG_CACHE_HOME='%s/xdg' '%s' chat -m '%s' --system 'Be brief.' -n 8 --temp 0 -c 512 < '%s' > '%s' 2> '%s'",
        f->dir, bin, f->model, in, out, err);
    const int st = system(cmd);
    tb_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1, NULL, NULL};
    size_t len;
    r.out = tb_read_file(out, &len);
    r.err = tb_read_file(err, &len);
    cr_assert(r.out && r.err);
    return r;
}

/* Chat's /save: the conversation's KV goes beside the messages (FILE.kv,
 * rk_conv_save); a later chat that /loads it prefills only the new turn, and answers as
 * one that reads the whole conversation again (the .kv removed). */
Test(cache, chat_save_then_load_prefills_only_the_new_turn) {
    fixture f;
    setup(&f);
    char path[700], cmds[1600], kvp[720];
    snprintf(path, sizeof path, "%s/conv.json", f.dir);
    snprintf(kvp, sizeof kvp, "%s.kv", path);
    snprintf(cmds, sizeof cmds, "Lily had a red ball and a dog named Max.\n/save %s\n", path);
    tb_result r = chat_run(&f, cmds);
    cr_assert_eq(r.code, 0, "%s", r.err);
    tb_result_free(&r);
    struct stat sb;
    cr_assert(stat(kvp, &sb) == 0 && sb.st_size > 0, "/save wrote the KV beside the messages (%s)", kvp);
    const char *Q = "/load %s\nWhat did Lily have?\n/stats\n";
    snprintf(cmds, sizeof cmds, Q, path);
    tb_result a = chat_run(&f, cmds);
    cr_assert_eq(a.code, 0, "%s", a.err);
    char backup[760];
    snprintf(backup, sizeof backup, "%s.bak", kvp);
    cr_assert(rename(kvp, backup) == 0);
    /* the JSON still names the block: without it the load reads everything again */
    tb_result b = chat_run(&f, cmds);
    cr_assert_eq(b.code, 0, "%s", b.err);
    long ctx_a = -1, pf_a = -1, ctx_b = -1, pf_b = -1;
    const char *p;
    if ((p = strstr(a.out, "context   "))) ctx_a = strtol(p + 10, NULL, 10);
    if ((p = strstr(a.out, "prefill   last "))) pf_a = strtol(p + 15, NULL, 10);
    if ((p = strstr(b.out, "context   "))) ctx_b = strtol(p + 10, NULL, 10);
    if ((p = strstr(b.out, "prefill   last "))) pf_b = strtol(p + 15, NULL, 10);
    cr_assert(ctx_a > 0 && pf_a > 0 && ctx_b > 0 && pf_b > 0, "stats:\n%s\n---\n%s", a.out, b.out);
    cr_expect_eq(ctx_a, ctx_b, "the same conversation either way");
    /* the block holds the saved turns' n_tokens: with it only the new turn is read (the
     * context after it is the saved tokens + the new turn + its answer); without it the
     * saved tokens are read again too */
    size_t jl;
    char *js = tb_read_file(path, &jl);
    cr_assert(js);
    const char *nt = strstr(js, "\"n_tokens\"");
    cr_assert(nt, "the JSON names the KV block: %s", js);
    const long n_saved = strtol(strchr(nt, ':') + 1, NULL, 10);
    free(js);
    cr_assert_gt(n_saved, 10);
    cr_expect_leq(pf_a + n_saved, ctx_a, "with the saved KV the new turn reads %ld of %ld tokens (%ld saved)", pf_a,
                  ctx_a, n_saved);
    /* (the context line counts the answer's tokens, the last of which no eval has read) */
    cr_expect_geq(pf_b - pf_a, n_saved * 3 / 4, "without it the saved tokens are read again (%ld, %ld, %ld saved)",
                  pf_b, pf_a, n_saved);
    const char *sa = strstr(a.out, "context   "), *sb2 = strstr(b.out, "context   ");
    cr_expect(sa - a.out == sb2 - b.out && !strncmp(a.out, b.out, (size_t)(sa - a.out)),
              "the same greedy answer:\n%s\n---\n%s", a.out, b.out);
    tb_result_free(&a), tb_result_free(&b);
    rm_rf(f.dir);
}
