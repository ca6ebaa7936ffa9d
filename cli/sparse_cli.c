/* --sparse (rk_sparse_params) and the cached sparse-attention calibration of a model
 * (`ridgekv prepare --sparse`, cmd_prepare.c), found beside its RidgeFill maps. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

int cli_sparse_cache_path(const rk_model *m, char *buf, size_t cap) {
    char dir[4096];
    if (cli_cache_dir(dir, sizeof dir) != 0) return -1;
    rk_fingerprint f;
    rk_model_fingerprint(m, &f);
    int w = snprintf(buf, cap, "%s/maps/%s-%016llx-%016llx-%016llx.sparse.gguf", dir, f.arch,
                     (unsigned long long)f.tokenizer_hash, (unsigned long long)f.weights_hash,
                     (unsigned long long)f.quant_hash);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

int cli_sparse_params(const cli_opts *o, const rk_model *m, rk_sparse_params *out) {
    /* one calibration per process: the sessions that borrow it live until exit */
    static rk_sparse_calib *calib;
    static const rk_model *calib_model;
    static bool looked;
    rk_sparse_params sp = {0};
    rk_err e = {0};
    /* without --sparse: on (it only acts past rk_sparse_params.min_kv keys, so short prompts
     * stay exact), except with --no-ridgefill, which asks for the exact prefill */
    if (!o->sparse && !o->no_ridgefill) sp = rk_sparse_params_default();
    if (o->sparse && rk_sparse_params_parse(o->sparse, &sp, &e)) {
        fprintf(stderr, "ridgekv: --sparse: %s\n", e.msg);
        return RK_EXIT_USAGE;
    }
    if (sp.on && (!looked || calib_model != m)) {
        looked = true, calib_model = m, calib = NULL;
        char path[4096], warn[512] = "";
        struct stat sb;
        if (cli_sparse_cache_path(m, path, sizeof path) == 0 && stat(path, &sb) == 0) {
            if (rk_sparse_calib_load(path, m, &calib, warn, sizeof warn, &e))
                fprintf(
                    stderr,
                    "ridgekv: sparse attention: the cached calibration is unusable (%s); online estimation at mass %g\n",
                    e.msg, sp.mass > 0 ? (double)sp.mass : 0.95);
            else if (o->verbose)
                fprintf(stderr, "ridgekv: sparse attention with the calibration %s%s%s\n", path, warn[0] ? ": " : "",
                        warn);
        }
    }
    if (sp.on) sp.calib = calib_model == m ? calib : NULL;
    *out = sp;
    return 0;
}
