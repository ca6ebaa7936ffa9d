/* Long prompts in one command (cli/long_cli.c over rk_long_defaults_get) through the
 * binary, on generated tiny qwen2 models with 64 trained tokens: a model the catalogue
 * documents (its file name and architecture: qwen2.5-coder-1.5b, YaRN x4) gets YaRN when a
 * prompt or -c needs it, with one stderr line; past 4 x 64 it is refused naming the flags;
 * explicit RoPE flags win; a model without documented scaling is refused; a GGUF's own
 * scaling is honoured; a prompt of 16K tokens gets q8 KV unless --kv says otherwise. */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tb.h"

#define CATALOGUE_FILE "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"

/* A tiny qwen2 model written as dir/name (dir made here); path receives it. */
static void model_at(char *dir, size_t dcap, char *path, size_t pcap, const char *name, int32_t n_ctx_train,
                     const char *scaling) {
    cr_assert(tb_tmp_dir(dir, dcap, "rk-long"), "%s", dir);
    tb_tiny_spec spec = {.arch = TB_ARCH_QWEN2,
                         .n_ctx_train = n_ctx_train,
                         .rope_scaling = scaling,
                         .rope_factor = scaling ? 4.0f : 0.0f,
                         .seed = 21};
    char tmp[512];
    cr_assert(tb_tiny_model(&spec, tmp, sizeof tmp), "%s", tmp);
    snprintf(path, pcap, "%s/%s", dir, name);
    cr_assert_eq(rename(tmp, path), 0, "rename %s", tmp);
}

static void cleanup(const char *dir, const char *path) {
    unlink(path);
    rmdir(dir);
}

/* A document of n bytes of words (about one token a byte in the tiny vocab). */
static void doc_at(const char *dir, char *path, size_t cap, size_t n) {
    snprintf(path, cap, "%s/doc.txt", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    static const char *const words[] = {"alpha ", "beta ", "gamma ", "delta ", "kappa "};
    size_t w = 0;
    for (int i = 0; w < n; i++) w += (size_t)fprintf(f, "%s", words[i % 5]);
    fputc('\n', f);
    fclose(f);
}

static tb_result run(const char *fmt, ...) {
    char args[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    tb_result r = tb_run(NULL, args);
    cr_assert(r.code != -2, "RK_BIN not set (meson sets it)");
    return r;
}

Test(long_prompt, documented_yarn_applied_when_the_prompt_needs_it) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, CATALOGUE_FILE, 64, NULL);
    doc_at(dir, dp, sizeof dp, 80);
    tb_result r = run("ask -m '%s' --doc '%s' --system 'Be brief.' --no-cache -n 4 -t 1 what is it", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "past the 64 the model was trained on: RoPE yarn x4 from 64 (the model's documented "
                            "scaling, applied), context up to 256"),
              "%s", r.err);
    /* one line */
    const char *a = strstr(r.err, "RoPE yarn");
    cr_expect(a && !strstr(a + 1, "RoPE yarn"), "%s", r.err);
    tb_result_free(&r);
    /* run, from the prompt's length */
    r = run("run -m '%s' -f '%s' -n 4 --temp 0 -t 1", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "ridgekv run: the prompt with its answer room needs") &&
                  strstr(r.err, "RoPE yarn x4 from 64 (the model's documented scaling, applied)"),
              "%s", r.err);
    tb_result_free(&r);
    /* a short prompt: nothing said, nothing changed */
    r = run("run -m '%s' -p 'alpha beta' -n 2 --temp 0 -t 1 -v", mp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "RoPE yarn") && strstr(r.err, "rope scaling none"), "%s", r.err);
    tb_result_free(&r);
    /* chat (stdin at its end: the setup only): -c above the trained context turns it on */
    char args[2048];
    snprintf(args, sizeof args, "chat -m '%s' -c 200 -n 2 --temp 0 -t 1", mp);
    r = tb_run(NULL, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "ridgekv chat: -c 200 tokens, past the 64 the model was trained on: RoPE yarn x4"), "%s",
              r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, mp);
}

