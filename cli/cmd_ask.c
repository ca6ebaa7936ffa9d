/* ridgekv ask: one question over local documents.
 *
 * The prompt is the model's chat template around one user turn holding the documents
 * (each under its file name) and then the question. The template markup is tokenized
 * with special tokens; the documents and the question are not, so a document that
 * happens to contain "<|im_end|>" stays text. A prompt that does not fit the context
 * is refused with the numbers; nothing is cut silently. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "lineedit.h"
#include "rk_io.h"
#include "stream.h"

#define MAX_DOCS 64

static const char *help =
    "usage: ridgekv ask [-m MODEL] --doc FILE [--doc FILE ...] [options] \"QUESTION\"\n"
    "\n"
    "Answers a question about local documents (.txt, .md: UTF-8 text). The documents,\n"
    "each under its file name, and then the question go into one chat prompt. Reading\n"
    "them shows progress on stderr; the answer streams to stdout.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "      --doc FILE          a document to read (repeat for more; at least one)\n"
    "  -p, --prompt TEXT       the question (or give it as the last argument)\n"
    "      --system TEXT       system prompt (default: answer from the documents)\n"
    "  -n, --n-predict N       most answer tokens (default 256; -1 = until the end of the turn)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's)\n"
    "  -b, --batch-size N      prefill chunk: progress and Ctrl-C act between chunks (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32        KV cache precision (default f16)\n"
    "      --backend cpu|cpu_ref  kernels (cpu_ref: the scalar oracle, slow)\n"
    "      --temp T            temperature (default 0 = greedy, so answers repeat)\n"
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
    "  -v, --verbose           model and prompt details on stderr\n"
    "\n"
    "The prompt must leave room for the answer: -n tokens, at most a quarter of the\n"
    "context. When it does not fit, ask prints each document's tokens, the context\n"
    "size and how many tokens to cut, and exits 4.\n"
    "\n"
    "stderr gets one line on the accelerations in use, a progress bar while the\n"
    "documents are read (tokens done/total, tokens/s, ETA; plain lines every few\n"
    "seconds when stderr is not a terminal), then time to first token and decode rate.\n"
    "Ctrl-C stops reading or answering and exits 130 (a second Ctrl-C quits at once).\n"
    "\n"
    "exit codes: 0 answered, 2 bad usage, 3 model unusable, 4 too long for the context,\n"
    "5 a document cannot be read, 6 no default model, 130 stopped by Ctrl-C\n";

static const char *default_system =
    "You are a helpful assistant. Answer the question using the document. Keep the answer short.";

typedef struct doc {
    const char *path; /* borrowed from argv */
    const char *name; /* base name, inside path */
    char *text;       /* owned, NUL-terminated */
    size_t len;
} doc;

typedef struct progress {
    bool tty;
    double t0, last;
    int64_t total;
} progress;

static void fmt_eta(char *buf, size_t cap, double s) {
    if (!(s >= 0) || s > 359999) snprintf(buf, cap, "--");
    else if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)s / 3600, (int)s % 3600 / 60);
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%.0fs", s);
}

static void draw(progress *p, int64_t done, double now) {
    double dt = now - p->t0, rate = dt > 0 && done > 0 ? (double)done / dt : 0;
    char eta[32];
    fmt_eta(eta, sizeof eta, rate > 0 ? (double)(p->total - done) / rate : -1);
    int pct = p->total ? (int)(100 * done / p->total) : 100;
    if (done == 0) strcpy(eta, "--");
    if (p->tty) {
        char bar[31];
        int fill = p->total ? (int)(30 * done / p->total) : 30;
        for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
        bar[30] = 0;
        fprintf(stderr, "\rreading [%s] %3d%% %lld/%lld tokens  %.1f tok/s  ETA %s\033[K", bar, pct, (long long)done,
                (long long)p->total, rate, eta);
    } else if (done == 0) {
        fprintf(stderr, "ridgekv ask: read 0/%lld tokens (0%%)\n", (long long)p->total);
    } else {
        fprintf(stderr, "ridgekv ask: read %lld/%lld tokens (%d%%), %.1f tok/s, ETA %s\n", (long long)done,
                (long long)p->total, pct, rate, eta);
    }
    fflush(stderr);
    p->last = now;
}

