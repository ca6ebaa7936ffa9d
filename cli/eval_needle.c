/* `ridgekv eval needle`: passkey retrieval with the needle inside the bulk region, every
 * fill mode on the same prompt (paired), McNemar against off (SPEC §2, line 1). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "eval_common.h"

static const char *help =
    "usage: ridgekv eval needle [-m MODEL] [--ridgefill MAPS] [--fill off,speed,quality] [--tail 512]\n"
    "                          [--lengths 1024,2048] [--depths 0.1,0.3,0.5,0.7,0.9] [--trials 200]\n"
    "                          [--files F1,F2] [--corpus DIR] [--seed N] [-t T] [--json]\n"
    "\n"
    "Passkey retrieval with the needle in the bulk region (rows with at least --tail prompt tokens\n"
    "after them, which RidgeFill fills). Each trial takes a random window of a corpus file as the\n"
    "haystack, inserts \"The secret passkey is NNNNN. Remember it.\" (random 5-digit key) at a depth\n"
    "given as a fraction of the bulk region (so the whole needle has >= tail tokens after it),\n"
    "and asks, in the model's chat template, \"What is the secret passkey? Answer with the number\n"
    "only.\" The prompt is exactly LENGTH tokens (template and question included). Every mode runs\n"
    "on the same prompt; the answer is --gen greedy tokens (decode is always exact) and counts as\n"
    "correct when it contains the key. Trials cycle over lengths x depths.\n"
    "Reported per mode: accuracy (overall, per depth, per length), the discordant pairs against\n"
    "off (b: off right, mode wrong; c: off wrong, mode right), the exact two-sided McNemar p, and\n"
    "the mean prefill time.\n"
    "\n"
    "  --ridgefill MAPS  map file from `ridgekv calibrate`\n"
    "  --fill LIST       modes to compare; off is always included (default off,speed,quality with\n"
    "                    maps; off,identity needs --split S)\n"
    "  --tail T          exact tail (default 512 here; >= 512)\n"
    "  --lengths LIST    prompt lengths in tokens (default 1024,2048)\n"
    "  --depths LIST     needle depths as fractions of the bulk region (default 0.1,0.3,0.5,0.7,0.9)\n"
    "  --trials N        total trials over lengths x depths (default 200)\n"
    "  --gen N           greedy answer tokens (default 16; stops early at the key or end of turn)\n"
    "  --files LIST      haystack text files (default " EV_DEFAULT_FILES ")\n"
    "  --corpus DIR      where bare file names are looked up (default $RIDGEKV_CORPUS or ../shared/corpus)\n"
    "  --seed N          haystack windows, depths and keys (default 1)\n"
    "  --json            one JSON object (with every trial's answers) on stdout instead of tables\n";

#define MAX_LIST 16
#define MAX_MODES 6

static const char *question = "What is the secret passkey? Answer with the number only.";
static const char *marker = "@@RIDGEKV_HAYSTACK@@";

static bool word_start(const rk_model *m, int32_t id) {
    char buf[64];
    size_t n = rk_model_token_piece(m, id, false, buf, sizeof buf);
    return n > 0 && n <= sizeof buf && (buf[0] == ' ' || buf[0] == '\n');
}

/* Chat-template text around the haystack, tokenized: prefix (with BOS when the vocab
 * wants it) and suffix (question, end of turn, open assistant turn). */
static rk_status chat_parts(const rk_model *m, int32_t **pre, size_t *n_pre, int32_t **suf, size_t *n_suf,
                            rk_err *e) {
    char content[256];
    snprintf(content, sizeof content, "%s\n\n%s", marker, question);
    rk_chat_msg msg = {"user", content};
    char *txt = NULL;
    rk_status st = rk_chat_format(rk_model_chat_family(m), &msg, 1, true, &txt, e);
    if (st) return st;
    char *at = strstr(txt, marker);
    if (!at) {
        free(txt);
        return rk_err_set(e, RK_E_INTERNAL, "eval needle: chat template dropped the haystack marker");
    }
    const char *rest = at + strlen(marker);
    st = rk_model_tokenize(m, txt, (size_t)(at - txt), true, true, pre, n_pre, e);
    if (!st) st = rk_model_tokenize(m, rest, strlen(rest), false, true, suf, n_suf, e);
    free(txt);
    return st;
}

