/* ridgekv serve --jsonl: one JSON request per stdin line, JSON events per stdout line.
 * The model and one session are made once; each request starts from an empty KV cache.
 * Requests run one after another, so EOF simply ends the loop after the current one. */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "serve.h"

static const char *help =
    "usage: ridgekv serve --jsonl [-m MODEL] [options]\n"
    "\n"
    "Reads one JSON request per line on stdin and writes JSON events, one per line, on\n"
    "stdout (logs go to stderr). Ops: complete, chat, ask, tokenize, info. docs/JSONL.md\n"
    "describes every field, event and error code. EOF ends the server (exit 0).\n"
    "\n"
    "  --jsonl                 the protocol (required; the only one so far)\n"
    "  --max-line BYTES        longest request line accepted (default 1048576)\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's)\n"
    "  -b, --batch-size N      prefill chunk (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32        KV cache precision (default f16)\n"
    "      --backend cpu|cpu_ref  kernels\n"
    "Defaults for requests that do not set them:\n"
    "  -n, --n-predict N       max_tokens (default 256; -1 = until end of text or context)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K, --top-p P, --min-p P, --repeat-penalty R, --repeat-last-n N, --seed S\n"
    "  -v, --verbose           one line per request on stderr\n";

#define DEFAULT_MAX_LINE ((size_t)1 << 20)

/* ---- stdin lines -------------------------------------------------------------------- */
typedef struct line_reader {
    int fd;
    bool eof;
    size_t pos, len;        /* unread bytes buf[pos..len) */
    char buf[1 << 16];
    serve_buf line;         /* the current line, at most max_line bytes */
    size_t max_line;
} line_reader;

enum { LINE_EOF = 0, LINE_OK = 1, LINE_TOO_LONG = 2, LINE_ERROR = -1 };

/* Next line without its '\n' (and '\r') in r->line. A line over max_line is consumed to
 * its end without being kept. A last line without '\n' counts. */
static int reader_next(line_reader *r) {
    r->line.n = 0;
    bool got = false, too_long = false;
    for (;;) {
        if (r->pos == r->len) {
            if (r->eof) break;
            ssize_t k = read(r->fd, r->buf, sizeof r->buf);
            if (k < 0) {
                if (errno == EINTR) continue;
                return LINE_ERROR;
            }
            if (k == 0) {
                r->eof = true;
                break;
            }
            r->pos = 0;
            r->len = (size_t)k;
        }
        got = true;
        char *start = r->buf + r->pos;
        char *nl = memchr(start, '\n', r->len - r->pos);
        size_t take = nl ? (size_t)(nl - start) : r->len - r->pos;
        if (!too_long) {
            if (take > r->max_line - r->line.n) {
                too_long = true;
                r->line.n = 0;
            } else if (!serve_buf_put(&r->line, start, take)) {
                errno = ENOMEM;
                return LINE_ERROR;
            }
        }
        r->pos += take + (nl ? 1 : 0);
        if (nl) break;
    }
    if (!got) return LINE_EOF;
    if (too_long) return LINE_TOO_LONG;
    if (r->line.n && r->line.p[r->line.n - 1] == '\r') r->line.n--;
    return LINE_OK;
}

/* ---- events ------------------------------------------------------------------------- */
typedef struct server {
    rk_model *m;
    rk_session *s;
    const rk_hparams *hp;
    float *logits;          /* (n_vocab) */
    serve_buf piece;
    serve_gen defaults;
    bool verbose;
    bool write_failed;
    int write_errno;
} server;

static json_object *event(json_object *id, const char *name) {
    json_object *ev = json_object_new_object();
    if (!ev) return NULL;
    json_object_object_add(ev, "id", id ? json_object_get(id) : NULL);
    json_object_object_add(ev, "event", json_object_new_string(name));
    return ev;
}

/* Writes ev as one line and releases it. After a failed write nothing more is written. */
static void emit(server *sv, json_object *ev) {
    if (!sv->write_failed) {
        size_t n = 0;
        const char *s =
            ev ? json_object_to_json_string_length(ev, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n)
               : NULL;
        errno = 0;
        if (!s) errno = ENOMEM;
        if (!s || fwrite(s, 1, n, stdout) != n || putc('\n', stdout) == EOF || fflush(stdout) == EOF) {
            sv->write_failed = true;
            sv->write_errno = errno ? errno : EIO;
        }
    }
    json_object_put(ev);
}

