/* `ridgekv eval`: the measurements' flags and output; ppl here (its driver: eval/eval_ppl.c). */
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"
#include "eval_cli.h"
#include "rk_io.h"

static const char *help =
    "usage: ridgekv eval ppl|needle|nll|splice [options]   (ridgekv eval MEASUREMENT --help)\n"
    "\n"
    "ppl: perplexity over a text file, as llama-perplexity computes it;\n"
    "needle: passkey retrieval with the needle in the RidgeFill bulk region, fill modes or KV policies\n"
    "        (--kv-modes) paired (McNemar);\n"
    "nll: ΔNLL on the last 512 tokens and on long-range tokens (LongPPL), bootstrap CIs;\n"
    "splice: share of the loss gap recovered by exact K or V per layer group, K/V error split.\n";

static const char *ppl_help =
    "usage: ridgekv eval ppl [-m MODEL] -f FILE [-c 512] [--chunks N] [-t T] [--kv POLICY] [--json]\n"
    "\n"
    "Perplexity as llama-perplexity computes it: the text (one trailing newline dropped) is\n"
    "tokenized (with BOS when the vocab asks for it) and cut into chunks of -c tokens; each chunk\n"
    "starts from an empty KV cache with its first token replaced by BOS (when the vocab uses BOS),\n"
    "and tokens c/2 .. c-1 of each chunk are scored.\n"
    "\n"
    "  -m MODEL      GGUF path or catalogue name (default: the cached default model)\n"
    "  -f FILE       text to score\n"
    "  -c N          chunk size (default 512)\n"
    "  --chunks N    score at most N chunks (default: all)\n"
    "  -t N          threads (default: all cores)\n"
    "  --kv POLICY   f16, f32, q8, q4 or lowram[:opts] (default f16)\n"
    "  --ridgefill MAPS, --fill MODE  score with RidgeFill prefill (docs/RIDGEFILL.md)\n"
    "  --json        one JSON object on stdout\n";

typedef struct ppl_progress {
    bool quiet; /* --json: stdout's one object only */
    int n_ctx;
    double t0;
} ppl_progress;

static void ppl_progress_fn(void *ud, int64_t done, int64_t total, double running_ppl) {
    const ppl_progress *p = ud;
    if (!p->quiet)
        fprintf(stderr, "eval ppl: chunk %lld/%lld  running ppl %.4f  (%.1f tok/s)\n", (long long)done,
                (long long)total, running_ppl, (double)(done * p->n_ctx) / (rk_time_now() - p->t0));
}

static int eval_ppl(int argc, char **argv) {
    int max_chunks = 0;
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) return RK_EXIT_ERROR;
    int ac = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--chunks") && i + 1 < argc) {
            max_chunks = atoi(argv[++i]);
            if (max_chunks < 1) {
                fprintf(stderr, "ridgekv eval ppl: --chunks expects a positive integer\n");
                free(av);
                return RK_EXIT_USAGE;
            }
            continue;
        }
        av[ac++] = argv[i];
    }
    cli_opts o = {.n_ctx = 512, .sp = rk_sampler_params_default()};
    const char *pos[1];
    int n_pos, rc = cli_parse(ac, av, 3, &o, pos, 0, &n_pos, "eval ppl");
    free(av);
    if (rc) return rc;
    if (!o.prompt_file) {
        fprintf(stderr, "ridgekv eval ppl: -f FILE is required\n");
        return RK_EXIT_USAGE;
    }
    if (o.n_ctx < 4) {
        fprintf(stderr, "ridgekv eval ppl: -c must be at least 4\n");
        return RK_EXIT_USAGE;
    }
    rk_err e = {0};
    char *text = NULL;
    size_t len = 0;
    if (rk_io_read_file(o.prompt_file, &text, &len, &e)) {
        cli_print_error(&e);
        return RK_EXIT_IO;
    }
    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_ridge_maps *maps = NULL;
    int32_t *ids = NULL;
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) {
        free(text);
        return rc;
    }
    size_t n_ids = 0;
    if ((st = ev_ppl_tokenize(m, text, len, &ids, &n_ids, &e))) goto fail;
    const ev_ppl_params pp = {.n_ctx = o.n_ctx, .max_chunks = max_chunks};
    if (ev_ppl_n_chunks(n_ids, &pp) < 1) {
        fprintf(stderr, "ridgekv eval ppl: %s has %zu tokens, fewer than one chunk of %d\n", o.prompt_file, n_ids,
                o.n_ctx);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    rk_session_params sp;
    if ((rc = cli_session_params(&o, &sp))) goto done;
    sp.n_ctx = o.n_ctx;
    if ((st = rk_session_create(m, &sp, &s, &e))) goto fail;
    if ((rc = cli_setup_fill(&o, m, s, &maps, NULL))) goto done; /* --ridgefill / --fill; else exact */
    ppl_progress pr = {o.json != 0, o.n_ctx, rk_time_now()};
    ev_ppl_result r = {0};
    if ((st = ev_ppl_run(m, s, ids, n_ids, &pp, ppl_progress_fn, &pr, &r, &e))) goto fail;
    if (o.json)
        printf(
            "{\"file\":\"%s\",\"n_ctx\":%d,\"chunks\":%lld,\"tokens_scored\":%lld,\"nll\":%.6f,\"ppl\":%.6f,\"ppl_err\":%.6f}\n",
            o.prompt_file, o.n_ctx, (long long)r.n_chunk, (long long)r.n_scored, r.nll, r.ppl, r.ppl_err);
    else
        printf("PPL = %.4f +/- %.5f  (%lld chunks of %d, %lld tokens scored, mean NLL %.6f)\n", r.ppl, r.ppl_err,
               (long long)r.n_chunk, o.n_ctx, (long long)r.n_scored, r.nll);
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    free(ids);
    free(text);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}

int cmd_eval(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(help, argc < 3 ? stderr : stdout);
        return argc < 3 ? RK_EXIT_USAGE : RK_EXIT_OK;
    }
    if (!strcmp(argv[2], "ppl")) {
        for (int i = 3; i < argc; i++)
            if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
                fputs(ppl_help, stdout);
                return RK_EXIT_OK;
            }
        return eval_ppl(argc, argv);
    }
    if (!strcmp(argv[2], "needle")) return cmd_eval_needle(argc, argv);
    if (!strcmp(argv[2], "nll")) return cmd_eval_nll(argc, argv);
    if (!strcmp(argv[2], "splice")) return cmd_eval_splice(argc, argv);
    fprintf(stderr, "ridgekv eval: unknown measurement '%s' (available: ppl, needle, nll, splice)\n", argv[2]);
    return RK_EXIT_USAGE;
}
