/* `ridgekv eval needle`: passkey retrieval with the needle inside the bulk region, every
 * fill mode (or, with --kv-modes, every KV policy) on the same prompt (paired), McNemar
 * against off or the first policy (SPEC §2, line 1). The run is the eval library's
 * (ev_needle_run); this file parses flags, makes the sessions and prints. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_gen.h"
#include "eval_cli.h"
#include "long_cli.h"

static const char *help =
    "usage: ridgekv eval needle [-m MODEL] [--ridgefill MAPS] [--fill off,speed,quality] [--tail 512]\n"
    "                          [--lengths 1024,2048] [--depths 0.1,0.3,0.5,0.7,0.9] [--trials 200]\n"
    "                          [--files F1,F2] [--corpus DIR] [--seed N] [--distractors N] [-t T] [--json]\n"
    "                          [--results FILE.jsonl [--budget SECONDS]]\n"
    "       ridgekv eval needle [-m MODEL] --kv-modes f16,lowram,lowram:budget=1024,q8,q4 [--tail 512]\n"
    "                          [--lengths 4096,8192] [...the flags above but --fill, --ridgefill, --split, --kv]\n"
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
    "With --kv-modes the modes are KV cache policies instead, compared the same way: fill is off\n"
    "for every one, each runs on a session of its own policy, and the first item is the reference\n"
    "that b, c and p are against (as off is for fill modes).\n"
    "\n";
/* the options (a second string: C99 promises string literals of 4095 bytes only) */
static const char *help_options =
    "  --ridgefill MAPS  map file from `ridgekv calibrate`\n"
    "  --fill LIST       modes to compare; off is always included (default off,speed,quality with\n"
    "                    maps; off,identity needs --split S). default: what ask runs with no flag\n"
    "                    (as for eval nll: KV policy and budget of the length, the cached maps'\n"
    "                    fill, sparse attention; off then exact: f16 KV, dense), one policy for\n"
    "                    every --lengths item (else refused: run the lengths apart)\n"
    "  --kv-modes LIST   KV policies to compare, each an item of --kv (f16, f32, q8, q4,\n"
    "                    lowram[:opts]); the first is the reference. Items are separated by commas:\n"
    "                    a new item starts at f16, f32, q8, q4 or lowram, any other comma-separated\n"
    "                    token continues the lowram options before it (as bench's --kv list), so\n"
    "                    f16,lowram:budget=1024,window=64,q8 is three policies. A repeated item runs\n"
    "                    again as ITEM#2 (a null comparison: it must show b = c = 0). Refused with\n"
    "                    --fill, --ridgefill, --split or --kv. LowRAM keeps the last 128 rows exact\n"
    "                    (window) and compresses nothing below start=3072 prompt rows (at most half\n"
    "                    the model's context): give lengths >= 4096 (8192 with --trials 200\n"
    "                    or more for a paired verdict) for the needle to land in compressed rows, or\n"
    "                    lowram:start=0 on short prompts\n";