static void emit_error(server *sv, json_object *id, serve_code code, const char *msg) {
    json_object *ev = event(id, "error");
    serve_buf clean = {0}; /* messages may quote engine text: keep the line well-formed */
    serve_utf8_sanitize(&clean, msg, strlen(msg), true);
    json_object_object_add(ev, "code", json_object_new_string(serve_code_name(code)));
    json_object_object_add(ev, "message", json_object_new_string_len(clean.p ? clean.p : "", (int)clean.n));
    serve_buf_free(&clean);
    emit(sv, ev);
}

__attribute__((format(printf, 4, 5))) static void emit_errorf(server *sv, json_object *id, serve_code code,
                                                              const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    emit_error(sv, id, code, msg);
}

/* A number with a fixed count of decimals, as it is printed. */
static json_object *num(double v, int decimals) {
    char b[64];
    if (!isfinite(v)) v = 0;
    snprintf(b, sizeof b, "%.*f", decimals, v);
    return json_object_new_double_s(v, b);
}

/* Bytes of token tok as text (borrowed from sv->piece until the next call). */
static const char *piece(server *sv, int32_t tok, bool render_special, size_t *n) {
    size_t need = rk_model_token_piece(sv->m, tok, render_special, sv->piece.p, sv->piece.cap);
    if (need > sv->piece.cap) {
        char *p = realloc(sv->piece.p, need);
        if (!p) {
            *n = 0;
            return "";
        }
        sv->piece.p = p;
        sv->piece.cap = need;
        need = rk_model_token_piece(sv->m, tok, render_special, sv->piece.p, sv->piece.cap);
    }
    *n = need;
    return need ? sv->piece.p : "";
}

/* ---- ops ------------------------------------------------------------------------------ */
static serve_code status_code(rk_status st) {
    return st == RK_E_CONTEXT ? SERVE_CONTEXT_OVERFLOW : st == RK_E_INVALID_ARG ? SERVE_INVALID_REQUEST : SERVE_INTERNAL;
}

/* Runs text as a prompt from an empty cache and streams the completion. Sends exactly one
 * terminal event (done or error). */
