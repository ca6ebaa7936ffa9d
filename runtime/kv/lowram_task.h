/* Internal to LowRAM attention: one (layer, KV head, query tile) of work (head_task), the
 * online softmax and the key-cache slot check the phases share (small, always inline), and
 * the phases' entry points.
 *
 * The phases whose inner loops are vector code are built twice (runtime/meson.build): for
 * the baseline target and, with -mavx2 -mfma -mf16c and LR_ISA_AVX2 defined, for AVX2; their
 * entry points carry the suffix LR_ISA() gives (none, or _avx2) and lowram_attn.c picks one
 * after rk_cpu_has_avx2(). Each phase keeps its hot loops in its own translation unit:
 *   lowram_chunk.c   (per ISA) head_run: exact rows, compressed chunks (keys from the key
 *                    cache or rebuilt, scores, Σ a·c), the W product, the output
 *   lowram_summary.c (per ISA) the unselected chunks' summary rows
 *   lowram_select.c  (per ISA) landmark scores, the chunk choice (budget, two-level, top-p,
 *                    spread)
 *   lowram_keys.c    sparse decode's per-head choice, key-cache hits and misses, the
 *                    LR_KEYS batches and the slot encoding
 *   lowram_attn.c    the workers over the pool and lr_attention */
#pragma once
#include <math.h>
#include <string.h>

#include "lowram_impl.h"
#include "lowram_simd.h"
#include "rk_kernels.h"

#ifdef LR_ISA_AVX2
#ifndef LR_HAVE_ACC_AVX2
#error "LR_ISA_AVX2 needs -mavx2 -mfma -mf16c"
#endif
#define LR_ISA(name) name##_avx2
#else
#define LR_ISA(name) name
#endif

/* One (layer, KV head, query tile) of work. State row j = local query i * grp + jj. */
typedef struct head_task {
    rk_kv_codec *c;
    lr_scratch *x;
    int l, h, grp, ns; /* ns state rows */
    int64_t i0, pos0;  /* first query row of the tile and its position */
    const float *q;    /* (n_q, q_dim) */
    float *out;
    bool sparse, use_c;  /* use_c: values have a predictor (acc_c is needed) */
    const int32_t *sel;  /* sparse decode: chunks chosen and rebuilt beforehand (n_sel), */
    const int32_t *slot; /* their key-cache slots */
    int64_t n_sel;
    bool vsum;        /* unselected chunks from the layer's value summaries (L->vsm) */
    int part, n_part; /* sparse decode: this task attends share `part` of n_part (> 1)
                              * of the head's rows and writes its unnormalised state to pout
                              * ((ns, head_dim + 2): Σ a·v, max, Σ a) */
    float *pout;
    const float *qdot; /* sparse decode: q_j·landmark of every chunk from the selection
                              * ((ns, n_ch) rows), or NULL */
    const float *pre;  /* sparse decode: every chunk's landmark score, computed over the
                              * pool beforehand (lr_score_range), or NULL: the selection scores */
} head_task;

LR_AI const float *q_of(const head_task *t, int j) {
    const int qd = t->c->n_head * t->c->hd;
    return t->q + (t->i0 + j / t->grp) * qd + (size_t)(t->h * t->grp + j % t->grp) * t->c->hd;
}

/* Online softmax for state row j: rescale the running state to the new maximum (from mx,
 * the block's maximum), turn the block's nv scores in sc into weights exp(s - m) and add
 * their sum. */
LR_AI void online_update(const head_task *t, int j, float *sc, int nv, float mx) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd, rc = lr_vr(c, &c->g[c->ly[t->l].grp]);
    const float m_new = mx > x->st_m[j] ? mx : x->st_m[j];
    if (m_new > x->st_m[j]) {
        const float a = expf(x->st_m[j] - m_new); /* 0 on the first block */
        x->st_l[j] *= a, x->st_a[j] *= a;
        scal(x->acc_v + (size_t)j * hd, a, hd);
        if (t->use_c) scal(x->acc_c + (size_t)j * c->r_max, a, rc);
        x->st_m[j] = m_new;
    }
    float sum = 0;
#ifdef LR_ISA_AVX2
    sum = exp_sum_avx2(sc, nv, m_new);
#else
    for (int k = 0; k < nv; k++) sum += sc[k] = expf(sc[k] - m_new);
#endif
    x->st_l[j] += sum;
}

/* Scores of nb keys kb for every state row, then the online-softmax rescale; returns per
 * state row the weights in x->sc (0 for keys a query may not see). kpos0 >= 0: keys sit
 * at kpos0.. and are causal-masked; < 0: every key is visible. */
