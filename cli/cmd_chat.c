/* ridgekv chat: a terminal chat over the model's chat template.
 *
 * The conversation is an rk_conv over one session: between turns the cache holds the
 * conversation, each turn reads only the tokens that do not match it, the model's own
 * answer tokens stay as generated, and the overflow rule drops the oldest exchanges
 * (docs/CHAT_ASK.md). This file reads turns, streams answers and prints notices. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "long_cli.h"
#include "chat.h"
#include "suggest.h"

static const char *help =
    "usage: ridgekv chat [-m MODEL | MODEL] [--system TEXT] [options]\n"
    "\n"
    "Talks with the model in the terminal through its chat template (ChatML when the\n"
    "model names none). Answers stream as they are written; the conversation stays in\n"
    "the KV cache between turns, so each turn reads only its own new tokens.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "      --system TEXT       system prompt (always kept, also when old turns are dropped)\n"
    "  -n, --n-predict N       most tokens per answer (default 512; -1 = up to the answer room)\n"
    "  -c, --ctx-size N        context size in tokens (default: the model's; past the trained one\n"
    "                          applies the model's documented RoPE scaling)\n"
    "  -b, --batch-size N      prefill chunk (default 512)\n"
    "  -t, --threads N         threads (default: all cores)\n"
    "      --kv f16|f32|q8|q4|lowram[:opts]  KV cache (default f16; lowram: compressed KV, docs/LOWRAM.md)\n"
    "      --backend cpu|cpu_ref|cuda  kernels (cpu_ref: the scalar oracle, slow; cuda: CUDA builds)\n"
    "      --temp T            temperature (default 0.8; 0 = greedy)\n"
    "      --top-k K           (default 40; 0 = off)\n"
    "      --top-p P           (default 0.95; 1 = off)\n"
    "      --min-p P           (default 0.05; 0 = off)\n" CLI_PENALTY_HELP
    /* the rest in a second string: C99 promises string literals of 4095 bytes */
    ;
static const char *help_rest =
    "      --seed S            sampling seed (default -1: random, printed with -v; N >= 0 repeats a chat)\n"
    "  -r, --stop TEXT         end an answer before TEXT (repeatable, up to 16)\n"
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
    "      --no-ridgefill      exact prefill even when `ridgekv prepare` left maps in the cache\n"
    "      --rope-scaling, --rope-scale, --yarn-*, --ctx-overflow-ok  as in ridgekv run --help\n"
    "  -v, --verbose           model details at the start, timings after each answer (stderr)\n"
    "      --verbose-prompt    print each turn's prompt as the model sees it and its tokens (stderr)\n"
    "\n"
    "In the chat:\n"
    "  a line ending in \\ continues on the next line; a line \"\"\" opens a block that\n"
    "  the next line \"\"\" closes; the history (Up arrow) recalls whole messages\n"
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
    "Each answer is capped by its room: -n tokens, at most a quarter of the context, so\n"
    "the history survives; \"[answer cut: ...]\" on stderr says when -n or the room cut one.\n"
    "When a turn plus room for its answer does not fit, the oldest exchanges are dropped\n"
    "(the system prompt stays), stderr says so, and the rest of the conversation is read\n"
    "again.\n"
    "\n"
    "exit codes: 0 left normally, 2 bad usage, 3 model unusable, 4 system prompt too long\n"
    "for the context, 5 reading input or writing output failed (a closed stdout), 6 no\n"
    "default model, 130 Ctrl-C while waiting for piped input\n";

static void tell_dropped(chat *c) {
    const rk_conv_fit f = rk_conv_last_fit(c->conv);
    if (!f.n_dropped || c->drop_told) return;
    char m[320];
    snprintf(m, sizeof m,
             "context full: %lld tokens + %lld answer room > %lld; dropped the oldest %d exchange%s and "
             "re-read the rest (%lld tokens)",
             (long long)f.n_before, (long long)f.n_room, (long long)f.n_ctx, f.n_dropped, f.n_dropped == 1 ? "" : "s",
             (long long)f.n_prompt);
    chat_notice(c, m);
    c->drop_told = true;
}

/* Prefill progress: the drop and RidgeFill notices before the answer, a bar when the
 * reading takes long; Ctrl-C cancels the reading. */