static void generate(server *sv, const serve_req *r, double t_req, const char *text, size_t len, bool add_special,
                     bool parse_special) {
    const serve_gen *g = &r->gen;
    rk_err e = {0};
    rk_status st;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    rk_sampler *smp = NULL;
    serve_text out = {.g = g};
    if ((st = rk_model_tokenize(sv->m, text, len, add_special, parse_special, &ids, &n_ids, &e))) {
        emit_errorf(sv, r->id, status_code(st), "tokenizing the prompt: %s", e.msg);
        goto done;
    }
    int64_t n_ctx = rk_session_n_ctx(sv->s);
    if (n_ids == 0) {
        emit_error(sv, r->id, SERVE_INVALID_REQUEST, "the prompt is empty (0 tokens)");
        goto done;
    }
    if ((int64_t)n_ids >= n_ctx) {
        emit_errorf(sv, r->id, SERVE_CONTEXT_OVERFLOW,
                    "the prompt has %zu tokens but the context holds %lld, and at least one more is needed to "
                    "generate (shorten the prompt, or start the server with a larger -c, up to the model's %d)",
                    n_ids, (long long)n_ctx, sv->hp->n_ctx_train);
        goto done;
    }
    int32_t *hist = realloc(ids, (n_ids + (size_t)n_ctx + 1) * sizeof *ids); /* prompt + generated */
    if (!hist) {
        emit_error(sv, r->id, SERVE_INTERNAL, "out of memory for the token history");
        goto done;
    }
    ids = hist;
    if ((st = rk_sampler_create(&g->sp, sv->hp->n_vocab, &smp, &e))) {
        emit_errorf(sv, r->id, status_code(st), "%s", e.msg);
        goto done;
    }
    rk_session_reset(sv->s);
    double t0 = rk_time_now();
    if ((st = rk_session_eval(sv->s, ids, n_ids, sv->logits, false, &e))) {
        emit_errorf(sv, r->id, status_code(st), "prefill: %s", e.msg);
        goto done;
    }
    double t1 = rk_time_now(), t_first = 0;
    const char *finish = "length";
    size_t n_hist = n_ids;
    int n_gen = 0;
    while (g->max_tokens < 0 || n_gen < g->max_tokens) {
        int32_t tok = rk_sampler_sample(smp, sv->logits, ids, n_hist);
        if (n_gen == 0) t_first = rk_time_now();
        if (rk_model_token_is_eog(sv->m, tok)) {
            finish = "eog";
            break;
        }
        size_t pn;
        const char *p = piece(sv, tok, false, &pn);
        if (!serve_text_push(&out, p, pn)) {
            emit_error(sv, r->id, SERVE_INTERNAL, "out of memory for the generated text");
            goto done;
        }
        ids[n_hist++] = tok;
        n_gen++;
        if (g->stream) {
            size_t off, n;
            serve_text_take(&out, &off, &n);
            json_object *ev = event(r->id, "token");
            json_object_object_add(ev, "text", json_object_new_string_len(n ? out.out.p + off : "", (int)n));
            json_object_object_add(ev, "token", json_object_new_int(tok));
            emit(sv, ev);
            if (sv->write_failed) goto done; /* nobody is listening */
        }
        if (out.stopped) {
            finish = "stop";
            break;
        }
        if (g->max_tokens >= 0 && n_gen >= g->max_tokens) break;
        if (rk_session_n_past(sv->s) >= n_ctx) {
            finish = "context";
            break;
        }
        if ((st = rk_session_eval(sv->s, &tok, 1, sv->logits, false, &e))) {
            emit_errorf(sv, r->id, status_code(st), "decode: %s", e.msg);
            goto done;
        }
    }
    double t2 = rk_time_now();
    if (!serve_text_finish(&out)) {
        emit_error(sv, r->id, SERVE_INTERNAL, "out of memory for the generated text");
        goto done;
    }
    json_object *ev = event(r->id, "done");
    json_object_object_add(ev, "finish_reason", json_object_new_string(finish));
    size_t off, n;
    serve_text_take(&out, &off, &n);
    /* the text not yet sent: all of it without streaming, else what was held back at the end */
    if (!g->stream || n) json_object_object_add(ev, "text", json_object_new_string_len(n ? out.out.p + off : "", (int)n));
    json_object *usage = json_object_new_object();
    json_object_object_add(usage, "prompt_tokens", json_object_new_int64((int64_t)n_ids));
    json_object_object_add(usage, "completion_tokens", json_object_new_int(n_gen));
    json_object_object_add(ev, "usage", usage);
    json_object_object_add(ev, "ttft_ms", t_first > 0 ? num(1000.0 * (t_first - t_req), 1) : NULL);
    json_object_object_add(ev, "prefill_tok_s", num(t1 > t0 ? (double)n_ids / (t1 - t0) : 0, 1));
    json_object_object_add(ev, "decode_tok_s", num(n_gen && t2 > t1 ? n_gen / (t2 - t1) : 0, 1));
    emit(sv, ev);
    if (sv->verbose)
        fprintf(stderr, "ridgekv serve: prompt %zu tokens (%.0f tok/s), generated %d (%.1f tok/s), %s\n", n_ids,
                t1 > t0 ? (double)n_ids / (t1 - t0) : 0.0, n_gen, n_gen && t2 > t1 ? n_gen / (t2 - t1) : 0.0, finish);
done:
    serve_text_deinit(&out);
    rk_sampler_destroy(smp);
    free(ids);
}

/* Formats messages with the model's chat template and generates the assistant turn. */
static void generate_chat(server *sv, const serve_req *r, double t_req, const rk_chat_msg *msgs, size_t n) {
    rk_err e = {0};
    char *text = NULL;
    rk_status st = rk_chat_format(rk_model_chat_family(sv->m), msgs, n, true, &text, &e);
    if (st) emit_errorf(sv, r->id, status_code(st), "chat template: %s", e.msg);
    else generate(sv, r, t_req, text, strlen(text), true, true);
    free(text);
}

