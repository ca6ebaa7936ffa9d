#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"
#include "long_cli.h"
#include "rk_io.h"
#include "suggest.h"

static const char *help =
    "usage: ridgekv run [-m MODEL] (-p TEXT | -f FILE | TEXT) [options]\n"
    "       ridgekv run MODEL TEXT [options]\n"
    "\n"
    "Generates a continuation of the prompt and streams it to stdout (logs go to stderr).\n"
    "A first argument that names a model (a catalogue name such as smollm2-135m, or a GGUF\n"
    "file) is the model, as in `ollama run MODEL`.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "  -p, --prompt TEXT       prompt text (special-token markup like <|im_start|> is honoured)\n"
    "  -f, --file FILE         read the prompt from FILE\n"
    "      --chat              wrap the prompt as one user turn in the model's chat template\n"
    "      --system TEXT       system prompt for --chat\n"
    "  -n, --n-predict N       tokens to generate (default 256; -1 = until end of text or context)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's, or what a longer prompt needs)\n"
    "  -b, --batch-size N      prefill chunk (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32|q8|q4|lowram[:opts]  KV cache (default f16); lowram: compressed KV at decode\n"
    "                          (opts: ratio=R,rank=r,budget=B,window=W,resid=S,dense,... see docs/LOWRAM.md)\n"
    "      --backend cpu|cpu_ref|cuda  kernels (cpu_ref: the scalar oracle, slow; cuda: CUDA builds)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K           (default 40; 0 = off)\n"
    "      --top-p P           (default 0.95; 1 = off)\n"
    "      --min-p P           (default 0.05; 0 = off)\n" CLI_PENALTY_HELP
    /* the rest in a second string: C99 promises string literals of 4095 bytes */
    ;
static const char *help_rest =
    "      --seed S            sampling seed (default -1: random, printed with -v; N >= 0 repeats a run)\n"
    "  -r, --stop TEXT         stop before TEXT (repeatable, up to 16); the text is cut there\n"
    "      --json-schema FILE  the answer is JSON that the schema in FILE allows (grammar-constrained\n"
    "                          sampling; the subset of docs/JSONL.md); --json-object: any JSON object\n"
    "      --ridgefill MAPS    RidgeFill map file (from ridgekv calibrate)\n"
    "      --fill MODE         off|speed|quality|identity|plumb (default: quality with maps, else off)\n"
    "      --tail T            exact tail in tokens (default 2048; 1536 with --fill speed; minimum 512)\n"
    "      --split S           split layer for --fill identity/plumb without maps\n"
    "      --keep-share X      quality mode: share of bulk rows kept exact, those the question\n"
    "                          attends to most (default: the map's, 0.1, and at least 4096 rows\n"
    "                          up to a quarter of them; a share given is taken as it is)\n"
    "      --fill-group G      quality/speed: late layers attend to each run of up to G filled\n"
    "                          rows as one row (default 16; 0: every row)\n" CLI_SPARSE_HELP
    "      --rope-scaling none|linear|yarn  RoPE scaling, with --rope-scale N, --yarn-orig-ctx N and the\n"
    "                          other --rope-*/--yarn-* flags (docs/MODELS.md; default: the GGUF's, or\n"
    "                          the model's documented one when the prompt passes the trained context)\n"
    "      --ctx-overflow-ok   allow a context past the trained one without scaling (garbage past it)\n"
    "  -v, --verbose           print model and timing details to stderr\n"
    "      --verbose-prompt    print the prompt as the model sees it and its tokens to stderr\n"
    "\n"
    "-f files have CRLF turned into LF; a file that is not UTF-8 is converted, with a warning.\n"
    "\n"
    "exit codes: 0 done, 2 bad usage, 3 model unusable, 4 prompt too long for the context,\n"
    "5 reading the prompt or writing the output failed (also a closed stdout), 6 no default model\n";

/* The prompt's tokens: the text as is (special-token markup honoured), or with --chat
 * one user turn (after --system) of the model's template. */
static rk_status prompt_ids(const cli_opts *o, const rk_model *m, rk_session *s, rk_conv **conv, int32_t **ids,
                            size_t *n, rk_err *e) {
    if (!o->chat) return rk_model_tokenize(m, o->prompt, strlen(o->prompt), true, true, ids, n, e);
    rk_conv_params cp = {0};
    rk_status st = rk_conv_create(m, s, &cp, conv, e);
    if (!st && o->system) st = rk_conv_add(*conv, "system", o->system, strlen(o->system), e);
    if (!st) st = rk_conv_add(*conv, "user", o->prompt, strlen(o->prompt), e);
    if (!st) st = rk_conv_prompt(*conv, ids, n, e);
    return st;
}

/* ollama's `run MODEL [PROMPT]`: a first positional argument that names a model (a
 * catalogue name, or a GGUF file) is the model; one more is the prompt. */
static int model_positional(cli_opts *o, const char **pos, int *n_pos) {
    if (*n_pos && !o->model && cli_names_model(pos[0])) {
        o->model = pos[0];
        pos[0] = pos[1];
        (*n_pos)--;
        if (!*n_pos && !o->prompt && !o->prompt_file) {
            fprintf(stderr,
                    "ridgekv run: no prompt for %s: `ridgekv run %s \"PROMPT\"` (a conversation: `ridgekv chat -m "
                    "%s`)\n",
                    o->model, o->model, o->model);
            return RK_EXIT_USAGE;
        }
    }
    if (*n_pos > 1) {
        fprintf(stderr, "ridgekv run: unexpected argument '%s' (quote a prompt of several words)\n", pos[1]);
        return RK_EXIT_USAGE;
    }
    return 0;
}

