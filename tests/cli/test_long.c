/* Long prompts in one command (cli/long_cli.c over rk_long_defaults_get) through the
 * binary, on generated tiny qwen2 models with 64 trained tokens: a model the catalogue
 * documents (its file name and architecture: qwen2.5-coder-1.5b, YaRN x4) gets YaRN when a
 * prompt or -c needs it, with one stderr line; past 4 x 64 it is refused naming the flags;
 * explicit RoPE flags win; a model without documented scaling is refused; a GGUF's own
 * scaling is honoured; a prompt of 16K tokens gets q8 KV unless --kv says otherwise, in
 * ask and in a JSONL server's ask requests; bench's and eval's `--fill off,default`. */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <math.h>
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

/* The JSON object of a --json run's stdout (new reference). */
static json_object *stdout_json(const tb_result *r) {
    json_object *j = json_tokener_parse(r->out);
    cr_assert(j, "stdout is not JSON: %.400s", r->out);
    return j;
}

/* Entry mi of the "modes" array and its field key (a string, or NULL). */
static const char *mode_str(json_object *j, int mi, const char *key) {
    json_object *a, *v;
    cr_assert(json_object_object_get_ex(j, "modes", &a) && json_object_array_length(a) > (size_t)mi);
    json_object *o = json_object_array_get_idx(a, mi);
    return json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : NULL;
}

Test(long_prompt, eval_nll_off_default) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, CATALOGUE_FILE, 256, NULL);
    doc_at(dir, dp, sizeof dp, 6000);
    const char *nll = "eval nll -m '%s' --corpus '%s' --files doc.txt --len 800 --score 16 --short 32 "
                      "--windows 2 --boot 20 -t 1 --fill off,default --json%s";
    tb_result r = run(nll, mp, dir, "");
    cr_assert_eq(r.code, 0, "%s", r.err);
    /* --len past the trained 256: the documented YaRN for both, one line; what default ran */
    cr_expect(strstr(r.err, "ridgekv eval nll: the prompt with its answer room needs 800 tokens") &&
                  strstr(r.err, "RoPE yarn x4 from 256"),
              "%s", r.err);
    cr_expect(strstr(r.err, "default runs what ask runs at this length: fill off, KV f16, sparse attention past "
                            "8192 keys; off: fill off, KV f16, dense attention"),
              "%s", r.err);
    json_object *j = stdout_json(&r);
    cr_expect_str_eq(mode_str(j, 0, "mode"), "off");
    cr_expect_str_eq(mode_str(j, 0, "kv"), "f16");
    cr_expect_str_eq(mode_str(j, 1, "mode"), "default");
    cr_expect_str_eq(mode_str(j, 1, "kv"), "f16");
    /* at 800 tokens the default is exact: no maps, f16, sparse attention idle below 8192 keys */
    json_object *a = json_object_object_get(j, "modes"), *d = json_object_array_get_idx(a, 1);
    const double delta = json_object_get_double(
        json_object_object_get(json_object_object_get(json_object_object_get(d, "last"), "delta"), "est"));
    cr_expect(fabs(delta) < 1e-6, "default against off at 800 tokens: %g", delta);
    json_object_put(j);
    tb_result_free(&r);
    /* --kv given applies to default, never to off: two sessions, a q8 loss that differs */
    r = run(nll, mp, dir, " --kv q8");
    cr_assert_eq(r.code, 0, "%s", r.err);
    j = stdout_json(&r);
    cr_expect_str_eq(mode_str(j, 0, "kv"), "f16");
    cr_expect_str_eq(mode_str(j, 1, "kv"), "q8");
    json_object_put(j);
    tb_result_free(&r);
    /* default takes no settings */
    r = run("eval nll -m '%s' --corpus '%s' --files doc.txt --len 800 --score 16 --short 32 "
            "--fill off,default:share=0.5",
            mp, dir);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "default takes no settings"), "%s", r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, mp);
}

Test(long_prompt, eval_needle_default_one_policy_per_run) {
    char dir[512], mp[700], dp[700];
    model_at(dir, sizeof dir, mp, sizeof mp, "long.gguf", 32768, NULL);
    doc_at(dir, dp, sizeof dp, 6000);
    tb_result r = run("eval needle -m '%s' --corpus '%s' --files doc.txt --lengths 1024 --trials 1 --gen 2 -t 1 "
                      "--fill off,default --json",
                      mp, dir);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = stdout_json(&r);
    cr_expect_str_eq(mode_str(j, 1, "mode"), "default");
    cr_expect_str_eq(mode_str(j, 1, "kv"), "f16");
    json_object_put(j);
    tb_result_free(&r);
    /* f16 at 1024 tokens, q8 from 16384: one run cannot be both */
    r = run("eval needle -m '%s' --corpus '%s' --files doc.txt --lengths 1024,16500 --trials 2 -t 1 "
            "--fill off,default",
            mp, dir);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "the default KV policy is f16 at 1024 tokens but q8 at 16500") &&
                  strstr(r.err, "run these lengths apart"),
              "%s", r.err);
    tb_result_free(&r);
    unlink(dp);
    cleanup(dir, mp);
}

