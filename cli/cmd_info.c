#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "rk_gguf.h"
#include "rk_kernels.h"

static const char *help = "usage: ridgekv info [-m] FILE.gguf|NAME [RoPE flags]\n"
                          "\n"
                          "Describes any GGUF file (model, ridge map, predictor): version, metadata, tensor types.\n"
                          "For a model it also prints architecture, shapes, tokenizer, the RoPE scaling in effect,\n"
                          "the effective context and the memory needed at that context. The RoPE flags (as on every\n"
                          "command that loads a model; docs/MODELS.md) change the scaling shown:\n"
                          "  --rope-scaling none|linear|yarn   --rope-scale N      --yarn-orig-ctx N\n"
                          "  --rope-freq-base B   --yarn-ext-factor F   --yarn-attn-factor F\n"
                          "  --yarn-beta-fast F   --yarn-beta-slow F\n"
                          "Without a file it describes the default model.\n";

static const char *type_names[RK_GGUF_TYPE_COUNT] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                     "bool", "string", "array", "u64", "i64", "f64"};

static void print_scalar(const rk_gguf *g, const rk_gguf_kv *kv) {
    char key[512];
    snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 511 ? kv->key.len : 511), kv->key.ptr);
    if (kv->type == RK_GGUF_STRING) {
        rk_str v;
        if (rk_gguf_get_str(g, key, &v, NULL) != RK_OK) return;
        size_t show = 0; /* one line of at most 80 bytes */
        while (show < v.len && show < 80 && v.ptr[show] != '\n') show++;
        printf("\"%.*s\"%s", (int)show, v.ptr, show < v.len ? " ..." : "");
    } else if (kv->type == RK_GGUF_F32 || kv->type == RK_GGUF_F64) {
        float f;
        if (rk_gguf_get_f32(g, key, &f, NULL) == RK_OK) printf("%g", (double)f);
    } else if (kv->type == RK_GGUF_BOOL) {
        bool v;
        if (rk_gguf_get_bool(g, key, &v, NULL) == RK_OK) printf("%s", v ? "true" : "false");
    } else if (kv->type == RK_GGUF_U64) {
        uint64_t v;
        if (rk_gguf_get_u64(g, key, &v, NULL) == RK_OK) printf("%llu", (unsigned long long)v);
    } else {
        int64_t v;
        if (rk_gguf_get_i64(g, key, &v, NULL) == RK_OK) printf("%lld", (long long)v);
    }
}

