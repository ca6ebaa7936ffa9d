/* ridgekv chat: a terminal chat over the model's chat template.
 *
 * The KV cache holds the conversation between turns. Each turn formats the whole
 * conversation, but when the text already read is a prefix of it only the new part
 * is tokenized and evaluated: the model's own answer tokens stay in the cache as
 * generated. kv_sync() keeps the longest common token prefix and evaluates the rest,
 * so a mismatch (after /load or dropping old turns) costs a re-read, never a wrong
 * cache. */
#include <json-c/json.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "lineedit.h"
#include "rk_io.h"
#include "stream.h"

static const char *help =
    "usage: ridgekv chat [-m MODEL] [--system TEXT] [options]\n"
    "\n"
    "Talks with the model in the terminal through its chat template (ChatML when the\n"
    "model names none). Answers stream as they are written; the conversation stays in\n"
    "the KV cache between turns, so each turn reads only its own new tokens.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "      --system TEXT       system prompt (always kept, also when old turns are dropped)\n"
    "  -n, --n-predict N       most tokens per answer (default 512; -1 = until the end of the turn)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's)\n"
    "  -b, --batch-size N      prefill chunk (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32        KV cache precision (default f16)\n"
    "      --backend cpu|cpu_ref  kernels (cpu_ref: the scalar oracle, slow)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K           (default 40; 0 = off)\n"
    "      --top-p P           (default 0.95; 1 = off)\n"
    "      --min-p P           (default 0.05; 0 = off)\n"
    "      --repeat-penalty R  (default 1.0 = off)\n"
    "      --repeat-last-n N   tokens the penalty looks back (default 64)\n"
    "      --seed S            sampling seed (default 0)\n"
    "      --ridgefill MAPS    RidgeFill map file (from ridgekv calibrate): faster reading of long prompts\n"
    "      --fill MODE         off|speed|quality|identity|plumb (default: speed with maps, else off)\n"
    "      --tail T            exact tail in tokens (default 2048, minimum 512)\n"
    "      --split S           split layer for --fill identity/plumb without maps\n"
    "      --keep-share X      quality mode: share of hard tokens kept exact (default: the map's)\n"
    "  -v, --verbose           model details at the start, timings after each answer (stderr)\n"
    "\n"
    "In the chat:\n"
    "  a line ending in \\ continues on the next line; a line \"\"\" opens a block that\n"
    "  the next line \"\"\" closes\n"
    "  /reset        forget the conversation (the system prompt stays)\n"
    "  /save FILE    write the conversation to FILE as JSON\n"
    "  /load FILE    replace the conversation with one saved by /save\n"
    "  /stats        tokens in context, last prefill and decode speed, KV cache bytes\n"
    "  /help         this list\n"
    "  /exit         leave (so does Ctrl-D, or Ctrl-C twice at an empty prompt)\n"
    "  Ctrl-C while an answer is written stops that answer; the part written stays in\n"
    "  the conversation.\n"
    "\n"
    "When stdin is not a terminal, every line (joined as above) is one turn and stdout\n"
    "gets only the answers, each followed by a newline; notices go to stderr.\n"
    "\n"
    "When a turn plus room for its answer (-n tokens, at most half the context) does not\n"
    "fit, the oldest exchanges are dropped (the system prompt stays), stderr says so,\n"
    "and the rest of the conversation is read again.\n"
    "\n"
    "exit codes: 0 left normally, 2 bad usage, 3 model unusable, 4 system prompt too long\n"
    "for the context, 5 reading input failed, 6 no default model, 130 Ctrl-C while waiting\n"
    "for piped input\n";

static const char *in_chat_help =
    "  /reset        forget the conversation (the system prompt stays)\n"
    "  /save FILE    write the conversation to FILE as JSON\n"
    "  /load FILE    replace the conversation with one saved by /save\n"
    "  /stats        tokens in context, last prefill and decode speed, KV cache bytes\n"
    "  /help         this list\n"
    "  /exit         leave (so does Ctrl-D, or Ctrl-C twice at an empty prompt)\n"
    "  end a line with \\ to continue it; \"\"\" on its own line opens and closes a block\n"
    "  Ctrl-C stops the answer being written\n";

typedef struct ids {
    int32_t *p;
    size_t n, cap;
} ids;

typedef struct msg {
    const char *role; /* static string */
    char *content;    /* owned */
} msg;

