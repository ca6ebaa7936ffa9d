/* `ridgekv eval ppl`: perplexity by llama-perplexity's procedure, so numbers compare. */
#include <math.h>
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
    if (len > 0 && text[len - 1] == '\n') text[--len] = '\0';
    rk_model *m = NULL;
    rk_session *s = NULL;
    int32_t *ids = NULL;
    float *logits = NULL;
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) {
        free(text);
        return rc;
    }
    const rk_hparams *hp = rk_model_hparams(m);
    size_t n_ids = 0;
    if ((st = rk_model_tokenize(m, text, len, true, false, &ids, &n_ids, &e))) goto fail;
    int c = o.n_ctx;
    int64_t n_chunk = (int64_t)n_ids / c;
    if (max_chunks && n_chunk > max_chunks) n_chunk = max_chunks;
    if (n_chunk < 1) {
        fprintf(stderr, "ridgekv eval ppl: %s has %zu tokens, fewer than one chunk of %d\n", o.prompt_file, n_ids, c);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    rk_session_params sp;
    if ((rc = cli_session_params(&o, &sp))) goto done;
    sp.n_ctx = c;
    if ((st = rk_session_create(m, &sp, &s, &e))) goto fail;
    /* Only the second half of a chunk is scored: the first half is evaluated without logits
     * and the second in pieces of PPL_PIECE rows, so memory stays PPL_PIECE x n_vocab floats
     * (a 16K chunk of a 152K-vocab model would otherwise keep 10 GB of logits). */
    enum { PPL_PIECE = 512 };
    logits = malloc((size_t)PPL_PIECE * (size_t)hp->n_vocab * sizeof(float));
    if (!logits) {
        st = rk_err_set(&e, RK_E_NOMEM, "eval: out of memory for %d x %d logits", PPL_PIECE, hp->n_vocab);
        goto fail;
    }
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    double t0 = rk_time_now();
    for (int64_t ch = 0; ch < n_chunk; ch++) {
        int32_t *chunk = ids + ch * c;
        int32_t saved = chunk[0];
        if (rk_model_add_bos(m) && rk_model_token_bos(m) >= 0) chunk[0] = rk_model_token_bos(m); /* as llama-perplexity */
        rk_session_reset(s);
        const int half = c / 2;
        st = rk_session_eval(s, chunk, (size_t)half, NULL, false, &e);
        for (int p0 = half; !st && p0 < c - 1; p0 += PPL_PIECE) {
            const int p1 = p0 + PPL_PIECE < c - 1 ? p0 + PPL_PIECE : c - 1; /* row c-1 has no next token */
            st = rk_session_eval(s, chunk + p0, (size_t)(p1 - p0), logits, true, &e);
            for (int j = p0; !st && j < p1; j++) {
                const double l = ev_nll_row(logits + (size_t)(j - p0) * (size_t)hp->n_vocab, hp->n_vocab, chunk[j + 1]);
                nll += l;
                nll2 += l * l;
                count++;
            }
        }
        chunk[0] = saved;
        if (st) goto fail;
        if (!o.json)
            fprintf(stderr, "eval ppl: chunk %lld/%lld  running ppl %.4f  (%.1f tok/s)\n", (long long)ch + 1,
                    (long long)n_chunk, exp(nll / (double)count),
                    (double)((ch + 1) * c) / (rk_time_now() - t0));
    }
    double mean = nll / (double)count;
    double var = nll2 / (double)count - mean * mean;
    double ppl = exp(mean);
    double ppl_err = ppl * sqrt(var > 0 ? var / (double)(count - 1 > 0 ? count - 1 : 1) : 0);
    if (o.json)
        printf("{\"file\":\"%s\",\"n_ctx\":%d,\"chunks\":%lld,\"tokens_scored\":%lld,\"nll\":%.6f,\"ppl\":%.6f,\"ppl_err\":%.6f}\n",
               o.prompt_file, c, (long long)n_chunk, (long long)count, mean, ppl, ppl_err);
    else
        printf("PPL = %.4f +/- %.5f  (%lld chunks of %d, %lld tokens scored, mean NLL %.6f)\n", ppl, ppl_err,
               (long long)n_chunk, c, (long long)count, mean);
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    free(logits);
    free(ids);
    free(text);
    rk_session_destroy(s);
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