static const char *help_options2 =
    "  --tail T          exact tail (default 512 here; >= 512); with --kv-modes, the needle still\n"
    "                    has >= T prompt tokens after it (past LowRAM's window when T > 128)\n"
    "  --lengths LIST    prompt lengths in tokens (default 1024,2048)\n"
    "  --depths LIST     needle depths as fractions of the bulk region (default 0.1,0.3,0.5,0.7,0.9)\n"
    "  --trials N        total trials over lengths x depths (default 200)\n"
    "  --gen N           greedy answer tokens (default 16; stops early at the key or end of turn)\n"
    "  --files LIST      haystack text files (default " EV_DEFAULT_FILES ")\n"
    "  --corpus DIR      where bare file names are looked up (default $RIDGEKV_CORPUS or ../shared/corpus)\n"
    "  --wordings N      cycle over N wordings of the needle sentence and its question (1-4,\n"
    "                    default 4; 1: only the passkey wording above); trial t uses wording\n"
    "                    (t / cells) % N, so every length x depth cell sees each wording\n"
    "  --distractors N   also insert N (0-3) sentences of the other wordings, each with a key of\n"
    "                    its own, at random depths of the bulk region away from the needle: the\n"
    "                    model must retrieve the fact asked for among similar ones. An answer\n"
    "                    with a distractor's key counts as wrong (lured; counted per mode)\n"
    "  --seed N          haystack windows, depths and keys (default 1)\n"
    "  --obs N, --baseline N, --score-layers N, --score-skip N, --pool R, --keep-share X:\n"
    "                    quality mode's question rows (32), baseline rows before them whose\n"
    "                    attention is subtracted (= obs; 0: none), scoring layers (3) below the\n"
    "                    split after skipping the ones right below it (2), max-pool radius (8;\n"
    "                    0: none), share of bulk rows kept exact (the map's, 0.1, and at least\n"
    "                    4096 rows up to a quarter of them; a share given is taken as it is)\n"
    "  --band N          quality mode: the last N bulk rows (nearest the tail) kept exact out\n"
    "                    of that share, the rest by score (default 0: none)\n"
    "  --fill-group G    quality/speed: late layers see runs of up to G filled rows as one\n"
    "                    row (mean K/V, bias log count; default 16, 0: every row)\n"
    "  --results FILE    resumable run: each paired trial is appended to FILE (JSON lines) as it\n"
    "                    ends; trials already there are not run again, and the tables cover every\n"
    "                    trial in the file. The file's header holds the settings (binary, model,\n"
    "                    maps, haystacks, flags, KV modes); a file of other settings is refused\n"
    "                    naming them.\n"
    "                    --trials may grow from run to run\n"
    "  --budget S        with --results: start no new trial once S seconds would be passed (its\n"
    "                    time is guessed from this run's trials, scaled by length^1.5)\n"
    "  --json            one JSON object (with every trial's answers) on stdout instead of tables\n";

