/* `ridgekv calibrate`: fit RidgeFill maps on calibration text and write the map file. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "rk_fitters.h"
#include "rk_io.h"

static const char *help =
    "usage: ridgekv calibrate [-m MODEL] --text FILE [--text FILE ...] -o MAPS.gguf [options]\n"
    "       ridgekv calibrate --lowram ... -o PRED.gguf   (LowRAM predictor file; --lowram --help)\n"
    "\n"
    "Fits RidgeFill maps: one exact forward pass over the text (in segments that start with\n"
    "BOS), rows sampled with a stride, fp64 accumulation of the centred XᵀX and XᵀY_l, λ chosen\n"
    "on held-out rows (every 5th sampled row), one Cholesky per λ, then the final fit on all rows.\n"
    "\n"
    "  --text FILE        calibration text (repeatable; files are joined with a blank line)\n"
    "  -o FILE            output map file (GGUF)\n"
    "  --split S          split layer (default: 0.4 of the depth, 12 for 30 layers)\n"
    "  --lambda auto|X    ridge strength relative to tr(XᵀX)/d (default auto: held-out choice)\n"
    "  --stride N         sample every N-th row (default 8)\n"
    "  --dtype D          map storage: f16 (default), bf16, int8 (per-32 block scales), f32\n"
    "  --max-tokens N     use at most N tokens of text (default 65536)\n"
    "  --seg-len N        tokens per forward segment (default 2048)\n"
    "  --keep-share X     quality-mode share of hard tokens kept exact, stored as default (0.1)\n"
    "  --target input|kv  what the maps predict for a filled row in each late layer: its input\n"
    "                     x_l (default; the cache writers then run on it), or its pre-RoPE K and V\n"
    "                     straight away (2 kv_dim outputs; no norm or projection for filled rows)\n"
    "  --normalized-space fit rmsnorm(x_S) -> rmsnorm(x_l) instead of the raw residual streams\n"
    "                     (measured worse on SmolLM2-135M; see docs/RIDGEFILL.md)\n"
    "  -t N               threads\n";

typedef struct prog {
    double t0, last;
    bool tty;
} prog;

/* A live line on a terminal; a plain line every 10 s otherwise. */
static bool progress(void *ud, int64_t done, int64_t total) {
    prog *p = ud;
    double now = rk_time_now(), el = now - p->t0;
    if (!p->tty && now - p->last < 10.0 && done < total) return true;
    p->last = now;
    fprintf(stderr, "%scalibrate: %lld / %lld tokens  %.0f tok/s  ETA %.0f s%s", p->tty ? "\r" : "", (long long)done,
            (long long)total, (double)done / el, el / (double)done * (double)(total - done), p->tty ? "   " : "\n");
    return true;
}