typedef struct chat {
    cli_opts o;
    rk_model *m;
    rk_session *s;
    rk_sampler *smp;
    rk_ridge_maps *maps;
    const rk_hparams *hp;
    rk_chat_family fam;
    int64_t n_ctx;
    int64_t reserve; /* answer room a turn must leave */
    float *logits;   /* (n_vocab) for the last token in the cache */
    msg *msgs;
    size_t n_msgs, cap_msgs;
    ids kv;     /* the tokens in the KV cache, in order: kv.n == rk_session_n_past */
    ids seq;    /* tokens standing for `text`; kv may lack the last one */
    char *text; /* conversation text that seq stands for; NULL: re-tokenize everything */
    bool interactive;
    int64_t last_prefill_n, last_decode_n;
    double last_prefill_s, last_decode_s;
} chat;

static bool ids_reserve(ids *v, size_t n) {
    if (n <= v->cap) return true;
    size_t cap = v->cap ? v->cap : 256;
    while (cap < n) cap *= 2;
    int32_t *p = realloc(v->p, cap * sizeof *p);
    if (!p) return false;
    v->p = p;
    v->cap = cap;
    return true;
}

static bool ids_append(ids *v, const int32_t *x, size_t n) {
    if (!ids_reserve(v, v->n + n)) return false;
    memcpy(v->p + v->n, x, n * sizeof *x);
    v->n += n;
    return true;
}

static bool str_append(char **s, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        char *q = realloc(*s, c);
        if (!q) return false;
        *s = q;
        *cap = c;
    }
    memcpy(*s + *len, p, n);
    *len += n;
    (*s)[*len] = 0;
    return true;
}

static bool msg_push(chat *c, const char *role, const char *content) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? c->cap_msgs * 2 : 16;
        msg *p = realloc(c->msgs, cap * sizeof *p);
        if (!p) return false;
        c->msgs = p;
        c->cap_msgs = cap;
    }
    char *dup = strdup(content);
    if (!dup) return false;
    c->msgs[c->n_msgs++] = (msg){role, dup};
    return true;
}

static void msg_pop(chat *c) {
    if (c->n_msgs) free(c->msgs[--c->n_msgs].content);
}

/* Removes messages [from, to). */
static void msg_remove(chat *c, size_t from, size_t to) {
    for (size_t i = from; i < to; i++) free(c->msgs[i].content);
    memmove(c->msgs + from, c->msgs + to, (c->n_msgs - to) * sizeof *c->msgs);
    c->n_msgs -= to - from;
}

static void forget_text(chat *c) {
    free(c->text);
    c->text = NULL;
    c->seq.n = 0;
}

static size_t n_exchanges(const chat *c) {
    size_t n = 0;
    for (size_t i = 0; i < c->n_msgs; i++) n += !strcmp(c->msgs[i].role, "user");
    return n;
}

static bool chat_progress(void *ud, int64_t done, int64_t total) {
    (void)ud, (void)done, (void)total;
    return !cli_sigint_pending();
}

/* The token sequence for the conversation text `full`: seq plus the new tail when
 * c->text is a prefix of full, else full tokenized from scratch. */
static rk_status build_want(chat *c, const char *full, ids *want, rk_err *e) {
    want->n = 0;
    const char *tail = full;
    bool add_special = true;
    if (c->text && c->seq.n && !strncmp(full, c->text, strlen(c->text))) {
        if (!ids_append(want, c->seq.p, c->seq.n)) return rk_err_set(e, RK_E_NOMEM, "chat: out of memory");
        tail = full + strlen(c->text);
        add_special = false;
    }
    int32_t *t = NULL;
    size_t n = 0;
    rk_status st = rk_model_tokenize(c->m, tail, strlen(tail), add_special, true, &t, &n, e);
    if (st) return st;
    bool ok = ids_append(want, t, n);
    free(t);
    return ok ? RK_OK : rk_err_set(e, RK_E_NOMEM, "chat: out of memory");
}

/* Makes the cache hold want[0..n): keeps the common prefix, evaluates the rest (at least
 * one token, for fresh logits). *n_eval: tokens evaluated. */