static void print_tables(const ev_needle_params *p, const ev_needle_result *r, const rk_model *m, const cli_opts *o,
                         int split) {
    const ev_modes *mo = &p->modes;
    printf("eval needle: %s, %d trials (lengths", rk_model_name(m), r->n_trials);
    for (int i = 0; i < p->n_lens; i++) printf("%s%d", i ? "," : " ", p->lens[i]);
    printf(" x depths");
    for (int i = 0; i < p->n_depths; i++) printf("%s%.2g", i ? "," : " ", p->depths[i]);
    if (mo->by_kv)
        printf("), tail %d, fill off, KV policies against %s, seed %llu\n", o->tail, ev_modes_label(mo, 0),
               (unsigned long long)p->seed);
    else
        printf("), tail %d, split %d, seed %llu%s%s\n", o->tail, split, (unsigned long long)p->seed,
               o->ridgefill ? ", maps " : "", o->ridgefill ? o->ridgefill : "");
    int w = 9; /* the mode column: as wide as the longest label */
    for (int mi = 0; mi < r->n_modes; mi++) {
        const int l = (int)strlen(ev_modes_label(mo, mi));
        w = l > w ? l : w;
    }
    printf("%-*s %9s %9s %7s %7s %10s %11s\n", w, "mode", "correct", "accuracy", "b", "c", "McNemar p", "prefill s");
    for (int mi = 0; mi < r->n_modes; mi++) {
        int k, b, c;
        ev_needle_count(r, mi, &k, &b, &c);
        char ks[32];
        snprintf(ks, sizeof ks, "%d/%d", k, r->n_trials);
        const char *name = ev_modes_label(mo, mi);
        if (mi == 0)
            printf("%-*s %9s %9.3f %7s %7s %10s %11.3f\n", w, name, ks, (double)k / r->n_trials, "-", "-", "-",
                   r->prefill_s[mi] / r->n_trials);
        else
            printf("%-*s %9s %9.3f %7d %7d %10.3g %11.3f\n", w, name, ks, (double)k / r->n_trials, b, c,
                   ev_mcnemar_p(b, c), r->prefill_s[mi] / r->n_trials);
    }
    printf("b: %s right and mode wrong; c: %s wrong and mode right (paired trials, same prompts)\n",
           ev_modes_label(mo, 0), ev_modes_label(mo, 0));
    if (p->n_distractors > 0) {
        printf("%d distractors per prompt; answers with a distractor's key (lured):", p->n_distractors);
        for (int mi = 0; mi < r->n_modes; mi++)
            printf("%s %s %d", mi ? "," : "", ev_modes_label(mo, mi), ev_needle_lured(r, mi));
        printf("\n");
    }
    for (int mi = 0; mi < r->n_modes; mi++) {
        int full = 0, any = 0, n = 0;
        for (int t = 0; t < r->n_trials; t++) {
            const int64_t k = r->kept[t * r->n_modes + mi];
            if (k < 0) continue;
            n++;
            full += k == r->trials[t].needle_len;
            any += k > 0;
        }
        if (n)
            printf("%s: the selection kept the whole needle exact in %d of %d trials, part of it in %d\n",
                   ev_modes_label(mo, mi), full, n, any - full);
    }
    for (int pass = 0; pass < 2; pass++) {
        int n_cells = pass ? p->n_lens : p->n_depths;
        printf("\naccuracy by %s\n%-10s %6s", pass ? "length (tokens)" : "depth (fraction of the bulk region)",
               pass ? "length" : "depth", "n");
        for (int mi = 0; mi < r->n_modes; mi++) printf(" %9s", ev_modes_label(mo, mi)); /* %9s: at least 9 wide */
        printf("\n");
        for (int ci = 0; ci < n_cells; ci++) {
            int n = 0, k = 0;
            ev_needle_cell(r, 0, pass, ci, &n, &k);
            if (pass) printf("%-10d %6d", p->lens[ci], n);
            else printf("%-10.2f %6d", p->depths[ci], n);
            for (int mi = 0; mi < r->n_modes; mi++) {
                ev_needle_cell(r, mi, pass, ci, &n, &k);
                const int l = (int)strlen(ev_modes_label(mo, mi));
                printf(" %*.3f", l > 9 ? l : 9, n ? (double)k / n : NAN);
            }
            printf("\n");
        }
    }
}

static json_object *mode_json(const ev_needle_params *p, const ev_needle_result *r, int mi) {
    json_object *j = json_object_new_object();
    int k, b, c;
    ev_needle_count(r, mi, &k, &b, &c);
    ev_json_str(j, "mode", ev_modes_label(&p->modes, mi));
    char kv[256];
    rk_kv_params_format(&p->modes.kv[mi], kv, sizeof kv);
    ev_json_str(j, "kv", kv);
    ev_json_int(j, "correct", k);
    ev_json_int(j, "n", r->n_trials);
    ev_json_num(j, "accuracy", (double)k / r->n_trials);
    ev_json_int(j, "b", b);
    ev_json_int(j, "c", c);
    ev_json_num(j, "p_mcnemar", ev_mcnemar_p(b, c));
    ev_json_num(j, "prefill_s_mean", r->prefill_s[mi] / r->n_trials);
    if (p->n_distractors > 0) ev_json_int(j, "lured", ev_needle_lured(r, mi));
    for (int pass = 0; pass < 2; pass++) {
        json_object *arr = json_object_new_array();
        for (int ci = 0; ci < (pass ? p->n_lens : p->n_depths); ci++) {
            int n, kk;
            ev_needle_cell(r, mi, pass, ci, &n, &kk);
            json_object *cell = json_object_new_object();
            if (pass) ev_json_int(cell, "length", p->lens[ci]);
            else ev_json_num(cell, "depth", p->depths[ci]);
            ev_json_int(cell, "n", n);
            ev_json_int(cell, "correct", kk);
            ev_json_num(cell, "accuracy", n ? (double)kk / n : NAN);
            json_object_array_add(arr, cell);
        }
        json_object_object_add(j, pass ? "by_length" : "by_depth", arr);
    }
    return j;
}

