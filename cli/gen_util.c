/* Helpers of the generating commands: see cli_gen.h. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_gen.h"
#include "lineedit.h"
#include "progress.h"

rk_gen_params cli_gen_params(const cli_opts *o) {
    rk_gen_params p = rk_gen_params_default();
    p.sampler = o->sp;
    p.max_tokens = o->n_predict;
    p.stop = o->stop;
    p.n_stop = o->n_stop;
    return p;
}

int cli_gen_grammar(const char *cmd, const cli_opts *o, rk_json_grammar **g) {
    *g = NULL;
    if (!o->json_schema && !o->json_object) return 0;
    char *text = NULL;
    size_t n = 0;
    if (o->json_schema) {
        FILE *f = fopen(o->json_schema, "rb");
        if (!f) {
            fprintf(stderr, "ridgekv %s: --json-schema %s: %s\n", cmd, o->json_schema, strerror(errno));
            return RK_EXIT_IO;
        }
        size_t cap = 0;
        for (;;) {
            if (n == cap) {
                char *q = cap < (64u << 20) ? realloc(text, cap = cap ? cap * 2 : 4096) : NULL;
                if (!q) {
                    fclose(f);
                    free(text);
                    fprintf(stderr, "ridgekv %s: --json-schema %s: too large or out of memory\n", cmd, o->json_schema);
                    return RK_EXIT_ERROR;
                }
                text = q;
            }
            size_t k = fread(text + n, 1, cap - n, f);
            if (!k) break;
            n += k;
        }
        const bool bad = ferror(f);
        fclose(f);
        if (bad) {
            free(text);
            fprintf(stderr, "ridgekv %s: --json-schema %s: read error\n", cmd, o->json_schema);
            return RK_EXIT_IO;
        }
    }
    rk_err e = {0};
    rk_status st = rk_json_grammar_create(text, n, g, &e);
    free(text);
    if (st) {
        fprintf(stderr, "ridgekv %s: --json-schema %s: %s\n", cmd, o->json_schema ? o->json_schema : "", e.msg);
        return st == RK_E_NOMEM ? RK_EXIT_ERROR : RK_EXIT_USAGE;
    }
    return 0;
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

static void sink_write(cli_sink *k, const char *p, size_t n) {
    if (k->failed) return;
    errno = 0;
    if ((n && fwrite(p, 1, n, k->f) != n) || fflush(k->f) == EOF) {
        k->failed = true;
        k->err = errno ? errno : EIO;
        return;
    }
    k->n += n;
}

bool cli_sink_token(void *ud, int32_t token, const char *text, size_t n) {
    (void)token;
    cli_sink *k = ud;
    /* after Ctrl-C nothing more is written: the token sampled meanwhile would land after the
     * "stopping" notice */
    if (k->sigint_stops && cli_sigint_pending()) return false;
    if (n) cli_progress_break(), sink_write(k, text, n);
    return !k->failed && !(k->sigint_stops && cli_sigint_pending());
}

void cli_sink_rest(cli_sink *k, const rk_gen_result *r) {
    if (k->sigint_stops && r->stop == RK_STOP_CANCELLED) return;
    cli_progress_break();
    sink_write(k, r->text + r->n_streamed, r->n_text > r->n_streamed ? r->n_text - r->n_streamed : 0);
}

int cli_sink_check(const char *cmd, cli_sink *k) {
    if (!k->failed) {
        errno = 0;
        if (fflush(k->f) == EOF || ferror(k->f)) k->failed = true, k->err = errno ? errno : EIO;
    }
    if (!k->failed) return 0;
    fprintf(stderr, "ridgekv %s: writing the output failed: %s; stopped\n", cmd, strerror(k->err));
    return RK_EXIT_IO;
}

