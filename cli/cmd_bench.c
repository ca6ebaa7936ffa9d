/* `ridgekv bench`: prefill and decode throughput, peak RSS and KV bytes per token. */
#include <malloc.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_gen.h"
#include "doc_cache_cli.h"
#include "long_cli.h"
#include "rk_experimental.h"

/* Resident set now (MiB), from /proc/self/statm; 0 when unreadable. */
static double rss_now_mib(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (!f) return 0;
    if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
    fclose(f);
    return (double)res * (double)sysconf(_SC_PAGESIZE) / 1048576.0;
}

/* Peak RSS per run in one process: the kernel's high-water mark (VmHWM) is reset to the
 * current RSS by writing 5 to /proc/self/clear_refs (Linux 4.0); freed heap goes back to the
 * system first, so a run's peak holds what is resident during it (weights, its session)
 * and not what an earlier run freed. False when the reset is refused: then no per-run peak. */
static bool peak_reset(void) {
    malloc_trim(0);
    FILE *f = fopen("/proc/self/clear_refs", "w");
    if (!f) return false;
    const bool ok = fputs("5", f) >= 0;
    return fclose(f) == 0 && ok;
}

static double peak_now_mib(void) { return (double)rk_proc_kb_field("/proc/self/status", "VmHWM") / 1048576.0; }

static const char *help =
    "usage: ridgekv bench [-m MODEL] [-p 512,2048] [-n 64] [-t T] [-r REPS] [--kv f16,lowram[:opts]]\n"
    "                     [--ridgefill MAPS --fill off,speed,quality] [-f TEXT] [--json]\n"
    "\n"
    "For each prompt length: prefill that many tokens (TTFT, prefill tokens/s), then decode -n\n"
    "tokens one at a time (decode tokens/s). Token ids are fixed pseudo-random ids, so runs are\n"
    "comparable; with -f, the first tokens of a text file (the attention of text has the\n"
    "structure that sparse attention and RidgeFill's question scoring use, random ids do not).\n"
    "Reports the best of -r repetitions (default 2), KV bytes per token, the RSS\n"
    "after each run and its peak (the high-water mark reset before the run: weights, session\n"
    "and scratch resident during it), and the process's peak.\n"
    "\n"
    "  -m FILE       GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "  -p LIST       comma-separated prompt lengths (default 512,2048)\n"
    "  -n N          decode steps after each prefill (default 64)\n"
    "  -f FILE       prompt: the first -p tokens of this text file (no BOS), which must hold the\n"
    "                longest -p; default: pseudo-random ids\n"
    "  -t N          threads (default: all cores)\n"
    "  -r N          repetitions per length (default 2)\n"
    "  -b N          prefill chunk (default 512)\n"
    "  -c N          context size (default: the model's; 0 = the model's)\n"
    "  --backend cpu|cpu_ref|cuda  kernels\n"
    "  --kv LIST     KV caches to compare in one run: f16, f32, q8, q4, lowram[:opts] (default f16);\n"
    "                KV bytes are counted after the decode steps, by part for lowram\n"
    "  --ridgefill MAPS  RidgeFill maps; --fill off,speed,quality compares modes in one run\n"
    "  --fill LIST   fill modes to run (default off); speedup is TTFT of the first mode / this mode;\n"
    "                --fill off,default compares the defaults with exact: off = no fill, f16 KV, no\n"
    "                budget, dense attention; default = what ask runs with no flag at that length\n"
    "                (KV policy and budget from the length and free memory, the cached maps' fill);\n"
    "                both get the RoPE scaling the longest -p needs (one stderr line says so)\n"
    "  --tail T      exact tail (default 2048; 1536 for speed mode)\n"
    "  --split S     split layer for --fill identity/plumb without maps\n"
    "  --keep-share X  quality mode: share of bulk rows kept exact (default: the map's, 0.1, and at\n"
    "                least 4096 rows up to a quarter of them; a share given is taken as it is)\n"
    "  --band N      quality mode: the last N bulk rows kept exact out of that share (default 0)\n"
    "  --fill-group G  quality/speed: late layers attend to each run of up to G filled rows as one\n"
    "                row (mean K/V, bias log count; default 16, 0: every row); a --fill item\n"
    "                MODE:group=G sets it for that mode only, e.g. --fill off,quality:group=0,quality\n" CLI_SPARSE_HELP
    "  -v            model and fill details on stderr\n"
    "  --kv-budget B KV bytes kept in memory (f16/f32/q8/lowram; 512M, or 25% of the plain KV at the longest\n"
    "                -p + -n); the rest spills to $TMPDIR and is read back: a line per run gives the\n"
    "                hit rate, bytes read back and stall time (docs/TIERS.md)\n"
    "  --kv-host-budget B  --backend cuda, f16/f32 under --kv-budget: pinned host bytes for the cold\n"
    "                layers (512M or 25%); the cold layers past it go to $TMPDIR (docs/GPU.md)\n"
    "  --json        one JSON object on stdout instead of a table\n";