int cmd_calibrate(int argc, char **argv) {
    for (int i = 2; i < argc; i++)
        if (!strcmp(argv[i], "--lowram")) return cmd_calibrate_lowram(argc, argv);
    const char *texts[64];
    int n_texts = 0, stride = 8, max_tokens = 65536, seg_len = 2048;
    float lambda = -1.0f;
    uint32_t dtype = RK_DT_F16;
    bool normalized_space = false, target_kv = false;
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
        if (!strcmp(a, "--normalized-space")) {
            normalized_space = true;
            continue;
        }
        if (!strcmp(a, "--target")) {
            const char *v = i + 1 < argc ? argv[++i] : "";
            if (!strcmp(v, "kv")) target_kv = true;
            else if (!strcmp(v, "input")) target_kv = false;
            else {
                fprintf(stderr, "ridgekv calibrate: --target expects input or kv (got '%s')\n", v);
                free(av);
                return RK_EXIT_USAGE;
            }
            continue;
        }
        bool ours = !strcmp(a, "--text") || !strcmp(a, "--lambda") || !strcmp(a, "--stride") || !strcmp(a, "--dtype") ||
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
        char *end = NULL;
        if (!strcmp(a, "--text")) {
            if (n_texts == 64) {
                fprintf(stderr, "ridgekv calibrate: at most 64 --text files\n");
                rc = RK_EXIT_USAGE;
                break;
            }
            texts[n_texts++] = v;
        } else if (!strcmp(a, "--lambda")) {
            if (strcmp(v, "auto")) {
                lambda = strtof(v, &end);
                if (*end || !(lambda >= 0)) {
                    fprintf(stderr, "ridgekv calibrate: --lambda expects auto or a number >= 0\n");
                    rc = RK_EXIT_USAGE;
                    break;
                }
            }
        } else if (!strcmp(a, "--dtype")) {
            if (!strcmp(v, "f16")) dtype = RK_DT_F16;
            else if (!strcmp(v, "bf16")) dtype = RK_DT_BF16;
            else if (!strcmp(v, "int8")) dtype = RK_DT_Q8_0;
            else if (!strcmp(v, "f32")) dtype = RK_DT_F32;
            else {
                fprintf(stderr, "ridgekv calibrate: --dtype expects f16, bf16, int8 or f32 (got '%s')\n", v);
                rc = RK_EXIT_USAGE;
                break;
            }
        } else {
            long x = strtol(v, &end, 10);
            int *dst = !strcmp(a, "--stride") ? &stride : !strcmp(a, "--max-tokens") ? &max_tokens : &seg_len;
            if (*end || x < 1 || x > (1L << 30)) {
                fprintf(stderr, "ridgekv calibrate: %s expects a positive integer\n", a);
                rc = RK_EXIT_USAGE;
                break;
            }
            *dst = (int)x;
        }
    }
    cli_opts o = {.sp = rk_sampler_params_default(), .keep_share = 0.1f};
    const char *pos[1];
    int n_pos;
    if (!rc) rc = cli_parse(ac, av, 2, &o, pos, 0, &n_pos, "calibrate");
    free(av);
    if (rc) return rc;
    if (!n_texts || !o.out) {
        fprintf(stderr, "ridgekv calibrate: --text FILE and -o MAPS.gguf are required (see --help)\n");
        return RK_EXIT_USAGE;
    }
    rk_model *m = NULL;
    if ((rc = cli_load_model(&o, &m))) return rc;
    const rk_hparams *hp = rk_model_hparams(m);
    rk_err e = {0};
    int32_t *all = NULL;
    size_t n_all = 0;
    if ((rc = cli_read_text_tokens(m, texts, n_texts, (size_t)max_tokens, &all, &n_all))) {
        rk_model_destroy(m);
        return rc;
    }
    rk_calib_params cp = {.split = o.split ? o.split : (int)(0.4 * hp->n_layer + 0.5),
                          .stride = stride,
                          .seg_len = seg_len,
                          .lambda = lambda,
                          .dtype = dtype,
                          .keep_share = o.keep_share,
                          .n_threads = o.n_threads,
                          .normalized_space = normalized_space,
                          .target_kv = target_kv};
    fprintf(stderr, "calibrate: %s, %zu tokens, split %d of %d layers, stride %d, dtype %s, lambda %s\n",
            rk_model_name(m), n_all, cp.split, hp->n_layer, stride, dtype == RK_DT_Q8_0 ? "int8" : rk_dtype_name(dtype),
            lambda < 0 ? "auto" : "given");
    prog pr = {rk_time_now(), rk_time_now(), isatty(2) != 0};
    void *bytes = NULL;
    size_t n_bytes = 0;
    rk_calib_report rep;
    rk_status st = rk_calibrate(m, all, n_all, &cp, progress, &pr, &bytes, &n_bytes, &rep, &e);
    if (pr.tty) fputc('\n', stderr);
    free(all);
    if (st) {
        cli_print_error(&e);
        rk_model_destroy(m);
        return cli_exit_code(st);
    }
    st = rk_io_write_file_atomic(o.out, bytes, n_bytes, &e);
    free(bytes);
    if (st) {
        cli_print_error(&e);
        rk_model_destroy(m);
        return RK_EXIT_IO;
    }
    printf("wrote %s (%.1f MiB): split %d, lambda %.3g (relative), %lld tokens, %lld rows (%lld held out)\n", o.out,
           (double)n_bytes / 1048576.0, cp.split, (double)rep.lambda, (long long)rep.n_tokens, (long long)rep.n_rows,
           (long long)rep.n_heldout);
    printf("cost: forward %.1f s, solve %.1f s, peak RSS %.0f MiB\n", rep.seconds_forward, rep.seconds_solve,
           (double)rk_peak_rss_bytes() / 1048576.0);
    printf("lambda (relative) vs mean held-out relative error over late layers:\n");
    for (int i = 0; i < rep.n_lambda; i++)
        printf("  %-8.3g %.5f%s\n", (double)rep.lambda_tried[i], (double)rep.lambda_err[i],
               rep.lambda_tried[i] == rep.lambda ? "  <- chosen" : "");
    printf("held-out relative error ||Y-Ŷ||²/||Y-Ȳ||² per late layer (fitted vs identity):\n");
    for (int l = cp.split + 1; l < hp->n_layer && l - cp.split - 1 < 256; l++)
        if (target_kv) printf("  layer %3d  K/V fitted %.4f\n", l, (double)rep.heldout_rel_err[l - cp.split - 1]);
        else
            printf("  layer %3d  fitted %.4f  identity %.4f\n", l, (double)rep.heldout_rel_err[l - cp.split - 1],
                   (double)rep.identity_rel_err[l - cp.split - 1]);
    rk_model_destroy(m);
    return RK_EXIT_OK;
}
