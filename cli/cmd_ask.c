/* ridgekv ask: one question over local documents.
 *
 * The prompt is rk_conv_add_ask's (the same as JSONL ask): the model's chat template
 * around a system message and one user turn holding the documents (each under its file
 * name) and then the question; the documents and the question are text, never special
 * tokens. A prompt that does not fit the context is refused with the numbers; nothing is
 * cut silently. */
#include <stdlib.h>
#include <string.h>

#include "ask_docs.h"
#include "cli_gen.h"
#include "doc_cache_cli.h"
#include "lineedit.h"
#include "long_cli.h"
#include "progress.h"
#include "rk_experimental.h"

static const char *help =
    "usage: ridgekv ask [-m MODEL] --doc FILE [--doc FILE ...] [options] QUESTION...\n"
    "\n"
    "Answers a question about local documents: text (UTF-8, UTF-16 with a BOM), PDF,\n"
    "HTML, EPUB and DOCX, with page or section markers kept. The documents, each under\n"
    "its file name, and then the question go into one chat prompt. Reading them shows\n"
    "progress on stderr; the answer streams to stdout.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "      --doc FILE          a document to read (repeat for more; at least one; - reads stdin)\n"
    "  -p, --prompt TEXT       the question (or give it as the last arguments: unquoted words are joined)\n"
    "      --system TEXT       system prompt (default: answer from the documents)\n"
    "  -n, --n-predict N       most answer tokens (default 256; -1 = up to the answer room)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's, or what a longer prompt needs)\n"
    "  -b, --batch-size N      prefill chunk: progress and Ctrl-C act between chunks (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32|q8|q4|lowram[:opts]  KV cache (default f16; q8 from 16384 prompt tokens or when f16\n"
    "                          would take over half the free memory; lowram: compressed KV, docs/LOWRAM.md)\n"
    "      --backend cpu|cpu_ref|cuda  kernels (cpu_ref: the scalar oracle, slow; cuda: CUDA builds)\n"
    "      --temp T            temperature (default 0 = greedy, so answers repeat)\n"
    "      --top-k K           (default 40; 0 = off)\n"
    "      --top-p P           (default 0.95; 1 = off)\n"
    "      --min-p P           (default 0.05; 0 = off)\n" CLI_PENALTY_HELP
    /* the rest in a second string: C99 promises string literals of 4095 bytes */
    ;
static const char *help_rest =
    "      --seed S            sampling seed (default -1: random, printed with -v; N >= 0 repeats a run)\n"
    "  -r, --stop TEXT         stop the answer before TEXT (repeatable, up to 16)\n"
    "      --json-schema FILE  the answer is JSON that the schema in FILE allows (grammar-constrained\n"
    "                          sampling; the subset of docs/JSONL.md); --json-object: any JSON object\n"
    "      --ridgefill MAPS    RidgeFill map file (from ridgekv calibrate): faster reading of long prompts\n"
    "      --fill MODE         off|speed|quality|identity|plumb (default: quality with maps, else off)\n"
    "      --tail T            exact tail in tokens (default 2048; 1536 with --fill speed; minimum 512)\n"
    "      --split S           split layer for --fill identity/plumb without maps\n"
    "      --keep-share X      quality mode: share of bulk rows kept exact, those the question\n"
    "                          attends to most (default: the map's, 0.1, and at least 4096 rows\n"
    "                          up to a quarter of them; a share given is taken as it is)\n"
    "      --fill-group G      quality/speed: late layers attend to each run of up to G filled\n"
    "                          rows as one row (default 16; 0: every row)\n"
    "      --rescore-rows N, --pool-after N  a later question on the same document: rows it may\n"
    "                          make exact (default: the work of 1024 rows at 2048 keys), and rows\n"
    "                          after a row it scores high that come with it (default 16)\n" CLI_SPARSE_HELP
    "      --no-ridgefill      exact prefill even when `ridgekv prepare` left maps in the cache\n";
