/* Helpers of the generating commands: see cli_gen.h. */
#include <stdlib.h>
#include <string.h>

#include "cli_gen.h"
#include "lineedit.h"

rk_gen_params cli_gen_params(const cli_opts *o) {
    rk_gen_params p = rk_gen_params_default();
    p.sampler = o->sp;
    p.max_tokens = o->n_predict;
    return p;
}

int cli_open_session(const cli_opts *o, const rk_model *m, int n_ctx, rk_session **s) {
    rk_session_params sp;
    int rc = cli_session_params(o, &sp);
    if (rc) return rc;
    if (n_ctx > 0) sp.n_ctx = n_ctx;
    rk_err e = {0};
    rk_status st = rk_session_create(m, &sp, s, &e);
    if (st) {
        cli_print_error(&e);
        return cli_exit_code(st);
    }
    return cli_setup_kv(o, *s, NULL);
}

bool cli_sink_token(void *ud, int32_t token, const char *text, size_t n) {
    (void)token;
    cli_sink *k = ud;
    if (n) {
        fwrite(text, 1, n, k->f);
        fflush(k->f);
        k->n += n;
    }
    return !(k->sigint_stops && cli_sigint_pending());
}

void cli_sink_rest(cli_sink *k, const rk_gen_result *r) {
    if (r->n_text > r->n_streamed) {
        fwrite(r->text + r->n_streamed, 1, r->n_text - r->n_streamed, k->f);
        k->n += r->n_text - r->n_streamed;
    }
    fflush(k->f);
}

void cli_fmt_bytes(char *buf, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(buf, cap, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%.0f B", b);
}

void cli_kv_summary(const rk_session *s, const char *kv_flag, char *buf, size_t cap) {
    rk_kv_bytes b;
    rk_session_kv_bytes(s, &b);
    char kind[16] = "f16";
    if (kv_flag) snprintf(kind, sizeof kind, "%.*s", (int)strcspn(kv_flag, ":,"), kv_flag);
    if (!b.n_compressed_rows && !b.coef) {
        snprintf(buf, cap, "%s", kind);
        return;
    }
    char tot[32], f16[32];
    cli_fmt_bytes(tot, sizeof tot, (double)b.total);
    cli_fmt_bytes(f16, sizeof f16, (double)b.f16_equiv);
    snprintf(buf, cap, "%s, %lld of %lld rows compressed, %s (f16: %s)", kind, (long long)b.n_compressed_rows,
             (long long)b.n_tokens, tot, f16);
}

void cli_gen_verbose(const char *cmd, const rk_session *s, const cli_opts *o, const rk_gen_result *r) {
    char kv[160];
    cli_kv_summary(s, o->kv, kv, sizeof kv);
    fprintf(stderr, "ridgekv %s: prefill %lld of %lld prompt tokens in %.3f s; filled %llu (row, layer) pairs; "
                    "%lld tokens generated (%s); KV %s\n",
            cmd, (long long)r->n_prefill, (long long)r->n_prompt, r->prefill_s, (unsigned long long)r->filled_rows,
            (long long)r->n_gen, rk_stop_reason_name(r->stop), kv);
}
