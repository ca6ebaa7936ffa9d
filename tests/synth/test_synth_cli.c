/* ridgekv synth end to end: write a small synthetic model, then run and bench
 * on it (what tests/gpu/check.sh does on a lent GPU, on the CPU here). */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tb.h"

static void done(tb_result *r) { tb_result_free(r); }

Test(synth_cli, write_run_bench, .timeout = 240) {
    char path[512], a[2048];
    cr_assert(tb_tmp_path(path, sizeof path, "synth-cli", ".gguf"), "%s", path);
    snprintf(a, sizeof a, "synth --shape qwen2.5-1.5b --type q4_k_m --layers 2 --vocab 1000 --seed 9 -o '%s'", path);
    tb_result r = tb_run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "wrote"), "%s", r.err);
    done(&r);
    struct stat st;
    cr_assert(stat(path, &st) == 0 && st.st_size > (1 << 20), "synthetic file missing or tiny");

    snprintf(a, sizeof a, "info '%s'", path);
    r = tb_run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.out, "qwen2") && strstr(r.out, "q4_K") && strstr(r.out, "q6_K") && strstr(r.out, "1000"), "%s",
              r.out);
    done(&r);

    /* greedy decode: exactly -n tokens (EOS is one token among 1000 and ignore-eos is not needed:
     * the count is checked only as "at least one") and the same text twice */
    snprintf(a, sizeof a, "run -m '%s' -p 'The quick brown fox' -n 12 --temp 0 -t 2", path);
    tb_result r1 = tb_run(NULL, a), r2 = tb_run(NULL, a);
    cr_assert_eq(r1.code, 0, "%s", r1.err);
    cr_assert_eq(r2.code, 0, "%s", r2.err);
    cr_expect(strlen(r1.out) > 0, "no text");
    cr_expect_str_eq(r1.out, r2.out, "greedy decode is not reproducible");
    cr_expect(strstr(r1.err, "generated"), "%s", r1.err);
    done(&r1);
    done(&r2);

    snprintf(a, sizeof a, "bench -m '%s' -p 64 -n 8 -r 1 -t 2 --json", path);
    r = tb_run(NULL, a);
    cr_assert_eq(r.code, 0, "%s", r.err);
    json_object *j = json_tokener_parse(r.out), *res, *kv;
    cr_assert(j && json_object_object_get_ex(j, "results", &res) &&
                  json_object_object_get_ex(j, "kv_bytes_per_token", &kv),
              "%s", r.out);
    /* 2 layers x (K+V) x 2 KV heads x 128 dims x 2 bytes (f16) */
    cr_expect_eq(json_object_get_int(kv), 2 * 2 * 2 * 128 * 2);
    json_object *r0 = json_object_array_get_idx(res, 0), *ttft, *dec;
    cr_assert(r0 && json_object_object_get_ex(r0, "ttft_ms", &ttft) &&
              json_object_object_get_ex(r0, "decode_tok_s", &dec));
    cr_expect(json_object_get_double(ttft) > 0 && json_object_get_double(dec) > 0, "%s", r.out);
    json_object_put(j);
    done(&r);
    unlink(path);
}

Test(synth_cli, usage_errors) {
    tb_result r = tb_run(NULL, "synth --shape gpt-5 --type f32 -o /tmp/never-written.gguf");
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "unknown shape \"gpt-5\"") && strstr(r.err, "qwen2.5-1.5b"), "%s", r.err);
    done(&r);
    r = tb_run(NULL, "synth --shape qwen3-0.6b --type f32");
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "-o"), "%s", r.err);
    done(&r);
    r = tb_run(NULL, "synth --shape qwen3-0.6b --type f32 --vocab 12 -o /tmp/never-written.gguf");
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "--vocab"), "%s", r.err);
    done(&r);
    r = tb_run(NULL, "synth --shape smollm2-135m --type q8_0 --layers 1 --vocab 320 -o /nonexistent-dir/x.gguf");
    cr_expect_eq(r.code, 5, "%s", r.err);
    cr_expect(strstr(r.err, "/nonexistent-dir/x.gguf"), "%s", r.err);
    done(&r);
    cr_expect_neq(access("/tmp/never-written.gguf", F_OK), 0);
    r = tb_run(NULL, "synth --help");
    cr_expect_eq(r.code, 0);
    cr_expect(strstr(r.out, "--shape") && strstr(r.out, "q4_k_m"), "%s", r.out);
    done(&r);
}
