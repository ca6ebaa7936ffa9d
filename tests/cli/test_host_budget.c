/* --kv-host-budget (the GPU KV tiers' pinned host bytes), in-process on
 * cli/args.c and cli/doc_cache_cli.c: the size reaches rk_kv_params.host_budget beside
 * --kv-budget's budget; bench's share "25%" is a share of the plain KV like --kv-budget's;
 * every use where it would mean nothing (another backend, no --kv-budget, only q8 / lowram,
 * a command without a KV) and every bad size is refused with exit 2 and a line naming the
 * flag and the reason. No device is needed: the flag is checked before any backend starts. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "doc_cache_cli.h"
#include "rk_io.h"
#include "tb.h"

/* cli_parse on argv (argv[0] the command) with stderr captured into err (cap bytes) */
static int parse(char *const *args, cli_opts *o, char *err, size_t cap) {
    int argc = 0;
    while (args[argc]) argc++;
    char g_err[256];
    cr_assert(tb_tmp_path(g_err, sizeof g_err, "rk-host-budget-stderr", ".txt"), "%s", g_err);
    *o = (cli_opts){.sp = rk_sampler_params_default()};
    const char *pos[4];
    int n_pos = 0;
    fflush(stderr);
    const int saved = dup(2);
    FILE *f = fopen(g_err, "w");
    cr_assert(f && saved >= 0);
    dup2(fileno(f), 2);
    const int rc = cli_parse(argc, (char **)args, 1, o, pos, 4, &n_pos, args[0]);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    char *text = NULL;
    size_t n = 0;
    rk_err e = {0};
    cr_assert_eq(rk_io_read_file(g_err, &text, &n, &e), RK_OK, "%s", e.msg);
    unlink(g_err);
    snprintf(err, cap, "%s", text ? text : "");
    free(text);
    return rc;
}

Test(host_budget, the_size_reaches_the_kv_params) {
    char err[1024];
    cli_opts o;
    int rc = parse((char *[]){"run", "--backend", "cuda", "--kv", "f16", "--kv-budget", "9M", "--kv-host-budget", "3M",
                              "-p", "x", NULL},
                   &o, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    rk_kv_params kp;
    cr_assert_eq(cli_kv_params(&o, "f16", &kp), 0);
    cr_expect_eq(kp.budget, 9ull << 20);
    cr_expect_eq(kp.host_budget, 3ull << 20);
    /* the --flag=value form and the other spellings of a size */
    int ac = 6;
    char *av0[] = {"ridgekv",  "serve", "--backend=cuda", "--kv-budget=1G", "--kv-host-budget=1536KiB",
                   "--kv=f32", NULL};
    char **av = cli_expand_eq(&ac, av0);
    rc = parse(av + 1, &o, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cli_kv_params(&o, "f32", &kp), 0);
    cr_expect_eq(kp.budget, 1ull << 30);
    cr_expect_eq(kp.host_budget, 1536ull << 10);
    if (av != av0) free(av);
    /* without the flag: 0, every cold layer pinned (the library's default) */
    rc = parse((char *[]){"ask", "--backend", "cuda", "--kv-budget", "9M", "q", NULL}, &o, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cli_kv_params(&o, "f16", &kp), 0);
    cr_expect_eq(kp.host_budget, 0);
    /* "0" is a size below any layer: it reaches the library as 1 byte, which refuses it by name
     * (kv_dev.c: "host budget 1 bytes below one cold layer's pinned rows"), never as "unbounded" */
    rc = parse((char *[]){"chat", "--backend", "cuda", "--kv-budget", "9M", "--kv-host-budget", "0", NULL}, &o, err,
               sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(cli_kv_params(&o, "f16", &kp), 0);
    cr_expect_eq(kp.host_budget, 1);
}

Test(host_budget, bench_takes_a_share_of_the_plain_kv) {
    char err[1024];
    cli_opts o;
    int rc = parse((char *[]){"bench", "--backend", "cuda", "--kv", "q8,f16", "--kv-budget", "50%", "--kv-host-budget",
                              "25%", NULL},
                   &o, err, sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    char sp[1024];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    rk_model *m = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_model_load(sp, &m, &e), RK_OK, "%s", e.msg);
    const rk_hparams *hp = rk_model_hparams(m);
    rk_kv_params kp;
    cr_assert_eq(cli_kv_params(&o, "f16", &kp), 0);
    /* plain f16 KV of 1000 tokens: 1000 x 2 (K, V) x layers x kv heads x head_dim x 2 bytes */
    const double plain = 1000.0 * 2 * hp->n_layer * hp->n_head_kv * hp->head_dim * 2.0;
    const uint64_t dev = cli_kv_budget_share(&o, m, &kp, 1000), host = cli_kv_host_budget_share(&o, m, &kp, 1000);
    cr_expect_eq(dev, (uint64_t)(0.5 * plain), "%llu vs %.0f", (unsigned long long)dev, plain);
    cr_expect_eq(host, (uint64_t)(0.25 * plain), "%llu vs %.0f", (unsigned long long)host, plain);
    rk_model_destroy(m);
}

Test(host_budget, uses_where_it_means_nothing_are_refused_with_the_reason) {
    struct {
        char *args[14];
        const char *want;
    } cases[] = {
        {{"run", "-p", "x", "--kv-budget", "9M", "--kv-host-budget", "4M", NULL},
         "--kv-host-budget applies to --backend cuda only"},
        {{"bench", "--backend", "cpu", "--kv-budget", "9M", "--kv-host-budget", "4M", NULL},
         "--kv-host-budget applies to --backend cuda only"},
        {{"ask", "--backend", "cpu_ref", "--kv-budget", "9M", "--kv-host-budget", "4M", "q", NULL},
         "--kv-host-budget applies to --backend cuda only"},
        {{"run", "--backend", "cuda", "--kv-host-budget", "4M", "-p", "x", NULL}, "--kv-host-budget needs --kv-budget"},
        {{"serve", "--backend", "cuda", "--kv", "q8", "--kv-budget", "9M", "--kv-host-budget", "4M", NULL},
         "--kv-host-budget applies to --kv f16 or f32 only"},
        {{"bench", "--backend", "cuda", "--kv", "q8,lowram", "--kv-budget", "9M", "--kv-host-budget", "4M", NULL},
         "--kv-host-budget applies to --kv f16 or f32 only"},
        {{"run", "--backend", "cuda", "--kv-budget", "9M", "--kv-host-budget", "4Q", NULL},
         "--kv-host-budget expects a size such as 512M (got '4Q')"},
        {{"run", "--backend", "cuda", "--kv-budget", "9M", "--kv-host-budget", "25%", NULL},
         "--kv-host-budget expects a size such as 512M (got '25%')"},
        {{"bench", "--backend", "cuda", "--kv-budget", "9M", "--kv-host-budget", "-1M", NULL},
         "--kv-host-budget expects a size such as 512M or a share such as 25% (got '-1M')"},
        {{"chat", "--backend", "cuda", "--kv-budget", "9M", "--kv-host-budget", NULL},
         "--kv-host-budget needs a value"},
        {{"tokenize", "--kv-host-budget", "4M", "x", NULL}, "--kv-host-budget does not apply to tokenize"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[1024];
        cli_opts o;
        const int rc = parse(cases[i].args, &o, err, sizeof err);
        cr_expect_eq(rc, RK_EXIT_USAGE, "case %zu (%s): exit %d: %s", i, cases[i].want, rc, err);
        cr_expect(strstr(err, cases[i].want), "case %zu: want '%s' in: %s", i, cases[i].want, err);
    }
}
