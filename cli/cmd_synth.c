/* ridgekv synth: flag parsing and printing around rk_synth_write. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "rk_synth.h"

static const char *help =
    "usage: ridgekv synth --shape SHAPE --type TYPE -o FILE.gguf [--vocab N] [--layers L] [--seed S]\n"
    "\n"
    "Writes a random-weight model of a real model's shape (tensor names, shapes, metadata) with a\n"
    "small SentencePiece-style tokenizer, for benchmarks and device checks without downloads.\n"
    "Its text is noise; its cost per token is the real model's.\n"
    "\n"
    "  --shape   smollm2-135m | qwen2.5-1.5b | qwen3-0.6b | llama-3.2-1b\n"
    "  --type    f32 | f16 | bf16 | q8_0 | q4_0 | q4_1 | q4_k | q6_k | q4_k_m (q4_k_m: q6_k for the\n"
    "            embedding and for attn_v / ffn_down of llama.cpp's use_more_bits layers; K types fall\n"
    "            back to q4_1 / q8_0 on rows that are not whole 256-blocks, as llama.cpp does)\n"
    "  --vocab   vocabulary size (default: the real model's; at least 320)\n"
    "  --layers  keep only the first L layers (default: all)\n"
    "  --seed    random seed (default 1); the same flags give the same bytes\n";

static int parse_i64(const char *flag, const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end = NULL;
    errno = 0;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || !*v || *end || errno || x < lo || x > hi) {
        fprintf(stderr, "ridgekv synth: %s needs an integer in %lld..%lld (got \"%s\")\n", flag, (long long)lo,
                (long long)hi, v ? v : "");
        return RK_EXIT_USAGE;
    }
    *out = x;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    rk_synth_params p = {NULL, NULL, 0, 0, 1};
    const char *out = NULL;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int64_t x = 0;
        int rc = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        } else if (!strcmp(a, "--shape") && v) {
            p.shape = v, i++;
        } else if (!strcmp(a, "--type") && v) {
            p.type = v, i++;
        } else if (!strcmp(a, "-o") && v) {
            out = v, i++;
        } else if (!strcmp(a, "--vocab")) {
            if (!(rc = parse_i64(a, v, RK_SYNTH_MIN_VOCAB, 1 << 24, &x))) p.n_vocab = x, i++;
        } else if (!strcmp(a, "--layers")) {
            if (!(rc = parse_i64(a, v, 1, 4096, &x))) p.n_layer = (int)x, i++;
        } else if (!strcmp(a, "--seed")) {
            if (!(rc = parse_i64(a, v, 0, INT64_MAX, &x))) p.seed = (uint64_t)x, i++;
        } else {
            fprintf(stderr, "ridgekv synth: unknown or incomplete option '%s' (try ridgekv synth --help)\n", a);
            return RK_EXIT_USAGE;
        }
        if (rc) return rc;
    }
    if (!p.shape || !p.type || !out) {
        fprintf(stderr, "ridgekv synth: --shape, --type and -o are required (try ridgekv synth --help)\n");
        return RK_EXIT_USAGE;
    }
    rk_err e = {0};
    double t0 = rk_time_now();
    rk_status st = rk_synth_write(&p, out, &e);
    if (st) {
        fprintf(stderr, "ridgekv synth: %s\n", e.msg);
        return st == RK_E_INVALID_ARG ? RK_EXIT_USAGE : st == RK_E_IO ? RK_EXIT_IO : RK_EXIT_ERROR;
    }
    fprintf(stderr, "ridgekv synth: wrote %s (%s, %s, seed %llu) in %.1f s\n", out, p.shape, p.type,
            (unsigned long long)p.seed, rk_time_now() - t0);
    return RK_EXIT_OK;
}