Test(long_prompt, past_the_scaled_limit_refused_naming_the_flags) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, CATALOGUE_FILE, 64, NULL);
    doc_at(dir, dp, sizeof dp, 400);
    tb_result r = run("ask -m '%s' --doc '%s' --no-cache -n 4 -t 1 what is it", mp, dp);
    cr_expect_eq(r.code, 4, "%s", r.err);
    cr_expect(strstr(r.err, "64 trained, 256 with its documented yarn x4 scaling") &&
                  strstr(r.err, "--rope-scaling yarn --rope-scale") && strstr(r.err, "--yarn-orig-ctx 64") &&
                  strstr(r.err, "--ctx-overflow-ok"),
              "%s", r.err);
    tb_result_free(&r);
    r = run("run -m '%s' -f '%s' -n 4 -t 1", mp, dp);
    cr_expect_eq(r.code, 4, "%s", r.err);
    cr_expect(strstr(r.err, "ridgekv run: the prompt has") && strstr(r.err, "--rope-scale"), "%s", r.err);
    tb_result_free(&r);
    /* the flags the refusal names work */
    r = run("run -m '%s' -f '%s' -n 2 --temp 0 -t 1 --rope-scaling yarn --rope-scale 8 --yarn-orig-ctx 64", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "RoPE yarn x8 from 64 (your --rope-*/--yarn-* flags), context up to 512"), "%s", r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, mp);
}

Test(long_prompt, explicit_flags_win_and_undocumented_models_are_refused) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, CATALOGUE_FILE, 64, NULL);
    doc_at(dir, dp, sizeof dp, 80);
    /* --rope-scaling none: no scaling, so the prompt past 64 is refused */
    tb_result r = run("run -m '%s' -f '%s' -n 2 -t 1 --rope-scaling none", mp, dp);
    cr_expect_eq(r.code, 4, "%s", r.err);
    cr_expect(strstr(r.err, "documents no RoPE scaling") && strstr(r.err, "--rope-scaling yarn"), "%s", r.err);
    tb_result_free(&r);
    /* a smaller scaling of your own: yours, with its limit */
    r = run("run -m '%s' -f '%s' -n 2 --temp 0 -t 1 --rope-scale 2", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "RoPE linear x2 from 64 (your --rope-*/--yarn-* flags), context up to 128"), "%s", r.err);
    tb_result_free(&r);
    /* the same model under another name: no documented scaling */
    char other[760];
    snprintf(other, sizeof other, "%s/mine.gguf", dir);
    cr_assert_eq(rename(mp, other), 0);
    r = run("run -m '%s' -f '%s' -n 2 -t 1", other, dp);
    cr_expect_eq(r.code, 4, "%s", r.err);
    cr_expect(strstr(r.err, "trained on 64 tokens and documents no RoPE scaling"), "%s", r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, other);
}

Test(long_prompt, gguf_scaling_honoured) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, "scaled.gguf", 64, "yarn");
    doc_at(dir, dp, sizeof dp, 80);
    tb_result r = run("run -m '%s' -f '%s' -n 2 --temp 0 -t 1", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "RoPE yarn x4 from 64 (the GGUF's scaling), context up to 256"), "%s", r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, mp);
}

Test(long_prompt, q8_kv_from_16k_prompt_tokens_unless_kv_given) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, "long.gguf", 32768, NULL);
    doc_at(dir, dp, sizeof dp, 17000);
    tb_result r = run("run -m '%s' -f '%s' -n 1 --temp 0 -b 2048 -v", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "ridgekv run: KV cache q8 for") && strstr(r.err, "q8 from 16384 prompt tokens on") &&
                  strstr(r.err, "KV q8"),
              "%s", r.err);
    tb_result_free(&r);
    r = run("run -m '%s' -f '%s' -n 1 --temp 0 -b 2048 --kv f16 -v", mp, dp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "KV cache q8") && strstr(r.err, "KV f16"), "%s", r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, mp);
}

Test(long_prompt, bench_off_default_is_one_command) {
    char dir[512], mp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, CATALOGUE_FILE, 64, NULL);
    tb_result r = run("bench -m '%s' -p 32,200 -n 2 -r 1 -t 1 --fill off,default --json", mp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    /* the longest prompt needs YaRN: one line, for both references */
    cr_expect(strstr(r.err, "ridgekv bench: the prompt with its answer room needs 203 tokens") &&
                  strstr(r.err, "RoPE yarn x4 from 64"),
              "%s", r.err);
    cr_expect(strstr(r.out, "\"n_prompt\":200,\"fill\":\"off\",\"kv\":\"f16\"") &&
                  strstr(r.out, "\"n_prompt\":200,\"fill\":\"default\",\"kv\":\"f16\""),
              "%s", r.out);
    tb_result_free(&r);
    /* --kv given applies to default (as in ask), never to off */
    r = run("bench -m '%s' -p 32 -n 1 -r 1 -t 1 --fill off,default --kv q8 --json", mp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "\"fill\":\"off\",\"kv\":\"f16\"") && strstr(r.out, "\"fill\":\"default\",\"kv\":\"q8\""),
              "%s", r.out);
    tb_result_free(&r);
    cleanup(dir, mp);
}