int cmd_run(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            fputs(help_rest, stdout);
            return RK_EXIT_OK;
        }
    cli_opts o = {.n_predict = 256, .sp = rk_sampler_params_default()};
    const char *pos[2];
    int n_pos, rc = cli_parse(argc, argv, 2, &o, pos, 2, &n_pos, "run");
    if (rc) return rc;
    if ((rc = model_positional(&o, pos, &n_pos))) return rc;
    if (n_pos && (o.prompt || o.prompt_file)) {
        fprintf(stderr, "ridgekv run: two prompts (%s and '%s'); give one\n", o.prompt ? "-p" : "-f", pos[0]);
        return RK_EXIT_USAGE;
    }
    if (n_pos) o.prompt = pos[0];
    if (o.prompt && o.prompt_file) {
        fprintf(stderr, "ridgekv run: -p and -f both give the prompt; give one\n");
        return RK_EXIT_USAGE;
    }
    char *file_text = NULL;
    rk_err e = {0};
    if (o.prompt_file) {
        size_t len;
        if (rk_io_read_file(o.prompt_file, &file_text, &len, &e)) {
            cli_print_error(&e);
            return RK_EXIT_IO;
        }
        if (memchr(file_text, 0, len)) {
            fprintf(stderr, "ridgekv run: %s is not a text file (it contains NUL bytes)\n", o.prompt_file);
            free(file_text);
            return RK_EXIT_IO;
        }
        if (cli_text_clean("run", o.prompt_file, &file_text, &len)) {
            free(file_text);
            fprintf(stderr, "ridgekv run: out of memory\n");
            return RK_EXIT_ERROR;
        }
        o.prompt = file_text;
    }
    if (!o.prompt) {
        fprintf(stderr, "ridgekv run: no prompt: pass -p TEXT or -f FILE (see ridgekv run --help)\n");
        return RK_EXIT_USAGE;
    }
    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_ridge_maps *maps = NULL;
    rk_conv *conv = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    rk_gen_result r = {0};
    rk_json_grammar *gram = NULL;
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) goto done;
    /* the prompt's tokens first (over a scratch session of the smallest context, whose
     * RoPE is never used): their count decides RoPE scaling, context and KV policy */
    {
        rk_session_params pp = rk_session_params_default();
        pp.n_ctx = 16;
        pp.n_threads = 1;
        rk_session *probe = NULL;
        st = rk_session_create(m, &pp, &probe, &e);
        if (!st) st = prompt_ids(&o, m, probe, &conv, &ids, &n_ids, &e);
        rk_conv_destroy(conv);
        conv = NULL;
        rk_session_destroy(probe);
        if (st) goto fail;
    }
    if ((rc = cli_long_apply("run", &o, m, (int64_t)n_ids, (int64_t)n_ids + (o.n_predict > 0 ? o.n_predict : 0),
                             NULL)) ||
        (rc = cli_open_session(&o, m, 0, &s)) || (rc = cli_setup_fill(&o, m, s, &maps, NULL)))
        goto done;
    const rk_hparams *hp = rk_model_hparams(m);
    if (o.verbose)
        fprintf(stderr, "ridgekv: %s (%s, %d layers, d=%d), prompt %zu tokens, ctx %lld\n", rk_model_name(m),
                hp->arch_name, hp->n_layer, hp->n_embd, n_ids, (long long)rk_session_n_ctx(s));
    cli_seed_note("run", &o);
    if (o.verbose_prompt) cli_show_prompt("run", m, ids, n_ids);
    cli_sink out = {.f = stdout};
    rk_gen_params gp = cli_gen_params(&o);
    gp.on_token = cli_sink_token;
    gp.token_ud = &out;
    if ((rc = cli_gen_grammar("run", &o, &gram))) goto done;
    gp.grammar = gram;
    if ((st = rk_generate(m, s, ids, n_ids, &gp, &r, &e))) {
        cli_kv_budget_check("run", s);
        goto fail;
    }
    cli_sink_rest(&out, &r);
    if (!out.failed) fputc('\n', stdout);
    if ((rc = cli_sink_check("run", &out))) goto done;
    cli_kv_budget_check("run", s);
    if (r.stop == RK_STOP_CONTEXT)
        fprintf(stderr, "ridgekv run: context full (%lld tokens); stopping\n", (long long)rk_session_n_ctx(s));
    fprintf(stderr,
            "ridgekv: prompt %lld tokens in %.2f s (%.1f tok/s, TTFT %.0f ms), generated %lld tokens (%.1f tok/s)\n",
            (long long)r.n_prompt, r.prefill_s, r.prefill_tok_s, 1000.0 * (r.ttft_s >= 0 ? r.ttft_s : r.prefill_s),
            (long long)r.n_gen, r.decode_tok_s);
    if (o.verbose) cli_gen_verbose("run", s, &o, &r);
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
    if (st == RK_E_CONTEXT)
        fprintf(stderr, "ridgekv run: shorten the prompt or raise -c (up to the model's %lld)\n",
                (long long)rk_model_n_ctx_max(m));
    else if (st == RK_E_INVALID_ARG && n_ids == 0)
        fprintf(stderr, "ridgekv run: the prompt is empty after tokenization\n");
done:
    rk_json_grammar_destroy(gram);
    rk_gen_result_deinit(&r);
    free(ids);
    free(file_text);
    rk_conv_destroy(conv);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