int cmd_bench(int argc, char **argv) {
    int reps = 2;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
    }
    /* -r is bench-only: take it out before the common parser sees it */
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) return RK_EXIT_ERROR;
    int ac = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-r") && i + 1 < argc) {
            reps = atoi(argv[++i]);
            if (reps < 1 || reps > 100) {
                fprintf(stderr, "ridgekv bench: -r expects 1..100\n");
                free(av);
                return RK_EXIT_USAGE;
            }
            continue;
        }
        av[ac++] = argv[i];
    }
    cli_opts o = {.n_predict = 64, .prompt_list = "512,2048", .sp = rk_sampler_params_default()};
    const char *pos[1];
    int n_pos, rc = cli_parse(ac, av, 2, &o, pos, 0, &n_pos, "bench");
    free(av);
    if (rc) return rc;
    int lens[32], n_lens = 0;
    for (const char *p = o.prompt_list; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > (1 << 22) || n_lens == 32 || (*end && *end != ',')) {
            fprintf(stderr, "ridgekv bench: -p expects a list like 512,2048 (got '%s')\n", o.prompt_list);
            return RK_EXIT_USAGE;
        }
        lens[n_lens++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (o.n_predict < 0) o.n_predict = 0;
    rk_model *m = NULL;
    if ((rc = cli_load_model(&o, &m))) return rc;
    int max_len = 0;
    for (int i = 0; i < n_lens; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    /* the RoPE scaling the longest prompt needs, as ask applies it (one line says so); the
     * KV defaults of "default" are taken per length below */
    {
        cli_opts lo = o;
        lo.kv = "f16"; /* RoPE only here */
        if ((rc = cli_long_apply("bench", &lo, m, max_len, (int64_t)max_len + o.n_predict + 1, NULL))) {
            rk_model_destroy(m);
            return rc;
        }
    }
    const rk_hparams *hp = rk_model_hparams(m);
    rk_session_params sp;
    if ((rc = cli_session_params(&o, &sp))) {
        rk_model_destroy(m);
        return rc;
    }
    sp.n_ctx = max_len + o.n_predict + 1;
    const int base_batch = sp.n_batch; /* -b, or 0: the session's */
    sp.kv.budget = cli_kv_budget_share(&o, m, &sp.kv, sp.n_ctx);
    sp.kv.host_budget = cli_kv_host_budget_share(&o, m, &sp.kv, sp.n_ctx);
    rk_err e = {0};
    rk_session *s = NULL;
    rk_status st = rk_session_create(m, &sp, &s, &e);
    int32_t *ids = malloc(((size_t)max_len + 1) * sizeof *ids);
    if (!st && !ids) st = rk_err_set(&e, RK_E_NOMEM, "bench: out of memory");
    if (st) {
        cli_print_error(&e);
        free(ids);
        rk_session_destroy(s);
        rk_model_destroy(m);
        return cli_exit_code(st);
    }
    if (o.prompt_file) { /* text: its first max_len tokens; each -p length takes a prefix */
        int32_t *txt = NULL;
        size_t n_txt = 0;
        rc = cli_read_text_tokens(m, &o.prompt_file, 1, (size_t)max_len, &txt, &n_txt);
        if (!rc && n_txt < (size_t)max_len) {
            fprintf(stderr, "ridgekv bench: %s holds %zu tokens; -p asks for %d (give a longer text or shorter -p)\n",
                    o.prompt_file, n_txt, max_len);
            rc = RK_EXIT_USAGE;
        }
        if (!rc) memcpy(ids, txt, (size_t)max_len * sizeof *ids);
        free(txt);
        if (rc) {
            free(ids);
            rk_session_destroy(s);
            rk_model_destroy(m);
            return rc;
        }
    } else {
        uint64_t rng = 12345;
        for (int i = 0; i < max_len; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            ids[i] = (int32_t)(rng >> 33) % hp->n_vocab;
        }
    }
    /* fill modes to compare in this run (ratios are against the first, usually off) */
    char modes_buf[256];
    snprintf(modes_buf, sizeof modes_buf, "%s", o.fill ? o.fill : "off");
    const char *modes[8];
    int n_modes = 0;
    for (char *tok = strtok(modes_buf, ","); tok && n_modes < 8; tok = strtok(NULL, ",")) modes[n_modes++] = tok;
    bool has_default = false;
    for (int mi = 0; mi < n_modes; mi++) has_default |= !strcmp(modes[mi], "default");
    /* "default" reads with ask's fill: the cached maps of the model when `prepare` left some */
    const char *default_fill = has_default ? cli_long_default_fill(&o, m, "bench") : "off";
    rk_ridge_maps *maps = NULL;
    static char kvs[8][1200];
    int n_kv = o.kv ? cli_kv_split(o.kv, kvs, 8) : 0;
    if (n_kv <= 0) n_kv = 1, strcpy(kvs[0], rk_kv_kind_name(sp.kv.kind));
    static double pf_tps[32][8][8], dc_tps[32][8][8], ttft[32][8][8], rss[32][8][8], rpeak[32][8][8];
    bool peaks = true; /* per-run peaks (peak_reset) */
    static rk_kv_bytes kvb[32][8][8];
    static double fit_s[32][8][8];    /* lowram: seconds of the end-of-prefill fit (last repetition) */
    static char full_s[32][8][8][96]; /* lowram: its full layers and their missed shares */
    static rk_kv_tier_stats tier0[32][8][8], tier1[32][8][8]; /* the KV tiers' counters around the last rep */
    static char kv_used[32][8][8][48]; /* with "default": the KV policy each run used (else the --kv item) */
#define KV_NAME(li, mi, ki) (has_default ? kv_used[li][mi][ki] : kvs[ki])
    rk_kv_params item_kv = sp.kv; /* the --kv item's policy */
    for (int ki = 0; ki < n_kv && !st && !rc; ki++) {
        if (ki > 0) { /* the KV policy is the session's: a new session per item */
            rk_session_destroy(s);
            s = NULL;
            if ((rc = cli_kv_params(&o, kvs[ki], &sp.kv))) break;
            sp.kv.budget = cli_kv_budget_share(&o, m, &sp.kv, sp.n_ctx);
            sp.kv.host_budget = cli_kv_host_budget_share(&o, m, &sp.kv, sp.n_ctx);
            item_kv = sp.kv;
            if ((st = rk_session_create(m, &sp, &s, &e))) break;
        }
        for (int li = 0; li < n_lens && !st && !rc; li++)
            for (int mi = 0; mi < n_modes && !st && !rc; mi++) {
                const char *mode = modes[mi];
                rk_kv_params want = item_kv;
                int want_batch = base_batch;
                if (has_default && (rc = cli_long_mode(&o, m, lens[li], (int64_t)lens[li] + o.n_predict + 1, &mode,
                                                       default_fill, &want, &want_batch)))
                    break;
                if (want.kind != sp.kv.kind || want.budget != sp.kv.budget || want.host_budget != sp.kv.host_budget ||
                    want_batch != sp.n_batch) {
                    rk_session_destroy(s); /* the KV policy and the chunk are the session's */
                    s = NULL;
                    sp.kv = want;
                    sp.n_batch = want_batch;
                    if ((st = rk_session_create(m, &sp, &s, &e))) break;
                }
                char *ku = kv_used[li][mi][ki];
                rk_kv_params_format(&sp.kv, ku, sizeof kv_used[0][0][0]);
                if (sp.kv.budget)
                    snprintf(ku + strlen(ku), sizeof kv_used[0][0][0] - strlen(ku), ",budget=%lluM",
                             (unsigned long long)(sp.kv.budget >> 20));
                rk_session_reset(s);
                /* off is exact: dense attention, unless --sparse was given for a list without
                 * `default` (then every mode runs it) */
                const char *sparse_given = o.sparse;
                if (!strcmp(modes[mi], "off") && (has_default || !o.sparse)) o.sparse = "off";
                rc = cli_setup_fill(&o, m, s, &maps, mode);
                o.sparse = sparse_given;
                if (rc || (rc = cli_setup_kv(&o, s, NULL))) break;
                double *pf_t = &pf_tps[li][mi][ki], *dc_t = &dc_tps[li][mi][ki], *tt = &ttft[li][mi][ki];
                peaks = peak_reset() && peaks;
                *pf_t = *dc_t = 0;
                *tt = 1e30;
                for (int r = 0; r < reps && !st; r++) {
                    /* one more token than decode steps: the first comes from the prefill's logits,
                 * so -n steps are -n evals; greedy through end-of-text tokens */
                    rk_gen_params gp = rk_gen_params_default();
                    gp.sampler.temp = 0;
                    gp.max_tokens = o.n_predict + 1;
                    gp.ignore_eog = true;
                    rk_gen_result g = {0};
                    rk_kv_tier_stats t0, t1;
                    rk_session_kv_tier_stats(s, &t0);
                    if ((st = rk_generate(m, s, ids, (size_t)lens[li], &gp, &g, &e))) break;
                    rk_session_kv_tier_stats(s, &t1);
                    cli_kv_tier_line("bench", &t0, &t1); /* stderr, also with --json */
                    cli_kv_budget_check("bench", s);
                    tier0[li][mi][ki] = t0, tier1[li][mi][ki] = t1;
                    const double pf_s = g.prefill_s, dc_s = g.decode_s;
                    rk_gen_result_deinit(&g);
                    if (pf_s < *tt) *tt = pf_s;
                    double pf = lens[li] / pf_s, dc = o.n_predict > 0 ? o.n_predict / dc_s : 0;
                    if (pf > *pf_t) *pf_t = pf;
                    if (dc > *dc_t) *dc_t = dc;
                    if (!o.json)
                        fprintf(stderr, "bench: p=%d fill=%s kv=%s rep %d: prefill %.1f tok/s, decode %.1f tok/s\n",
                                lens[li], modes[mi], KV_NAME(li, mi, ki), r + 1, pf, dc);
                }
                rk_session_kv_bytes(s, &kvb[li][mi][ki]);
                {
                    rk_lowram_stats ls;
                    rk_session_lowram_stats(s, &ls);
                    fit_s[li][mi][ki] = ls.seconds_fit;
                    char *fs = full_s[li][mi][ki];
                    int fo = snprintf(fs, 96, "%s", ls.n_full ? "; full layers" : "");
                    for (int f = 0; f < ls.n_full && fo < 80; f++)
                        fo += snprintf(fs + fo, (size_t)(96 - fo), " %d (%.2f)", ls.full_l[f],
                                       (double)ls.sel_miss[ls.full_l[f]]);
                }
                rss[li][mi][ki] = rss_now_mib();
                rpeak[li][mi][ki] = peak_now_mib();
            }
    }
    if (st) {
        cli_print_error(&e);
    } else if (!rc) {
        /* the high-water mark was reset before each run: the process's peak is the largest
         * of the runs' peaks and what the kernel holds now (the last run's and after) */
        double peak = (double)rk_peak_rss_bytes() / 1048576.0;
        for (int li = 0; peaks && li < n_lens; li++)
            for (int mi = 0; mi < n_modes; mi++)
                for (int ki = 0; ki < n_kv; ki++)
                    if (rpeak[li][mi][ki] > peak) peak = rpeak[li][mi][ki];
        int nt = o.n_threads > 0 ? o.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (o.json) {
            /* kv_type / kv_bytes_per_token: the plain cache of the first --kv item */
            const bool f32 = !strcmp(kvs[0], "f32");
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"weights_bytes\":%llu,\"threads\":%d,\"kv_type\":\"%s\","
                   "\"kv_bytes_per_token\":%llu,\"peak_rss_mib\":%.1f,\"reps\":%d,\"prompt\":\"%s\",\"results\":[",
                   rk_model_name(m), hp->arch_name, (unsigned long long)rk_model_weight_bytes(m), nt,
                   f32 ? "f32" : "f16", 2ull * hp->n_layer * hp->n_head_kv * hp->head_dim * (f32 ? 4 : 2), peak, reps,
                   o.prompt_file ? "text" : "random");
            for (int li = 0; li < n_lens; li++)
                for (int mi = 0; mi < n_modes; mi++)
                    for (int ki = 0; ki < n_kv; ki++) {
                        const rk_kv_bytes *b = &kvb[li][mi][ki];
                        printf(
                            "%s{\"n_prompt\":%d,\"fill\":\"%s\",\"kv\":\"%s\",\"ttft_ms\":%.2f,\"prefill_tok_s\":%.2f,"
                            "\"ttft_speedup\":%.3f,\"n_decode\":%d,\"decode_tok_s\":%.2f,\"rss_after_mib\":%.1f,\"peak_rss_mib\":%.1f,"
                            "\"kv_bytes\":{\"total\":%llu,\"f16_equiv\":%llu,\"exact\":%llu,\"coef\":%llu,\"bases\":%llu,"
                            "\"predictors\":%llu,\"residuals\":%llu,\"landmarks\":%llu,\"meta\":%llu,\"key_cache\":%llu,\"scratch\":%llu,"
                            "\"n_tokens\":%lld,\"n_exact_rows\":%lld,\"n_compressed_rows\":%lld,\"n_evicted_rows\":%lld}",
                            li || mi || ki ? "," : "", lens[li], modes[mi], KV_NAME(li, mi, ki),
                            1000 * ttft[li][mi][ki], pf_tps[li][mi][ki], ttft[li][0][ki] / ttft[li][mi][ki],
                            o.n_predict, dc_tps[li][mi][ki], rss[li][mi][ki], peaks ? rpeak[li][mi][ki] : -1.0,
                            (unsigned long long)b->total, (unsigned long long)b->f16_equiv,
                            (unsigned long long)b->exact, (unsigned long long)b->coef, (unsigned long long)b->bases,
                            (unsigned long long)b->predictors, (unsigned long long)b->residuals,
                            (unsigned long long)b->landmarks, (unsigned long long)b->meta,
                            (unsigned long long)b->key_cache, (unsigned long long)b->scratch, (long long)b->n_tokens,
                            (long long)b->n_exact_rows, (long long)b->n_compressed_rows, (long long)b->n_evicted_rows);
                        const rk_kv_tier_stats *a0 = &tier0[li][mi][ki], *a1 = &tier1[li][mi][ki];
                        if (a1->on) /* the last rep's moves (--kv-budget), inside the result object */
                            printf(
                                ",\"kv_tier\":{\"backend\":\"%s\",\"budget\":%llu,\"resident_bytes\":%llu,"
                                "\"spilled_bytes\":%llu,\"hits\":%llu,\"misses\":%llu,\"prefetched\":%llu,"
                                "\"bytes_up\":%llu,\"bytes_down\":%llu,\"stall_s\":%.4f,\"host_bytes\":%llu,"
                                "\"disk_reads\":%llu,\"disk_bytes_read\":%llu,\"disk_bytes_written\":%llu,"
                                "\"dev_chunk_rows\":%d,\"dev_chunks\":%llu,\"dev_chunk_bytes\":%llu,\"bytes_dev\":%llu}",
                                a1->backend, (unsigned long long)a1->budget, (unsigned long long)a1->resident_bytes,
                                (unsigned long long)a1->spilled_bytes, (unsigned long long)(a1->hits - a0->hits),
                                (unsigned long long)(a1->misses - a0->misses),
                                (unsigned long long)(a1->prefetched - a0->prefetched),
                                (unsigned long long)(a1->bytes_read - a0->bytes_read),
                                (unsigned long long)(a1->bytes_spilled - a0->bytes_spilled), a1->stall_s - a0->stall_s,
                                (unsigned long long)a1->host_bytes,
                                (unsigned long long)(a1->disk_reads - a0->disk_reads),
                                (unsigned long long)(a1->disk_bytes_read - a0->disk_bytes_read),
                                (unsigned long long)(a1->disk_bytes_written - a0->disk_bytes_written),
                                (int)a1->dev_chunk_rows, (unsigned long long)a1->dev_chunks,
                                (unsigned long long)a1->dev_chunk_bytes,
                                (unsigned long long)(a1->bytes_dev - a0->bytes_dev));
                        printf("}");
                    }
            printf("]}\n");
        } else {
            printf("model: %s (%s), weights %.1f MiB, threads %d, prompt %s\n", rk_model_name(m), hp->arch_name,
                   (double)rk_model_weight_bytes(m) / 1048576.0, nt, o.prompt_file ? "text (-f)" : "pseudo-random ids");
            int fw = 8; /* the fill column fits the longest mode ("quality:group=16") */
            for (int mi = 0; mi < n_modes; mi++)
                if ((int)strlen(modes[mi]) > fw) fw = (int)strlen(modes[mi]);
            printf("%9s %*s %-24s %10s %13s %8s %8s %12s %10s %7s %9s %9s\n", "n_prompt", fw, "fill", "kv", "TTFT ms",
                   "prefill tok/s", "speedup", "n_decode", "decode tok/s", "KV B/tok", "vs f16", "RSS MiB", "peak MiB");
            for (int li = 0; li < n_lens; li++)
                for (int mi = 0; mi < n_modes; mi++)
                    for (int ki = 0; ki < n_kv; ki++) {
                        const rk_kv_bytes *b = &kvb[li][mi][ki];
                        char pk[32] = "-";
                        if (peaks) snprintf(pk, sizeof pk, "%.1f", rpeak[li][mi][ki]);
                        printf("%9d %*s %-24.24s %10.1f %13.1f %7.2fx %8d %12.1f %10.0f %6.2fx %9.1f %9s\n", lens[li],
                               fw, modes[mi], KV_NAME(li, mi, ki), 1000 * ttft[li][mi][ki], pf_tps[li][mi][ki],
                               ttft[li][0][ki] / ttft[li][mi][ki], o.n_predict, dc_tps[li][mi][ki],
                               b->n_tokens ? (double)b->total / (double)b->n_tokens : 0.0,
                               b->total ? (double)b->f16_equiv / (double)b->total : 0.0, rss[li][mi][ki], pk);
                        if (b->coef || b->bases)
                            printf(
                                "%9s KV bytes: exact %.2f MiB (%lld rows) + coef %.2f + bases %.2f + predictors %.2f + "
                                "residuals %.2f + landmarks %.2f + meta %.2f + key cache %.2f = %.2f MiB (%lld rows "
                                "compressed, %lld evicted; scratch %.2f; fit %.2f s%s)\n",
                                "", b->exact / 1048576.0, (long long)b->n_exact_rows, b->coef / 1048576.0,
                                b->bases / 1048576.0, b->predictors / 1048576.0, b->residuals / 1048576.0,
                                b->landmarks / 1048576.0, b->meta / 1048576.0, b->key_cache / 1048576.0,
                                b->total / 1048576.0, (long long)b->n_compressed_rows, (long long)b->n_evicted_rows,
                                b->scratch / 1048576.0, fit_s[li][mi][ki], full_s[li][mi][ki]);
                    }
            printf("peak RSS %.1f MiB (the process)%s\n", peak,
                   peaks ? "" : "; per-run peaks: /proc/self/clear_refs refused");
        }
    }
#undef KV_NAME
    rk_ridge_maps_destroy(maps);
    free(ids);
    rk_session_destroy(s);
    rk_model_destroy(m);
    return st ? cli_exit_code(st) : rc;
}