LR_AI void scores(const head_task *t, const float *kb, int nb, int64_t kpos0, const float *bias) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    const int hd = c->hd;
    const float scale = 1.0f / sqrtf((float)hd);
    for (int j = 0; j < t->ns; j++) {
        const float *qv = q_of(t, j);
        float *sc = x->sc + (size_t)j * c->sc_ld;
        int nv = nb;
        if (kpos0 >= 0) {
            const int64_t lim = t->pos0 + j / t->grp - kpos0 + 1; /* keys kpos0 + k, k < lim */
            nv = lim < 0 ? 0 : lim < nb ? (int)lim : nb;
        }
        float mx = -INFINITY;
        for (int k = 0; k < nv; k++) {
            sc[k] = rk_simd_dot8(qv, kb + (size_t)k * hd, hd) * scale + (bias ? bias[k] : 0.0f);
            mx = sc[k] > mx ? sc[k] : mx;
        }
        for (int k = nv; k < nb; k++) sc[k] = 0;
        if (nv == 0) continue;
        online_update(t, j, sc, nv, mx);
    }
}

/* The online-softmax part of scores() for nb scores already in x->sc (every key visible). */
LR_AI void softmax_block(const head_task *t, int nb) {
    const rk_kv_codec *c = t->c;
    lr_scratch *x = t->x;
    for (int j = 0; j < t->ns; j++) {
        float *sc = x->sc + (size_t)j * c->sc_ld, mx = -INFINITY;
        for (int k = 0; k < nb; k++) mx = sc[k] > mx ? sc[k] : mx;
        if (mx == -INFINITY) {
            for (int k = 0; k < nb; k++) sc[k] = 0;
            continue;
        }
        online_update(t, j, sc, nb, mx);
    }
}

/* Key-cache slot k of H holds the current keys of a chunk below n_ch. */
LR_AI bool kc_valid(const rk_kv_codec *c, const lr_group *g, const lr_head *H, int k, int64_t n_ch) {
    const int64_t ch = H->kc_ch[k], C = c->p.chunk;
    if (ch < 0 || ch >= n_ch || H->kc_epoch[k] != c->epoch) return false;
    return H->kc_rows[k] == (g->n_rows - ch * C < C ? g->n_rows - ch * C : C);
}

/* ---- per-ISA phases (name, name_avx2) ------------------------------------------- */
/* lowram_chunk.c: the task's attention: sinks, chunks (every one, or the chosen ones of
 * t->sel / the selection), summaries, window; writes t->out (or t->pout for a part). */
void lr_head_run(head_task *t);
void lr_head_run_avx2(head_task *t);
/* lowram_summary.c: the chunks not marked in x->mark as one row each, from the mean
 * coefficients (lr_summaries; part 0 of a split head) or from the layer's value summaries
 * (lr_vsummaries; each part its share of the blocks). */
void lr_summaries(const head_task *t, int64_t n_ch);
void lr_summaries_avx2(const head_task *t, int64_t n_ch);
void lr_vsummaries(const head_task *t, int64_t n_ch);
void lr_vsummaries_avx2(const head_task *t, int64_t n_ch);
/* lowram_select.c: the chunks the task attends, by index into x->sel, returns their count:
 * the budget's best landmark scores (their scores stay in x->csc), or top-p over the
 * estimated attention mass (p.topp > 0). */
int64_t lr_select_chunks(const head_task *t, int64_t n_ch);
int64_t lr_select_chunks_avx2(const head_task *t, int64_t n_ch);
int64_t lr_select_topp(const head_task *t, int64_t n_ch);
int64_t lr_select_topp_avx2(const head_task *t, int64_t n_ch);
/* lowram_select.c: the one-level landmark scores of chunks [a, b) into out[a..b) (and the
 * q·landmark dots into t->qdot when set). */
void lr_score_range(const head_task *t, int64_t a, int64_t b, int64_t n_ch, float *out);
void lr_score_range_avx2(const head_task *t, int64_t a, int64_t b, int64_t n_ch, float *out);

/* ---- lowram_keys.c: sparse decode's key cache ----------------------------------- */
/* Every KV head chooses its chunks (lr_select_*), finds its hits in the key cache and orders
 * the victims for its misses and gathers the first batch of them: over the pool, or
 * serially (err set) under a tier. qdot, pre: c->dec.qdot / c->dec.score or NULL. */
rk_status lr_keys_choose(rk_kv_codec *c, int layer, int ns, int64_t pos0, const float *q, bool avx2, const float *qdot,
                         size_t qd_head, const float *pre, rk_err *err);
/* Rebuilds every head's misses through RK_OP_LR_KEYS in batches and encodes them into their
 * slots; with hyst, adds the other valid cached chunks to the heads' choices. */
rk_status lr_keys_rebuild(rk_kv_codec *c, int layer, bool avx2, rk_err *err);
