/* Helpers of the runtime suites that read ../shared: skip the test (with the reason) when
 * the file is absent, assert on every failure. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rk.h"
#include "tb.h"
#include "rk_experimental.h"

/* A generated tiny model (tests/tb) written, loaded and its file removed (the mapping keeps
 * it alive); no ../shared needed. The caller destroys it. */
rk_model *rt_tiny_loaded(const tb_tiny_spec *spec);
/* A generated model of stories260K's shape (tb_tiny_stories_spec: llama, 5 layers, n_embd 64,
 * 8 heads, 4 KV heads of 8 dims, n_ff 172, 512 rows of context, f32) with random weights
 * drawn from seed: the fixture of the suites whose assertions hold for any weights. */
rk_model *rt_stories_like(uint64_t seed);
/* n pseudo-random token ids below the model's vocabulary (malloc'd). */
int32_t *rt_random_ids(const rk_model *m, size_t n, uint64_t seed);
/* Loads ../shared/<rel> (the caller destroys it). */
rk_model *rt_load_shared(const char *rel);
/* Token ids (BOS first) of the TinyStories sample, at least `want` of them (malloc'd). */
int32_t *rt_story_ids(const rk_model *m, size_t want);
/* Largest |a[i] - b[i]| over n values. */
double rt_max_abs_diff(const float *a, const float *b, size_t n);
/* Mean KL(p_ref || p) over rows of two logit traces (rows x nv), softmax in double. */
double rt_mean_kl(const float *ref, const float *lg, int rows, int nv);
/* A 512-row session on 2 threads with the LowRAM policy of spec (rk_lowram_parse) and
 * n_batch rows per prefill chunk (0: the default); asserts on failure. */
rk_session *rt_lowram_session(const rk_model *m, const char *spec, int n_batch);
/* Logits of n_dec teacher-forced decode steps (ids[n_p..n_p + n_dec)) after a prefill of
 * ids[0..n_p), (n_dec, nv), malloc'd; asserts on failure. */
float *rt_decode_trace(rk_session *s, const int32_t *ids, int n_p, int n_dec, int nv);