static void print_json(const ev_needle_params *p, const ev_needle_result *r, const ev_corpus *c, const rk_model *m,
                       const cli_opts *o, int split, double seconds) {
    json_object *j = json_object_new_object();
    ev_json_str(j, "command", "needle");
    ev_json_str(j, "model", rk_model_name(m));
    ev_json_str(j, "maps", o->ridgefill);
    if (p->modes.by_kv) {
        json_object *kv = json_object_new_array();
        for (int mi = 0; mi < p->modes.n; mi++)
            json_object_array_add(kv, json_object_new_string(ev_modes_label(&p->modes, mi)));
        json_object_object_add(j, "kv_modes", kv);
    } else ev_json_str(j, "kv", o->kv ? o->kv : "f16");
    ev_json_int(j, "split", split);
    ev_json_int(j, "tail", o->tail);
    ev_json_int(j, "seed", (int64_t)p->seed);
    ev_json_int(j, "distractors", p->n_distractors);
    ev_json_int(j, "fill_group", p->modes.fill.group);
    ev_json_int(j, "trials", r->n_trials);
    ev_json_lens_depths(j, p);
    json_object *a = json_object_new_array();
    for (int mi = 0; mi < r->n_modes; mi++) json_object_array_add(a, mode_json(p, r, mi));
    json_object_object_add(j, "modes", a);
    a = json_object_new_array();
    for (int t = 0; t < r->n_trials; t++) {
        const ev_needle_trial *tr = &r->trials[t];
        json_object *tj = json_object_new_object(), *answers = json_object_new_object();
        ev_json_int(tj, "length", p->lens[tr->len_i]);
        ev_json_num(tj, "depth", p->depths[tr->depth_i]);
        ev_json_int(tj, "needle_pos", tr->needle_pos);
        ev_json_int(tj, "needle_len", tr->needle_len);
        ev_json_int(tj, "wording", tr->wording);
        ev_json_int(tj, "bulk_end", tr->bulk_end);
        ev_json_int(tj, "key", tr->key);
        ev_json_str(tj, "file", c->docs[tr->doc].path);
        ev_json_int(tj, "offset", (int64_t)tr->off);
        if (tr->n_distr) json_object_object_add(tj, "distractors", cli_needle_distractors_json(tr));
        for (int mi = 0; mi < r->n_modes; mi++) {
            json_object *an = json_object_new_object();
            ev_json_str(an, "answer", r->answers + ((size_t)t * (size_t)r->n_modes + (size_t)mi) * EV_ANSWER_BYTES);
            json_object_object_add(an, "correct", json_object_new_boolean(r->correct[t * r->n_modes + mi]));
            if (tr->n_distr)
                json_object_object_add(an, "lured", json_object_new_boolean(r->lured[t * r->n_modes + mi]));
            if (r->kept[t * r->n_modes + mi] >= 0) ev_json_int(an, "needle_kept", r->kept[t * r->n_modes + mi]);
            json_object_object_add(answers, ev_modes_label(&p->modes, mi), an);
        }
        json_object_object_add(tj, "answers", answers);
        json_object_array_add(a, tj);
    }
    json_object_object_add(j, "trial_results", a);
    ev_json_num(j, "seconds", seconds);
    ev_json_print(j, false);
}

