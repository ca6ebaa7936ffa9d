/* A snapshot of a session's work counters with the rows of each layer (rk_session_layer_rows),
 * for tests that compare counters before and after or between sessions. */
#pragma once
#include <string.h>

#include "rk.h"

enum { TB_MAX_LAYER = 64 }; /* the layers a snapshot keeps (generated and shared models have fewer) */

typedef struct tb_counters {
    rk_session_counters c;
    int n_layer;
    uint64_t exact_rows[TB_MAX_LAYER], filled_rows[TB_MAX_LAYER];
} tb_counters;

static inline tb_counters tb_counters_get(const rk_session *s, int n_layer) {
    tb_counters t;
    memset(&t, 0, sizeof t);
    t.c = *rk_session_get_counters(s);
    t.n_layer = n_layer < TB_MAX_LAYER ? n_layer : TB_MAX_LAYER;
    for (int l = 0; l < t.n_layer; l++) rk_session_layer_rows(s, l, &t.exact_rows[l], &t.filled_rows[l]);
    return t;
}

/* Same counters and the same rows per layer. */
static inline bool tb_counters_eq(const tb_counters *a, const tb_counters *b) {
    if (memcmp(&a->c, &b->c, sizeof a->c) != 0 || a->n_layer != b->n_layer) return false;
    for (int l = 0; l < a->n_layer; l++)
        if (a->exact_rows[l] != b->exact_rows[l] || a->filled_rows[l] != b->filled_rows[l]) return false;
    return true;
}
