/* rk_long_defaults_get (runtime/defaults.c) on generated tiny qwen2 models: which RoPE
 * scaling, context, KV policy and budget a prompt of a given length gets, at several
 * sizes and free-memory values; explicit choices win; the exact request gets f16 and no
 * budget whatever the size. The tiny shape (2 layers, 2 KV heads of 16) holds 2 * 2 * 2 *
 * 16 values a row: 256 bytes in f16, 256 * 34 / 64 = 136 in q8. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "rk.h"
#include "rk_long.h"
#include "tb.h"

#define F16_ROW 256u
#define Q8_ROW 136u

static rk_model *tiny(int32_t n_ctx_train, const char *scaling, float factor) {
    char path[512];
    tb_tiny_spec spec = {
        .arch = TB_ARCH_QWEN2, .n_ctx_train = n_ctx_train, .rope_scaling = scaling, .rope_factor = factor, .seed = 11};
    cr_assert(tb_tiny_model(&spec, path, sizeof path), "%s", path);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(path, &m, &e), RK_OK, "%s", e.msg);
    return m;
}

static rk_long_defaults get(const rk_model *m, rk_long_request r) {
    rk_long_defaults d;
    rk_err e = {0};
    cr_assert_eq(rk_long_defaults_get(m, &r, &d, &e), RK_OK, "%s", e.msg);
    return d;
}

static const rk_rope_scaling yarn4 = {.type = RK_ROPE_SCALING_YARN, .factor = 4.0f};

Test(defaults, kv_bytes_per_row) {
    rk_model *m = tiny(64, NULL, 0);
    cr_expect_eq(rk_long_kv_bytes(m, RK_KV_F16, 10), 10 * F16_ROW);
    cr_expect_eq(rk_long_kv_bytes(m, RK_KV_Q8, 10), 10 * Q8_ROW);
    cr_expect_eq(rk_long_kv_bytes(m, RK_KV_F32, 3), 3 * 2 * F16_ROW);
    cr_expect_eq(rk_long_kv_bytes(m, RK_KV_F16, 0), 0);
    rk_model_destroy(m);
}

Test(defaults, short_prompt_changes_nothing) {
    rk_model *m = tiny(64, NULL, 0);
    rk_long_defaults d = get(m, (rk_long_request){.n_prompt = 40, .n_rows = 60, .documented = yarn4});
    cr_expect_eq(d.rope, RK_LONG_ROPE_NONE);
    cr_expect_eq(d.n_ctx, 0);
    cr_expect_eq(d.n_ctx_train, 64);
    cr_expect_eq(d.n_ctx_max, 64);
    cr_expect_eq(d.kv, RK_KV_F16);
    cr_expect_eq(d.kv_why, RK_LONG_KV_DEFAULT);
    cr_expect_eq(d.kv_budget, 0);
    cr_expect_eq(d.kv_f16_bytes, 60 * F16_ROW);
    cr_expect_eq(d.sparse, 0);
    cr_expect_eq(d.n_batch, 0); /* dense: the session's chunk */
    rk_model_destroy(m);
}

