#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rk_io.h"
#include "stream.h"

static const char *help =
    "usage: ridgekv run [-m MODEL] (-p TEXT | -f FILE) [options]\n"
    "\n"
    "Generates a continuation of the prompt and streams it to stdout (logs go to stderr).\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "  -p, --prompt TEXT       prompt text (special-token markup like <|im_start|> is honoured)\n"
    "  -f, --file FILE         read the prompt from FILE\n"
    "      --chat              wrap the prompt as one user turn in the model's chat template\n"
    "      --system TEXT       system prompt for --chat\n"
    "  -n, --n-predict N       tokens to generate (default 256; -1 = until end of text or context)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's)\n"
    "  -b, --batch-size N      prefill chunk (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32|lowram[:opts]  KV cache (default f16); lowram: compressed KV at decode\n"
    "                          (opts: ratio=R,rank=r,budget=B,window=W,resid=S,dense,... see docs/LOWRAM.md)\n"
    "      --backend cpu|cpu_ref  kernels (cpu_ref: the scalar oracle, slow)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K           (default 40; 0 = off)\n"
    "      --top-p P           (default 0.95; 1 = off)\n"
    "      --min-p P           (default 0.05; 0 = off)\n"
    "      --repeat-penalty R  (default 1.0 = off)\n"
    "      --repeat-last-n N   tokens the penalty looks back (default 64)\n"
    "      --seed S            sampling seed (default 0)\n"
    "      --ridgefill MAPS    RidgeFill map file (from ridgekv calibrate)\n"
    "      --fill MODE         off|speed|quality|identity|plumb (default: speed with maps, else off)\n"
    "      --tail T            exact tail in tokens (default 2048, minimum 512)\n"
    "      --split S           split layer for --fill identity/plumb without maps\n"
    "      --keep-share X      quality mode: share of hard tokens kept exact (default: the map's)\n"
    "  -v, --verbose           print model and timing details to stderr\n";

int cmd_run(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    cli_opts o = {.n_predict = 256, .sp = rk_sampler_params_default()};
    const char *pos[1];
    int n_pos, rc = cli_parse(argc, argv, 2, &o, pos, 1, &n_pos, "run");
    if (rc) return rc;
    if (n_pos && !o.prompt) o.prompt = pos[0];
    char *file_text = NULL;
    rk_err e = {0};
    if (o.prompt_file) {
        size_t len;
        if (rk_io_read_file(o.prompt_file, &file_text, &len, &e)) {
            cli_print_error(&e);
            return RK_EXIT_IO;
        }
        o.prompt = file_text;
    }
    if (!o.prompt) {
        fprintf(stderr, "ridgekv run: no prompt: pass -p TEXT or -f FILE (see ridgekv run --help)\n");
        return RK_EXIT_USAGE;
    }
    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_sampler *smp = NULL;
    rk_ridge_maps *maps = NULL;
    int32_t *ids = NULL;
    char *formatted = NULL;
    float *logits = NULL;
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) goto done;
    const rk_hparams *hp = rk_model_hparams(m);
    const char *text = o.prompt;
    if (o.chat) {
        rk_chat_msg msgs[2];
        size_t n = 0;
        if (o.system) msgs[n++] = (rk_chat_msg){"system", o.system};
        msgs[n++] = (rk_chat_msg){"user", o.prompt};
        if ((st = rk_chat_format(rk_model_chat_family(m), msgs, n, true, &formatted, &e))) goto fail;
        text = formatted;
    }
    size_t n_ids;
    if ((st = rk_model_tokenize(m, text, strlen(text), true, true, &ids, &n_ids, &e))) goto fail;
    if (n_ids == 0) {
        fprintf(stderr, "ridgekv run: the prompt is empty after tokenization\n");
        rc = RK_EXIT_USAGE;
        goto done;
    }
    rk_session_params sp;
    cli_session_params(&o, &sp);
    int64_t n_ctx = sp.n_ctx > 0 ? sp.n_ctx : hp->n_ctx_train;
    if ((int64_t)n_ids >= n_ctx) {
        fprintf(stderr, "ridgekv run: the prompt has %zu tokens but the context holds %lld "
                        "(leave room for at least one generated token; raise -c up to the model's %d)\n",
                n_ids, (long long)n_ctx, hp->n_ctx_train);
        rc = RK_EXIT_CONTEXT;
        goto done;
    }
    if ((st = rk_session_create(m, &sp, &s, &e))) goto fail;
    if ((rc = cli_setup_fill(&o, m, s, &maps, NULL)) || (rc = cli_setup_kv(&o, s, NULL))) goto done;
    if ((st = rk_sampler_create(&o.sp, hp->n_vocab, &smp, &e))) goto fail;
    logits = malloc((size_t)hp->n_vocab * sizeof(float));
    int32_t *hist = realloc(ids, (n_ids + (size_t)n_ctx) * sizeof(int32_t));
    if (!logits || !hist) {
        st = rk_err_set(&e, RK_E_NOMEM, "run: out of memory");
        goto fail;
    }
    ids = hist;
    if (o.verbose)
        fprintf(stderr, "ridgekv: %s (%s, %d layers, d=%d), prompt %zu tokens, ctx %lld\n",
                rk_model_name(m), hp->arch_name, hp->n_layer, hp->n_embd, n_ids, (long long)n_ctx);
    double t0 = rk_time_now();
    if ((st = rk_session_eval(s, ids, n_ids, logits, false, &e))) goto fail;
    double t1 = rk_time_now();
    cli_stream out = {.out = stdout};
    size_t n_hist = n_ids;
    int n_gen = 0;
    char piece[1024];
    while (o.n_predict < 0 || n_gen < o.n_predict) {
        int32_t tok = rk_sampler_sample(smp, logits, ids, n_hist);
        if (rk_model_token_is_eog(m, tok)) break;
        size_t pl = rk_model_token_piece(m, tok, false, piece, sizeof piece);
        if (pl <= sizeof piece) cli_stream_put(&out, piece, pl);
        ids[n_hist++] = tok;
        n_gen++;
        if (rk_session_n_past(s) >= rk_session_n_ctx(s)) {
            cli_stream_flush(&out);
            fprintf(stderr, "\nridgekv run: context full (%lld tokens); stopping\n", (long long)n_ctx);
            break;
        }
        if (o.n_predict >= 0 && n_gen >= o.n_predict) break;
        if ((st = rk_session_eval(s, &tok, 1, logits, false, &e))) goto fail;
    }
    cli_stream_flush(&out);
    fputc('\n', stdout);
    fflush(stdout);
    double t2 = rk_time_now();
    fprintf(stderr, "ridgekv: prompt %zu tokens in %.2f s (%.1f tok/s, TTFT %.0f ms), generated %d tokens (%.1f tok/s)\n",
            n_ids, t1 - t0, (double)n_ids / (t1 - t0), 1000.0 * (t1 - t0), n_gen,
            n_gen > 0 ? (double)n_gen / (t2 - t1) : 0.0);
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    free(logits);
    free(ids);
    free(formatted);
    free(file_text);
    rk_sampler_destroy(smp);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
