/* End-to-end tests of the ridgekv binary: exit codes and messages for bad input, real
 * runs on the tiny stories260K model from ../shared, and --kv / --fill on run, eval and
 * bench. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rk_gguf.h"
#include "tb.h"

typedef tb_result result;

static result run(const char *env, const char *args) {
    result r = tb_run(env, args);
    cr_assert(r.code != -2, "RK_BIN not set (meson sets it)");
    return r;
}

static void done(result *r) { tb_result_free(r); }

static const char *stories(char *buf, size_t cap) {
    if (!tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    return buf;
}

/* A fresh directory for a test's files (mkdtemp), name in buf. */
static char *tmp_dir(char *buf, size_t cap) {
    snprintf(buf, cap, "/tmp/rkcliXXXXXX");
    cr_assert(mkdtemp(buf));
    return buf;
}

/* The number after `key` in text, or -1. */
static long num_after(const char *text, const char *key) {
    const char *p = strstr(text, key);
    return p ? strtol(p + strlen(key), NULL, 10) : -1;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

Test(cli, usage_errors_exit_2) {
    result r = run(NULL, "");
    cr_expect_eq(r.code, 2);
    done(&r);
    r = run(NULL, "frobnicate");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "unknown command 'frobnicate'"), "%s", r.err);
    done(&r);
    r = run(NULL, "run --bogus-flag -p hi");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "--bogus-flag"), "%s", r.err);
    done(&r);
    r = run(NULL, "run -n abc -p hi");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "-n expects an integer"), "%s", r.err);
    done(&r);
    r = run(NULL, "run --temp");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "needs a value"), "%s", r.err);
    done(&r);
}

Test(cli, help_for_every_command) {
    const char *cmds[] = {"run", "info", "bench", "pull", "eval"};
    for (int i = 0; i < 5; i++) {
        char a[64];
        snprintf(a, sizeof a, "%s --help", cmds[i]);
        result r = run(NULL, a);
        cr_expect_eq(r.code, 0, "%s", a);
        cr_expect(strstr(r.out, "usage: ridgekv"), "%s: %s", a, r.out);
        done(&r);
    }
}

Test(cli, missing_model_exit_3_names_file) {
    result r = run(NULL, "run -m /nonexistent/dir/model.gguf -p hi");
    cr_expect_eq(r.code, 3);
    cr_expect(strstr(r.err, "/nonexistent/dir/model.gguf"), "%s", r.err);
    done(&r);
}

Test(cli, no_default_model_exit_6_says_pull) {
    result r = run("env -u RIDGEKV_MODEL HOME=/nonexistent-home XDG_CACHE_HOME=", "run -p hi");
    cr_expect_eq(r.code, 6);
    cr_expect(strstr(r.err, "ridgekv pull"), "%s", r.err);
    done(&r);
}