static const char *help_more = /* two strings: C99 compilers need only support 4095 characters in one */
    "      --no-cache          do not use the document KV cache (docs/TIERS.md; ridgekv cache)\n"
    "      --cache-level N     zstd level of the cached KV (1..19, default 1; 0: raw)\n"
    "      --kv-budget SIZE    KV kept in memory (f16/f32/q8/lowram, e.g. 512M); the rest spills to $TMPDIR\n"
    "                          (default: none, or half the free memory when the KV would crowd it)\n"
    "      --kv-host-budget SIZE  --backend cuda, f16/f32: pinned host memory for the KV past\n"
    "                          --kv-budget; the rest spills to $TMPDIR\n"
    "      --rope-scaling none|linear|yarn  RoPE scaling (default: the GGUF's, or the model's documented\n"
    "                          one when the prompt needs it); with --rope-scale N, --yarn-orig-ctx N,\n"
    "                          --rope-freq-base B, --yarn-ext-factor F, --yarn-attn-factor F,\n"
    "                          --yarn-beta-fast F, --yarn-beta-slow F (docs/MODELS.md)\n"
    "      --ctx-overflow-ok   allow a context past the trained one without scaling (garbage past it)\n"
    "  -v, --verbose           model and prompt details on stderr\n"
    "      --verbose-prompt    print the prompt as the model sees it and its tokens to stderr\n"
    "\n"
    "Long documents: one command, no flags. When the prompt and its answer room pass the\n"
    "context the model was trained on, ask applies the model's RoPE scaling (the GGUF's, or\n"
    "the one its card documents: qwen2.5-coder-1.5b, YaRN x4 from 32768 to 131072 tokens)\n"
    "and says so in one line; past the scaled limit it refuses, naming the flags. From 16384\n"
    "prompt tokens the KV cache is q8 (1.9x fewer bytes than f16), and a --kv-budget is set\n"
    "only when even that would crowd the free memory (one line says which). Flags given\n"
    "win: --kv f16 keeps f16, --rope-scaling none keeps the RoPE. For example:\n"
    "  ridgekv ask -m qwen2.5-coder-1.5b --doc book.txt \"Who wrote the letter?\"\n"
    "\n"
    "The prompt must leave room for the answer: -n tokens, at most a quarter of the\n"
    "context; the answer stops there, and stderr says \"[answer cut: ...]\" when -n or\n"
    "that room cut it. When the prompt does not fit, ask prints each document's tokens,\n"
    "the context size and how many tokens to cut, and exits 4. Documents have CRLF turned\n"
    "into LF; one that is not UTF-8 is converted, with a warning.\n"
    "\n"
    "stderr gets one line on the accelerations in use, a progress bar while the\n"
    "documents are read (tokens done/total, tokens/s, ETA; plain lines every few\n"
    "seconds when stderr is not a terminal), then time to first token and decode rate.\n"
    "Ctrl-C stops reading or answering and exits 130 (a second Ctrl-C quits at once).\n"
    "\n"
    "exit codes: 0 answered, 2 bad usage, 3 model unusable, 4 too long for the context,\n"
    "5 a document cannot be read or writing the answer failed (a closed stdout), 6 no default\n"
    "model, 130 stopped by Ctrl-C\n";

/* One stderr line on what is in use; RidgeFill only when the prompt is long enough for it
 * (the maps' path with -v). */
