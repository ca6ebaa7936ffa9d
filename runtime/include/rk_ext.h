/* The runtime's extension API (librk): what tools above the runtime (the offline fitters,
 * the eval drivers, tests) need beyond rk.h. Same rules as rk.h: opaque types, rk_status
 * returns, nothing prints, reads the environment or exits. */
#pragma once
#include "rk_experimental.h"
#include "rk_gguf.h"

/* Called with the input of layer l (l = n_layer: the final residual, before the output
 * norm) for the n rows of a chunk at positions pos0.. while no row of the chunk is
 * filled (calibration taps this). x is borrowed for the call. */
typedef void (*rk_tap_fn)(void *ud, int layer, const float *x, int64_t n, int64_t pos0);
void rk_session_set_tap(rk_session *s, rk_tap_fn fn, void *ud);

/* Reads cache rows [row0, row0 + n) of layer l as f32 into dst (n, n_head_kv * head_dim):
 * values, or keys (pre_rope: with the rotation undone, as the K projection (+ k-norm)
 * wrote them). Rows must be < n_past. Whatever the KV policy stores (plain, q8,
 * compressed), this gives what attention would see. */
rk_status rk_session_kv_rows(const rk_session *s, int layer, bool values, bool pre_rope, int64_t row0, int64_t n,
                             float *dst, rk_err *err);

/* Model fingerprint keys "<prefix>.*" in map and predictor files (runtime/model). check:
 * RK_E_MISMATCH naming both models for another model; RK_OK with a note in warning
 * (cap bytes, may be NULL) for another quantisation of the same weights. */
rk_status rk_fingerprint_check(const rk_gguf *g, const char *prefix, const rk_model *m, const char *what, char *warning,
                               size_t cap, rk_err *err);
rk_status rk_fingerprint_write(rk_gguf_writer *w, const char *prefix, const rk_model *m, rk_err *err);