Test(cli, corrupt_models_exit_3_with_reason) {
    char sp[1024];
    stories(sp, sizeof sp);
    size_t len;
    unsigned char *good = tb_read_file(sp, &len);
    cr_assert(good);
    char dir[64], path[96];
    snprintf(path, sizeof path, "%s/corrupt.gguf", tmp_dir(dir, sizeof dir));
    struct {
        const char *what, *expect, *status;
        size_t cut;
        int patch_at;
        unsigned char patch[4];
    } cases[] = {
        {"bad magic", "bad magic", "[RK_E_GGUF_MAGIC]", 0, 0, {'G', 'G', 'U', 'X'}},
        {"version 1", "version 1 is unsupported", "[RK_E_GGUF_VERSION]", 0, 4, {1, 0, 0, 0}},
        {"version 9", "version 9", "[RK_E_GGUF_VERSION]", 0, 4, {9, 0, 0, 0}},
        /* the header's counts cannot fit the 1000 bytes left */
        {"truncated", "truncated file", "[RK_E_GGUF_COUNT]", 1000, -1, {0}},
        {"data cut", "past end of file", "[RK_E_GGUF_BOUNDS]", 0, -2, {0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        unsigned char *b = malloc(len);
        memcpy(b, good, len);
        size_t n = len;
        if (cases[i].patch_at >= 0) memcpy(b + cases[i].patch_at, cases[i].patch, 4);
        if (cases[i].cut) n = cases[i].cut;
        if (cases[i].patch_at == -2) n = len - 4096;
        write_file(path, b, n);
        char a[256];
        snprintf(a, sizeof a, "run -m %s -p hi", path);
        result r = run(NULL, a);
        cr_expect_eq(r.code, 3, "%s: exit %d", cases[i].what, r.code);
        cr_expect(strstr(r.err, cases[i].expect), "%s: %s", cases[i].what, r.err);
        cr_expect(strstr(r.err, cases[i].status), "%s: want %s: %s", cases[i].what, cases[i].status, r.err);
        cr_expect(strstr(r.err, path), "%s: message should name the file: %s", cases[i].what, r.err);
        done(&r);
        free(b);
    }
    free(good);
    unlink(path);
    rmdir(dir);
}

Test(cli, unsupported_architecture_exit_3) {
    rk_gguf_writer *w = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_gguf_writer_create(32, &w, &e), RK_OK);
    cr_assert_eq(rk_gguf_writer_set_str(w, "general.architecture", "mamba", &e), RK_OK);
    float data[64] = {0};
    int64_t ne[2] = {8, 8};
    cr_assert_eq(rk_gguf_writer_add_tensor(w, "token_embd.weight", RK_DT_F32, 2, ne, data, sizeof data, &e), RK_OK);
    void *bytes;
    size_t n;
    cr_assert_eq(rk_gguf_writer_finish(w, &bytes, &n, &e), RK_OK, "%s", e.msg);
    rk_gguf_writer_destroy(w);
    char dir[64], path[96], a[160];
    snprintf(path, sizeof path, "%s/mamba.gguf", tmp_dir(dir, sizeof dir));
    write_file(path, bytes, n);
    free(bytes);
    snprintf(a, sizeof a, "run -m %s -p hi", path);
    result r = run(NULL, a);
    cr_expect_eq(r.code, 3);
    cr_expect(strstr(r.err, "unsupported architecture 'mamba'"), "%s", r.err);
    done(&r);
    unlink(path);
    rmdir(dir);
}

Test(cli, prompt_longer_than_context_exit_4) {
    char sp[1024], a[2048];
    snprintf(
        a, sizeof a,
        "run -m %s -c 16 -p 'Once upon a time there was a little girl who liked to play in the park with her dog every day'",
        stories(sp, sizeof sp));
    result r = run(NULL, a);
    cr_expect_eq(r.code, 4);
    cr_expect(strstr(r.err, "context holds 16"), "%s", r.err);
    done(&r);
}

Test(cli, run_greedy_matches_llama_cpp_text) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "run -m %s -p 'Once upon a time' -n 12 --temp 0 --kv f32", stories(sp, sizeof sp));
    result r = run(NULL, a);
    cr_expect_eq(r.code, 0, "%s", r.err);
    /* golden/logits/stories260K/once_upon.meta.json greedy_text */
    cr_expect(!strncmp(r.out, ", there was a little girl named Lily.", 37), "got: %s", r.out);
    cr_expect(strstr(r.err, "tok/s"), "timings on stderr: %s", r.err);
    done(&r);
}

Test(cli, info_describes_model) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "info %s", stories(sp, sizeof sp));
    result r = run(NULL, a);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "architecture   llama"), "%s", r.out);
    cr_expect(strstr(r.out, "layers         5"), "%s", r.out);
    cr_expect(strstr(r.out, "tokenizer.ggml.model"), "%s", r.out);
    done(&r);
}

/* llama-perplexity gives 3.9749 (c=128) on this text; golden/README.md §4. */
Test(cli, eval_ppl_matches_llama_cpp) {
    char sp[1024], txt[1024], a[4096];
    stories(sp, sizeof sp);
    if (!tb_shared_path(txt, sizeof txt, "golden/perplexity/tinystories_sample_clean.txt")) cr_skip_test("%s", txt);
    snprintf(a, sizeof a, "eval ppl -m %s -f %s -c 128 --kv f32 --json", sp, txt);
    result r = run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out), *ppl, *cnt;
    cr_assert(j && json_object_object_get_ex(j, "ppl", &ppl) && json_object_object_get_ex(j, "tokens_scored", &cnt),
              "%s", r.out);
    cr_expect_eq(json_object_get_int(cnt), 882);
    cr_expect(fabs(json_object_get_double(ppl) - 3.974868) < 1e-3, "ppl %f", json_object_get_double(ppl));
    json_object_put(j);
    done(&r);
}