static void accelerations(const cli_opts *o, const rk_ridge_maps *maps, const rk_session *s, int64_t n_ids) {
    char fill[1400] = "", kv[32], note[256];
    if (cli_fill_applies(o, n_ids, note, sizeof note)) {
        snprintf(fill, sizeof fill, "%s, ", note);
        if (o->verbose && maps) {
            const size_t l = strlen(fill) - 2;
            rk_fill_mode fm = RK_FILL_OFF;
            (void)rk_fill_mode_parse(o->fill ? o->fill : cli_default_fill_name(), &fm);
            snprintf(fill + l, sizeof fill - l, " (maps %s, split %d, groups of %d), ", o->ridgefill,
                     rk_ridge_maps_split(maps), cli_fill_group(o, fm));
        }
    } else if (!maps && n_ids > rk_fill_default_tail(RK_FILL_QUALITY) && !o->no_ridgefill && !o->fill) {
        snprintf(fill, sizeof fill, "RidgeFill off (no maps: `ridgekv prepare` fits them once), ");
    }
    snprintf(kv, sizeof kv, "%.*s", o->kv ? (int)strcspn(o->kv, ":") : 3, o->kv ? o->kv : "f16");
    const char *lr = strcmp(kv, "lowram") ? "lowram off" : "lowram on (fitted on the prompt)";
    if (!strcmp(kv, "lowram") && strstr(o->kv, "pred=")) lr = "lowram on (predictor file)";
    /* sparse attention acts past its min_kv keys (8192 unless --sparse sets min=) */
    rk_sparse_params sp = {0};
    if (!o->sparse && !o->no_ridgefill) sp = rk_sparse_params_default();
    else if (o->sparse) (void)rk_sparse_params_parse(o->sparse, &sp, NULL);
    const int64_t sp_min = sp.min_kv > 0 ? sp.min_kv : 8192;
    char sparse[96] = "";
    if (sp.on && n_ids > sp_min)
        snprintf(sparse, sizeof sparse, "sparse attention past %lld keys (--sparse off: dense), ", (long long)sp_min);
    fprintf(stderr, "ridgekv ask: accelerations: %s%s%s, document cache %s; %s KV cache\n", fill, sparse, lr,
            o->no_cache ? "off" : "on", kv);
    (void)s;
}

/* Tokens of the ask prompt, built over a scratch session of the smallest context (its
 * RoPE is never used): the real session's context and RoPE depend on this length. */
static rk_status prompt_len(const rk_model *m, const rk_conv_params *cp, const char *system, const rk_doc *docs,
                            size_t n_docs, const char *question, size_t *n, rk_err *e) {
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = 16;
    sp.n_threads = 1;
    rk_session *s = NULL;
    rk_conv *c = NULL;
    int32_t *ids = NULL;
    rk_status st = rk_session_create(m, &sp, &s, e);
    if (!st) st = rk_conv_create(m, s, cp, &c, e);
    if (!st) st = rk_conv_add_ask(c, system, docs, n_docs, question, e);
    if (!st) st = rk_conv_prompt(c, &ids, n, e);
    free(ids);
    rk_conv_destroy(c);
    rk_session_destroy(s);
    return st;
}

/* Parses argv into o, the documents and the question. */
/* The question: -p, or the positional words joined by single spaces (as an unquoted
 * question arrives); *joined is malloc'd when they were joined. */
static int parse(int argc, char **argv, cli_opts *o, cli_doc *d, int *n_docs, const char **question, char **joined) {
    char **rest = malloc((size_t)argc * sizeof *rest);
    const char **pos = malloc((size_t)argc * sizeof *pos);
    if (!rest || !pos) {
        free(rest);
        free(pos);
        return RK_EXIT_ERROR;
    }
    int n_rest, n_pos = 0;
    int rc = cli_docs_split(argc, argv, rest, &n_rest, d, n_docs);
    if (!rc) rc = cli_parse(n_rest, rest, 2, o, pos, argc, &n_pos, "ask");
    free(rest);
    if (!rc && n_pos && o->prompt) {
        fprintf(stderr, "ridgekv ask: two questions (-p and '%s'); give one\n", pos[0]);
        rc = RK_EXIT_USAGE;
    }
    if (!rc && n_pos) {
        size_t len = 0;
        for (int i = 0; i < n_pos; i++) len += strlen(pos[i]) + 1;
        if (!(*joined = malloc(len + 1))) rc = RK_EXIT_ERROR;
        else {
            (*joined)[0] = 0;
            for (int i = 0; i < n_pos; i++) {
                if (i) strcat(*joined, " ");
                strcat(*joined, pos[i]);
            }
        }
    }
    free(pos);
    if (rc) return rc;
    *question = n_pos ? *joined : o->prompt;
    if (!*n_docs) {
        fprintf(stderr, "ridgekv ask: no document: pass --doc FILE (see ridgekv ask --help)\n");
        return RK_EXIT_USAGE;
    }
    if (!*question || !(*question)[strspn(*question, " \t\n")]) {
        fprintf(stderr, "ridgekv ask: no question: give it as the last argument (see ridgekv ask --help)\n");
        return RK_EXIT_USAGE;
    }
    return 0;
}