/* The user turn of `ask`: every document (named ones under a header), then the question. */
static void op_ask(server *sv, const serve_req *r, double t_req) {
    serve_buf u = {0};
    bool ok = true;
    for (size_t i = 0; i < r->n_docs; i++) {
        if (r->docs[i].name) {
            ok = ok && serve_buf_put(&u, "Document: ", 10) &&
                 serve_buf_put(&u, r->docs[i].name, strlen(r->docs[i].name)) && serve_buf_put(&u, "\n", 1);
        }
        ok = ok && serve_buf_put(&u, r->docs[i].text, strlen(r->docs[i].text)) && serve_buf_put(&u, "\n\n", 2);
    }
    ok = ok && serve_buf_put(&u, "Question: ", 10) && serve_buf_put(&u, r->question, strlen(r->question)) &&
         serve_buf_put(&u, "", 1);
    if (!ok) {
        emit_error(sv, r->id, SERVE_INTERNAL, "out of memory for the documents");
    } else {
        rk_chat_msg msgs[2];
        size_t n = 0;
        if (r->system) msgs[n++] = (rk_chat_msg){"system", r->system};
        msgs[n++] = (rk_chat_msg){"user", u.p};
        generate_chat(sv, r, t_req, msgs, n);
    }
    serve_buf_free(&u);
}

static void op_tokenize(server *sv, const serve_req *r) {
    rk_err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    rk_status st = rk_model_tokenize(sv->m, r->text, r->text_len, r->add_special, r->parse_special, &ids, &n, &e);
    if (st) {
        emit_errorf(sv, r->id, status_code(st), "tokenize: %s", e.msg);
        return;
    }
    json_object *ev = event(r->id, "tokens");
    json_object *toks = json_object_new_array_ext((int)n);
    json_object *pieces = r->pieces ? json_object_new_array_ext((int)n) : NULL;
    serve_buf clean = {0};
    for (size_t i = 0; i < n; i++) {
        json_object_array_add(toks, json_object_new_int(ids[i]));
        if (!pieces) continue;
        size_t pn;
        const char *p = piece(sv, ids[i], true, &pn);
        clean.n = 0; /* a byte-level piece may hold part of a character: show U+FFFD for it */
        serve_utf8_sanitize(&clean, p, pn, true);
        json_object_array_add(pieces, json_object_new_string_len(clean.n ? clean.p : "", (int)clean.n));
    }
    serve_buf_free(&clean);
    json_object_object_add(ev, "tokens", toks);
    if (pieces) json_object_object_add(ev, "pieces", pieces);
    emit(sv, ev);
    emit(sv, event(r->id, "done"));
    free(ids);
}

static void op_info(server *sv, const serve_req *r) {
    const rk_hparams *hp = sv->hp;
    json_object *ev = event(r->id, "info");
    json_object_object_add(ev, "name", json_object_new_string(rk_model_name(sv->m)));
    json_object_object_add(ev, "arch", json_object_new_string(hp->arch_name));
    json_object_object_add(ev, "n_layer", json_object_new_int(hp->n_layer));
    json_object_object_add(ev, "n_embd", json_object_new_int(hp->n_embd));
    json_object_object_add(ev, "n_head", json_object_new_int(hp->n_head));
    json_object_object_add(ev, "n_head_kv", json_object_new_int(hp->n_head_kv));
    json_object_object_add(ev, "n_vocab", json_object_new_int(hp->n_vocab));
    json_object_object_add(ev, "n_ctx", json_object_new_int64(rk_session_n_ctx(sv->s)));
    json_object_object_add(ev, "n_ctx_train", json_object_new_int(hp->n_ctx_train));
    json_object_object_add(ev, "chat_template",
                           json_object_new_string(rk_chat_family_name(rk_model_chat_family(sv->m))));
    json_object_object_add(ev, "weight_bytes", json_object_new_int64((int64_t)rk_model_weight_bytes(sv->m)));
    emit(sv, ev);
    emit(sv, event(r->id, "done"));
}

static void handle_line(server *sv, const char *line, size_t n) {
    double t_req = rk_time_now();
    serve_req r;
    char msg[512];
    serve_code code = serve_req_parse(line, n, &sv->defaults, &r, msg, sizeof msg);
    if (code) {
        emit_error(sv, r.id, code, msg);
    } else {
        switch (r.op) {
        case SERVE_OP_COMPLETE: generate(sv, &r, t_req, r.text, r.text_len, r.add_special, r.parse_special); break;
        case SERVE_OP_CHAT: generate_chat(sv, &r, t_req, r.msgs, r.n_msgs); break;
        case SERVE_OP_ASK: op_ask(sv, &r, t_req); break;
        case SERVE_OP_TOKENIZE: op_tokenize(sv, &r); break;
        case SERVE_OP_INFO: op_info(sv, &r); break;
        }
    }
    serve_req_deinit(&r);
}

