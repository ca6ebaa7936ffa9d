/* ridgekv serve --jsonl: one JSON request per stdin line, JSON events per stdout line.
 * The model and the server's session are made once; each request starts from an empty
 * KV cache (serve_ops.c). Requests run one after another, so EOF simply ends the loop
 * after the current one. */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "long_cli.h"
#include "cli.h"
#include "doc_cache_cli.h"
#include "serve.h"
#include "serve_guard.h"

static const char *help =
    "usage: ridgekv serve (--jsonl | --http [ADDR:]PORT) [-m MODEL] [options]\n"
    "\n"
    "--jsonl reads one JSON request per line on stdin and writes JSON events, one per line,\n"
    "on stdout (logs go to stderr). Ops: complete, chat, ask, tokenize, info. docs/JSONL.md\n"
    "describes every field, event and error code. EOF ends the server (exit 0).\n"
    "--http serves OpenAI-compatible /v1/chat/completions and /v1/completions (SSE with\n"
    "\"stream\": true), /v1/models and /health (docs/HTTP.md), one request at a time, until\n"
    "SIGINT or SIGTERM (exit 0). ADDR defaults to 127.0.0.1; port 0 picks a free one.\n"
    "\n"
    "  --jsonl                 JSON lines on stdin / stdout\n"
    "  --max-line BYTES        longest request line accepted (default 1048576)\n"
    "  --http [ADDR:]PORT      HTTP on ADDR:PORT (builds with libmicrohttpd)\n"
    "  --http-max-body BYTES   largest HTTP request body accepted (default 1048576; more: 413)\n"
    "  --api-key KEY           HTTP clients must send 'Authorization: Bearer KEY' (default:\n"
    "                          $RIDGEKV_API_KEY; none: no key asked)\n"
    "  --allow-host NAME       a Host name to answer besides localhost and the address (repeat)\n"
    "  --allow-origin ORIGIN   a web page origin (https://app.example:443, or *) allowed to call\n"
    "                          the server from a browser (repeat; default: none)\n"
    "  --host ADDR --port PORT the same as --http ADDR:PORT (llama-server's flags; defaults\n"
    "                          127.0.0.1 and 8080)\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's; past the trained context\n"
    "                          the model's documented RoPE scaling is applied)\n"
    "  -b, --batch-size N      prefill chunk (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32|q8|q4|lowram[:opts]  KV cache (default f16); a request's \"kv\" gets a session\n"
    "                          of its own with that policy; without --kv, an ask request takes the\n"
    "                          policy and budget ridgekv ask picks at its length (q8 from 16384\n"
    "                          prompt tokens; one stderr line says so; docs/JSONL.md)\n"
    "      --backend cpu|cpu_ref|cuda  kernels\n"
    "      --ridgefill MAPS, --fill MODE, --tail T, --split S, --keep-share X, --fill-group G\n"
    "                          RidgeFill for every\n"
    "                          request's prefill (as for ridgekv run); requests may set \"fill\",\n"
    "                          \"ridgefill\", \"tail\"\n"
    "      --no-ridgefill      exact prefill even when `ridgekv prepare` left maps in the cache\n" CLI_SPARSE_HELP
    "Defaults for requests that do not set them:\n"
    "  -n, --n-predict N       max_tokens (default 256; -1 = until end of text or context)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K, --top-p P, --min-p P, --repeat-penalty R, --repeat-last-n N, --seed S\n"
    "                          (--seed default -1: random at start, printed with -v)\n"
    "      --rope-scaling none|linear|yarn  RoPE scaling, with --rope-scale N, --yarn-orig-ctx N and the\n"
    "                          other --rope-*/--yarn-* flags (docs/MODELS.md; default: the GGUF's, or\n"
    "                          the model's documented one when -c passes the trained context)\n"
    "      --ctx-overflow-ok   allow a context past the trained one without scaling (garbage past it)\n"
    "      --frequency-penalty F, --presence-penalty P, --dry-multiplier M, --dry-base B,\n"
    "      --dry-allowed-length N, --dry-penalty-last-n N  repetition guards, as for run\n"
    "                          (DRY on by default: 0.8, 1.75, 2, -1)\n"
    "  -v, --verbose           one line per request on stderr\n"
    "\n"
    "exit codes: 0 EOF on stdin (--jsonl) or SIGINT/SIGTERM (--http), 2 bad usage, 3 model\n"
    "unusable, 5 reading stdin or writing stdout failed, or the port cannot be bound, 6 no\n"
    "default model\n";

#define DEFAULT_MAX_LINE ((size_t)1 << 20)

/* ---- stdin lines -------------------------------------------------------------------- */
typedef struct line_reader {
    int fd;
    bool eof;
    size_t pos, len; /* unread bytes buf[pos..len) */
    char buf[1 << 16];
    serve_buf line; /* the current line, at most max_line bytes */
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

static bool blank(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != ' ' && p[i] != '\t' && p[i] != '\r') return false;
    return true;
}