int cmd_ask(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            fputs(help_rest, stdout);
            fputs(help_more, stdout);
            return RK_EXIT_OK;
        }
    cli_doc d[CLI_MAX_DOCS];
    int n_docs = 0;
    const char *question = NULL;
    char *joined = NULL;
    cli_opts o = {.n_predict = rk_gen_params_default().max_tokens, .sp = rk_sampler_params_default()};
    o.sp.temp = 0.0f;
    int rc = parse(argc, argv, &o, d, &n_docs, &question, &joined);
    if (rc) {
        free(joined);
        return rc;
    }

    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_ridge_maps *maps = NULL;
    rk_conv *conv = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    rk_gen_result r = {0};
    rk_json_grammar *gram = NULL;
    rk_err e = {0};
    rk_status st = RK_OK;
    rk_doc docs[CLI_MAX_DOCS];
    rk_conv_params cp = {.n_answer = o.n_predict, .room_div = 4};
    if ((rc = cli_docs_read(d, n_docs)) || (rc = cli_load_model(&o, &m))) goto done;
    for (int i = 0; i < n_docs; i++) docs[i] = (rk_doc){d[i].name, d[i].text, d[i].len};
    /* the prompt's length decides RoPE scaling, context and KV policy before the session */
    size_t n_probe = 0;
    if ((st = prompt_len(m, &cp, o.system, docs, (size_t)n_docs, question, &n_probe, &e))) goto fail;
    const int64_t answer = o.n_predict >= 0 ? o.n_predict : (int64_t)n_probe / 3 + 1;
    rk_long_defaults ld;
    if ((rc = cli_long_apply("ask", &o, m, (int64_t)n_probe, (int64_t)n_probe + answer, &ld))) {
        if (rc == RK_EXIT_CONTEXT) cli_docs_too_long(m, d, n_docs, (int64_t)n_probe, answer, ld.n_ctx_max);
        goto done;
    }
    if ((rc = cli_open_session(&o, m, 0, &s))) goto done;
    cli_seed_note("ask", &o);
    if ((st = rk_conv_create(m, s, &cp, &conv, &e)) ||
        (st = rk_conv_add_ask(conv, o.system, docs, (size_t)n_docs, question, &e)) ||
        (st = rk_conv_prompt(conv, &ids, &n_ids, &e)))
        goto fail;
    const int64_t n_ctx = rk_session_n_ctx(s), room = rk_conv_answer_room(conv);
    if ((int64_t)n_ids + room > n_ctx) {
        cli_docs_too_long(m, d, n_docs, (int64_t)n_ids, room, n_ctx);
        rc = RK_EXIT_CONTEXT;
        goto done;
    }
    if ((rc = cli_auto_fill(&o, m, "ask")) || (rc = cli_setup_fill(&o, m, s, &maps, NULL))) goto done;
    if (o.verbose)
        fprintf(stderr, "ridgekv ask: %s (%s, %s template), %d document%s, prompt %zu tokens, context %lld\n",
                rk_model_name(m), rk_model_hparams(m)->arch_name, rk_chat_family_name(rk_conv_family(conv)), n_docs,
                n_docs == 1 ? "" : "s", n_ids, (long long)n_ctx);
    accelerations(&o, maps, s, (int64_t)n_ids);
    if (o.verbose_prompt) cli_show_prompt("ask", m, ids, n_ids);

    cli_progress pr;
    cli_sink out = {.f = stdout, .sigint_stops = true};
    rk_gen_params gp = cli_gen_params(&o);
    gp.progress = cli_progress_fn;
    gp.progress_ud = &pr;
    gp.on_token = cli_sink_token;
    gp.token_ud = &out;
    if ((rc = cli_gen_grammar("ask", &o, &gram))) goto done;
    gp.grammar = gram;
    cli_sigint_install(true);
    cli_progress_start(&pr, "ask", (int64_t)n_ids);
    cli_eta_cost_units(&pr.eta); /* the session reports cost-weighted tokens (runtime/prefill/cost.c) */
    /* the documents first (from the document cache when it holds them), then the question */
    cli_prefix pre = {0};
    rk_doc_cache *dc = o.no_cache ? NULL : cli_doc_cache_open(&o, "ask");
    st =
        cli_doc_prefix(&o, "ask", dc, m, s, o.system, docs, (size_t)n_docs, ids, n_ids, cli_progress_fn, &pr, &pre, &e);
    rk_doc_cache_close(dc);
    cli_prefix_progress rest = {cli_progress_fn, &pr, pre.n_prefix, 0};
    gp.progress = cli_prefix_progress_fn;
    gp.progress_ud = &rest;
    if (!st) st = rk_conv_generate(conv, &gp, &r, &e);
    cli_progress_end(&pr);
    r.n_prefill += pre.n_read;
    r.filled_rows += pre.filled;
    r.prefill_s += pre.read_s;
    if (r.prefill_s > 0) r.prefill_tok_s = (double)r.n_prefill / r.prefill_s;
    if (r.ttft_s >= 0) r.ttft_s += pre.read_s;
    if (st == RK_E_CANCELLED) {
        fprintf(stderr, "ridgekv ask: stopped while reading the documents (Ctrl-C)\n");
        rc = 130;
        goto done;
    }
    if (st) goto fail;
    cli_sink_rest(&out, &r);
    if (!out.failed) fputc('\n', stdout);
    if ((rc = cli_sink_check("ask", &out))) goto done;
    const bool stopped = r.stop == RK_STOP_CANCELLED;
    cli_cut_marker("ask", &o, &r, rk_conv_last_fit(conv).n_answer_cap, false);
    if (stopped) fprintf(stderr, "ridgekv ask: answer stopped (Ctrl-C)\n");
    if (r.stop == RK_STOP_CONTEXT)
        fprintf(stderr, "ridgekv ask: context full (%lld tokens); the answer is cut\n", (long long)n_ctx);
    fprintf(stderr,
            "ridgekv ask: read %lld tokens in %.2f s (%.1f tok/s); time to first token %.2f s; "
            "answer %lld tokens in %.2f s (%.1f tok/s)\n",
            (long long)r.n_prefill, r.prefill_s, r.prefill_tok_s, r.ttft_s >= 0 ? r.ttft_s : r.prefill_s,
            (long long)r.n_gen, r.decode_s, r.decode_tok_s);
    rk_fill_rescore_stats rs;
    rk_session_fill_rescore_stats(s, &rs);
    if (rs.calls > 0) /* quality mode: the question chose the documents' exact rows again (prefill.c) */
        fprintf(stderr,
                "ridgekv ask: re-scored %lld document rows for the question: %lld changed, %lld recomputed "
                "exactly, %lld refilled, in %.2f s\n",
                (long long)rs.scored, (long long)rs.changed, (long long)rs.recomputed, (long long)rs.refilled,
                rs.seconds);
    cli_kv_budget_check("ask", s);
    if (o.verbose) cli_gen_verbose("ask", s, &o, &r);
    rc = stopped ? 130 : RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    rk_json_grammar_destroy(gram);
    cli_sigint_restore();
    cli_docs_free(d, n_docs);
    free(joined);
    rk_gen_result_deinit(&r);
    free(ids);
    rk_conv_destroy(conv);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