void cli_show_prompt(const char *cmd, const rk_model *m, const int32_t *ids, size_t n) {
    char stack[256];
    fprintf(stderr, "ridgekv %s: prompt (%zu tokens):\n", cmd, n);
    for (size_t i = 0; i < n; i++) {
        size_t k = rk_model_token_piece(m, ids[i], true, stack, sizeof stack);
        fwrite(stack, 1, k < sizeof stack ? k : sizeof stack, stderr);
    }
    fprintf(stderr, "\nridgekv %s: prompt tokens:\n", cmd);
    for (size_t i = 0; i < n; i++) {
        size_t k = rk_model_token_piece(m, ids[i], true, stack, sizeof stack);
        if (k > sizeof stack) k = sizeof stack;
        fprintf(stderr, "%6d '", ids[i]);
        for (size_t j = 0; j < k; j++) {
            unsigned char ch = (unsigned char)stack[j];
            if (ch == '\n') fputs("\\n", stderr);
            else if (ch == '\t') fputs("\\t", stderr);
            else if (ch == '\r') fputs("\\r", stderr);
            else if (ch == '\'' || ch == '\\') fprintf(stderr, "\\%c", ch);
            else if (ch < 0x20 || ch == 0x7f) fprintf(stderr, "\\x%02x", ch);
            else fputc(ch, stderr);
        }
        fputs("'\n", stderr);
    }
    fflush(stderr);
}

int cli_text_clean(const char *cmd, const char *path, char **text, size_t *len) {
    char *t = *text;
    size_t w = 0, n = *len;
    for (size_t i = 0; i < n; i++) { /* CRLF and lone CR -> LF */
        if (t[i] == '\r') {
            t[w++] = '\n';
            if (i + 1 < n && t[i + 1] == '\n') i++;
        } else {
            t[w++] = t[i];
        }
    }
    t[w] = 0;
    *len = n = w;
    size_t bad;
    if (rk_utf8_valid(t, n, &bad)) return 0;
    bool multibyte = false;
    for (size_t i = 0; i < n && !multibyte;) {
        int k = rk_utf8_char((const unsigned char *)t + i, n - i);
        if (k > 1) multibyte = true;
        i += k > 0 ? (size_t)k : 1;
    }
    char *out;
    size_t out_len = 0;
    if (!multibyte) { /* a legacy 8-bit file: Latin-1 maps byte b to U+00b */
        out = malloc(2 * n + 1);
        if (!out) return RK_EXIT_ERROR;
        for (size_t i = 0; i < n; i++) {
            unsigned char b = (unsigned char)t[i];
            if (b < 0x80) out[out_len++] = (char)b;
            else out[out_len++] = (char)(0xC0 | (b >> 6)), out[out_len++] = (char)(0x80 | (b & 0x3F));
        }
        out[out_len] = 0;
    } else if (!(out = rk_utf8_repair(t, n, &out_len))) {
        return RK_EXIT_ERROR;
    }
    fprintf(stderr, "ridgekv %s: warning: %s is not UTF-8 (byte 0x%02X at offset %zu); %s\n", cmd, path,
            (unsigned char)t[bad], bad,
            multibyte ? "each byte that is not UTF-8 was replaced by U+FFFD"
                      : "read it as Latin-1 (converted to UTF-8)");
    free(t);
    *text = out;
    *len = out_len;
    return 0;
}

bool cli_cut_marker(const char *cmd, const cli_opts *o, const rk_gen_result *r, int64_t cap, bool tty) {
    if (r->stop != RK_STOP_LENGTH || r->n_gen == 0 || cap <= 0 || r->n_gen < cap) return false;
    char why[160];
    if (o->n_predict >= 0 && cap >= o->n_predict) snprintf(why, sizeof why, "-n %d tokens reached", o->n_predict);
    else
        snprintf(why, sizeof why, "the answer room of %lld tokens is used up (raise -c for longer answers)",
                 (long long)cap);
    if (tty) fprintf(stderr, "[answer cut: %s]\n", why);
    else fprintf(stderr, "ridgekv %s: [answer cut: %s]\n", cmd, why);
    return true;
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
    fprintf(stderr,
            "ridgekv %s: prefill %lld of %lld prompt tokens in %.3f s; filled %llu (row, layer) pairs; "
            "%lld tokens generated (%s); KV %s\n",
            cmd, (long long)r->n_prefill, (long long)r->n_prompt, r->prefill_s, (unsigned long long)r->filled_rows,
            (long long)r->n_gen, rk_stop_reason_name(r->stop), kv);
    rk_sparse_stats sp;
    rk_session_sparse_stats(s, &sp);
    if (sp.blocks_causal)
        fprintf(stderr,
                "ridgekv %s: sparse attention computed %llu of %llu causal key blocks (%.3f) in %llu sparse "
                "calls\n",
                cmd, (unsigned long long)sp.blocks_done, (unsigned long long)sp.blocks_causal,
                (double)sp.blocks_done / (double)sp.blocks_causal, (unsigned long long)sp.calls_sparse);
}
