/* Long prompts without flags: see long_cli.h. */
#include "long_cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "catalog.h"
#include "cli_gen.h"

uint64_t cli_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kib = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) break;
    fclose(f);
    return (uint64_t)kib * 1024u;
}

rk_long_request cli_long_request(const cli_opts *o, const rk_model *m, int64_t n_prompt, int64_t n_rows) {
    rk_long_request r = {.n_prompt = n_prompt,
                         .n_rows = n_rows,
                         .n_ctx = o->n_ctx > 0 ? o->n_ctx : 0,
                         .free_bytes = cli_mem_available(),
                         .rope_explicit = o->rope_set != 0,
                         .kv_explicit = o->kv != NULL,
                         .budget_explicit = o->kv_budget != NULL,
                         .overflow_ok = o->ctx_overflow_ok != 0};
    if (o->kv) {
        rk_kv_params kp;
        char head[16];
        snprintf(head, sizeof head, "%.*s", (int)strcspn(o->kv, ":,"), o->kv);
        if (rk_kv_params_parse(head, &kp, NULL) == RK_OK) r.kv_kind = kp.kind;
    }
    char buf[4096];
    const char *path = cli_model_path(o, buf, sizeof buf);
    const cli_model_entry *e = cli_catalog_by_file(path, rk_model_hparams(m)->arch_name);
    if (e && e->rope_scaling && rk_rope_scaling_parse(e->rope_scaling, &r.documented.type)) {
        r.documented.factor = e->rope_factor;
        r.documented.orig_ctx = 0; /* from the file's trained context */
    }
    return r;
}

/* A prompt past reach (without -c): the numbers and the flags. */
static void refuse(const char *cmd, const rk_model *m, const rk_long_request *r, const rk_long_defaults *d) {
    const int64_t need = r->n_prompt ? r->n_prompt : d->n_rows;
    fprintf(stderr, "ridgekv %s: the prompt has %lld tokens, past what the model handles: ", cmd, (long long)need);
    const rk_rope_scaling *s = &rk_model_hparams(m)->rope_scaling;
    if (s->type != RK_ROPE_SCALING_NONE)
        fprintf(stderr, "%lld trained, %lld with the %s x%g scaling in effect.", (long long)d->n_ctx_train,
                (long long)d->n_ctx_max, rk_rope_scaling_name(s->type), (double)s->factor);
    else if (r->documented.type != RK_ROPE_SCALING_NONE && !r->rope_explicit)
        fprintf(stderr, "%lld trained, %lld with its documented %s x%g scaling.", (long long)d->n_ctx_train,
                (long long)d->n_ctx_max, rk_rope_scaling_name(r->documented.type), (double)r->documented.factor);
    else fprintf(stderr, "it was trained on %lld tokens and documents no RoPE scaling.", (long long)d->n_ctx_train);
    const long long f = (long long)((need + d->n_ctx_train - 1) / (d->n_ctx_train > 0 ? d->n_ctx_train : 1));
    fprintf(stderr,
            "\nShorten the prompt (or lower -n), or choose a scaling yourself: --rope-scaling yarn --rope-scale %lld "
            "--yarn-orig-ctx %lld (quality past the model's documented range is not known), or --ctx-overflow-ok "
            "(no scaling: garbage past the trained context).\n",
            f < 2 ? 2 : f, (long long)d->n_ctx_train);
}

/* rk_long_defaults_get, its error on stderr */
static rk_status defaults(const rk_model *m, const rk_long_request *r, rk_long_defaults *d) {
    rk_err e = {0};
    rk_status st = rk_long_defaults_get(m, r, d, &e);
    if (st) cli_print_error(&e);
    return st;
}

bool cli_long_sparse_on(const cli_opts *o) { return o->sparse ? !strncmp(o->sparse, "on", 2) : !o->no_ridgefill; }