int cmd_info(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    cli_opts o = {0};
    const char *pos[1];
    int n_pos, rc = cli_parse(argc, argv, 2, &o, pos, 1, &n_pos, "info");
    if (rc) return rc;
    if (n_pos) o.model = pos[0];
    char buf[4096];
    const char *path = cli_model_path(&o, buf, sizeof buf);
    if (!path) return o.model ? RK_EXIT_MODEL : RK_EXIT_NO_MODEL;
    rk_err e = {0};
    rk_mapping map = {0};
    rk_gguf *g = NULL;
    rk_status st = rk_mapping_open(path, &map, &e);
    if (!st) st = rk_gguf_parse(map.data, map.len, &g, &e);
    if (st) {
        rk_err_wrap(&e, "%s", path);
        cli_print_error(&e);
        rk_mapping_close(&map);
        return cli_exit_code(st) == RK_EXIT_IO ? RK_EXIT_IO : RK_EXIT_MODEL;
    }
    printf("file: %s (%zu bytes)\n", path, map.len);
    printf("gguf: version %u, %llu metadata keys, %llu tensors, alignment %u\n", rk_gguf_version(g),
           (unsigned long long)rk_gguf_n_kv(g), (unsigned long long)rk_gguf_n_tensors(g), rk_gguf_alignment(g));
    printf("\nmetadata:\n");
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++) {
        const rk_gguf_kv *kv = rk_gguf_kv_at(g, i);
        printf("  %-44.*s ", (int)kv->key.len, kv->key.ptr);
        if (kv->type == RK_GGUF_ARRAY)
            printf("[%s x %llu]", kv->arr_type < RK_GGUF_TYPE_COUNT ? type_names[kv->arr_type] : "?",
                   (unsigned long long)kv->n);
        else print_scalar(g, kv);
        printf("\n");
    }
    /* tensor types: count and bytes per type */
    uint64_t count[64] = {0}, bytes[64] = {0}, total = 0;
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        if (t->type < 64) count[t->type]++, bytes[t->type] += t->n_bytes;
        total += t->n_bytes;
    }
    printf("\ntensor types:\n");
    for (int t = 0; t < 64; t++)
        if (count[t])
            printf("  %-6s %5llu tensors %10.2f MiB\n", rk_dtype_name((uint32_t)t), (unsigned long long)count[t],
                   (double)bytes[t] / 1048576.0);
    printf("  total  %5llu tensors %10.2f MiB\n", (unsigned long long)rk_gguf_n_tensors(g), (double)total / 1048576.0);
    rk_gguf_destroy(g);
    rk_mapping_close(&map);

    rk_model *m = NULL;
    rk_err me = {0};
    rk_model_params mp = rk_model_params_default();
    mp.huge_pages = false; /* no decode here: the plain mapping, no copy */
    if (rk_model_load_with(path, &mp, &m, &me) == RK_OK && o.rope_set && rk_model_set_rope(m, &o.rope, &me)) {
        cli_print_error(&me);
        rk_model_destroy(m);
        return RK_EXIT_USAGE;
    }
    if (m) {
        const rk_hparams *hp = rk_model_hparams(m);
        const rk_rope_scaling *rs = &hp->rope_scaling;
        const int64_t n_ctx_max = rk_model_n_ctx_max(m);
        uint64_t kv_tok_f16 = 2ull * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * 2u;
        printf("\nmodel: %s\n", rk_model_name(m));
        printf("  architecture   %s\n", hp->arch_name);
        printf("  layers         %d\n  n_embd         %d\n  n_ff           %d\n", hp->n_layer, hp->n_embd, hp->n_ff);
        printf("  heads          %d (KV heads %d, head_dim %d)\n", hp->n_head, hp->n_head_kv, hp->head_dim);
        printf("  vocab          %d\n  context        %d trained, %lld effective\n", hp->n_vocab, hp->n_ctx_train,
               (long long)n_ctx_max);
        printf("  rope           %s, base %g, %d dims\n", hp->rope_mode == 2 ? "neox" : "norm", (double)hp->rope_base,
               hp->n_rot);
        if (rs->type == RK_ROPE_SCALING_NONE) printf("  rope scaling   none\n");
        else {
            rk_rope_params rp = {.mode = hp->rope_mode,
                                 .n_rot = hp->n_rot,
                                 .freq_base = hp->rope_base,
                                 .freq_scale = 1.0f / rs->factor,
                                 .ext_factor = rs->type == RK_ROPE_SCALING_YARN ? rs->ext_factor : 0.0f,
                                 .attn_factor = rs->attn_factor,
                                 .beta_fast = rs->beta_fast,
                                 .beta_slow = rs->beta_slow,
                                 .n_ctx_orig = rs->orig_ctx};
            printf("  rope scaling   %s, factor %g, original context %d", rk_rope_scaling_name(rs->type),
                   (double)rs->factor, (int)rs->orig_ctx);
            if (rs->type == RK_ROPE_SCALING_YARN)
                printf(", ext %g, attn %g, beta fast %g / slow %g, mscale %.4f", (double)rs->ext_factor,
                       (double)rs->attn_factor, (double)rs->beta_fast, (double)rs->beta_slow, rk_rope_mscale(&rp));
            printf("\n");
        }
        printf("  rms eps        %g\n  output         %s\n", (double)hp->rms_eps,
               hp->tied_output ? "tied to token_embd" : "separate");
        printf("  extras         %s%s%s\n", hp->has_qkv_bias ? "qkv bias " : "", hp->has_qk_norm ? "q/k norm " : "",
               hp->has_qkv_bias || hp->has_qk_norm ? "" : "none");
        printf("  chat template  %s\n", rk_chat_family_name(rk_model_chat_family(m)));
        if (rk_model_chat_default_system(m)[0])
            printf("  chat system    \"%s\" (the template's default when none is given)\n",
                   rk_model_chat_default_system(m));
        printf("  memory         weights %.1f MiB (mapped) + KV %.1f KiB/token f16 = %.1f MiB at %d tokens\n",
               (double)rk_model_weight_bytes(m) / 1048576.0, (double)kv_tok_f16 / 1024.0,
               ((double)rk_model_weight_bytes(m) + (double)kv_tok_f16 * n_ctx_max) / 1048576.0, (int)n_ctx_max);
        rk_model_destroy(m);
    } else if (o.verbose) {
        fprintf(stderr, "ridgekv info: not loadable as a model: %s\n", me.msg);
    }
    return RK_EXIT_OK;
}
