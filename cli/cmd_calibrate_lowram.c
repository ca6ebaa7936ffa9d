/* `ridgekv calibrate --lowram`: fit a LowRAM predictor file (offline key bases and value
 * predictors per layer group) on calibration text. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "rk_fitters.h"
#include "rk_io.h"

static const char *help =
    "usage: ridgekv calibrate --lowram [-m MODEL] --text FILE [--text FILE ...] -o PRED.gguf [options]\n"
    "\n"
    "Fits a LowRAM predictor file: one exact forward pass over the text (segments starting with\n"
    "BOS), fp64 moments of the pre-RoPE keys of each group of adjacent layers (stacked) and of\n"
    "keys x values, one eigendecomposition per group, closed-form value predictors in the\n"
    "basis' coefficients. Use it with --kv lowram:pred=PRED.gguf (the file's basis replaces the\n"
    "per-prompt fit; predictors start from the file's). Refused on another model.\n"
    "\n"
    "  --text FILE        calibration text (repeatable)\n"
    "  -o FILE            output predictor file (GGUF)\n"
    "  --group G          adjacent layers per basis (default 3)\n"
    "  --rank R           basis rows kept in the file (default 384; capped at the stacked dim)\n"
    "  --stride N         sample every N-th row (default 2)\n"
    "  --max-tokens N     use at most N tokens of text (default 16384)\n"
    "  --seg-len N        tokens per forward segment (default 2048)\n"
    "  -t N               threads\n";

static bool progress(void *ud, int64_t done, int64_t total) {
    (void)ud;
    fprintf(stderr, "calibrate --lowram: %lld / %lld tokens\n", (long long)done, (long long)total);
    return true;
}

int cmd_calibrate_lowram(int argc, char **argv) {
    const char *texts[64];
    int n_texts = 0, group = 3, rank = 384, stride = 2, max_tokens = 16384, seg_len = 2048;
    char **av = calloc((size_t)argc + 1, sizeof *av);
    if (!av) return RK_EXIT_ERROR;
    int ac = 0, rc = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help, stdout);
            free(av);
            return RK_EXIT_OK;
        }
        if (!strcmp(a, "--lowram")) continue;
        bool ours = !strcmp(a, "--text") || !strcmp(a, "--group") || !strcmp(a, "--rank") || !strcmp(a, "--stride") ||
                    !strcmp(a, "--max-tokens") || !strcmp(a, "--seg-len");
        if (!ours) {
            av[ac++] = argv[i];
            continue;
        }
        if (!v) {
            fprintf(stderr, "ridgekv calibrate: %s needs a value\n", a);
            rc = RK_EXIT_USAGE;
            break;
        }
        i++;
        if (!strcmp(a, "--text")) {
            if (n_texts == 64) {
                fprintf(stderr, "ridgekv calibrate: at most 64 --text files\n");
                rc = RK_EXIT_USAGE;
                break;
            }
            texts[n_texts++] = v;
            continue;
        }
        char *end;
        long x = strtol(v, &end, 10);
        int *dst = !strcmp(a, "--group")        ? &group
                   : !strcmp(a, "--rank")       ? &rank
                   : !strcmp(a, "--stride")     ? &stride
                   : !strcmp(a, "--max-tokens") ? &max_tokens
                                                : &seg_len;
        if (*end || x < 1 || x > (1L << 30)) {
            fprintf(stderr, "ridgekv calibrate: %s expects a positive integer (got '%s')\n", a, v);
            rc = RK_EXIT_USAGE;
            break;
        }
        *dst = (int)x;
    }
    cli_opts o = {.sp = rk_sampler_params_default()};
    const char *pos[1];
    int n_pos;
    if (!rc) rc = cli_parse(ac, av, 2, &o, pos, 0, &n_pos, "calibrate");
    free(av);
    if (rc) return rc;
    if (!n_texts || !o.out) {
        fprintf(stderr, "ridgekv calibrate --lowram: --text FILE and -o PRED.gguf are required (see --help)\n");
        return RK_EXIT_USAGE;
    }
    rk_model *m = NULL;
    if ((rc = cli_load_model(&o, &m))) return rc;
    rk_err e = {0};
    int32_t *all = NULL;
    size_t n_all = 0;
    if ((rc = cli_read_text_tokens(m, texts, n_texts, (size_t)max_tokens, &all, &n_all))) {
        rk_model_destroy(m);
        return rc;
    }
    rk_lowram_calib_params cp = {
        .group = group, .rank = rank, .seg_len = seg_len, .stride = stride, .n_threads = o.n_threads};
    fprintf(stderr, "calibrate --lowram: %s, %zu tokens, groups of %d layers, rank %d, stride %d\n", rk_model_name(m),
            n_all, group, rank, stride);
    double t0 = rk_time_now();
    void *bytes = NULL;
    size_t n_bytes = 0;
    rk_status st = rk_lowram_calibrate(m, all, n_all, &cp, progress, NULL, &bytes, &n_bytes, &e);
    free(all);
    if (!st) st = rk_io_write_file_atomic(o.out, bytes, n_bytes, &e);
    free(bytes);
    rk_model_destroy(m);
    if (st) {
        cli_print_error(&e);
        return st == RK_E_IO ? RK_EXIT_IO : cli_exit_code(st);
    }
    printf("wrote %s (%.1f MiB) in %.1f s, peak RSS %.0f MiB\n", o.out, (double)n_bytes / 1048576.0, rk_time_now() - t0,
           (double)rk_peak_rss_bytes() / 1048576.0);
    return RK_EXIT_OK;
}