static bool chat_progress(void *ud, int64_t done, int64_t total) {
    chat *c = ud;
    tell_dropped(c);
    char note[256];
    if (!c->fill_told && cli_fill_applies(&c->o, total, note, sizeof note)) {
        chat_notice(c, note);
        c->fill_told = true;
    }
    cli_progress_update(&c->bar, done, total);
    return !cli_sigint_pending();
}

/* One turn: the user's text in, the answer streamed out. Returns 0 or an exit code. */
static int turn(chat *c, const char *user) {
    rk_err e = {0};
    rk_gen_result r = {0};
    cli_sink out = {.f = stdout, .sigint_stops = true};
    rk_status st = rk_conv_add(c->conv, "user", user, strlen(user), &e);
    if (st) goto fail;
    rk_gen_params gp = cli_gen_params(&c->o);
    gp.progress = chat_progress;
    gp.progress_ud = c;
    gp.on_token = cli_sink_token;
    gp.token_ud = &out;
    c->drop_told = false;
    if (c->o.verbose_prompt) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (rk_conv_prompt(c->conv, &ids, &n_ids, &e) == RK_OK) cli_show_prompt("chat", c->m, ids, n_ids);
        free(ids);
    }
    /* the bar shows only on a terminal and only once reading has taken a second */
    cli_progress_begin_late(&c->bar, "chat", 0, 1.0);
    cli_eta_prior(&c->bar.eta, cli_attn_ratio(rk_model_hparams(c->m)));
    st = rk_conv_generate(c->conv, &gp, &r, &e);
    cli_progress_end(&c->bar);
    tell_dropped(c);
    const rk_conv_fit f = rk_conv_last_fit(c->conv);
    if (st == RK_E_CONTEXT && f.too_long) {
        char m[256];
        snprintf(m, sizeof m,
                 "this message does not fit: %lld tokens with the system prompt and template, context "
                 "%lld tokens; it was not sent",
                 (long long)f.n_prompt, (long long)f.n_ctx);
        chat_notice(c, m);
        rk_conv_pop(c->conv);
        return 0;
    }
    if (st == RK_E_CANCELLED) {
        if (c->interactive) fputc('\n', stderr);
        chat_notice(c, "stopped before the answer; the message was not sent");
        rk_conv_pop(c->conv);
        return 0;
    }
    if (st) goto fail;
    cli_sink_rest(&out, &r);
    const bool stopped = r.stop == RK_STOP_CANCELLED && !out.failed;
    if (stopped && out.n > 0 && out.n < r.n_text) {
        /* the sink wrote nothing after Ctrl-C: the conversation keeps what was shown */
        rk_conv_pop(c->conv);
        if (rk_conv_add(c->conv, "assistant", r.text, out.n, &e)) cli_print_error(&e);
    }
    if (!out.failed) fputc('\n', stdout);
    if (c->interactive && !stopped && !out.failed) fputc('\n', stdout);
    int wrc = cli_sink_check("chat", &out);
    if (wrc) {
        rk_gen_result_deinit(&r);
        return wrc;
    }
    c->last_prefill_n = r.n_prefill;
    c->last_prefill_s = r.prefill_s;
    c->last_decode_n = r.n_gen;
    c->last_decode_s = r.decode_s;
    if (stopped) chat_notice(c, c->interactive ? "stopped" : "answer stopped (Ctrl-C)");
    cli_cut_marker("chat", &c->o, &r, rk_conv_last_fit(c->conv).n_answer_cap, c->interactive);
    if (r.stop == RK_STOP_CONTEXT)
        chat_notice(c, "context full: the answer was cut by the context; the next turn drops the oldest exchanges");
    if (c->o.verbose)
        fprintf(stderr,
                "ridgekv chat: read %lld tokens in %.2f s (%.1f tok/s), wrote %lld tokens (%.1f tok/s), "
                "%lld/%lld in context\n",
                (long long)r.n_prefill, r.prefill_s, r.prefill_tok_s, (long long)r.n_gen, r.decode_tok_s,
                (long long)rk_session_n_past(c->s), (long long)rk_session_n_ctx(c->s));
    cli_kv_budget_check("chat", c->s);
    if (c->o.verbose) cli_gen_verbose("chat", c->s, &c->o, &r);
    rk_gen_result_deinit(&r);
    return 0;
fail:
    fflush(stdout);
    if (out.n) fputc('\n', stdout);
    cli_print_error(&e);
    rk_gen_result_deinit(&r);
    return cli_exit_code(st) ? cli_exit_code(st) : RK_EXIT_ERROR;
}