static bool blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return false;
    return true;
}

int cmd_serve(int argc, char **argv) {
    /* serve's own flags are taken out; the rest go through the common parser */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return RK_EXIT_ERROR;
    int n_rest = 0;
    bool jsonl = false;
    size_t max_line = DEFAULT_MAX_LINE;
    int rc = RK_EXIT_OK;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i >= 2 && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            fputs(help, stdout);
            free(rest);
            return RK_EXIT_OK;
        }
        if (i >= 2 && !strcmp(a, "--jsonl")) {
            jsonl = true;
        } else if (i >= 2 && !strcmp(a, "--max-line")) {
            char *end;
            errno = 0;
            unsigned long long v = i + 1 < argc ? strtoull(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || errno || end == argv[i + 1] || *end || argv[i + 1][0] == '-' || v < 64 ||
                v > (1ull << 30)) {
                fprintf(stderr, "ridgekv serve: --max-line expects a byte count in [64, 1073741824] (got '%s')\n",
                        i + 1 < argc ? argv[i + 1] : "");
                free(rest);
                return RK_EXIT_USAGE;
            }
            max_line = (size_t)v;
            i++;
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    cli_opts o = {.n_predict = 256, .sp = rk_sampler_params_default()};
    int n_pos;
    rc = cli_parse(n_rest, rest, 2, &o, NULL, 0, &n_pos, "serve");
    free(rest);
    if (rc) return rc;
    if (!jsonl) {
        fprintf(stderr, "ridgekv serve: pass --jsonl (JSON lines on stdin/stdout is the only protocol so far)\n");
        return RK_EXIT_USAGE;
    }
    if (o.prompt || o.prompt_file || o.out || o.chat || o.system) {
        fprintf(stderr, "ridgekv serve: -p, -f, -o, --chat and --system do not apply: requests come on stdin\n");
        return RK_EXIT_USAGE;
    }

    server sv = {.verbose = o.verbose};
    sv.defaults = (serve_gen){.max_tokens = o.n_predict, .sp = o.sp, .stream = true};
    line_reader *rd = NULL;
    rk_err e = {0};
    rk_status st;
    if ((rc = cli_load_model(&o, &sv.m))) goto done;
    sv.hp = rk_model_hparams(sv.m);
    rk_session_params sp;
    cli_session_params(&o, &sp);
    if ((st = rk_session_create(sv.m, &sp, &sv.s, &e))) {
        cli_print_error(&e);
        rc = cli_exit_code(st);
        goto done;
    }
    sv.logits = malloc((size_t)sv.hp->n_vocab * sizeof *sv.logits);
    rd = calloc(1, sizeof *rd);
    if (!sv.logits || !rd) {
        fprintf(stderr, "ridgekv serve: out of memory\n");
        rc = RK_EXIT_ERROR;
        goto done;
    }
    rd->fd = STDIN_FILENO;
    rd->max_line = max_line;
    /* a closed stdout must become a write error we report, not a silent death */
    signal(SIGPIPE, SIG_IGN);
    fprintf(stderr, "ridgekv serve: %s (%s, %d layers, ctx %lld) ready for JSON lines on stdin\n",
            rk_model_name(sv.m), sv.hp->arch_name, sv.hp->n_layer, (long long)rk_session_n_ctx(sv.s));
    for (;;) {
        int k = reader_next(rd);
        if (k == LINE_EOF) break;
        if (k == LINE_ERROR) {
            fprintf(stderr, "ridgekv serve: reading stdin failed: %s\n", strerror(errno));
            rc = RK_EXIT_IO;
            break;
        }
        if (k == LINE_TOO_LONG)
            emit_errorf(&sv, NULL, SERVE_LINE_TOO_LONG, "line too long: more than %zu bytes (see --max-line)",
                        max_line);
        else if (!blank(rd->line.p, rd->line.n))
            handle_line(&sv, rd->line.p, rd->line.n);
        if (sv.write_failed) {
            fprintf(stderr, "ridgekv serve: writing to stdout failed: %s; stopping\n", strerror(sv.write_errno));
            rc = RK_EXIT_IO;
            break;
        }
    }
done:
    if (rd) serve_buf_free(&rd->line);
    free(rd);
    serve_buf_free(&sv.piece);
    free(sv.logits);
    rk_session_destroy(sv.s);
    rk_model_destroy(sv.m);
    return rc;
}
