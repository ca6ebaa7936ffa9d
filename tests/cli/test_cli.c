/* End-to-end tests of the ridgekv binary: exit codes and messages for bad input,
 * and real runs on the tiny stories260K model from ../shared. */
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
    char path[224]; /* fits the 256-byte argument line below */
    cr_assert(tb_tmp_path(path, sizeof path, "rk_cli_corrupt", ".gguf"), "%s", path);
    struct {
        const char *what, *expect;
        size_t cut;
        int patch_at;
        unsigned char patch[4];
    } cases[] = {
        {"bad magic", "magic", 0, 0, {'G', 'G', 'U', 'X'}},
        {"version 1", "version 1 is unsupported", 0, 4, {1, 0, 0, 0}},
        {"version 9", "version", 0, 4, {9, 0, 0, 0}},
        {"truncated", "truncated", 1000, -1, {0}},
        {"data cut", "past end", 0, -2, {0}},
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
        cr_expect(strstr(r.err, cases[i].expect) || strstr(r.err, "TRUNCATED") || strstr(r.err, "BOUNDS"),
                  "%s: %s", cases[i].what, r.err);
        cr_expect(strstr(r.err, path), "%s: message should name the file: %s", cases[i].what, r.err);
        done(&r);
        free(b);
    }
    free(good);
    unlink(path);
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
    char mamba[512], mamba_args[600];
    cr_assert(tb_tmp_path(mamba, sizeof mamba, "rk_cli_mamba", ".gguf"), "%s", mamba);
    snprintf(mamba_args, sizeof mamba_args, "run -m %s -p hi", mamba);
    write_file(mamba, bytes, n);
    free(bytes);
    result r = run(NULL, mamba_args);
    cr_expect_eq(r.code, 3);
    cr_expect(strstr(r.err, "unsupported architecture 'mamba'"), "%s", r.err);
    done(&r);
    unlink(mamba);
}

Test(cli, prompt_longer_than_context_exit_4) {
    char sp[1024], a[2048];
    snprintf(a, sizeof a, "run -m %s -c 16 -p 'Once upon a time there was a little girl who liked to play in the park with her dog every day'",
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
    cr_assert(j && json_object_object_get_ex(j, "ppl", &ppl) && json_object_object_get_ex(j, "tokens_scored", &cnt), "%s", r.out);
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
    cr_assert(j && json_object_object_get_ex(j, "results", &res) && json_object_object_get_ex(j, "kv_bytes_per_token", &kv), "%s", r.out);
    cr_expect_eq(json_object_array_length(res), 2);
    /* 5 layers x (K+V) x 4 KV heads x 8 dims x 2 bytes (f16) */
    cr_expect_eq(json_object_get_int(kv), 5 * 2 * 4 * 8 * 2);
    json_object_put(j);
    done(&r);
}