static int chat_loop(chat *c, cli_lineedit *le) {
    int prompt_interrupts = 0;
    for (;;) {
        cli_sigint_clear();
        char *t = NULL;
        bool had_text = false;
        cli_le_result r = chat_read_turn(c, le, &t, &had_text);
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
        char *s = chat_trim(t);
        int rc = 0;
        if (s[0] == '/' && !strchr(s, '\n')) {
            if (chat_command(c, s)) {
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

/* The system prompt must leave the answer room: exit 4 otherwise. */
static int check_system(chat *c) {
    rk_err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    rk_status st = rk_conv_add(c->conv, "system", c->o.system, strlen(c->o.system), &e);
    if (!st) st = rk_conv_prompt(c->conv, &ids, &n, &e);
    free(ids);
    if (st) {
        cli_print_error(&e);
        return cli_exit_code(st);
    }
    const int64_t room = rk_conv_answer_room(c->conv), n_ctx = rk_session_n_ctx(c->s);
    if ((int64_t)n + room > n_ctx) {
        fprintf(stderr,
                "ridgekv chat: the system prompt is %zu tokens; with %lld tokens of answer room it does not "
                "fit the context of %lld (shorten it, lower -n or raise -c)\n",
                n, (long long)room, (long long)n_ctx);
        return RK_EXIT_CONTEXT;
    }
    return 0;
}

int cmd_chat(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            fputs(help_rest, stdout);
            return RK_EXIT_OK;
        }
    chat c = {.o = {.n_predict = 512, .sp = rk_sampler_params_default()}};
    const char *pos[1];
    int n_pos, rc = cli_parse(argc, argv, 2, &c.o, pos, 1, &n_pos, "chat");
    if (rc) return rc;
    if (n_pos == 1 && !c.o.model && cli_names_model(pos[0])) c.o.model = pos[0], n_pos = 0; /* `chat MODEL` */
    if (n_pos || c.o.prompt || c.o.prompt_file || c.o.out || c.o.chat || c.o.json) {
        fprintf(stderr,
                "ridgekv chat: %s does not apply to chat: type your messages at the prompt or pipe them "
                "to stdin (see ridgekv chat --help)\n",
                n_pos             ? pos[0]
                : c.o.prompt      ? "-p"
                : c.o.prompt_file ? "-f"
                : c.o.out         ? "-o"
                : c.o.chat        ? "--chat"
                                  : "--json");
        return RK_EXIT_USAGE;
    }
    c.interactive = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
    rk_err e = {0};
    rk_status st = RK_OK;
    cli_lineedit *le = NULL;
    /* -c past the trained context turns the model's documented RoPE scaling on (long_cli.h) */
    if ((rc = cli_load_model(&c.o, &c.m)) || (rc = cli_long_apply("chat", &c.o, c.m, 0, 0, NULL)) ||
        (rc = cli_open_session(&c.o, c.m, 0, &c.s)) || (rc = cli_auto_fill(&c.o, c.m, "chat")) ||
        (rc = cli_setup_fill(&c.o, c.m, c.s, &c.maps, NULL)))
        goto done;
    rk_conv_params cp = {.n_answer = c.o.n_predict, .room_div = 4, .drop_oldest = true};
    if ((st = rk_conv_create(c.m, c.s, &cp, &c.conv, &e))) goto fail;
    if (c.o.system && (rc = check_system(&c))) goto done;
    if (!(le = cli_le_open("ridgekv", c.interactive))) {
        st = rk_err_set(&e, RK_E_NOMEM, "chat: out of memory");
        goto fail;
    }
    if (c.interactive || c.o.verbose)
        fprintf(stderr, "ridgekv chat: %s, %s template, context %lld tokens%s%s\n", rk_model_name(c.m),
                rk_chat_family_name(rk_conv_family(c.conv)), (long long)rk_session_n_ctx(c.s),
                c.interactive ? ", line editing: " : "", c.interactive ? cli_le_kind(le) : "");
    if (c.interactive) fprintf(stderr, "/help lists the commands; Ctrl-D leaves.\n");
    cli_seed_note("chat", &c.o);
    cli_sigint_install(false);
    rc = chat_loop(&c, le);
    cli_sigint_restore();
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    cli_le_close(le);
    rk_conv_destroy(c.conv);
    rk_session_destroy(c.s);
    rk_ridge_maps_destroy(c.maps);
    rk_model_destroy(c.m);
    return rc;
}
