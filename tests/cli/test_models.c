/* The binary's side of the models issue on the tiny stories260K model (512 trained
 * tokens, ../shared): `-c` past the effective context refused with the numbers (exit 4),
 * accepted with YaRN or --ctx-overflow-ok (with a warning); `info` shows the effective
 * context and the scaling; bad rope flags name themselves; `models` lists the catalogue;
 * `-m NAME` for a model not in the cache says how to fetch it. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tb.h"

static tb_result run(const char *env, const char *fmt, const char *model) {
    char args[2048];
    snprintf(args, sizeof args, fmt, model);
    tb_result r = tb_run(env, args);
    cr_assert(r.code != -2, "RK_BIN not set (meson sets it)");
    return r;
}

static const char *stories(char *buf, size_t cap) {
    if (!tb_shared_path(buf, cap, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", buf);
    return buf;
}

Test(models, context_past_training_refused_unless_scaled) {
    char sp[1024];
    stories(sp, sizeof sp);
    tb_result r = run(NULL, "run -m %s -c 1024 -n 2 --temp 0 -p Once", sp);
    cr_expect_eq(r.code, 4, "%s", r.err);
    cr_expect(strstr(r.err, "context 1024 is larger than the 512 tokens") && strstr(r.err, "factor >= 2"), "%s", r.err);
    tb_result_free(&r);
    r = run(NULL, "run -m %s -c 1024 --rope-scaling yarn --rope-scale 2 -n 2 --temp 0 -v -p Once", sp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "rope scaling yarn (factor 2, original context 512, yarn), effective context 1024"), "%s",
              r.err);
    tb_result_free(&r);
    r = run(NULL, "run -m %s -c 1024 --ctx-overflow-ok -n 2 --temp 0 -p Once", sp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "warning") && strstr(r.err, "past the 512 tokens"), "%s", r.err);
    tb_result_free(&r);
    /* --rope-scale alone: linear */
    r = run(NULL, "run -m %s -c 2048 --rope-scale 4 -n 1 --temp 0 -v -p Once", sp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "rope scaling linear (factor 4"), "%s", r.err);
    tb_result_free(&r);
}

Test(models, info_shows_effective_context_and_scaling) {
    char sp[1024];
    stories(sp, sizeof sp);
    tb_result r = run(NULL, "info %s", sp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "context        512 trained, 512 effective") && strstr(r.out, "rope scaling   none"), "%s",
              r.out);
    tb_result_free(&r);
    r = run(NULL, "info %s --rope-scaling yarn --rope-scale 4 --yarn-orig-ctx 256", sp);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(
        strstr(r.out, "512 trained, 1024 effective") &&
            strstr(r.out, "yarn, factor 4, original context 256, ext 1, attn 1, beta fast 32 / slow 1, mscale 1.1386"),
        "%s", r.out);
    tb_result_free(&r);
}

Test(models, bad_rope_flags_name_themselves) {
    char sp[1024];
    stories(sp, sizeof sp);
    tb_result r = run(NULL, "run -m %s --rope-scaling ntk -p x", sp);
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "--rope-scaling expects none, linear or yarn"), "%s", r.err);
    tb_result_free(&r);
    r = run(NULL, "run -m %s --rope-scaling yarn -p x", sp);
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "needs a factor") && strstr(r.err, "--rope-scale"), "%s", r.err);
    tb_result_free(&r);
    r = run(NULL, "run -m %s --yarn-beta-fast 0.5 -p x", sp);
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "--yarn-beta-fast"), "%s", r.err);
    tb_result_free(&r);
}

Test(models, catalogue_listed_and_missing_name_says_pull) {
    tb_result r = run("XDG_CACHE_HOME=/nonexistent-rk-cache", "models%s", "");
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "smollm2-135m  (default)") && strstr(r.out, "qwen2.5-coder-1.5b") &&
                  strstr(r.out, "1117320768 bytes") &&
                  strstr(r.out, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046") &&
                  strstr(r.out, "the packages record no licence") && strstr(r.out, "not in the cache"),
              "%s", r.out);
    tb_result_free(&r);
    r = run("XDG_CACHE_HOME=/nonexistent-rk-cache", "info -m %s", "qwen2.5-coder-1.5b");
    cr_expect_neq(r.code, 0);
    cr_expect(strstr(r.err, "ridgekv pull qwen2.5-coder-1.5b"), "%s", r.err);
    tb_result_free(&r);
    r = run(NULL, "pull %s", "no-such-model");
    cr_expect_eq(r.code, 2);
    cr_expect(strstr(r.err, "not in the catalogue"), "%s", r.err);
    tb_result_free(&r);
}