static bool on_progress(void *ud, int64_t done, int64_t total) {
    progress *p = ud;
    p->total = total;
    double now = rk_time_now();
    if (p->tty || done == total || now - p->last >= 2.0) draw(p, done, now);
    return !cli_sigint_pending();
}

static bool all_text(const char *s, size_t n) { return memchr(s, 0, n) == NULL; }

/* Appends text to *b (malloc'd), growing it; false when out of memory. */
static bool cat(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        char *q = realloc(*b, c);
        if (!q) return false;
        *b = q;
        *cap = c;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return true;
}

static char *user_content(const doc *d, int n_docs, const char *question) {
    char *b = NULL, head[512];
    size_t len = 0, cap = 0;
    bool ok = true;
    for (int i = 0; ok && i < n_docs; i++) {
        if (n_docs == 1) snprintf(head, sizeof head, "Document: %s\n\"\"\"\n", d[i].name);
        else snprintf(head, sizeof head, "Document %d of %d: %s\n\"\"\"\n", i + 1, n_docs, d[i].name);
        size_t tl = d[i].len;
        while (tl && (d[i].text[tl - 1] == '\n' || d[i].text[tl - 1] == '\r')) tl--;
        ok = cat(&b, &len, &cap, head, strlen(head)) && cat(&b, &len, &cap, d[i].text, tl) &&
             cat(&b, &len, &cap, "\n\"\"\"\n\n", 6);
    }
    ok = ok && cat(&b, &len, &cap, "Question: ", 10) && cat(&b, &len, &cap, question, strlen(question));
    if (!ok) {
        free(b);
        return NULL;
    }
    return b;
}

static rk_status tok_append(const rk_model *m, const char *s, size_t n, bool add_special, bool parse_special,
                            int32_t **ids, size_t *n_ids, rk_err *e) {
    int32_t *t = NULL;
    size_t nt = 0;
    rk_status st = rk_model_tokenize(m, s, n, add_special, parse_special, &t, &nt, e);
    if (st) return st;
    int32_t *p = realloc(*ids, (*n_ids + nt + 1) * sizeof *p);
    if (!p) {
        free(t);
        return rk_err_set(e, RK_E_NOMEM, "ask: out of memory");
    }
    if (nt) memcpy(p + *n_ids, t, nt * sizeof *t);
    *ids = p;
    *n_ids += nt;
    free(t);
    return RK_OK;
}

/* Template text around a placeholder user turn, tokenized with special tokens; the user
 * content in between without. */
static rk_status build_prompt(const rk_model *m, const char *system, const char *content, int32_t **ids,
                              size_t *n_ids, rk_err *e) {
    static const char mark[] = "\x01ridgekv-user-content\x01";
    rk_chat_msg msgs[2] = {{"system", system}, {"user", mark}};
    char *t = NULL;
    rk_status st = rk_chat_format(rk_model_chat_family(m), msgs, 2, true, &t, e);
    if (st) return st;
    char *at = strstr(t, mark);
    if (!at || strstr(at + 1, mark)) {
        free(t);
        return rk_err_set(e, RK_E_INVALID_ARG, "ask: the system prompt must not contain control characters");
    }
    *ids = NULL;
    *n_ids = 0;
    const char *tail = at + sizeof mark - 1;
    if ((st = tok_append(m, t, (size_t)(at - t), true, true, ids, n_ids, e)) ||
        (st = tok_append(m, content, strlen(content), false, false, ids, n_ids, e)) ||
        (st = tok_append(m, tail, strlen(tail), false, true, ids, n_ids, e))) {
        free(*ids);
        *ids = NULL;
    }
    free(t);
    return st;
}