static rk_status kv_sync(chat *c, const ids *want, size_t *n_eval, rk_err *e) {
    if (!want->n) return rk_err_set(e, RK_E_INTERNAL, "chat: empty turn");
    size_t p = 0;
    while (p < c->kv.n && p < want->n && c->kv.p[p] == want->p[p]) p++;
    if (p == want->n) p--;
    rk_status st;
    if (p < c->kv.n) {
        if ((st = rk_session_truncate(c->s, (int64_t)p, e))) return st;
        c->kv.n = p;
    }
    *n_eval = want->n - p;
    if ((st = rk_session_eval(c->s, want->p + p, want->n - p, c->logits, false, e))) return st;
    return ids_append(&c->kv, want->p + p, want->n - p) ? RK_OK : rk_err_set(e, RK_E_NOMEM, "chat: out of memory");
}

static void print_notice(const chat *c, const char *msg) {
    if (c->interactive) fprintf(stderr, "[%s]\n", msg);
    else fprintf(stderr, "ridgekv chat: %s\n", msg);
}

/* Formats the conversation (ending with the new user message) and drops the oldest
 * exchanges until it fits with answer room. Returns 1 when even the new message alone
 * does not fit (it is then removed), 0 when *full and *want are ready, or -status. */
static int fit_turn(chat *c, char **full, ids *want, rk_err *e) {
    size_t dropped = 0;
    int64_t before = -1;
    for (;;) {
        free(*full);
        *full = NULL;
        rk_chat_msg *cm = malloc(c->n_msgs * sizeof *cm);
        if (!cm) return -(int)rk_err_set(e, RK_E_NOMEM, "chat: out of memory");
        for (size_t i = 0; i < c->n_msgs; i++) cm[i] = (rk_chat_msg){c->msgs[i].role, c->msgs[i].content};
        rk_status st = rk_chat_format(c->fam, cm, c->n_msgs, true, full, e);
        free(cm);
        if (st || (st = build_want(c, *full, want, e))) return -(int)st;
        if (before < 0) before = (int64_t)want->n;
        if ((int64_t)want->n + c->reserve <= c->n_ctx) break;
        /* the oldest exchange: the first message after the system prompt and everything up
         * to the next user message, never the new message itself */
        size_t from = c->n_msgs && !strcmp(c->msgs[0].role, "system") ? 1 : 0;
        if (from + 1 < c->n_msgs) {
            size_t to = from + 1;
            while (to < c->n_msgs - 1 && strcmp(c->msgs[to].role, "user")) to++;
            msg_remove(c, from, to);
            forget_text(c);
            dropped++;
            continue;
        }
        if ((int64_t)want->n < c->n_ctx) break; /* alone it fits: the answer gets what is left */
        char m[256];
        snprintf(m, sizeof m, "this message does not fit: %zu tokens with the system prompt and template, "
                              "context %lld tokens; it was not sent",
                 want->n, (long long)c->n_ctx);
        print_notice(c, m);
        msg_pop(c);
        return 1;
    }
    if (dropped) {
        char m[320];
        snprintf(m, sizeof m, "context full: %lld tokens + %lld answer room > %lld; dropped the oldest %zu "
                              "exchange%s and re-read the rest (%zu tokens)",
                 (long long)before, (long long)c->reserve, (long long)c->n_ctx, dropped, dropped == 1 ? "" : "s",
                 want->n);
        print_notice(c, m);
    }
    return 0;
}