/* A JSONL ask request over a document of n bytes, with extra fields, as one line. */
static void ask_line(FILE *f, const char *id, size_t n, const char *extra) {
    fprintf(f, "{\"id\":%s,\"op\":\"ask\",\"docs\":[{\"name\":\"d\",\"text\":\"", id);
    static const char *const words[] = {"alpha ", "beta ", "gamma ", "delta ", "kappa "};
    size_t w = 0;
    for (int i = 0; w < n; i++) w += (size_t)fprintf(f, "%s", words[i % 5]);
    fprintf(f, "\"}],\"question\":\"what is it\",\"max_tokens\":1,\"temperature\":0,\"stream\":false%s}\n", extra);
}

/* The done event of request id in a JSONL reply (new reference; NULL when none). */
static json_object *done_of(const char *out, int id) {
    for (const char *p = out; *p;) {
        const char *nl = strchr(p, '\n');
        const size_t n = nl ? (size_t)(nl - p) : strlen(p);
        char *line = strndup(p, n);
        json_object *o = json_tokener_parse(line), *v;
        free(line);
        if (o && json_object_object_get_ex(o, "id", &v) && json_object_get_int(v) == id &&
            json_object_object_get_ex(o, "event", &v) && !strcmp(json_object_get_string(v), "done"))
            return o;
        json_object_put(o);
        p += n + (nl != NULL);
    }
    return NULL;
}

static const char *field(json_object *o, const char *key) {
    json_object *v;
    return o && json_object_object_get_ex(o, key, &v) ? json_object_get_string(v) : "(none)";
}

Test(long_prompt, jsonl_ask_takes_the_length_defaults) {
    char dir[512], mp[700], rq[760];
    model_at(dir, sizeof dir, mp, sizeof mp, "long.gguf", 32768, NULL);
    snprintf(rq, sizeof rq, "%s/req.jsonl", dir);
    FILE *f = fopen(rq, "w");
    cr_assert(f);
    ask_line(f, "1", 17000, "");                /* 16K tokens and more: q8, as ask */
    ask_line(f, "2", 17000, ",\"kv\":\"f16\""); /* the request's kv wins */
    ask_line(f, "3", 200, "");                  /* short: the server's f16 */
    fclose(f);
    char env[1200];
    snprintf(env, sizeof env, "RKREQ='%s' sh -c 'exec \"$0\" \"$@\" <\"$RKREQ\"'", rq);
    char args[1024];
    snprintf(args, sizeof args, "serve --jsonl --no-cache -b 2048 -t 1 -m '%s'", mp);
    tb_result r = tb_run(env, args);
    cr_assert(r.code != -2, "RK_BIN not set (meson sets it)");
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *d1 = done_of(r.out, 1), *d2 = done_of(r.out, 2), *d3 = done_of(r.out, 3);
    cr_assert(d1 && d2 && d3, "%s\n%s", r.out, r.err);
    cr_expect_str_eq(field(d1, "kv"), "q8");
    cr_expect_str_eq(field(d2, "kv"), "f16");
    cr_expect_str_eq(field(d3, "kv"), "f16");
    cr_expect(strstr(r.err, "ridgekv serve: ask of ") && strstr(r.err, "prompt tokens: KV cache q8, q8 from 16384 "
                                                                       "prompt tokens on"),
              "%s", r.err);
    /* the same rows: q8 holds 34 bytes per 32 values where f16 holds 64 */
    const double ratio = (double)json_object_get_int64(json_object_object_get(d1, "kv_bytes")) /
                         (double)json_object_get_int64(json_object_object_get(d2, "kv_bytes"));
    cr_expect(fabs(ratio - 34.0 / 64.0) < 0.01, "q8 / f16 KV bytes %g", ratio);
    /* one line: the short ask and the one with its own kv took no default */
    const char *a = strstr(r.err, "ridgekv serve: ask of ");
    cr_expect(a && !strstr(a + 1, "ridgekv serve: ask of "), "%s", r.err);
    json_object_put(d1), json_object_put(d2), json_object_put(d3);
    tb_result_free(&r);
    /* the server's --kv wins */
    snprintf(args, sizeof args, "serve --jsonl --no-cache -b 2048 -t 1 --kv f16 -m '%s'", mp);
    r = tb_run(env, args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    d1 = done_of(r.out, 1);
    cr_expect_str_eq(field(d1, "kv"), "f16");
    cr_expect(!strstr(r.err, "ridgekv serve: ask of "), "%s", r.err);
    json_object_put(d1);
    tb_result_free(&r);
    unlink(rq);
    cleanup(dir, mp);
}