/* --kv-modes LIST into p->modes (the flags that choose a fill or one KV policy refused). */
static int parse_kv_modes(const char *list, const cli_opts *o, ev_modes *out) {
    const char *cmd = "eval needle", *clash = o->fill        ? "--fill"
                                              : o->ridgefill ? "--ridgefill"
                                              : o->split     ? "--split"
                                              : o->kv        ? "--kv"
                                                             : NULL;
    if (clash) {
        fprintf(stderr,
                "ridgekv %s: --kv-modes compares KV policies with fill off for every one; %s does not go "
                "with it (compare fill modes with --fill, or put the policy in the --kv-modes list)\n",
                cmd, clash);
        return RK_EXIT_USAGE;
    }
    char items[EV_MAX_MODES + 1][1200]; /* one more than allowed: "too many" is told, not cut */
    const int n = cli_kv_split(list, items, EV_MAX_MODES + 1);
    if (n < 1) {
        fprintf(stderr,
                "ridgekv %s: --kv-modes expects a comma list of at most %d KV policies (f16, f32, q8, q4, "
                "lowram[:opts]; got '%.200s')\n",
                cmd, EV_MAX_MODES, list);
        return RK_EXIT_USAGE;
    }
    const char *ptr[EV_MAX_MODES + 1];
    for (int i = 0; i < n; i++) ptr[i] = items[i];
    rk_err e = {0};
    if (ev_parse_kv_modes(ptr, n, out, &e)) return cli_ev_fail(cmd, &e);
    return 0;
}

/* The flags into p (and o). */
static int parse(int argc, char **argv, cli_opts *o, ev_needle_params *p, const char **files, const char **corpus,
                 const char **results) {
    const char *cmd = "eval needle", *f_depths = "0.1,0.3,0.5,0.7,0.9", *f_lens = "1024,2048", *f_trials = "200",
               *f_gen = "16", *f_words = "4", *f_budget = "0", *f_kv_modes = NULL, *f_distr = "0";
    ev_flag flags[] = {{"--depths", &f_depths},     {"--lengths", &f_lens},     {"--trials", &f_trials},
                       {"--gen", &f_gen},           {"--files", files},         {"--corpus", corpus},
                       {"--wordings", &f_words},    {"--results", results},     {"--budget", &f_budget},
                       {"--kv-modes", &f_kv_modes}, {"--distractors", &f_distr}};
    char **av = NULL;
    int ac = 0, n_pos = 0;
    rk_err e = {0};
    if (ev_take_flags(argc, argv, flags, (int)(sizeof flags / sizeof flags[0]), &av, &ac, &e))
        return cli_ev_fail(cmd, &e);
    const char *pos[1];
    int rc = cli_parse(ac, av, 3, o, pos, 0, &n_pos, cmd);
    free(av);
    if (rc) return rc;
    long trials, gen, words, distr;
    if (ev_parse_doubles(f_depths, 0.0, 1.0, p->depths, EV_MAX_LIST, &p->n_depths, "--depths", &e) ||
        ev_parse_ints(f_lens, 64, 1 << 20, p->lens, EV_MAX_LIST, &p->n_lens, "--lengths", &e) ||
        ev_parse_int(f_trials, 1, 1000000, &trials, "--trials", &e) || ev_parse_int(f_gen, 1, 256, &gen, "--gen", &e) ||
        ev_parse_int(f_words, 1, EV_NEEDLE_WORDINGS, &words, "--wordings", &e) ||
        ev_parse_int(f_distr, 0, EV_NEEDLE_WORDINGS - 1, &distr, "--distractors", &e) ||
        ev_parse_double(f_budget, 0.0, 1e9, &p->budget_s, "--budget", &e))
        return cli_ev_fail(cmd, &e);
    if (p->budget_s > 0 && !*results) {
        fprintf(stderr, "ridgekv %s: --budget needs --results FILE (the trials past it are run later from there)\n",
                cmd);
        return RK_EXIT_USAGE;
    }
    p->n_trials = (int)trials;
    p->gen = (int)gen;
    p->n_wordings = (int)words;
    p->n_distractors = (int)distr;
    p->seed = o->sp.seed;
    if (!o->tail) o->tail = 512;
    if (f_kv_modes) return parse_kv_modes(f_kv_modes, o, &p->modes);
    if (!o->fill && !o->ridgefill && !o->split) {
        fprintf(stderr,
                "ridgekv %s: nothing to compare: give --ridgefill MAPS (or --split S with --fill "
                "off,identity)\n",
                cmd);
        return RK_EXIT_USAGE;
    }
    return 0;
}

/* One session per KV mode, its policy with the flags' threads and tiers, all on one
 * backend (one thread pool for the process); every mode checked to take fill off. */
