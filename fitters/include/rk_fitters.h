/* The offline fitters (librk_fitters): RidgeFill's ridge maps and LowRAM's predictor
 * file, fitted once per model over calibration text. They sit above the runtime and use
 * only rk.h and rk_ext.h. Nothing here prints, reads the environment or exits. */
#pragma once
#include "rk_ext.h"

/* ---- RidgeFill maps ------------------------------------------------------------- */
typedef struct rk_calib_params {
    int32_t split;    /* S: first predicted layer input is layer S (1 <= S < n_layer) */
    int32_t stride;   /* sample every stride-th row (0: 8) */
    int32_t seg_len;  /* tokens per exact forward segment (0: 1024) */
    float lambda;     /* < 0: chosen on held-out rows; else relative to tr(XᵀX)/d */
    uint32_t dtype;   /* RK_DT_F16, RK_DT_BF16, RK_DT_Q8_0 (int8 + block scales), RK_DT_F32 */
    float keep_share; /* quality-mode default share of hard tokens kept exact (0: 0.1) */
    int32_t n_threads;
    bool normalized_space; /* fit rmsnorm(x_S) -> rmsnorm(x_l) instead of the raw streams
                            * (measured worse on SmolLM2: docs/RIDGEFILL.md) */
    bool target_kv;        /* predict each late layer's pre-RoPE K and V (after k-norm) from x_S
                           * (2 kv_dim outputs) instead of its input x_l (n_embd outputs) */
} rk_calib_params;

typedef struct rk_calib_report {
    int64_t n_tokens, n_rows, n_heldout;
    float lambda;                /* chosen, relative */
    float heldout_rel_err[256];  /* per late layer: held-out ||Y-Ŷ||² / ||Y-Ȳ||² */
    float identity_rel_err[256]; /* the same for W = I (NaN for K/V targets: no identity there) */
    double seconds_forward, seconds_solve;
    int32_t n_lambda;       /* λ values tried (auto) */
    float lambda_tried[16]; /* relative λ */
    float lambda_err[16];   /* mean held-out relative error over late layers */
} rk_calib_report;

/* One exact forward over ids (in segments), centred fp64 accumulation of XᵀX and XᵀY_l,
 * λ choice, one Cholesky per λ, and the map file serialised into *bytes (malloc'd). */
rk_status rk_calibrate(const rk_model *m, const int32_t *ids, size_t n_ids, const rk_calib_params *p,
                       rk_progress_fn progress, void *ud, void **bytes, size_t *n_bytes, rk_calib_report *report,
                       rk_err *err);

/* Ridge fit on rows given directly (X: n x d, Y: n x m, m a multiple of d, row-major):
 * W (d x m) and b (m) with Y ≈ X W + b, by the same centred solve as calibration. */
bool rk_ridge_fit_rows(int d, int m, int64_t n, const double *X, const double *Y, double lambda_rel, double *W,
                       double *b);

/* ---- LowRAM predictor file ------------------------------------------------------ */
/* Offline predictor file: one exact forward over ids (segments of seg_len starting with
 * BOS), fp64 moments of the stacked pre-RoPE keys per group and of keys x values per
 * layer, one eigendecomposition per group, closed-form value predictors in coefficient
 * space; serialised into *bytes (malloc'd) with the model fingerprint. */
typedef struct rk_lowram_calib_params {
    int32_t group;   /* 0: 3 */
    int32_t rank;    /* basis rows kept in the file (0: the full dim) */
    int32_t seg_len; /* 0: 2048 */
    int32_t stride;  /* sample every stride-th row (0: 2) */
    float lambda;    /* relative ridge (<= 0: 1e-3) */
    int32_t n_threads;
} rk_lowram_calib_params;
rk_status rk_lowram_calibrate(const rk_model *m, const int32_t *ids, size_t n_ids, const rk_lowram_calib_params *p,
                              rk_progress_fn progress, void *ud, void **bytes, size_t *n_bytes, rk_err *err);