typedef struct needle_run {
    int n_trials, n_modes, n_lens, n_depths;
    rk_fill_mode modes[MAX_MODES];
    int lens[MAX_LIST];
    double depths[MAX_LIST];
    unsigned char *correct;   /* (n_trials, n_modes) */
    int *t_len, *t_depth;     /* (n_trials) cell of each trial */
    double prefill_s[MAX_MODES];
} needle_run;

/* Correct answers of mode mi and its discordant pairs with off (mode 0): b = off right
 * and mi wrong, c = off wrong and mi right. */
static void count_mode(const needle_run *r, int mi, int *k, int *b, int *c) {
    *k = *b = *c = 0;
    for (int t = 0; t < r->n_trials; t++) {
        bool x = r->correct[t * r->n_modes + mi], x0 = r->correct[t * r->n_modes];
        *k += x;
        *b += x0 && !x;
        *c += !x0 && x;
    }
}

static void print_tables(const needle_run *r, const rk_model *m, const cli_opts *o, int split) {
    printf("eval needle: %s, %d trials (lengths", rk_model_name(m), r->n_trials);
    for (int i = 0; i < r->n_lens; i++) printf("%s%d", i ? "," : " ", r->lens[i]);
    printf(" x depths");
    for (int i = 0; i < r->n_depths; i++) printf("%s%.2g", i ? "," : " ", r->depths[i]);
    printf("), tail %d, split %d, seed %llu%s%s\n", o->tail, split, (unsigned long long)o->sp.seed,
           o->ridgefill ? ", maps " : "", o->ridgefill ? o->ridgefill : "");
    printf("%-9s %9s %9s %7s %7s %10s %11s\n", "mode", "correct", "accuracy", "b", "c", "McNemar p", "prefill s");
    for (int mi = 0; mi < r->n_modes; mi++) {
        int k, b, c;
        count_mode(r, mi, &k, &b, &c);
        char ks[32];
        snprintf(ks, sizeof ks, "%d/%d", k, r->n_trials);
        if (mi == 0)
            printf("%-9s %9s %9.3f %7s %7s %10s %11.3f\n", rk_fill_mode_name(r->modes[mi]), ks,
                   (double)k / r->n_trials, "-", "-", "-", r->prefill_s[mi] / r->n_trials);
        else
            printf("%-9s %9s %9.3f %7d %7d %10.3g %11.3f\n", rk_fill_mode_name(r->modes[mi]), ks,
                   (double)k / r->n_trials, b, c, ev_mcnemar_p(b, c), r->prefill_s[mi] / r->n_trials);
    }
    printf("b: off right and mode wrong; c: off wrong and mode right (paired trials, same prompts)\n");
    for (int pass = 0; pass < 2; pass++) {
        int n_cells = pass ? r->n_lens : r->n_depths;
        printf("\naccuracy by %s\n%-10s %6s", pass ? "length (tokens)" : "depth (fraction of the bulk region)",
               pass ? "length" : "depth", "n");
        for (int mi = 0; mi < r->n_modes; mi++) printf(" %9s", rk_fill_mode_name(r->modes[mi]));
        printf("\n");
        for (int ci = 0; ci < n_cells; ci++) {
            int n = 0, k[MAX_MODES] = {0};
            for (int t = 0; t < r->n_trials; t++) {
                if ((pass ? r->t_len[t] : r->t_depth[t]) != ci) continue;
                n++;
                for (int mi = 0; mi < r->n_modes; mi++) k[mi] += r->correct[t * r->n_modes + mi];
            }
            if (pass) printf("%-10d %6d", r->lens[ci], n);
            else printf("%-10.2f %6d", r->depths[ci], n);
            for (int mi = 0; mi < r->n_modes; mi++) printf(" %9.3f", n ? (double)k[mi] / n : NAN);
            printf("\n");
        }
    }
}

static json_object *mode_json(const needle_run *r, int mi) {
    json_object *j = json_object_new_object();
    int k, b, c;
    count_mode(r, mi, &k, &b, &c);
    ev_json_str(j, "mode", rk_fill_mode_name(r->modes[mi]));
    ev_json_int(j, "correct", k);
    ev_json_int(j, "n", r->n_trials);
    ev_json_num(j, "accuracy", (double)k / r->n_trials);
    ev_json_int(j, "b", b);
    ev_json_int(j, "c", c);
    ev_json_num(j, "p_mcnemar", ev_mcnemar_p(b, c));
    ev_json_num(j, "prefill_s_mean", r->prefill_s[mi] / r->n_trials);
    for (int pass = 0; pass < 2; pass++) {
        json_object *arr = json_object_new_array();
        int n_cells = pass ? r->n_lens : r->n_depths;
        for (int ci = 0; ci < n_cells; ci++) {
            int n = 0, kk = 0;
            for (int t = 0; t < r->n_trials; t++) {
                if ((pass ? r->t_len[t] : r->t_depth[t]) != ci) continue;
                n++;
                kk += r->correct[t * r->n_modes + mi];
            }
            json_object *cell = json_object_new_object();
            if (pass) ev_json_int(cell, "length", r->lens[ci]);
            else ev_json_num(cell, "depth", r->depths[ci]);
            ev_json_int(cell, "n", n);
            ev_json_int(cell, "correct", kk);
            ev_json_num(cell, "accuracy", n ? (double)kk / n : NAN);
            json_object_array_add(arr, cell);
        }
        json_object_object_add(j, pass ? "by_length" : "by_depth", arr);
    }
    return j;
}

