/* `ridgekv bench`: prefill and decode throughput, peak RSS and KV bytes per token. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static const char *help =
    "usage: ridgekv bench [-m MODEL] [-p 512,2048] [-n 64] [-t T] [-r REPS] [--kv f16|f32]\n"
    "                     [--ridgefill MAPS --fill off,speed,quality] [--json]\n"
    "\n"
    "For each prompt length: prefill that many tokens (TTFT, prefill tokens/s), then decode -n\n"
    "tokens one at a time (decode tokens/s). Token ids are fixed pseudo-random ids, so runs are\n"
    "comparable. Reports the best of -r repetitions (default 2), peak RSS, and KV bytes per token.\n"
    "\n"
    "  -p LIST       comma-separated prompt lengths (default 512,2048)\n"
    "  -n N          decode steps after each prefill (default 64)\n"
    "  -t N          threads (default: all cores)\n"
    "  -r N          repetitions per length (default 2)\n"
    "  -b N          prefill chunk (default 512)\n"
    "  --kv f16|f32  KV cache precision (default f16)\n"
    "  --ridgefill MAPS  RidgeFill maps; --fill off,speed,quality compares modes in one run\n"
    "  --fill LIST   fill modes to run (default off); speedup is TTFT of the first mode / this mode\n"
    "  --tail T      exact tail (default 2048)\n"
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
    const rk_hparams *hp = rk_model_hparams(m);
    rk_session_params sp;
    cli_session_params(&o, &sp);
    int max_len = 0;
    for (int i = 0; i < n_lens; i++) max_len = lens[i] > max_len ? lens[i] : max_len;
    sp.n_ctx = max_len + o.n_predict + 1;
    rk_err e = {0};
    rk_session *s = NULL;
    rk_status st = rk_session_create(m, &sp, &s, &e);
    int32_t *ids = malloc(((size_t)max_len + (size_t)o.n_predict + 1) * sizeof *ids);
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    if (!st && (!ids || !logits)) st = rk_err_set(&e, RK_E_NOMEM, "bench: out of memory");
    if (st) {
        cli_print_error(&e);
        free(ids);
        free(logits);
        rk_session_destroy(s);
        rk_model_destroy(m);
        return cli_exit_code(st);
    }
    uint64_t rng = 12345;
    for (int i = 0; i < max_len + o.n_predict + 1; i++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)(rng >> 33) % hp->n_vocab;
    }
    /* fill modes to compare in this run (ratios are against the first, usually off) */
    char modes_buf[256];
    snprintf(modes_buf, sizeof modes_buf, "%s", o.fill ? o.fill : "off");
    const char *modes[8];
    int n_modes = 0;
    for (char *tok = strtok(modes_buf, ","); tok && n_modes < 8; tok = strtok(NULL, ",")) modes[n_modes++] = tok;
    rk_ridge_maps *maps = NULL;
    double pf_tps[32][8], dc_tps[32][8], ttft[32][8];
    for (int li = 0; li < n_lens && !st && !rc; li++)
        for (int mi = 0; mi < n_modes && !st && !rc; mi++) {
            if ((rc = cli_setup_fill(&o, m, s, &maps, modes[mi]))) break;
            pf_tps[li][mi] = dc_tps[li][mi] = 0;
            ttft[li][mi] = 1e30;
            for (int r = 0; r < reps && !st; r++) {
                rk_session_reset(s);
                double t0 = rk_time_now();
                st = rk_session_eval(s, ids, (size_t)lens[li], logits, false, &e);
                double t1 = rk_time_now();
                for (int k = 0; k < o.n_predict && !st; k++)
                    st = rk_session_eval(s, &ids[lens[li] + k], 1, logits, false, &e);
                double t2 = rk_time_now();
                if (st) break;
                if (t1 - t0 < ttft[li][mi]) ttft[li][mi] = t1 - t0;
                double pf = lens[li] / (t1 - t0), dc = o.n_predict > 0 ? o.n_predict / (t2 - t1) : 0;
                if (pf > pf_tps[li][mi]) pf_tps[li][mi] = pf;
                if (dc > dc_tps[li][mi]) dc_tps[li][mi] = dc;
                if (!o.json)
                    fprintf(stderr, "bench: p=%d fill=%s rep %d: prefill %.1f tok/s, decode %.1f tok/s\n", lens[li],
                            modes[mi], r + 1, pf, dc);
            }
        }
    if (st) {
        cli_print_error(&e);
    } else if (!rc) {
        uint64_t kvb = rk_session_kv_bytes_per_token(s);
        double rss = (double)rk_peak_rss_bytes() / 1048576.0;
        int nt = o.n_threads > 0 ? o.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
        if (o.json) {
            printf("{\"model\":\"%s\",\"arch\":\"%s\",\"weights_bytes\":%llu,\"threads\":%d,\"kv_type\":\"%s\","
                   "\"kv_bytes_per_token\":%llu,\"peak_rss_mib\":%.1f,\"reps\":%d,\"results\":[",
                   rk_model_name(m), hp->arch_name, (unsigned long long)rk_model_weight_bytes(m), nt,
                   sp.kv_type == RK_DT_F32 ? "f32" : "f16", (unsigned long long)kvb, rss, reps);
            for (int li = 0; li < n_lens; li++)
                for (int mi = 0; mi < n_modes; mi++)
                    printf("%s{\"n_prompt\":%d,\"fill\":\"%s\",\"ttft_ms\":%.2f,\"prefill_tok_s\":%.2f,"
                           "\"ttft_speedup\":%.3f,\"n_decode\":%d,\"decode_tok_s\":%.2f}",
                           li || mi ? "," : "", lens[li], modes[mi], 1000 * ttft[li][mi], pf_tps[li][mi],
                           ttft[li][0] / ttft[li][mi], o.n_predict, dc_tps[li][mi]);
            printf("]}\n");
        } else {
            printf("model: %s (%s), weights %.1f MiB, threads %d, KV %s %llu bytes/token\n", rk_model_name(m),
                   hp->arch_name, (double)rk_model_weight_bytes(m) / 1048576.0, nt,
                   sp.kv_type == RK_DT_F32 ? "f32" : "f16", (unsigned long long)kvb);
            printf("%10s %10s %12s %16s %10s %10s %16s\n", "n_prompt", "fill", "TTFT ms", "prefill tok/s", "speedup",
                   "n_decode", "decode tok/s");
            for (int li = 0; li < n_lens; li++)
                for (int mi = 0; mi < n_modes; mi++)
                    printf("%10d %10s %12.1f %16.1f %9.2fx %10d %16.1f\n", lens[li], modes[mi], 1000 * ttft[li][mi],
                           pf_tps[li][mi], ttft[li][0] / ttft[li][mi], o.n_predict, dc_tps[li][mi]);
            printf("peak RSS %.1f MiB\n", rss);
        }
    }
    rk_ridge_maps_destroy(maps);
    free(ids);
    free(logits);
    rk_session_destroy(s);
    rk_model_destroy(m);
    return st ? cli_exit_code(st) : rc;
}