Test(cli, bench_json) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "bench -m %s -p 16,64 -n 8 -r 1 --json", stories(sp, sizeof sp));
    result r = run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out), *res, *kv;
    cr_assert(j && json_object_object_get_ex(j, "results", &res) &&
                  json_object_object_get_ex(j, "kv_bytes_per_token", &kv),
              "%s", r.out);
    cr_expect_eq(json_object_array_length(res), 2);
    /* 5 layers x (K+V) x 4 KV heads x 8 dims x 2 bytes (f16) */
    cr_expect_eq(json_object_get_int(kv), 5 * 2 * 4 * 8 * 2);
    json_object_put(j);
    done(&r);
}

/* -f: the prompt is the text's first tokens; a text shorter than the longest -p is refused,
 * naming the file and both counts, and a missing file is an I/O error. */
Test(cli, bench_prompt_from_text) {
    char sp[1024], dir[64], txt[128], a[2048];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    snprintf(txt, sizeof txt, "%s/story.txt", dir);
    FILE *f = fopen(txt, "w");
    cr_assert(f);
    for (int i = 0; i < 40; i++) fputs("Once upon a time there was a little girl who liked to play in the park. ", f);
    fclose(f);
    snprintf(a, sizeof a, "bench -m %s -p 16,64 -n 4 -r 1 -f %s --json", sp, txt);
    result r = run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out), *res, *pr;
    cr_assert(j && json_object_object_get_ex(j, "results", &res) && json_object_object_get_ex(j, "prompt", &pr), "%s",
              r.out);
    cr_expect_str_eq(json_object_get_string(pr), "text");
    cr_expect_eq(json_object_array_length(res), 2);
    json_object_put(j);
    done(&r);
    f = fopen(txt, "w"); /* about 20 tokens */
    cr_assert(f);
    fputs("Once upon a time there was a little girl who liked to play.", f);
    fclose(f);
    snprintf(a, sizeof a, "bench -m %s -p 16,200 -n 4 -r 1 -f %s", sp, txt);
    r = run(NULL, a);
    cr_expect_eq(r.code, 2, "a text too short for -p is a usage error: %d %s", r.code, r.err);
    cr_expect(strstr(r.err, "story.txt") && strstr(r.err, "asks for 200"), "names the file and -p: %s", r.err);
    done(&r);
    f = fopen(txt, "wb"); /* binary: refused, not tokenized */
    cr_assert(f);
    fwrite("Once\0upon a time there was a girl who played all day long in the park.", 1, 72, f);
    fclose(f);
    snprintf(a, sizeof a, "bench -m %s -p 16 -n 4 -r 1 -f %s", sp, txt);
    r = run(NULL, a);
    cr_expect_eq(r.code, 2, "%d %s", r.code, r.err);
    cr_expect(strstr(r.err, "story.txt") && strstr(r.err, "NUL"), "names the file and why: %s", r.err);
    done(&r);
    snprintf(a, sizeof a, "bench -m %s -p 16 -n 4 -r 1 -f %s/missing.txt", sp, dir);
    r = run(NULL, a);
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "missing.txt") != NULL, "%s", r.err);
    done(&r);
    remove(txt);
    rmdir(dir);
}

/* ---- --kv and --fill: fixed at session creation, applied by run, eval and bench ---------- */

/* "-p '<reps x a sentence>'": a prompt of about 12 * reps tokens on stories260K */
static void long_prompt(char *buf, size_t cap, int reps) {
    size_t n = (size_t)snprintf(buf, cap, "-p '");
    for (int i = 0; i < reps && n + 64 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "The little dog ran in the park. ");
    snprintf(buf + n, cap - n, "'");
}

Test(cli, run_kv_lowram_compresses_old_rows) {
    char sp[1024], p[4096], a[6000];
    stories(sp, sizeof sp);
    long_prompt(p, sizeof p, 30);
    snprintf(a, sizeof a, "run -m %s %s -n 16 --temp 0 -v --kv lowram:window=32", sp, p);
    result r = run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    long comp = num_after(r.err, "KV lowram, "), prompt = num_after(r.err, "prefill ");
    /* window 32 and 4 sinks stay exact; older rows are compressed in chunks of 32 */
    cr_expect(prompt > 300 && comp > prompt - 32 - 4 - 64 && comp <= prompt + 16, "compressed %ld of %ld: %s", comp,
              prompt, r.err);
    done(&r);
    /* the flag is parsed as a policy: a bad option is a usage error naming it */
    snprintf(a, sizeof a, "run -m %s -p hi --kv lowram:bogus=1", sp);
    r = run(NULL, a);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "bogus"), "%s", r.err);
    done(&r);
}