/* One turn: the user's text in, the answer streamed out. Returns 0 or an exit code. */
static int turn(chat *c, const char *user) {
    rk_err e = {0};
    rk_status st = RK_OK;
    char *full = NULL, *answer = NULL, *text = NULL;
    size_t ans_len = 0, ans_cap = 0, n_eval = 0;
    ids want = {0};
    cli_stream out = {.out = stdout};
    char piece[256];
    int n_gen = 0, rc = 0;
    bool stopped = false, ctx_full = false;
    double t0, t1, t2;
    if (!msg_push(c, "user", user) || !str_append(&answer, &ans_len, &ans_cap, "", 0)) goto oom;
    int f = fit_turn(c, &full, &want, &e);
    if (f) {
        st = (rk_status)-f;
        if (f < 0) goto fail;
        goto done;
    }
    t0 = rk_time_now();
    st = kv_sync(c, &want, &n_eval, &e);
    if (st == RK_E_CANCELLED) {
        if (c->interactive) fputc('\n', stderr);
        print_notice(c, "stopped before the answer; the message was not sent");
        msg_pop(c);
        goto done;
    }
    if (st) goto fail;
    t1 = rk_time_now();
    c->last_prefill_n = (int64_t)n_eval;
    c->last_prefill_s = t1 - t0;

    while (c->o.n_predict < 0 || n_gen < c->o.n_predict) {
        if (cli_sigint_pending()) {
            stopped = true;
            break;
        }
        int32_t tok = rk_sampler_sample(c->smp, c->logits, c->kv.p, c->kv.n);
        if (rk_model_token_is_eog(c->m, tok)) break;
        size_t pl = rk_model_token_piece(c->m, tok, false, piece, sizeof piece);
        if (pl <= sizeof piece) {
            cli_stream_put(&out, piece, pl);
            if (!str_append(&answer, &ans_len, &ans_cap, piece, pl)) goto oom;
        }
        /* want becomes the new seq: it may end with a token the cache has not read yet */
        if (!ids_append(&want, &tok, 1)) goto oom;
        n_gen++;
        if (c->o.n_predict >= 0 && n_gen >= c->o.n_predict) break;
        if ((int64_t)c->kv.n >= c->n_ctx) {
            ctx_full = true;
            break;
        }
        if ((st = rk_session_eval(c->s, &tok, 1, c->logits, false, &e))) goto fail;
        if (!ids_append(&c->kv, &tok, 1)) goto oom;
    }
    cli_stream_flush(&out);
    fputc('\n', stdout);
    if (c->interactive && !stopped) fputc('\n', stdout);
    fflush(stdout);
    t2 = rk_time_now();
    c->last_decode_n = n_gen;
    c->last_decode_s = t2 - t1;
    if (stopped) print_notice(c, c->interactive ? "stopped" : "answer stopped (Ctrl-C)");
    if (ctx_full) print_notice(c, "context full: the answer was cut; the next turn drops the oldest exchanges");
    if (c->o.verbose)
        fprintf(stderr, "ridgekv chat: read %zu tokens in %.2f s (%.1f tok/s), wrote %d tokens (%.1f tok/s), %zu/%lld in context\n",
                n_eval, t1 - t0, (double)n_eval / (t1 - t0 > 0 ? t1 - t0 : 1e-9), n_gen,
                n_gen ? n_gen / (t2 - t1 > 0 ? t2 - t1 : 1e-9) : 0.0, c->kv.n, (long long)c->n_ctx);
    /* the answer joins the conversation, also when stopped part way */
    size_t fl = strlen(full);
    if (!(text = malloc(fl + ans_len + 1)) || !msg_push(c, "assistant", answer)) goto oom;
    memcpy(text, full, fl);
    memcpy(text + fl, answer, ans_len + 1);
    free(c->text);
    c->text = text;
    text = NULL;
    ids tmp = c->seq;
    c->seq = want;
    want = tmp;
    goto done;
oom:
    st = rk_err_set(&e, RK_E_NOMEM, "chat: out of memory");
fail:
    cli_stream_flush(&out);
    if (n_gen) fputc('\n', stdout);
    fflush(stdout);
    cli_print_error(&e);
    rc = cli_exit_code(st);
    if (!rc) rc = RK_EXIT_ERROR;
done:
    free(text);
    free(full);
    free(answer);
    free(want.p);
    return rc;
}

static void reset(chat *c) {
    size_t keep = c->n_msgs && !strcmp(c->msgs[0].role, "system") ? 1 : 0;
    msg_remove(c, keep, c->n_msgs);
    forget_text(c);
    rk_session_reset(c->s);
    c->kv.n = 0;
}