int cli_long_apply(const char *cmd, cli_opts *o, rk_model *m, int64_t n_prompt, int64_t n_rows, rk_long_defaults *out) {
    rk_long_request r = cli_long_request(o, m, n_prompt, n_rows);
    rk_long_defaults d;
    rk_err e = {0};
    rk_status st = defaults(m, &r, &d);
    if (st) return cli_exit_code(st);
    if (out) *out = d;
    /* a -c past reach is the session's refusal (RK_E_CONTEXT, with the numbers) */
    if (d.rope == RK_LONG_ROPE_TOO_LONG && r.n_ctx == 0) {
        refuse(cmd, m, &r, &d);
        return RK_EXIT_CONTEXT;
    }
    if (d.rope == RK_LONG_ROPE_APPLY && (st = rk_model_set_rope(m, &d.rope_set, &e))) {
        cli_print_error(&e);
        return cli_exit_code(st);
    }
    const int64_t need = r.n_ctx > 0 ? r.n_ctx : d.n_rows;
    const char *why = r.n_ctx > 0 ? "-c" : "the prompt with its answer room needs";
    const rk_rope_scaling *s = &rk_model_hparams(m)->rope_scaling;
    if (d.rope != RK_LONG_ROPE_NONE && d.rope != RK_LONG_ROPE_TOO_LONG)
        fprintf(stderr,
                "ridgekv %s: %s %lld tokens, past the %lld the model was trained on: RoPE %s x%g from %d "
                "(%s), context up to %lld%s\n",
                cmd, why, (long long)need, (long long)d.n_ctx_train, rk_rope_scaling_name(s->type), (double)s->factor,
                (int)s->orig_ctx,
                d.rope == RK_LONG_ROPE_APPLY  ? "the model's documented scaling, applied"
                : d.rope == RK_LONG_ROPE_FILE ? "the GGUF's scaling"
                                              : "your --rope-*/--yarn-* flags",
                (long long)d.n_ctx_max,
                d.rope == RK_LONG_ROPE_APPLY ? "; --rope-scaling none or other --rope-*/--yarn-* flags override it"
                                             : "");
    if (d.n_ctx > 0) o->n_ctx = d.n_ctx;
    if (d.n_batch > 0 && o->n_batch == 0 && cli_long_sparse_on(o)) o->n_batch = d.n_batch;
    static char budget[32];
    if (d.kv_why == RK_LONG_KV_LONG || d.kv_why == RK_LONG_KV_MEMORY) o->kv = rk_kv_kind_name(d.kv);
    if (d.kv_budget) {
        snprintf(budget, sizeof budget, "%lluM", (unsigned long long)(d.kv_budget >> 20));
        o->kv_budget = budget;
    }
    if (d.kv_why == RK_LONG_KV_LONG || d.kv_why == RK_LONG_KV_MEMORY || d.kv_budget) {
        char kvb[32], f16b[32], freeb[32];
        cli_fmt_bytes(kvb, sizeof kvb, (double)d.kv_bytes);
        cli_fmt_bytes(f16b, sizeof f16b, (double)d.kv_f16_bytes);
        cli_fmt_bytes(freeb, sizeof freeb, (double)r.free_bytes);
        fprintf(stderr, "ridgekv %s: KV cache %s for %lld rows: %s", cmd, rk_kv_kind_name(d.kv), (long long)d.n_rows,
                kvb);
        if (d.kv != RK_KV_F16) fprintf(stderr, " (f16: %s)", f16b);
        if (d.kv_why == RK_LONG_KV_LONG) fprintf(stderr, ", q8 from %d prompt tokens on", RK_LONG_Q8_MIN_TOKENS);
        else if (d.kv_why == RK_LONG_KV_MEMORY)
            fprintf(stderr, ", q8 as f16 would take over half of the %s free", freeb);
        if (d.kv_budget)
            fprintf(stderr, "; --kv-budget %s: %s free would not hold it, the rest spills to $TMPDIR", budget, freeb);
        fprintf(stderr, "%s\n", d.kv_why == RK_LONG_KV_EXPLICIT ? "" : " (--kv f16 or --kv-budget SIZE override)");
    }
    return 0;
}

int cli_long_mode(const cli_opts *o, const rk_model *m, int64_t n_prompt, int64_t n_rows, const char **mode,
                  const char *default_fill, rk_kv_params *kv, int *n_batch) {
    const bool off = !strcmp(*mode, "off");
    if (!off && strcmp(*mode, "default")) return 0;
    rk_long_request r = cli_long_request(o, m, n_prompt, n_rows);
    r.exact = off;
    rk_long_defaults d;
    rk_status st = defaults(m, &r, &d);
    if (st) return cli_exit_code(st);
    if (off) { /* the library's exact reference: f16, no budget, no tiers */
        *kv = rk_kv_params_default();
        kv->kind = d.kv;
        return 0;
    }
    if (!o->kv) {
        rk_kv_params p = rk_kv_params_default();
        p.kind = d.kv;
        cli_kv_apply(o, &p);
        *kv = p;
    }
    if (!o->kv_budget) kv->budget = d.kv_budget;
    /* the sparse prefill attention of the default (d.sparse) is cli_sparse_params's default,
     * as in ask: on unless --sparse says otherwise */
    (void)d.sparse;
    if (n_batch && d.n_batch > 0 && !o->n_batch && cli_long_sparse_on(o))
        *n_batch = d.n_batch; /* the chunk ask reads with when sparse attention acts (-b given wins) */
    *mode = default_fill;
    return 0;
}

const char *cli_long_default_fill(cli_opts *o, const rk_model *m, const char *cmd) {
    cli_opts fo = *o;
    fo.fill = NULL;
    (void)cli_auto_fill(&fo, m, cmd); /* says on stderr what it found */
    if (!fo.ridgefill) return "off";
    o->ridgefill = fo.ridgefill;
    return fo.fill ? fo.fill : cli_default_fill_name();
}