int cmd_eval_needle(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    const char *f_depths = "0.1,0.3,0.5,0.7,0.9", *f_lens = "1024,2048", *f_trials = "200", *f_gen = "16",
               *f_files = EV_DEFAULT_FILES, *f_corpus = NULL;
    ev_flag flags[] = {{"--depths", &f_depths}, {"--lengths", &f_lens}, {"--trials", &f_trials},
                       {"--gen", &f_gen}, {"--files", &f_files}, {"--corpus", &f_corpus}};
    char **av = NULL;
    int ac = 0, n_pos = 0;
    int rc = ev_take_flags(argc, argv, flags, 6, &av, &ac, "eval needle");
    if (rc) return rc;
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = -1.0f};
    o.sp.seed = 1;
    const char *pos[1];
    rc = cli_parse(ac, av, 3, &o, pos, 0, &n_pos, "eval needle");
    free(av);
    if (rc) return rc;
    needle_run r = {0};
    long trials, gen;
    if (!ev_parse_doubles(f_depths, 0.0, 1.0, r.depths, MAX_LIST, &r.n_depths, "eval needle", "--depths") ||
        !ev_parse_ints(f_lens, 64, 1 << 20, r.lens, MAX_LIST, &r.n_lens, "eval needle", "--lengths") ||
        !ev_parse_int(f_trials, 1, 1000000, &trials, "eval needle", "--trials") ||
        !ev_parse_int(f_gen, 1, 256, &gen, "eval needle", "--gen"))
        return RK_EXIT_USAGE;
    r.n_trials = (int)trials;
    if (!o.tail) o.tail = 512;
    const char *fill = o.fill ? o.fill : o.ridgefill ? "off,speed,quality" : o.split ? "off,identity" : NULL;
    if (!fill) {
        fprintf(stderr, "ridgekv eval needle: nothing to compare: give --ridgefill MAPS (or --split S with "
                        "--fill off,identity)\n");
        return RK_EXIT_USAGE;
    }
    if ((r.n_modes = ev_parse_modes(fill, r.modes, MAX_MODES, "eval needle")) < 0) return RK_EXIT_USAGE;
    if (!f_corpus) f_corpus = getenv("RIDGEKV_CORPUS");
    if (!f_corpus || !*f_corpus) f_corpus = "../shared/corpus";

    rk_model *m = NULL;
    rk_session *s = NULL;
    rk_ridge_maps *maps = NULL;
    ev_corpus corpus = {0};
    int32_t *pre = NULL, *suf = NULL, *prompt = NULL, *needle = NULL;
    size_t n_pre = 0, n_suf = 0;
    float *logits = NULL;
    json_object *trials_js = NULL;
    rk_err e = {0};
    rk_status st = RK_OK;
    if ((rc = cli_load_model(&o, &m))) return rc;
    const rk_hparams *hp = rk_model_hparams(m);
    if ((rc = ev_corpus_load(&corpus, m, f_files, f_corpus, "eval needle"))) goto done;
    if ((st = chat_parts(m, &pre, &n_pre, &suf, &n_suf, &e))) goto fail;
    /* the needle's length is the same for every 5-digit key (digits tokenize alike) */
    char needle_txt[128];
    size_t n_needle = 0;
    snprintf(needle_txt, sizeof needle_txt, " The secret passkey is %d. Remember it.", 12345);
    if ((st = rk_model_tokenize(m, needle_txt, strlen(needle_txt), false, false, &needle, &n_needle, &e))) goto fail;
    free(needle);
    needle = NULL;
    int max_len = 0;
    for (int i = 0; i < r.n_lens; i++) {
        int L = r.lens[i];
        if ((long)L - o.tail - (long)n_pre - (long)n_needle - 8 < 0 || L < (int)(n_pre + n_suf + n_needle) + 8) {
            fprintf(stderr, "ridgekv eval needle: length %d leaves no room for the needle (%zu tokens) before the "
                            "exact tail of %d (chat prefix %zu, question %zu tokens)\n",
                    L, n_needle, o.tail, n_pre, n_suf);
            rc = RK_EXIT_USAGE;
            goto done;
        }
        if (L > hp->n_ctx_train)
            fprintf(stderr, "ridgekv eval needle: warning: length %d exceeds the model's training context %d\n", L,
                    hp->n_ctx_train);
        max_len = L > max_len ? L : max_len;
    }
    rk_session_params sp;
    cli_session_params(&o, &sp);
    sp.n_ctx = o.n_ctx ? o.n_ctx : max_len + (int)gen;
    if (sp.n_ctx < max_len + (int)gen) {
        fprintf(stderr, "ridgekv eval needle: -c %d is below the longest prompt plus answer (%d)\n", o.n_ctx,
                max_len + (int)gen);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    if ((st = rk_session_create(m, &sp, &s, &e))) goto fail;
    for (int mi = r.n_modes - 1; mi >= 0; mi--) /* checks every mode before the long run; ends on off */
        if ((rc = cli_setup_fill(&o, m, s, &maps, rk_fill_mode_name(r.modes[mi])))) goto done;
    int split = maps ? rk_ridge_maps_split(maps) : o.split;
    r.correct = calloc((size_t)r.n_trials * (size_t)r.n_modes, 1);
    r.t_len = calloc((size_t)r.n_trials, sizeof *r.t_len);
    r.t_depth = calloc((size_t)r.n_trials, sizeof *r.t_depth);
    prompt = malloc((size_t)max_len * sizeof *prompt);
    logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    trials_js = json_object_new_array();
    if (!r.correct || !r.t_len || !r.t_depth || !prompt || !logits || !trials_js) {
        st = rk_err_set(&e, RK_E_NOMEM, "eval needle: out of memory");
        goto fail;
    }
    uint64_t rng = o.sp.seed * 0x2545f4914f6cdd1dull + 17;
    ev_progress prog;
    ev_progress_init(&prog);
    const int n_cells = r.n_lens * r.n_depths;
    for (int t = 0; t < r.n_trials; t++) {
        /* trials cycle over cells so a shorter run stays balanced */
        const int li = (t % n_cells) / r.n_depths, di = (t % n_cells) % r.n_depths, L = r.lens[li];
        r.t_len[t] = li;
        r.t_depth[t] = di;
        const int key = 10000 + (int)ev_rand_below(&rng, 90000);
        snprintf(needle_txt, sizeof needle_txt, " The secret passkey is %d. Remember it.", key);
        if ((st = rk_model_tokenize(m, needle_txt, strlen(needle_txt), false, false, &needle, &n_needle, &e))) goto fail;
        const size_t n_hay = (size_t)L - n_pre - n_suf - n_needle;
        ev_window w;
        if (!ev_corpus_pick(&corpus, n_hay, 1, &rng, &w)) {
            fprintf(stderr, "ridgekv eval needle: no corpus file holds %zu tokens for a haystack\n", n_hay);
            rc = RK_EXIT_USAGE;
            goto done;
        }
        const int32_t *hay = corpus.docs[w.doc].ids + w.off;
        /* needle start inside the haystack: depth of the room before bulk_end, snapped back
         * to a word start so the sentence sits between words */
        const int64_t bulk_end = L - o.tail, room = bulk_end - (int64_t)n_needle - (int64_t)n_pre;
        int64_t ph = room > 0 ? (int64_t)llround(r.depths[di] * (double)room) : 0;
        for (int k = 0; k < 32 && ph > 0 && !word_start(m, hay[ph]); k++) ph--;
        size_t at = 0;
        memcpy(prompt + at, pre, n_pre * sizeof *prompt), at += n_pre;
        memcpy(prompt + at, hay, (size_t)ph * sizeof *prompt), at += (size_t)ph;
        memcpy(prompt + at, needle, n_needle * sizeof *prompt), at += n_needle;
        memcpy(prompt + at, hay + ph, (n_hay - (size_t)ph) * sizeof *prompt), at += n_hay - (size_t)ph;
        memcpy(prompt + at, suf, n_suf * sizeof *prompt), at += n_suf;
        const int64_t needle_pos = (int64_t)n_pre + ph;
        json_object *tj = json_object_new_object();
        ev_json_int(tj, "length", L);
        ev_json_num(tj, "depth", r.depths[di]);
        ev_json_int(tj, "needle_pos", needle_pos);
        ev_json_int(tj, "bulk_end", bulk_end);
        ev_json_int(tj, "key", key);
        ev_json_str(tj, "file", corpus.docs[w.doc].path);
        ev_json_int(tj, "offset", (int64_t)w.off);
        json_object *answers = json_object_new_object();
        char keys[16], detail[160];
        snprintf(keys, sizeof keys, "%d", key);
        int dl = snprintf(detail, sizeof detail, "len %d depth %.2f:", L, r.depths[di]);
        for (int mi = 0; mi < r.n_modes; mi++) {
            if ((rc = cli_setup_fill(&o, m, s, &maps, rk_fill_mode_name(r.modes[mi])))) {
                json_object_put(tj);
                json_object_put(answers);
                goto done;
            }
            rk_session_reset(s);
            double t0 = rk_time_now();
            st = rk_session_eval(s, prompt, (size_t)L, logits, false, &e);
            r.prefill_s[mi] += rk_time_now() - t0;
            char text[512] = "";
            size_t n_text = 0;
            for (int g = 0; g < gen && !st; g++) {
                int32_t best = 0;
                for (int32_t v = 1; v < hp->n_vocab; v++)
                    if (logits[v] > logits[best]) best = v;
                if (rk_model_token_is_eog(m, best)) break;
                size_t pl = rk_model_token_piece(m, best, false, text + n_text, sizeof text - 1 - n_text);
                if (pl <= sizeof text - 1 - n_text) n_text += pl;
                text[n_text] = '\0';
                if (strstr(text, keys) || g + 1 == gen) break;
                st = rk_session_eval(s, &best, 1, logits, false, &e);
            }
            if (st) {
                json_object_put(tj);
                json_object_put(answers);
                goto fail;
            }
            bool ok = strstr(text, keys) != NULL;
            r.correct[t * r.n_modes + mi] = ok;
            json_object *a = json_object_new_object();
            ev_json_str(a, "answer", text);
            json_object_object_add(a, "correct", json_object_new_boolean(ok));
            json_object_object_add(answers, rk_fill_mode_name(r.modes[mi]), a);
            if (dl > 0 && (size_t)dl < sizeof detail)
                dl += snprintf(detail + dl, sizeof detail - (size_t)dl, " %s %s", rk_fill_mode_name(r.modes[mi]),
                               ok ? "ok" : "MISS");
        }
        json_object_object_add(tj, "answers", answers);
        json_object_array_add(trials_js, tj);
        free(needle);
        needle = NULL;
        ev_progress_line(&prog, "eval needle: trial", t + 1, r.n_trials, detail);
    }
    if (o.json) {
        json_object *j = json_object_new_object();
        ev_json_str(j, "command", "needle");
        ev_json_str(j, "model", rk_model_name(m));
        ev_json_str(j, "maps", o.ridgefill);
        ev_json_int(j, "split", split);
        ev_json_int(j, "tail", o.tail);
        ev_json_int(j, "seed", (int64_t)o.sp.seed);
        ev_json_int(j, "trials", r.n_trials);
        json_object *a = json_object_new_array();
        for (int i = 0; i < r.n_lens; i++) json_object_array_add(a, json_object_new_int(r.lens[i]));
        json_object_object_add(j, "lengths", a);
        a = json_object_new_array();
        for (int i = 0; i < r.n_depths; i++) json_object_array_add(a, json_object_new_double(r.depths[i]));
        json_object_object_add(j, "depths", a);
        a = json_object_new_array();
        for (int mi = 0; mi < r.n_modes; mi++) json_object_array_add(a, mode_json(&r, mi));
        json_object_object_add(j, "modes", a);
        json_object_object_add(j, "trial_results", trials_js);
        trials_js = NULL;
        ev_json_num(j, "seconds", rk_time_now() - prog.t0);
        ev_json_print(j, false);
    } else {
        print_tables(&r, m, &o, split);
    }
    rc = RK_EXIT_OK;
    goto done;
fail:
    cli_print_error(&e);
    rc = cli_exit_code(st);
done:
    json_object_put(trials_js);
    free(r.correct);
    free(r.t_len);
    free(r.t_depth);
    free(prompt);
    free(needle);
    free(logits);
    free(pre);
    free(suf);
    ev_corpus_deinit(&corpus);
    rk_session_destroy(s);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