/* --kv q8: llama.cpp's q8_0 KV blocks, end to end. */
Test(cli, run_kv_q8_greedy_text) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "run -m %s -p 'Once upon a time' -n 12 --temp 0 --kv q8", stories(sp, sizeof sp));
    result r = run(NULL, a);
    cr_expect_eq(r.code, 0, "%s", r.err);
    /* int8 K/V moves the logits by ~1e-3 of their scale: the greedy story stays the golden one */
    cr_expect(!strncmp(r.out, ", there was a little girl", 25), "q8 greedy text: %s", r.out);
    done(&r);
}

Test(cli, run_fill_modes_reach_the_prefill) {
    char sp[1024], p[4096], a[6000];
    stories(sp, sizeof sp);
    long_prompt(p, sizeof p, 60);
    char out[3][256];
    long filled[3], prompt = 0;
    const char *modes[3] = {"off", "identity", "plumb"};
    for (int i = 0; i < 3; i++) {
        snprintf(a, sizeof a, "run -m %s -c 1024 --ctx-overflow-ok %s -n 8 --temp 0 -v --split 2 --tail 512 --fill %s",
                 sp, p, modes[i]);
        result r = run(NULL, a);
        cr_assert_eq(r.code, 0, "%s: %s", modes[i], r.err);
        filled[i] = num_after(r.err, "; filled ");
        prompt = num_after(r.err, "prefill ");
        snprintf(out[i], sizeof out[i], "%s", r.out);
        done(&r);
    }
    /* bulk rows (>= 512 prompt tokens after them) in the 3 layers past split 2 */
    cr_expect(prompt > 600, "%ld", prompt);
    cr_expect_eq(filled[0], 0);
    cr_expect_eq(filled[1], 3 * (prompt - 512));
    cr_expect_eq(filled[2], 3 * (prompt - 512), "plumb runs the fill path");
    cr_expect_str_eq(out[2], out[0], "plumb feeds the fill path exact inputs: off's text");
    /* identity without --split is refused before reading anything */
    snprintf(a, sizeof a, "run -m %s -p hi --fill identity", sp);
    result r = run(NULL, a);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "--split"), "%s", r.err);
    done(&r);
}

Test(cli, eval_ppl_with_kv_lowram) {
    char sp[1024], txt[1024], a[4096];
    stories(sp, sizeof sp);
    if (!tb_shared_path(txt, sizeof txt, "golden/perplexity/tinystories_sample_clean.txt")) cr_skip_test("%s", txt);
    /* each chunk is one eval, whose attention is exact before LowRAM compresses: f16's ppl */
    snprintf(a, sizeof a, "eval ppl -m %s -f %s -c 128 --kv lowram:window=16 --json", sp, txt);
    result r = run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out), *ppl;
    cr_assert(j && json_object_object_get_ex(j, "ppl", &ppl), "%s", r.out);
    cr_expect(fabs(json_object_get_double(ppl) - 3.974888) < 1e-4, "ppl %f", json_object_get_double(ppl));
    json_object_put(j);
    done(&r);
}

Test(cli, bench_kv_list_one_session_per_policy) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "bench -m %s -p 300 -n 4 -r 1 --kv f16,f32,lowram:window=32 --json", stories(sp, sizeof sp));
    result r = run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out), *res;
    cr_assert(j && json_object_object_get_ex(j, "results", &res), "%s", r.out);
    cr_assert_eq(json_object_array_length(res), 3);
    int64_t total[3], comp[3], ntok[3];
    for (int i = 0; i < 3; i++) {
        json_object *it = json_object_array_get_idx(res, i), *kb = json_object_object_get(it, "kv_bytes");
        total[i] = json_object_get_int64(json_object_object_get(kb, "total"));
        comp[i] = json_object_get_int64(json_object_object_get(kb, "n_compressed_rows"));
        ntok[i] = json_object_get_int64(json_object_object_get(kb, "n_tokens"));
    }
    cr_expect_str_eq(json_object_get_string(json_object_object_get(json_object_array_get_idx(res, 2), "kv")),
                     "lowram:window=32");
    cr_expect(ntok[0] == 304 && ntok[1] == 304 && ntok[2] == 304, "300 prompt + 4 decode evals: %lld",
              (long long)ntok[0]);
    cr_expect_eq(total[0], 304 * 5 * 2 * 4 * 8 * 2, "f16");
    cr_expect_eq(total[1], 2 * total[0], "f32 rows are twice f16's");
    cr_expect(comp[0] == 0 && comp[1] == 0 && comp[2] > 0, "only LowRAM compresses: %lld", (long long)comp[2]);
    /* per-run peaks: the high-water mark reset before each run, so each lies between the RSS
     * after that run and the process's peak (-1 would mean the reset was refused) */
    const double proc = json_object_get_double(json_object_object_get(j, "peak_rss_mib"));
    for (int i = 0; i < 3; i++) {
        json_object *it = json_object_array_get_idx(res, i);
        const double pk = json_object_get_double(json_object_object_get(it, "peak_rss_mib")),
                     after = json_object_get_double(json_object_object_get(it, "rss_after_mib"));
        cr_expect(after > 0 && pk >= after - 0.1 && pk <= proc + 0.1, "run %d: after %.1f, peak %.1f, process %.1f", i,
                  after, pk, proc);
    }
    json_object_put(j);
    done(&r);
}