static int open_kv_sessions(const cli_opts *o, const rk_model *m, int n_ctx, const ev_modes *mo, rk_backend **be,
                            rk_session **s) {
    rk_session_params sp;
    int rc = cli_session_params(o, &sp);
    if (rc) return rc;
    sp.n_ctx = n_ctx;
    rk_err e = {0};
    rk_status st = rk_backend_open(sp.backend, o->n_threads, be, &e);
    if (st) {
        cli_print_error(&e);
        return cli_exit_code(st);
    }
    int mi = 0;
    for (; mi < mo->n; mi++) {
        sp.kv = mo->kv[mi];
        cli_kv_apply(o, &sp.kv);
        sp.shared_backend = *be;
        if ((st = rk_session_create(m, &sp, &s[mi], &e))) break;
        rk_fill_params fp;
        ev_modes_params(mo, mi, &fp);
        if ((st = rk_session_set_fill(s[mi], &fp, &e))) break;
        const char *w = rk_session_warning(s[mi]);
        if (w[0]) fprintf(stderr, "ridgekv: warning: %s: %s\n", ev_modes_label(mo, mi), w);
    }
    if (!st) return 0;
    fprintf(stderr, "ridgekv eval needle: --kv-modes %s: %s\n", ev_modes_label(mo, mi), e.msg);
    return st == RK_E_INVALID_ARG || st == RK_E_UNSUPPORTED ? RK_EXIT_USAGE : cli_exit_code(st);
}

