/* ridgekv chat: the /commands (see chat.h). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "chat.h"

static const char *in_chat_help =
    "  /reset        forget the conversation (the system prompt stays)\n"
    "  /save FILE    write the conversation to FILE as JSON\n"
    "  /load FILE    replace the conversation with one saved by /save\n"
    "  /stats        tokens in context, last prefill and decode speed, KV cache bytes\n"
    "  /help         this list\n"
    "  /exit         leave (so does Ctrl-D, or Ctrl-C twice at an empty prompt)\n"
    "  end a line with \\ to continue it; \"\"\" on its own line opens and closes a block\n"
    "  Ctrl-C stops the answer being written\n";

void chat_notice(const chat *c, const char *msg) {
    cli_progress_break();
    if (c->interactive) fprintf(stderr, "[%s]\n", msg);
    else fprintf(stderr, "ridgekv chat: %s\n", msg);
}

static void stats(const chat *c) {
    const int64_t n_past = rk_session_n_past(c->s), n_ctx = rk_session_n_ctx(c->s);
    const size_t n_ex = rk_conv_n_exchanges(c->conv);
    rk_kv_bytes b;
    rk_session_kv_bytes(c->s, &b);
    /* every policy reports its bytes; plain caches have none in the parts and count rows */
    const double total = b.total ? (double)b.total : (double)rk_session_kv_bytes_per_token(c->s) * (double)n_past;
    char kvb[32], what[160];
    cli_fmt_bytes(kvb, sizeof kvb, total);
    cli_kv_summary(c->s, c->o.kv, what, sizeof what);
    printf("context   %lld / %lld tokens (%.1f%%), %zu exchange%s\n", (long long)n_past, (long long)n_ctx,
           100.0 * (double)n_past / (double)n_ctx, n_ex, n_ex == 1 ? "" : "s");
    if (c->last_prefill_n)
        printf("prefill   last %lld tokens in %.2f s (%.1f tok/s)\n", (long long)c->last_prefill_n, c->last_prefill_s,
               (double)c->last_prefill_n / (c->last_prefill_s > 0 ? c->last_prefill_s : 1e-9));
    else printf("prefill   none yet\n");
    if (c->last_decode_n)
        printf("decode    last %lld tokens in %.2f s (%.1f tok/s)\n", (long long)c->last_decode_n, c->last_decode_s,
               (double)c->last_decode_n / (c->last_decode_s > 0 ? c->last_decode_s : 1e-9));
    else printf("decode    none yet\n");
    printf("kv cache  %s (%.0f bytes/token x %lld tokens, %s)\n", kvb, n_past ? total / (double)n_past : 0.0,
           (long long)n_past, what);
    printf("model     %s, %s template\n", rk_model_name(c->m), rk_chat_family_name(rk_conv_family(c->conv)));
    fflush(stdout);
}

/* "1.7 KiB" for the file at path; "?" when it cannot be read. */
static void file_size(const char *path, char *buf, size_t cap) {
    struct stat st;
    if (stat(path, &st) == 0) cli_fmt_bytes(buf, cap, (double)st.st_size);
    else snprintf(buf, cap, "?");
}

/* Says what was written and how big: the KV block beside a short conversation can be
 * thousands of times its size. */
static void save(const chat *c, const char *path) {
    rk_err e = {0};
    bool kv = false;
    if (rk_conv_save(c->conv, path, &kv, &e)) {
        fprintf(stderr, "ridgekv chat: cannot save the conversation: %s\n", e.msg);
        return;
    }
    char js[32], kvs[32] = "", kvp[4200], msg[8600];
    file_size(path, js, sizeof js);
    snprintf(kvp, sizeof kvp, "%s.kv", path);
    if (kv) file_size(kvp, kvs, sizeof kvs);
    const size_t n = rk_conv_n_messages(c->conv);
    if (kv)
        snprintf(msg, sizeof msg,
                 "saved %zu message%s to %s (%s) and the KV cache of %lld tokens to %s (%s): /load reuses it; "
                 "delete %s to keep only the conversation",
                 n, n == 1 ? "" : "s", path, js, (long long)rk_session_n_past(c->s), kvp, kvs, kvp);
    else snprintf(msg, sizeof msg, "saved %zu message%s to %s (%s)", n, n == 1 ? "" : "s", path, js);
    chat_notice(c, msg);
}

static void load(chat *c, const char *path) {
    rk_err e = {0};
    bool kv = false;
    if (rk_conv_load(c->conv, path, &kv, &e)) {
        fprintf(stderr, "ridgekv chat: cannot load: %s\n", e.msg);
        return;
    }
    if (c->interactive)
        fprintf(stderr, "[loaded %zu messages from %s; %s]\n", rk_conv_n_messages(c->conv), path,
                kv ? "the KV cache came with them" : "the next turn reads them");
}

int chat_command(chat *c, char *line) {
    char *cmd = chat_trim(line), *arg = cmd;
    while (*arg && *arg != ' ' && *arg != '\t') arg++;
    if (*arg) *arg++ = 0;
    arg = chat_trim(arg);
    if (!strcmp(cmd, "/exit") || !strcmp(cmd, "/quit")) return 1;
    if (!strcmp(cmd, "/help")) fputs(in_chat_help, stdout);
    else if (!strcmp(cmd, "/stats")) stats(c);
    else if (!strcmp(cmd, "/reset")) {
        rk_conv_reset(c->conv, true);
        if (c->interactive) fprintf(stderr, "[conversation reset]\n");
    } else if (!strcmp(cmd, "/save") || !strcmp(cmd, "/load")) {
        if (!*arg) fprintf(stderr, "ridgekv chat: %s needs a file name\n", cmd);
        else if (cmd[1] == 's') save(c, arg);
        else load(c, arg);
    } else {
        fprintf(stderr, "ridgekv chat: unknown command %s (/help lists them)\n", cmd);
    }
    fflush(stdout);
    return 0;
}
