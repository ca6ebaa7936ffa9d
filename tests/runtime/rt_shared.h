/* Helpers of the runtime suites that read ../shared: skip the test (with the reason) when
 * the file is absent, assert on every failure. */
#pragma once
#include <stddef.h>
#include <stdint.h>

#include "rk.h"

/* Loads ../shared/<rel> (the caller destroys it). */
rk_model *rt_load_shared(const char *rel);
/* Token ids (BOS first) of the TinyStories sample, at least `want` of them (malloc'd). */
int32_t *rt_story_ids(const rk_model *m, size_t want);