int cmd_eval_needle(int argc, char **argv) {
    for (int i = 3; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            fputs(help_options, stdout);
            fputs(help_options2, stdout);
            return RK_EXIT_OK;
        }
    const char *cmd = "eval needle", *files = EV_DEFAULT_FILES, *corpus = NULL, *results = NULL;
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = -1.0f};
    o.sp.seed = 1;
    ev_needle_params p = {0};
    int rc = parse(argc, argv, &o, &p, &files, &corpus, &results);
    if (rc) return rc;
    p.sampler = &o.sp; /* the penalty flags (--repeat-penalty, --dry-multiplier, ...) */
    rk_model *m = NULL;
    rk_session *s[EV_MAX_MODES] = {0}, *base = NULL, *owned[EV_MAX_MODES] = {0};
    rk_backend *be = NULL;
    rk_ridge_maps *maps = NULL;
    ev_corpus c = {0};
    ev_needle_result r = {0};
    cli_needle_log lg = {.fd = -1};
    rk_err e = {0};
    int n_ctx = 0;
    if ((rc = cli_load_model(&o, &m)) || (rc = cli_ev_corpus(&c, m, files, cli_ev_corpus_dir(corpus), cmd))) goto done;
    p.modes.fill.tail = o.tail;
    if (ev_needle_plan(m, &p, &n_ctx, &e)) {
        rc = cli_ev_fail(cmd, &e);
        goto done;
    }
    if (!p.modes.by_kv && cli_ev_lists_default(o.fill)) { /* the RoPE the longest length needs, as ask applies it */
        cli_opts lo = o;
        lo.kv = "f16"; /* RoPE only here; default's KV: cli_ev_sessions */
        if ((rc = cli_long_apply(cmd, &lo, m, n_ctx - p.gen, n_ctx, NULL))) goto done;
    }
    for (int i = 0; i < p.n_lens; i++)
        if (p.lens[i] > rk_model_n_ctx_max(m))
            fprintf(stderr, "ridgekv %s: warning: length %d exceeds the model's context %lld\n", cmd, p.lens[i],
                    (long long)rk_model_n_ctx_max(m));
    if (o.n_ctx && o.n_ctx < n_ctx) {
        fprintf(stderr, "ridgekv %s: -c %d is below the longest prompt plus answer (%d)\n", cmd, o.n_ctx, n_ctx);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    if (p.modes.by_kv) {
        if ((rc = open_kv_sessions(&o, m, o.n_ctx ? o.n_ctx : n_ctx, &p.modes, &be, s))) goto done;
    } else {
        /* fill modes share the session, but off and default with default in the list */
        const int nc = o.n_ctx ? o.n_ctx : n_ctx;
        if ((rc = cli_open_session(&o, m, nc, &base)) || (rc = cli_ev_modes(&o, m, base, &maps, &p.modes, cmd)) ||
            (rc = cli_ev_sessions(&o, m, p.lens, p.n_lens, p.gen, nc, base, &p.modes, s, owned, cmd)))
            goto done;
    }
    const int split = maps ? rk_ridge_maps_split(maps) : o.split;
    unsigned char *skip = NULL;
    if (results) { /* earlier trials from the file; this run adds the missing ones */
        char modes[128] = "";
        if (p.modes.by_kv) snprintf(modes, sizeof modes, "off"); /* every KV mode's fill; policies: kv_modes */
        for (int mi = 0; mi < p.modes.n && !p.modes.by_kv; mi++)
            snprintf(modes + strlen(modes), sizeof modes - strlen(modes), "%s%s", mi ? "," : "",
                     ev_modes_label(&p.modes, mi));
        json_object *set = cli_needle_settings(&o, m, &p, &c, modes, split);
        rc = cli_needle_log_open(&lg, results, set, &p.modes);
        json_object_put(set);
        if (rc) goto done;
        if (lg.max_trial + 1 > p.n_trials) p.n_trials = lg.max_trial + 1;
        skip = calloc((size_t)p.n_trials, 1);
        if (!skip) {
            rc = RK_EXIT_ERROR;
            goto done;
        }
        for (int i = 0; i < lg.n; i++) skip[json_object_get_int(json_object_object_get(lg.rec[i], "trial"))] = 1;
        lg.params = &p, lg.corpus = &c;
        p.skip = skip, p.on_trial = cli_needle_log_append, p.trial_ud = &lg;
        fprintf(stderr, "ridgekv %s: results file %s holds %d trials; running the missing ones of %d%s\n", cmd, results,
                lg.n, p.n_trials, p.budget_s > 0 ? " within the budget" : "");
    }
    cli_ev_progress prog;
    cli_ev_progress_init(&prog, "eval needle: trial");
    p.progress = cli_ev_progress_fn;
    p.progress_ud = &prog;
    rk_status st = ev_needle_run(m, s, &c, &p, &r, &e);
    free(skip);
    if (st) {
        cli_print_error(&e);
        rc = st == RK_E_INVALID_ARG ? RK_EXIT_USAGE : cli_exit_code(st);
        goto done;
    }
    if (results) {
        if ((rc = cli_needle_log_merge(&lg, &r))) goto done;
        int undone = 0;
        for (int t = 0; t < r.n_trials; t++) undone += !r.done[t];
        fprintf(stderr, "ridgekv %s: results file %s: %d trials (%d new in this run)%s\n", cmd, results,
                r.n_trials - undone, lg.appended, undone ? "; the budget ran out, run again to go on" : "");
    }
    ev_needle_result_compact(&r);
    if (r.n_trials == 0) {
        fprintf(stderr, "ridgekv %s: no trial done yet (the budget is shorter than one trial)\n", cmd);
        rc = RK_EXIT_USAGE;
        goto done;
    }
    if (o.json) print_json(&p, &r, &c, m, &o, split, rk_time_now() - prog.t0);
    else print_tables(&p, &r, m, &o, split);
    rc = RK_EXIT_OK;
done:
    cli_needle_log_close(&lg);
    ev_needle_result_free(&r);
    ev_corpus_deinit(&c);
    for (int mi = 0; mi < EV_MAX_MODES; mi++) { /* fill modes share base */
        if (p.modes.by_kv) rk_session_destroy(s[mi]);
        rk_session_destroy(owned[mi]);
    }
    rk_session_destroy(base);
    rk_backend_close(be);
    rk_ridge_maps_destroy(maps);
    rk_model_destroy(m);
    return rc;
}