Test(defaults, documented_scaling_applied_past_trained_context) {
    rk_model *m = tiny(64, NULL, 0);
    /* the answer room alone pushes past 64 rows: scaling on, context the rows rounded to 256 */
    rk_long_defaults d = get(m, (rk_long_request){.n_prompt = 50, .n_rows = 80, .documented = yarn4});
    cr_expect_eq(d.rope, RK_LONG_ROPE_APPLY);
    cr_expect_eq(d.rope_set.type, RK_ROPE_SCALING_YARN);
    cr_expect_float_eq(d.rope_set.factor, 4.0f, 0);
    cr_expect_eq(d.rope_set.orig_ctx, 64);
    cr_expect_eq(d.n_ctx_max, 256);
    cr_expect_eq(d.n_ctx, 256);
    /* the override is one rk_model_set_rope accepts, and gives the same limit */
    rk_err e = {0};
    cr_assert_eq(rk_model_set_rope(m, &d.rope_set, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(rk_model_n_ctx_max(m), 256);
    rk_model_destroy(m);

    /* -c above the trained context (chat, serve: no prompt yet) turns it on too */
    m = tiny(64, NULL, 0);
    d = get(m, (rk_long_request){.n_ctx = 200, .documented = yarn4});
    cr_expect_eq(d.rope, RK_LONG_ROPE_APPLY);
    cr_expect_eq(d.n_ctx, 200);
    /* a prompt past the rows the context holds: the context is capped at the scaled limit */
    d = get(m, (rk_long_request){.n_prompt = 250, .n_rows = 500, .documented = yarn4});
    cr_expect_eq(d.rope, RK_LONG_ROPE_APPLY);
    cr_expect_eq(d.n_ctx, 256);
    rk_model_destroy(m);
}

Test(defaults, past_the_scaled_limit_or_without_scaling_refused) {
    rk_model *m = tiny(64, NULL, 0);
    rk_long_defaults d = get(m, (rk_long_request){.n_prompt = 300, .n_rows = 320, .documented = yarn4});
    cr_expect_eq(d.rope, RK_LONG_ROPE_TOO_LONG);
    cr_expect_eq(d.n_ctx, 0);
    d = get(m, (rk_long_request){.n_ctx = 257, .documented = yarn4});
    cr_expect_eq(d.rope, RK_LONG_ROPE_TOO_LONG);
    /* no documented scaling */
    d = get(m, (rk_long_request){.n_prompt = 100, .n_rows = 110});
    cr_expect_eq(d.rope, RK_LONG_ROPE_TOO_LONG);
    /* --ctx-overflow-ok: no scaling, no refusal, the rows as context */
    d = get(m, (rk_long_request){.n_prompt = 100, .n_rows = 110, .overflow_ok = true});
    cr_expect_eq(d.rope, RK_LONG_ROPE_NONE);
    cr_expect_eq(d.n_ctx, 256);
    rk_model_destroy(m);
}

Test(defaults, explicit_rope_flags_win) {
    rk_model *m = tiny(64, NULL, 0);
    /* flags that leave no scaling (--rope-freq-base, --rope-scaling none): not replaced */
    rk_long_defaults d =
        get(m, (rk_long_request){.n_prompt = 100, .n_rows = 110, .documented = yarn4, .rope_explicit = true});
    cr_expect_eq(d.rope, RK_LONG_ROPE_TOO_LONG);
    /* flags with a scaling of their own: theirs, with its limit */
    rk_rope_override o = rk_rope_override_default();
    o.type = RK_ROPE_SCALING_LINEAR;
    o.factor = 2.0f;
    rk_err e = {0};
    cr_assert_eq(rk_model_set_rope(m, &o, &e), RK_OK, "%s", e.msg);
    d = get(m, (rk_long_request){.n_prompt = 100, .n_rows = 110, .documented = yarn4, .rope_explicit = true});
    cr_expect_eq(d.rope, RK_LONG_ROPE_FLAGS);
    cr_expect_eq(d.n_ctx_max, 128);
    cr_expect_eq(d.n_ctx, 128);
    d = get(m, (rk_long_request){.n_prompt = 200, .n_rows = 210, .documented = yarn4, .rope_explicit = true});
    cr_expect_eq(d.rope, RK_LONG_ROPE_TOO_LONG);
    rk_model_destroy(m);
}

Test(defaults, gguf_scaling_is_honoured) {
    rk_model *m = tiny(64, "yarn", 4.0f);
    rk_long_defaults d = get(m, (rk_long_request){.n_prompt = 100, .n_rows = 120});
    cr_expect_eq(d.rope, RK_LONG_ROPE_FILE);
    cr_expect_eq(d.n_ctx_max, 256);
    cr_expect_eq(d.n_ctx, 256);
    d = get(m, (rk_long_request){.n_prompt = 300, .n_rows = 310});
    cr_expect_eq(d.rope, RK_LONG_ROPE_TOO_LONG);
    rk_model_destroy(m);
}

Test(defaults, kv_policy_and_budget_by_size_and_free_memory) {
    rk_model *m = tiny(32768, NULL, 0);
    const uint64_t plenty = 64ull << 30;
    /* just below the q8 threshold, plenty of memory: f16 */
    rk_long_defaults d = get(m, (rk_long_request){.n_prompt = RK_LONG_Q8_MIN_TOKENS - 1, .free_bytes = plenty});
    cr_expect_eq(d.kv, RK_KV_F16);
    cr_expect_eq(d.kv_why, RK_LONG_KV_DEFAULT);
    cr_expect_eq(d.kv_budget, 0);
    /* at the threshold: q8, no budget */
    d = get(m, (rk_long_request){.n_prompt = RK_LONG_Q8_MIN_TOKENS, .n_rows = 20000, .free_bytes = plenty});
    cr_expect_eq(d.kv, RK_KV_Q8);
    cr_expect_eq(d.kv_why, RK_LONG_KV_LONG);
    cr_expect_eq(d.kv_bytes, 20000 * Q8_ROW);
    cr_expect_eq(d.kv_f16_bytes, 20000 * F16_ROW);
    cr_expect_eq(d.kv_budget, 0);
    /* unknown free memory: the size rule only */
    d = get(m, (rk_long_request){.n_prompt = 1000});
    cr_expect_eq(d.kv, RK_KV_F16);
    /* short, but f16 would take over half the free memory (256000 > 400000 / 2): q8, which fits */
    d = get(m, (rk_long_request){.n_prompt = 1000, .free_bytes = 400000});
    cr_expect_eq(d.kv, RK_KV_Q8);
    cr_expect_eq(d.kv_why, RK_LONG_KV_MEMORY);
    cr_expect_eq(d.kv_budget, 0);
    /* exactly half: still f16 */
    d = get(m, (rk_long_request){.n_prompt = 1000, .free_bytes = 512000});
    cr_expect_eq(d.kv, RK_KV_F16);
    /* even q8 crowds the memory (2720000 > 3/4 of 3 MiB): a budget of half the free memory, in MiB */
    d = get(m, (rk_long_request){.n_prompt = 20000, .free_bytes = 3u << 20});
    cr_expect_eq(d.kv, RK_KV_Q8);
    cr_expect_eq(d.kv_budget, 1u << 20);
    d = get(m, (rk_long_request){.n_prompt = 20000, .free_bytes = 4u << 20});
    cr_expect_eq(d.kv_budget, 0);
    rk_model_destroy(m);
}

Test(defaults, explicit_kv_choices_and_the_exact_request_win) {
    rk_model *m = tiny(32768, NULL, 0);
    rk_long_defaults d = get(
        m, (rk_long_request){.n_prompt = 20000, .kv_explicit = true, .kv_kind = RK_KV_F16, .free_bytes = 64ull << 30});
    cr_expect_eq(d.kv, RK_KV_F16);
    cr_expect_eq(d.kv_why, RK_LONG_KV_EXPLICIT);
    cr_expect_eq(d.kv_budget, 0);
    /* --kv f16 on a small machine: f16 kept, and the budget that f16 then needs */
    d = get(m, (rk_long_request){.n_prompt = 20000, .kv_explicit = true, .kv_kind = RK_KV_F16, .free_bytes = 4u << 20});
    cr_expect_eq(d.kv, RK_KV_F16);
    cr_expect_eq(d.kv_budget, 2u << 20);
    /* --kv-budget given: none added */
    d = get(m, (rk_long_request){.n_prompt = 20000, .budget_explicit = true, .free_bytes = 1u << 20});
    cr_expect_eq(d.kv, RK_KV_Q8);
    cr_expect_eq(d.sparse, 1); /* past 8192 prompt tokens the default attends sparsely */
    cr_expect_eq(d.n_batch, RK_LONG_SPARSE_BATCH, "sparse reads take the longer chunk: %d", d.n_batch);
    cr_expect_eq(d.kv_budget, 0);
    /* q4 has no tiers: no budget */
    d = get(m, (rk_long_request){.n_prompt = 20000, .kv_explicit = true, .kv_kind = RK_KV_Q4, .free_bytes = 1u << 20});
    cr_expect_eq(d.kv_budget, 0);
    /* the exact reference: f16, no budget, dense, whatever the size, memory and --kv */
    d = get(m, (rk_long_request){
                   .n_prompt = 30000, .free_bytes = 1u << 20, .kv_explicit = true, .kv_kind = RK_KV_Q4, .exact = true});
    cr_expect_eq(d.kv, RK_KV_F16);
    cr_expect_eq(d.kv_why, RK_LONG_KV_DEFAULT);
    cr_expect_eq(d.kv_budget, 0);
    cr_expect_eq(d.sparse, 0);
    cr_expect_eq(d.n_batch, 0);
    rk_model_destroy(m);
    /* the exact request still gets the scaling the length needs */
    m = tiny(64, NULL, 0);
    d = get(m, (rk_long_request){.n_prompt = 100, .n_rows = 100, .documented = yarn4, .exact = true});
    cr_expect_eq(d.rope, RK_LONG_ROPE_APPLY);
    rk_model_destroy(m);
}

Test(defaults, bad_requests_named) {
    rk_model *m = tiny(64, NULL, 0);
    rk_long_defaults d;
    rk_err e = {0};
    rk_long_request r = {.n_prompt = 100, .documented = {.type = RK_ROPE_SCALING_YARN, .factor = 0.5f}};
    cr_expect_eq(rk_long_defaults_get(m, &r, &d, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "factor 0.5"), "%s", e.msg);
    r = (rk_long_request){.n_prompt = -1};
    cr_expect_eq(rk_long_defaults_get(m, &r, &d, &e), RK_E_INVALID_ARG);
    cr_expect(strstr(e.msg, "negative"), "%s", e.msg);
    cr_expect_eq(rk_long_defaults_get(NULL, &r, &d, &e), RK_E_INVALID_ARG);
    rk_model_destroy(m);
}
