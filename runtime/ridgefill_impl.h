/* Internal: RidgeFill pieces shared by forward.c, ridgefill.c and calibrate.c. */
#pragma once
#include "session_impl.h"

/* Checks the fingerprint keys "<prefix>.*" in g against m. RK_E_MISMATCH (naming both
 * models) for another model; RK_OK with a warning for another quantisation. */
rk_status rk_fingerprint_check(const rk_gguf *g, const char *prefix, const rk_model *m, const char *what,
                               char *warning, size_t cap, rk_err *err);
/* Writes the fingerprint keys "<prefix>.*" of m. */
rk_status rk_write_fingerprint(rk_gguf_writer *w, const char *prefix, const rk_model *m, rk_err *err);
/* Ridge fit on rows given directly (X: n x d, Y: n x m, m a multiple of d, row-major):
 * W (d x m) and b (m) with Y ≈ X W + b, by the same centred solve as calibration.
 * Exposed for tests. */
bool rk_ridge_fit_rows(int d, int m, int64_t n, const double *X, const double *Y, double lambda_rel, double *W,
                       double *b);