/* Prints why the prompt does not fit, with per-document token counts. */
static void too_long(const rk_model *m, const doc *d, int n_docs, size_t n_prompt, int64_t room, int64_t n_ctx,
                     int n_ctx_train) {
    size_t n_doc_total = 0, n_doc_bytes = 0;
    fprintf(stderr, "ridgekv ask: the documents do not fit the context:\n");
    for (int i = 0; i < n_docs; i++) {
        int32_t *t = NULL;
        size_t nt = 0;
        if (rk_model_tokenize(m, d[i].text, d[i].len, false, false, &t, &nt, NULL) == RK_OK) {
            fprintf(stderr, "  %s: %zu tokens (%zu bytes)\n", d[i].path, nt, d[i].len);
            n_doc_total += nt;
            n_doc_bytes += d[i].len;
        }
        free(t);
    }
    int64_t need = (int64_t)n_prompt + room, cut = need - n_ctx;
    fprintf(stderr,
            "  prompt %zu tokens (documents %zu, question + system prompt + template %zu) + %lld tokens of answer room\n"
            "  = %lld tokens, but the context holds %lld.\n",
            n_prompt, n_doc_total, n_prompt > n_doc_total ? n_prompt - n_doc_total : 0, (long long)room,
            (long long)need, (long long)n_ctx);
    if ((size_t)cut >= n_doc_total) {
        if (n_ctx < n_ctx_train)
            fprintf(stderr, "Even without documents the rest leaves no room for them: raise -c (up to the model's %d) "
                            "or lower -n.\n", n_ctx_train);
        else fprintf(stderr, "Even without documents the rest leaves no room for them: lower -n or shorten the "
                             "question and system prompt.\n");
        return;
    }
    fprintf(stderr, "Cut at least %lld tokens from the documents", (long long)cut);
    if (n_doc_total)
        fprintf(stderr, " (about %.0f bytes, %.0f%% of them)", (double)cut * (double)n_doc_bytes / (double)n_doc_total,
                100.0 * (double)cut / (double)n_doc_total + 0.5);
    if (n_ctx < n_ctx_train)
        fprintf(stderr, ", or raise -c (this model was trained on %d tokens)", n_ctx_train);
    else if (cut < room) fprintf(stderr, ", or lower -n to leave less answer room");
    fprintf(stderr, ". Nothing is cut automatically.\n");
}

/* Takes the --doc values out of argv; the rest goes to cli_parse. */
static int split_docs(int argc, char **argv, char **rest, int *n_rest, doc *d, int *n_docs) {
    *n_rest = 0;
    *n_docs = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 2 && !strcmp(argv[i], "--doc")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ridgekv ask: --doc needs a value\n");
                return RK_EXIT_USAGE;
            }
            if (*n_docs >= MAX_DOCS) {
                fprintf(stderr, "ridgekv ask: at most %d documents\n", MAX_DOCS);
                return RK_EXIT_USAGE;
            }
            const char *p = argv[++i], *slash = strrchr(p, '/');
            d[(*n_docs)++] = (doc){.path = p, .name = slash && slash[1] ? slash + 1 : p};
        } else {
            rest[(*n_rest)++] = argv[i];
        }
    }
    return 0;
}

static int read_docs(doc *d, int n_docs) {
    for (int i = 0; i < n_docs; i++) {
        rk_err e = {0};
        if (rk_io_read_file(d[i].path, &d[i].text, &d[i].len, &e)) {
            fprintf(stderr, "ridgekv ask: cannot read document %s: %s\n", d[i].path, e.msg);
            return RK_EXIT_IO;
        }
        if (!all_text(d[i].text, d[i].len)) {
            fprintf(stderr, "ridgekv ask: document %s is not a text file (it contains NUL bytes); "
                            "ask reads .txt and .md files\n", d[i].path);
            return RK_EXIT_IO;
        }
        const char *s = d[i].text;
        while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
        if (!*s) {
            fprintf(stderr, "ridgekv ask: document %s is empty\n", d[i].path);
            return RK_EXIT_IO;
        }
    }
    return 0;
}

