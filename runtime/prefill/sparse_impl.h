/* Internal: sparse attention's calibration file and the calibration pass's accumulators
 * (sparse.c, sparse_fit.c). */
#pragma once
#include "rk_attn_sparse.h"
#include "session_impl.h"

struct rk_sparse_calib {
    int32_t n_layer, n_head;
    int32_t block, n_sink, window, n_est; /* the geometry the masses were measured with */
    float *mass;                          /* (n_layer, n_head) */
};

/* The calibration pass (rk_sparse_fit): per layer, the kernel's counters for the thresholds
 * tried; its calls go sparse from min_kv keys on and compute with every line kept. */
typedef struct rk_sparse_acc {
    int64_t min_kv;
    rk_attn_sparse_cal *layer; /* (n_layer) */
} rk_sparse_acc;

/* p with its zeros replaced by the defaults of rk.h (and the calibration's geometry). */
void rk_sparse_resolve(const rk_sparse_params *p, rk_sparse_params *out);
/* p's ranges and its calibration against m (rk_session_set_fill). */
rk_status rk_sparse_check(const rk_sparse_params *p, const rk_model *m, rk_err *err);
/* The resolved settings and a hash of the calibration's masses as text (the document
 * cache's key); false (nothing written) when p is off. */
bool rk_sparse_key(const rk_sparse_params *p, char *buf, size_t cap);
/* rk_sparse_calib_load over bytes (borrowed only during the call). */
rk_status rk_sparse_calib_parse(const void *bytes, size_t len, const rk_model *m, rk_sparse_calib **out, char *warning,
                                size_t warning_cap, rk_err *err);