static void fmt_bytes(char *buf, size_t cap, double b) {
    if (b >= 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.2f GiB", b / (1024.0 * 1024 * 1024));
    else if (b >= 1024.0 * 1024) snprintf(buf, cap, "%.2f MiB", b / (1024.0 * 1024));
    else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%.0f B", b);
}

static void stats(const chat *c) {
    int64_t n_past = rk_session_n_past(c->s);
    uint64_t per = rk_session_kv_bytes_per_token(c->s);
    char kvb[32];
    fmt_bytes(kvb, sizeof kvb, (double)per * (double)n_past);
    printf("context   %lld / %lld tokens (%.1f%%), %zu exchange%s\n", (long long)n_past, (long long)c->n_ctx,
           100.0 * (double)n_past / (double)c->n_ctx, n_exchanges(c), n_exchanges(c) == 1 ? "" : "s");
    if (c->last_prefill_n)
        printf("prefill   last %lld tokens in %.2f s (%.1f tok/s)\n", (long long)c->last_prefill_n, c->last_prefill_s,
               (double)c->last_prefill_n / (c->last_prefill_s > 0 ? c->last_prefill_s : 1e-9));
    else printf("prefill   none yet\n");
    if (c->last_decode_n)
        printf("decode    last %lld tokens in %.2f s (%.1f tok/s)\n", (long long)c->last_decode_n, c->last_decode_s,
               (double)c->last_decode_n / (c->last_decode_s > 0 ? c->last_decode_s : 1e-9));
    else printf("decode    none yet\n");
    printf("kv cache  %s (%llu bytes/token x %lld tokens, %s)\n", kvb, (unsigned long long)per, (long long)n_past,
           c->o.kv && !strcmp(c->o.kv, "f32") ? "f32" : "f16");
    printf("model     %s, %s template\n", rk_model_name(c->m), rk_chat_family_name(c->fam));
    fflush(stdout);
}

static void save(const chat *c, const char *path) {
    json_object *root = json_object_new_object(), *arr = json_object_new_array();
    json_object_object_add(root, "format", json_object_new_string("ridgekv-chat"));
    json_object_object_add(root, "version", json_object_new_int(1));
    json_object_object_add(root, "model", json_object_new_string(rk_model_name(c->m)));
    json_object_object_add(root, "template", json_object_new_string(rk_chat_family_name(c->fam)));
    for (size_t i = 0; i < c->n_msgs; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "role", json_object_new_string(c->msgs[i].role));
        json_object_object_add(o, "content", json_object_new_string(c->msgs[i].content));
        json_object_array_add(arr, o);
    }
    json_object_object_add(root, "messages", arr);
    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    rk_err e = {0};
    char *text = s ? malloc(strlen(s) + 2) : NULL;
    if (!text) {
        fprintf(stderr, "ridgekv chat: out of memory saving %s\n", path);
    } else {
        size_t n = strlen(s);
        memcpy(text, s, n);
        text[n] = '\n';
        if (rk_io_write_file_atomic(path, text, n + 1, &e))
            fprintf(stderr, "ridgekv chat: cannot save the conversation: %s\n", e.msg);
        else if (c->interactive)
            fprintf(stderr, "[saved %zu messages to %s]\n", c->n_msgs, path);
    }
    free(text);
    json_object_put(root);
}

static const char *role_name(const char *r) {
    if (!strcmp(r, "system")) return "system";
    if (!strcmp(r, "user")) return "user";
    if (!strcmp(r, "assistant")) return "assistant";
    return NULL;
}

/* Replaces the conversation with the file's; on any error the conversation is unchanged. */
static void load(chat *c, const char *path) {
    rk_err e = {0};
    char *data = NULL;
    size_t len;
    json_object *root = NULL;
    if (rk_io_read_file(path, &data, &len, &e)) {
        fprintf(stderr, "ridgekv chat: cannot load: %s\n", e.msg);
        return;
    }
    enum json_tokener_error jerr;
    root = json_tokener_parse_verbose(data, &jerr);
    json_object *arr;
    const char *why = NULL;
    if (!root) why = json_tokener_error_desc(jerr);
    else if (!json_object_object_get_ex(root, "messages", &arr) || !json_object_is_type(arr, json_type_array))
        why = "no \"messages\" array";
    size_t n = why ? 0 : json_object_array_length(arr);
    for (size_t i = 0; !why && i < n; i++) {
        json_object *o = json_object_array_get_idx(arr, i), *r, *t;
        if (!json_object_object_get_ex(o, "role", &r) || !json_object_is_type(r, json_type_string) ||
            !json_object_object_get_ex(o, "content", &t) || !json_object_is_type(t, json_type_string) ||
            !role_name(json_object_get_string(r)))
            why = "a message lacks a role (system, user or assistant) or a string content";
        else if (!strcmp(json_object_get_string(r), "system") && i != 0)
            why = "a system message after the first message";
        else if (strlen(json_object_get_string(t)) != (size_t)json_object_get_string_len(t))
            why = "a message contains a NUL character";
    }
    if (why) {
        fprintf(stderr, "ridgekv chat: cannot load %s: %s\n", path, why);
    } else {
        msg_remove(c, 0, c->n_msgs);
        forget_text(c);
        for (size_t i = 0; i < n; i++) {
            json_object *o = json_object_array_get_idx(arr, i), *r, *t;
            json_object_object_get_ex(o, "role", &r);
            json_object_object_get_ex(o, "content", &t);
            if (!msg_push(c, role_name(json_object_get_string(r)), json_object_get_string(t))) {
                fprintf(stderr, "ridgekv chat: out of memory loading %s\n", path);
                break;
            }
        }
        /* the cache keeps what still matches; the next turn reads the rest */
        if (c->interactive)
            fprintf(stderr, "[loaded %zu messages from %s; the next turn reads them]\n", c->n_msgs, path);
    }
    json_object_put(root);
    free(data);
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
    return s;
}

