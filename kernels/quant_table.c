/* Per-dtype row function tables (reference and AVX2) and their dispatch. */
#include <stdatomic.h>

#include "quant_impl.h"

#ifdef RK_HAVE_AVX2
#include <cpuid.h>
#endif

#define RK_QUANT_ROW(prefix, t) \
    { prefix##_##t##_to_f32, prefix##_##t##_dot }
#define RK_QUANT_TABLE(prefix)                                                                \
    {                                                                                         \
        [RK_DT_F32] = RK_QUANT_ROW(prefix, f32), [RK_DT_F16] = RK_QUANT_ROW(prefix, f16),     \
        [RK_DT_Q4_0] = RK_QUANT_ROW(prefix, q4_0), [RK_DT_Q4_1] = RK_QUANT_ROW(prefix, q4_1), \
        [RK_DT_Q8_0] = RK_QUANT_ROW(prefix, q8_0), [RK_DT_Q4_K] = RK_QUANT_ROW(prefix, q4_K), \
        [RK_DT_Q6_K] = RK_QUANT_ROW(prefix, q6_K), [RK_DT_BF16] = RK_QUANT_ROW(prefix, bf16), \
    }

/* Unlisted ids (Q8_1, Q8_K: never weights) stay {NULL, NULL}. */
static const rk_quant_fns ref_fns[RK_DT_BF16 + 1] = RK_QUANT_TABLE(rk_quant_ref);
#ifdef RK_HAVE_AVX2
static const rk_quant_fns avx2_fns[RK_DT_BF16 + 1] = RK_QUANT_TABLE(rk_quant_avx2);
#endif

static const rk_quant_fns *lookup(const rk_quant_fns *tab, uint32_t type) {
    if (type > RK_DT_BF16 || !tab[type].to_f32) return NULL;
    return &tab[type];
}

const rk_quant_fns *rk_quant_ref(uint32_t type) { return lookup(ref_fns, type); }

static bool probe_avx2(void) {
#ifdef RK_HAVE_AVX2
    /* __builtin_cpu_supports checks the OS saves YMM state for "avx2"; clang 14
     * has no "f16c" name, so that bit (CPUID.1:ECX[29]) is read directly. */
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return false;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    return (c & bit_F16C) != 0;
#else
    return false;
#endif
}

bool rk_cpu_has_avx2(void) {
    /* cpuid traps under a hypervisor (~90 us measured here) and this sits on hot
     * paths, so the answer -- a fact about the machine, not program state -- is
     * probed once. Racing first calls store the same value. */
    static atomic_int state; /* 0 unknown, 1 no, 2 yes */
    int v = atomic_load_explicit(&state, memory_order_relaxed);
    if (v == 0) {
        v = probe_avx2() ? 2 : 1;
        atomic_store_explicit(&state, v, memory_order_relaxed);
    }
    return v == 2;
}

const rk_quant_fns *rk_quant_fast(uint32_t type) {
#ifdef RK_HAVE_AVX2
    if (rk_cpu_has_avx2()) return lookup(avx2_fns, type);
#endif
    return lookup(ref_fns, type);
}

/* ---- integer dot products against 8-bit activations ---------------------- */
#define RK_QDOT_ROW(pre, t, blk, x4, w2)                                                                           \
    {                                                                                                              \
        blk, blk == 32 ? sizeof(rk_act_q8_32) : sizeof(rk_act_q8_K), blk == 32 ? pre##_act_q8_32 : pre##_act_q8_K, \
            pre##_##t##_dot, x4, w2                                                                                \
    }
#define RK_QDOT_TABLE(pre, x4, w2q4_1)                                       \
    {                                                                        \
        [RK_DT_Q4_0] = RK_QDOT_ROW(pre, q4_0, 32, x4(pre, q4_0), NULL),      \
        [RK_DT_Q4_1] = RK_QDOT_ROW(pre, q4_1, 32, x4(pre, q4_1), w2q4_1),    \
        [RK_DT_Q8_0] = RK_QDOT_ROW(pre, q8_0, 32, x4(pre, q8_0), NULL),      \
        [RK_DT_Q4_K] = RK_QDOT_ROW(pre, q4_K, RK_QK_K, x4(pre, q4_K), NULL), \
        [RK_DT_Q6_K] = RK_QDOT_ROW(pre, q6_K, RK_QK_K, x4(pre, q6_K), NULL), \
    }
#define RK_NO_X4(pre, t) NULL
#define RK_X4(pre, t) pre##_##t##_dot_x4

static const rk_qdot_fns qref_fns[RK_DT_BF16 + 1] = RK_QDOT_TABLE(rk_qref, RK_NO_X4, NULL);
#ifdef RK_HAVE_AVX2
/* dot_2w only for Q4_1: for Q4_K and Q6_K a two-row kernel was no faster (docs/PERFORMANCE.md) */
static const rk_qdot_fns qavx2_fns[RK_DT_BF16 + 1] = RK_QDOT_TABLE(rk_qavx2, RK_X4, rk_qavx2_q4_1_dot_2w);
#endif

static const rk_qdot_fns *qlookup(const rk_qdot_fns *tab, uint32_t type) {
    if (type > RK_DT_BF16 || !tab[type].dot) return NULL;
    return &tab[type];
}

const rk_qdot_fns *rk_qdot_ref(uint32_t type) { return qlookup(qref_fns, type); }

const rk_qdot_fns *rk_qdot_fast(uint32_t type) {
#ifdef RK_HAVE_AVX2
    if (rk_cpu_has_avx2()) return qlookup(qavx2_fns, type);
#endif
    (void)type;
    return NULL;
}