/* --api-key, --allow-host, --allow-origin into g. */
static int guard_flag(serve_guard *g, const char *flag, const char *v) {
    if (!v || !v[0]) {
        fprintf(stderr, "ridgekv serve: %s needs a value\n", flag);
        return RK_EXIT_USAGE;
    }
    if (!strcmp(flag, "--api-key")) {
        g->api_key = v;
        return 0;
    }
    const bool host = !strcmp(flag, "--allow-host");
    int *n = host ? &g->n_allow_host : &g->n_allow_origin;
    if (*n >= SERVE_GUARD_MAX_NAMES) {
        fprintf(stderr, "ridgekv serve: at most %d %s values\n", SERVE_GUARD_MAX_NAMES, flag);
        return RK_EXIT_USAGE;
    }
    if (!host && strcmp(v, "*") && strncmp(v, "http://", 7) && strncmp(v, "https://", 8)) {
        fprintf(stderr, "ridgekv serve: --allow-origin expects SCHEME://HOST[:PORT] or * (got '%s')\n", v);
        return RK_EXIT_USAGE;
    }
    (host ? g->allow_host : g->allow_origin)[(*n)++] = v;
    return 0;
}

int cmd_serve(int argc, char **argv) {
    /* serve's own flags are taken out; the rest go through the common parser */
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    if (!rest) return RK_EXIT_ERROR;
    int n_rest = 0;
    bool jsonl = false;
    size_t max_line = DEFAULT_MAX_LINE, max_body = DEFAULT_MAX_LINE;
    const char *http = NULL, *host = NULL, *port = NULL;
    char host_port[160];
    int rc = RK_EXIT_OK;
    serve_guard guard = {.api_key = getenv("RIDGEKV_API_KEY")};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i >= 2 && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            fputs(help, stdout);
            free(rest);
            return RK_EXIT_OK;
        }
        if (i >= 2 && !strcmp(a, "--jsonl")) {
            jsonl = true;
        } else if (i >= 2 && !strcmp(a, "--http")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ridgekv serve: --http needs [ADDR:]PORT\n");
                free(rest);
                return RK_EXIT_USAGE;
            }
            http = argv[++i];
        } else if (i >= 2 && (!strcmp(a, "--api-key") || !strcmp(a, "--allow-host") || !strcmp(a, "--allow-origin"))) {
            if ((rc = guard_flag(&guard, a, i + 1 < argc ? argv[i + 1] : NULL))) {
                free(rest);
                return rc;
            }
            i++;
        } else if (i >= 2 && (!strcmp(a, "--host") || !strcmp(a, "--port"))) {
            /* llama-server's spelling of --http ADDR:PORT */
            if (i + 1 >= argc) {
                fprintf(stderr, "ridgekv serve: %s needs a value\n", a);
                free(rest);
                return RK_EXIT_USAGE;
            }
            if (a[2] == 'h') host = argv[++i];
            else port = argv[++i];
        } else if (i >= 2 && (!strcmp(a, "--max-line") || !strcmp(a, "--http-max-body"))) {
            char *end;
            errno = 0;
            unsigned long long v = i + 1 < argc ? strtoull(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || errno || end == argv[i + 1] || *end || argv[i + 1][0] == '-' || v < 64 ||
                v > (1ull << 30)) {
                fprintf(stderr, "ridgekv serve: %s expects a byte count in [64, 1073741824] (got '%s')\n", a,
                        i + 1 < argc ? argv[i + 1] : "");
                free(rest);
                return RK_EXIT_USAGE;
            }
            if (a[2] == 'm') max_line = (size_t)v;
            else max_body = (size_t)v;
            i++;
        } else {
            rest[n_rest++] = argv[i];
        }
    }
    if (host || port) {
        if (http) {
            fprintf(stderr, "ridgekv serve: --http and --host/--port both give the address; give one\n");
            free(rest);
            return RK_EXIT_USAGE;
        }
        snprintf(host_port, sizeof host_port, "%.100s:%.40s", host ? host : "127.0.0.1", port ? port : "8080");
        http = host_port;
    }
    cli_opts o = {.n_predict = rk_gen_params_default().max_tokens, .sp = rk_sampler_params_default()};
    int n_pos;
    rc = cli_parse(n_rest, rest, 2, &o, NULL, 0, &n_pos, "serve");
    free(rest);
    if (rc) return rc;
    if (jsonl == (http != NULL)) {
        fprintf(stderr,
                "ridgekv serve: pass --jsonl (JSON lines on stdin/stdout) or --http [ADDR:]PORT, one of them\n");
        return RK_EXIT_USAGE;
    }
    char http_addr[64] = "127.0.0.1";
    int http_port = 0;
    if (http) {
        const char *colon = strrchr(http, ':'), *ps = colon ? colon + 1 : http;
        char *end;
        errno = 0;
        long pv = strtol(ps, &end, 10);
        if (errno || end == ps || *end || pv < 0 || pv > 65535 ||
            (colon && (size_t)(colon - http) >= sizeof http_addr)) {
            fprintf(stderr, "ridgekv serve: --http expects [ADDR:]PORT with a port in [0, 65535] (got '%s')\n", http);
            return RK_EXIT_USAGE;
        }
        if (colon && colon > http) snprintf(http_addr, sizeof http_addr, "%.*s", (int)(colon - http), http);
        http_port = (int)pv;
        (void)http_port;
#ifndef RK_HAVE_MHD
        (void)max_body, (void)guard;
        fprintf(stderr, "ridgekv serve: --http: this build has no HTTP server (install libmicrohttpd-dev and "
                        "rebuild)\n");
        return RK_EXIT_USAGE;
#endif
    }
    if (o.prompt || o.prompt_file || o.out || o.chat || o.system) {
        fprintf(stderr, "ridgekv serve: -p, -f, -o, --chat and --system do not apply: requests come on stdin\n");
        return RK_EXIT_USAGE;
    }

    server sv = {.verbose = o.verbose, .o = &o};
    sv.defaults = (serve_gen){.max_tokens = o.n_predict, .sp = o.sp, .stream = true};
    snprintf(sv.kv, sizeof sv.kv, "%s", o.kv ? o.kv : "f16");
    line_reader *rd = NULL;
    rk_err e = {0};
    rk_status st;
    /* -c past the trained context turns the model's documented RoPE scaling on (long_cli.h) */
    if ((rc = cli_load_model(&o, &sv.m)) || (rc = cli_long_apply("serve", &o, sv.m, 0, 0, NULL)) ||
        (rc = cli_session_params(&o, &sv.sp)))
        goto done;
    sv.hp = rk_model_hparams(sv.m);
    if ((st = rk_session_create(sv.m, &sv.sp, &sv.s, &e))) {
        cli_print_error(&e);
        rc = cli_exit_code(st);
        goto done;
    }
    if ((rc = cli_setup_kv(&o, sv.s, NULL)) || (rc = cli_auto_fill(&o, sv.m, "serve")) ||
        (rc = cli_fill_params(&o, sv.m, &sv.maps, NULL, &sv.fill)))
        goto done;
    if (rk_session_set_fill(sv.s, &sv.fill, &e)) { /* checked once here: a bad --split is a usage error */
        cli_print_error(&e);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    cli_seed_note("serve", &o);
#ifdef RK_HAVE_MHD
    if (http) {
        signal(SIGPIPE, SIG_IGN);
        rc = serve_http(&sv, http_addr, http_port, max_body, &guard);
        goto done;
    }
#endif
    if (!o.no_cache) sv.cache = cli_doc_cache_open(&o, "serve");
    rd = calloc(1, sizeof *rd);
    if (!rd) {
        fprintf(stderr, "ridgekv serve: out of memory\n");
        rc = RK_EXIT_ERROR;
        goto done;
    }
    rd->fd = STDIN_FILENO;
    rd->max_line = max_line;
    /* a closed stdout must become a write error we report, not a silent death */
    signal(SIGPIPE, SIG_IGN);
    char too_long[96];
    snprintf(too_long, sizeof too_long, "line too long: more than %zu bytes (see --max-line)", max_line);
    fprintf(stderr, "ridgekv serve: %s (%s, %d layers, ctx %lld) ready for JSON lines on stdin\n", rk_model_name(sv.m),
            sv.hp->arch_name, sv.hp->n_layer, (long long)rk_session_n_ctx(sv.s));
    for (;;) {
        int k = reader_next(rd);
        if (k == LINE_EOF) break;
        if (k == LINE_ERROR) {
            fprintf(stderr, "ridgekv serve: reading stdin failed: %s\n", strerror(errno));
            rc = RK_EXIT_IO;
            break;
        }
        if (k == LINE_TOO_LONG) serve_emit_error(&sv, NULL, SERVE_LINE_TOO_LONG, too_long);
        else if (!blank(rd->line.p, rd->line.n)) serve_handle_line(&sv, rd->line.p, rd->line.n);
        if (sv.write_failed) {
            fprintf(stderr, "ridgekv serve: writing to stdout failed: %s; stopping\n", strerror(sv.write_errno));
            rc = RK_EXIT_IO;
            break;
        }
    }
done:
    if (rd) serve_buf_free(&rd->line);
    free(rd);
    serve_deinit(&sv);
    return rc;
}