/* --backend cuda creates the CUDA backend or stops before any work with the reason: not
 * built, no device, or the first op the device lacks — never a partial answer. */
Test(cli, backend_cuda_refused_before_any_work) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "run -m %s -p 'Once upon a time' -n 4 --temp 0 --backend cuda", stories(sp, sizeof sp));
    result r = run(NULL, a);
    if (r.code == 0) {
        /* a GPU machine once the CUDA issue completes the ops */
        cr_expect(!strncmp(r.out, ", there was", 11), "cuda greedy text: %s", r.out);
    } else {
        cr_expect_eq(r.code, 3, "%s", r.err);
        cr_expect(strstr(r.err, "cuda: not built") || strstr(r.err, "cuda: no device") ||
                      (strstr(r.err, "cuda: op ") && strstr(r.err, "not implemented yet")),
                  "%s", r.err);
        cr_expect_eq(r.out[0], '\0', "output before the refusal: %s", r.out);
    }
    done(&r);
    r = run(NULL, "run -p hi --backend tpu");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "--backend expects cpu, cpu_ref or cuda (got 'tpu')"), "%s", r.err);
    done(&r);
}

/* The CUDA backend is a module loaded on the first --backend cuda: a module that is not
 * there, or a library that is not ours, is refused with its path and the reason; a CPU run
 * never maps the CUDA runtime (it once cost ~140 MiB of RSS and most of the start-up). */
Test(cli, cuda_module_loaded_on_demand) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "run -m %s -p 'Once upon a time' -n 2 --temp 0 --backend cuda", stories(sp, sizeof sp));
    result r = run("RIDGEKV_CUDA_MODULE=/nonexistent/libridgekv-cuda.so", a);
    cr_expect_eq(r.code, 3, "%s", r.err);
    cr_expect(strstr(r.err, "cuda: not built") ||
                  (strstr(r.err, "cannot load the CUDA backend module /nonexistent/libridgekv-cuda.so") &&
                   strstr(r.err, "No such file")),
              "%s", r.err);
    cr_expect_eq(r.out[0], '\0', "%s", r.out);
    done(&r);
    /* a real shared library without our entry point (libc is always there) */
    const char *libc =
        access("/lib/x86_64-linux-gnu/libc.so.6", R_OK) == 0 ? "/lib/x86_64-linux-gnu/libc.so.6" : "libc.so.6";
    char env[256];
    snprintf(env, sizeof env, "RIDGEKV_CUDA_MODULE=%s", libc);
    r = run(env, a);
    cr_expect_eq(r.code, 3, "%s", r.err);
    cr_expect(strstr(r.err, "cuda: not built") || strstr(r.err, "is not a ridgekv CUDA module"), "%s", r.err);
    done(&r);
    /* a CPU run: no libcudart/libcublas among the process's mappings at exit */
    snprintf(a, sizeof a, "run -m %s -p 'Once upon a time' -n 2 --temp 0", stories(sp, sizeof sp));
    char dir[512];
    cr_assert(tmp_dir(dir, sizeof dir));
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "LD_DEBUG=files '%s' %s >/dev/null 2>'%s/ld'", getenv("RK_BIN"), a, dir);
    cr_assert_eq(system(cmd), 0);
    char p[600];
    snprintf(p, sizeof p, "%s/ld", dir);
    size_t len = 0;
    char *ld = tb_read_file(p, &len);
    cr_assert(ld);
    cr_expect(!strstr(ld, "libcublas") && !strstr(ld, "libcudart"), "a CPU run loaded CUDA libraries");
    free(ld);
    unlink(p);
    rmdir(dir);
}
