/* Test helpers of the kernels_quant test (quant_rows.c): the test's own decoder of
 * every dtype's byte layout, independent of kernels/quant_ref.c, and random rows. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rk_gguf.h"
#include "rk_kernels.h"

/* F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q6_K */
#define N_TYPES 8
extern const uint32_t all_types[N_TYPES];

uint16_t rd16(const uint8_t *p);
void put16(uint8_t *p, uint16_t v);
/* binary16 and bfloat16 from their bit fields */
float half_value(uint16_t h);
float bf16_value(uint16_t h);
/* sub-block j's 6-bit scale and min of a q4_K scales[12] */
void q4k_scale_min(const uint8_t *s, int j, int *sc, int *m);
/* Element i of a row; *mag = sum of the magnitudes of the parts that make it. */
float elem(uint32_t type, const uint8_t *row, int64_t i, double *mag);
uint32_t blck(uint32_t type);
size_t row_bytes(uint32_t type, int64_t n);
/* bit-identical floats (any two NaNs count as equal) */
bool same_bits(float a, float b);
uint16_t rand_half(uint64_t *rng, float scale);
/* A random row of n elements with sane block scales, at an odd address of an
 * exact-size allocation; free(*base) frees it. */
uint8_t *rand_row(uint32_t type, int64_t n, uint64_t *rng, void **base);
/* n standard normal floats (malloc) */
float *rand_x(int64_t n, uint64_t *rng);
/* the fast f32 dot's error bound for n elements of summed magnitude mag */
double dot_tol(int64_t n, double mag);