/* Returns 1 to leave the chat, 0 to go on. */
static int command(chat *c, char *line) {
    char *cmd = trim(line), *arg = cmd;
    while (*arg && *arg != ' ' && *arg != '\t') arg++;
    if (*arg) *arg++ = 0;
    arg = trim(arg);
    if (!strcmp(cmd, "/exit") || !strcmp(cmd, "/quit")) return 1;
    if (!strcmp(cmd, "/help")) fputs(in_chat_help, stdout);
    else if (!strcmp(cmd, "/stats")) stats(c);
    else if (!strcmp(cmd, "/reset")) {
        reset(c);
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

/* Reads one turn: a line, lines joined by a trailing backslash, or a """ block. */
static cli_le_result read_turn(chat *c, cli_lineedit *le, char **out, bool *had_text) {
    char *line = NULL, *acc = NULL;
    size_t len = 0, cap = 0;
    bool block = false, first = true, any = false;
    cli_le_result r;
    *out = NULL;
    for (;;) {
        r = cli_le_read(le, first ? ">>> " : "... ", &line, had_text);
        if (r != CLI_LE_LINE) {
            if (r == CLI_LE_INTERRUPT && !first) *had_text = true;
            if (r == CLI_LE_EOF && !first) break; /* piped input ended inside a block: send it */
            free(acc);
            return r;
        }
        if (c->interactive && *line) cli_le_history_add(le, line);
        bool fence = !strcmp(trim(line), "\"\"\"");
        if (first && fence) {
            block = true;
        } else if (block && fence) {
            free(line);
            break;
        } else {
            size_t n = strlen(line);
            bool cont = !block && n && line[n - 1] == '\\';
            if (cont) n--;
            if ((any && !str_append(&acc, &len, &cap, "\n", 1)) || !str_append(&acc, &len, &cap, line, n)) {
                free(line);
                free(acc);
                return CLI_LE_ERROR;
            }
            any = true;
            if (!block && !cont) {
                free(line);
                break;
            }
        }
        free(line);
        line = NULL;
        first = false;
    }
    *out = acc ? acc : strdup("");
    return *out ? CLI_LE_LINE : CLI_LE_ERROR;
}

static int chat_loop(chat *c, cli_lineedit *le) {
    int prompt_interrupts = 0;
    for (;;) {
        cli_sigint_clear();
        char *t = NULL;
        bool had_text = false;
        cli_le_result r = read_turn(c, le, &t, &had_text);
        if (r == CLI_LE_EOF) {
            if (c->interactive) fputc('\n', stdout);
            return RK_EXIT_OK;
        }
        if (r == CLI_LE_ERROR) {
            fprintf(stderr, "ridgekv chat: reading input failed\n");
            return RK_EXIT_IO;
        }
        if (r == CLI_LE_INTERRUPT) {
            if (!c->interactive) return 130;
            fputc('\n', stdout);
            if (had_text) {
                prompt_interrupts = 0;
                continue;
            }
            if (++prompt_interrupts >= 2) return RK_EXIT_OK;
            fprintf(stderr, "[Ctrl-C again or Ctrl-D to leave; /help lists the commands]\n");
            continue;
        }
        prompt_interrupts = 0;
        char *s = trim(t);
        int rc = 0;
        if (s[0] == '/' && !strchr(s, '\n')) {
            if (command(c, s)) {
                free(t);
                return RK_EXIT_OK;
            }
        } else if (*s) {
            rc = turn(c, t);
        }
        free(t);
        if (rc) return rc;
    }
}

int cmd_chat(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    chat c = {.o = {.n_predict = 512, .sp = rk_sampler_params_default()}};
    const char *pos[1];
    int n_pos, rc = cli_parse(argc, argv, 2, &c.o, pos, 1, &n_pos, "chat");
    if (rc) return rc;
    if (n_pos || c.o.prompt || c.o.prompt_file || c.o.out || c.o.chat || c.o.json) {
        fprintf(stderr, "ridgekv chat: %s does not apply to chat: type your messages at the prompt or pipe them "
                        "to stdin (see ridgekv chat --help)\n",
                n_pos ? pos[0] : c.o.prompt ? "-p" : c.o.prompt_file ? "-f" : c.o.out ? "-o" : c.o.chat ? "--chat" : "--json");
        return RK_EXIT_USAGE;
    }
    c.interactive = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    rk_err e = {0};
    rk_status st = RK_OK;
    cli_lineedit *le = NULL;
    if ((rc = cli_load_model(&c.o, &c.m))) goto done;
    c.hp = rk_model_hparams(c.m);
    c.fam = rk_model_chat_family(c.m);
    rk_session_params sp;
    cli_session_params(&c.o, &sp);
    if ((st = rk_session_create(c.m, &sp, &c.s, &e))) goto fail;
    if ((rc = cli_setup_fill(&c.o, c.m, c.s, &c.maps, NULL))) goto done;
    if ((st = rk_sampler_create(&c.o.sp, c.hp->n_vocab, &c.smp, &e))) goto fail;
    c.n_ctx = rk_session_n_ctx(c.s);
    c.reserve = c.o.n_predict > 0 && c.o.n_predict < c.n_ctx / 2 ? c.o.n_predict : c.n_ctx / 2;
    c.logits = malloc((size_t)c.hp->n_vocab * sizeof(float));
    if (!c.logits || !ids_reserve(&c.kv, (size_t)c.n_ctx)) {
        st = rk_err_set(&e, RK_E_NOMEM, "chat: out of memory");
        goto fail;
    }
    rk_session_set_progress(c.s, chat_progress, NULL);
    if (c.o.system) {
        char *sys = NULL;
        ids w = {0};
        if (!msg_push(&c, "system", c.o.system)) {
            st = rk_err_set(&e, RK_E_NOMEM, "chat: out of memory");
            goto fail;
        }
        st = rk_chat_format(c.fam, &(rk_chat_msg){"system", c.o.system}, 1, true, &sys, &e);
        if (!st) st = build_want(&c, sys, &w, &e);
        free(sys);
        free(w.p);
        if (st) goto fail;
        if ((int64_t)w.n + c.reserve > c.n_ctx) {
            fprintf(stderr, "ridgekv chat: the system prompt is %zu tokens; with %lld tokens of answer room it "
                            "does not fit the context of %lld (shorten it, lower -n or raise -c)\n",
                    w.n, (long long)c.reserve, (long long)c.n_ctx);
            rc = RK_EXIT_CONTEXT;
            goto done;
        }
    }
    if (!(le = cli_le_open("ridgekv", c.interactive))) {
        st = rk_err_set(&e, RK_E_NOMEM, "chat: out of memory");
        goto fail;
    }
    if (c.interactive || c.o.verbose)
        fprintf(stderr, "ridgekv chat: %s, %s template, context %lld tokens%s%s\n", rk_model_name(c.m),
                rk_chat_family_name(c.fam), (long long)c.n_ctx, c.interactive ? ", line editing: " : "",
                c.interactive ? cli_le_kind(le) : "");
    if (c.interactive) fprintf(stderr, "/help lists the commands; Ctrl-D leaves.\n");
    cli_sigint_install(false);
    rc = chat_loop(&c, le);
    cli_sigint_restore();
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    cli_le_close(le);
    for (size_t i = 0; i < c.n_msgs; i++) free(c.msgs[i].content);
    free(c.msgs);
    free(c.kv.p);
    free(c.seq.p);
    free(c.text);
    free(c.logits);
    rk_sampler_destroy(c.smp);
    rk_session_destroy(c.s);
    rk_ridge_maps_destroy(c.maps);
    rk_model_destroy(c.m);
    return rc;
}