int cmd_ask(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    doc d[MAX_DOCS];
    char **rest = malloc((size_t)argc * sizeof *rest);
    if (!rest) return RK_EXIT_ERROR;
    int n_rest, n_docs = 0;
    cli_opts o = {.n_predict = 256, .sp = rk_sampler_params_default()};
    o.sp.temp = 0.0f;
    const char *pos[1];
    int n_pos = 0;
    int rc = split_docs(argc, argv, rest, &n_rest, d, &n_docs);
    if (!rc) rc = cli_parse(n_rest, rest, 2, &o, pos, 1, &n_pos, "ask");
    free(rest);
    if (rc) return rc;
    if (o.prompt_file || o.out || o.chat || o.json) {
        fprintf(stderr, "ridgekv ask: %s does not apply to ask (see ridgekv ask --help)\n",
                o.prompt_file ? "-f" : o.out ? "-o" : o.chat ? "--chat" : "--json");
        return RK_EXIT_USAGE;
    }
    if (n_pos && o.prompt) {
        fprintf(stderr, "ridgekv ask: two questions (-p and '%s'); give one\n", pos[0]);
        return RK_EXIT_USAGE;
    }
    const char *question = n_pos ? pos[0] : o.prompt;
    if (!n_docs) {
        fprintf(stderr, "ridgekv ask: no document: pass --doc FILE (see ridgekv ask --help)\n");
        return RK_EXIT_USAGE;
    }
    if (!question || !question[strspn(question, " \t\n")]) {
        fprintf(stderr, "ridgekv ask: no question: give it as the last argument (see ridgekv ask --help)\n");
        return RK_EXIT_USAGE;
    }

    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_sampler *smp = NULL;
    rk_ridge_maps *maps = NULL;
    int32_t *ids = NULL;
    char *content = NULL;
    float *logits = NULL;
    rk_err e = {0};
    rk_status st = RK_OK;
    if ((rc = read_docs(d, n_docs))) goto done;
    if ((rc = cli_load_model(&o, &m))) goto done;
    const rk_hparams *hp = rk_model_hparams(m);
    size_t n_ids = 0;
    if (!(content = user_content(d, n_docs, question))) {
        st = rk_err_set(&e, RK_E_NOMEM, "ask: out of memory");
        goto fail;
    }
    if ((st = build_prompt(m, o.system ? o.system : default_system, content, &ids, &n_ids, &e))) goto fail;
    rk_session_params sp;
    cli_session_params(&o, &sp);
    int64_t n_ctx = sp.n_ctx > 0 ? sp.n_ctx : hp->n_ctx_train;
    int64_t room = o.n_predict > 0 && o.n_predict < n_ctx / 4 ? o.n_predict : n_ctx / 4;
    if ((int64_t)n_ids + room > n_ctx) {
        too_long(m, d, n_docs, n_ids, room, n_ctx, hp->n_ctx_train);
        rc = RK_EXIT_CONTEXT;
        goto done;
    }
    if ((st = rk_session_create(m, &sp, &s, &e))) goto fail;
    if ((rc = cli_setup_fill(&o, m, s, &maps, NULL))) goto done;
    if ((st = rk_sampler_create(&o.sp, hp->n_vocab, &smp, &e))) goto fail;
    if (!(logits = malloc((size_t)hp->n_vocab * sizeof(float)))) {
        st = rk_err_set(&e, RK_E_NOMEM, "ask: out of memory");
        goto fail;
    }
    int32_t *grown = realloc(ids, ((size_t)n_ctx + 1) * sizeof *ids);
    if (!grown) {
        st = rk_err_set(&e, RK_E_NOMEM, "ask: out of memory");
        goto fail;
    }
    ids = grown;
    if (o.verbose)
        fprintf(stderr, "ridgekv ask: %s (%s, %s template), %d document%s, prompt %zu tokens, context %lld\n",
                rk_model_name(m), hp->arch_name, rk_chat_family_name(rk_model_chat_family(m)), n_docs,
                n_docs == 1 ? "" : "s", n_ids, (long long)rk_session_n_ctx(s));
    /* LowRAM predictor files and the document cache do not exist yet */
    const char *mode = o.fill ? o.fill : o.ridgefill ? "speed" : "off";
    char fill[1200];
    if (maps)
        snprintf(fill, sizeof fill, "ridgefill %s (maps %s, split %d, exact tail %d)", mode, o.ridgefill,
                 rk_ridge_maps_split(maps), o.tail ? o.tail : 2048);
    else snprintf(fill, sizeof fill, "ridgefill %s (no maps)", mode);
    fprintf(stderr, "ridgekv ask: accelerations: %s, lowram off (no predictor files), document cache off; %s KV cache\n",
            fill, o.kv && !strcmp(o.kv, "f32") ? "f32" : "f16");

    progress pr = {.tty = isatty(STDERR_FILENO), .total = (int64_t)n_ids};
    rk_session_set_progress(s, on_progress, &pr);
    cli_sigint_install(true);
    pr.t0 = rk_time_now();
    draw(&pr, 0, pr.t0);
    st = rk_session_eval(s, ids, n_ids, logits, false, &e);
    if (pr.tty) fputc('\n', stderr);
    if (st == RK_E_CANCELLED || (st == RK_OK && cli_sigint_pending())) {
        fprintf(stderr, "ridgekv ask: stopped while reading the documents (Ctrl-C)\n");
        rc = 130;
        goto done;
    }
    if (st) goto fail;
    double t1 = rk_time_now(), t_first = 0;
    rk_session_set_progress(s, NULL, NULL);

    cli_stream out = {.out = stdout};
    size_t n_hist = n_ids;
    int n_gen = 0;
    bool stopped = false;
    char piece[256];
    while (o.n_predict < 0 || n_gen < o.n_predict) {
        if (cli_sigint_pending()) {
            stopped = true;
            break;
        }
        int32_t tok = rk_sampler_sample(smp, logits, ids, n_hist);
        if (!t_first) t_first = rk_time_now();
        if (rk_model_token_is_eog(m, tok)) break;
        size_t pl = rk_model_token_piece(m, tok, false, piece, sizeof piece);
        if (pl <= sizeof piece) cli_stream_put(&out, piece, pl);
        ids[n_hist++] = tok;
        n_gen++;
        if (o.n_predict >= 0 && n_gen >= o.n_predict) break;
        if (rk_session_n_past(s) >= rk_session_n_ctx(s)) {
            cli_stream_flush(&out);
            fprintf(stderr, "\nridgekv ask: context full (%lld tokens); the answer is cut\n",
                    (long long)rk_session_n_ctx(s));
            break;
        }
        if ((st = rk_session_eval(s, &tok, 1, logits, false, &e))) goto fail;
    }
    cli_stream_flush(&out);
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = rk_time_now();
    if (!t_first) t_first = t2;
    if (stopped) fprintf(stderr, "ridgekv ask: answer stopped (Ctrl-C)\n");
    fprintf(stderr, "ridgekv ask: read %zu tokens in %.2f s (%.1f tok/s); time to first token %.2f s; "
                    "answer %d tokens in %.2f s (%.1f tok/s)\n",
            n_ids, t1 - pr.t0, (double)n_ids / (t1 - pr.t0 > 0 ? t1 - pr.t0 : 1e-9), t_first - pr.t0, n_gen,
            t2 - t1, n_gen && t2 > t1 ? n_gen / (t2 - t1) : 0.0);
    rc = stopped ? 130 : RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    cli_sigint_restore();
    for (int i = 0; i < n_docs; i++) free(d[i].text);
    free(logits);
    free(ids);
    free(content);
    rk_sampler_destroy(smp);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
