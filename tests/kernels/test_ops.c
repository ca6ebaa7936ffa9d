/* The op-case table: every op on every backend (cpu with 1 and 2 threads) vs
 * cpu_ref, first NaN/Inf parity then NMSE = sum (a-b)^2 / sum b^2 under a
 * bound derived from float32 rounding (EPS2 = (2^-24)^2 per rounding step);
 * plus exact hand-computed cases, error statuses and the thread pool. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "q8_ref.h"
#include "rk_kernels.h"
#include "cpu_backends.h"
#include "tb.h"

#define EPS2 3.552713678800501e-15 /* (2^-24)^2: one float32 rounding, squared */
#define PAD_SENTINEL 12345.0f      /* fills row padding; no op produces it here */

enum {
    F_NONE = 0,
    F_NAN = 1,
    F_SPECIAL = 2,
    F_INPLACE = 4,
    F_3D = 8,
    F_PAD = 16,
    F_NOW = 32,
    F_OOP = 64,
    F_TIGHT = 128
};

typedef struct op_case {
    const char *name;
    rk_op op;
    uint32_t type;             /* weight (GET_ROWS, MATMUL), caches (ATTN), dst (CPY_ROWS) */
    int64_t n, d, m;           /* rows; row length (k for MATMUL); MATMUL out columns / vocab / dst rows */
    int n_head, n_head_kv, hd; /* ROPE, ATTN */
    int64_t pos0;              /* ROPE, ATTN; dst_row0 for CPY_ROWS */
    int mode, n_rot;
    int flags;
    double nmse; /* bound; 0 = bit-exact (NaN matches NaN) */
} op_case;

/* Bounds. Each is a multiple of EPS2 with the reason beside it:
 * - exact: ADD/ADD_ROW/CPY_ROWS/GET_ROWS(f32,f16,bf16) round once, identically.
 * - elementwise (RMSNORM, ROPE, SILU_MUL, dequantised GET_ROWS): a handful of
 *   roundings per output plus 1-2 ulp exp / FMA differences: <= 16 roundings,
 *   rms -> 256 EPS2 ~ 1e-12.
 * - MATMUL over k terms in f32 (blocked / FMA / BLAS order): random-walk error of
 *   k roundings against a sum of size sqrt(k) gives NMSE ~ k EPS2 / 2; x64
 *   margin on that (8x on the rms): 32 k EPS2 (k=576: 6.5e-11).
 * - ATTN: scores carry ~hd roundings of |q||k| scale (~1e-6 relative here), exp
 *   is 1-2 ulp and the online rescaling adds a few roundings per key tile; all
 *   enter the output linearly: (1e-5)^2 = 1e-10 covers it with room. A q8_0
 *   cache is dequantised exactly (q * d, one rounding) by every backend, so the
 *   same bound holds; the quantisation error itself is test_kv_q8.c's business.
 * - CPY_ROWS into q8_0: one quantiser for all CPU backends: exact. */
#define B_ELT (256 * EPS2)
#define B_MM(k) (32.0 * (k)*EPS2)
#define B_ATTN 1e-10
/* MATMUL on the cpu backend where it dots quantised weights with 8-bit
 * activations (rk_qdot_fast): x_i becomes d q_i with |x_i - d q_i| <= d/2,
 * d = amax/127 of its 32- or 256-block. The errors enter the output linearly,
 * so NMSE ~ E[e^2] / E[x^2] <= (d/2)^2 / sigma^2; here x ~ N(0, 1) and the amax
 * of <= 256 samples stays under 4 sigma: (4/127)^2 / 4 = 2.5e-4. */
#define B_MMQ 2.5e-4

#define MM(nm, t, n_, k_, m_, fl) \
    { nm, RK_OP_MATMUL, t, n_, k_, m_, 0, 0, 0, 0, 0, 0, fl, B_MM(k_) }
#define MM_ALL_N(nm, t, k_, m_)                                                                       \
    MM(nm " n=1", t, 1, k_, m_, 0), MM(nm " n=3", t, 3, k_, m_, 0), MM(nm " n=17", t, 17, k_, m_, 0), \
        MM(nm " n=64", t, 64, k_, m_, 0), MM(nm " n=300", t, 300, k_, m_, 0)
#define GR(nm, t, n_, d_, vocab, b) \
    { nm, RK_OP_GET_ROWS, t, n_, d_, vocab, 0, 0, 0, 0, 0, 0, 0, b }
#define AT(nm, t, n_, h, hkv, hd_, p0, fl) \
    { nm, RK_OP_ATTN, t, n_, 0, 0, h, hkv, hd_, p0, 0, 0, fl, B_ATTN }
#define RO(nm, n_, h, hd_, p0, md, nrot, fl) \
    { nm, RK_OP_ROPE, RK_DT_F32, n_, hd_, 0, h, 0, hd_, p0, md, nrot, fl, B_ELT }
#define EL(nm, op_, n_, d_, fl, b) \
    { nm, op_, RK_DT_F32, n_, d_, 0, 0, 0, 0, 0, 0, 0, fl, b }
#define LK(nm, t, n_, r_, maxpos, hd_, md, nrot, fl) \
    { nm, RK_OP_LR_KEYS, t, n_, r_, maxpos, 0, 0, hd_, 0, md, nrot, fl, B_MM(r_) + B_ELT }

static op_case cases[] = {
    /* MATMUL: every weight dtype x n = 1, 3 (GEMV), 17, 64, 300 (tiled GEMM);
     * m = 72 is not a multiple of the 16-row tiles or the 4x4 micro-kernel. */
    MM_ALL_N("matmul f32", RK_DT_F32, 512, 72),
    MM_ALL_N("matmul f16", RK_DT_F16, 512, 72),
    MM_ALL_N("matmul bf16", RK_DT_BF16, 512, 72),
    MM_ALL_N("matmul q8_0", RK_DT_Q8_0, 512, 72),
    MM_ALL_N("matmul q4_0", RK_DT_Q4_0, 512, 72),
    MM_ALL_N("matmul q4_1", RK_DT_Q4_1, 512, 72),
    MM_ALL_N("matmul q4_K", RK_DT_Q4_K, 512, 72),
    MM_ALL_N("matmul q6_K", RK_DT_Q6_K, 512, 72),
    MM("matmul f32 k=37 tails", RK_DT_F32, 17, 37, 13, 0),
    MM("matmul f32 k=37 n=3", RK_DT_F32, 3, 37, 13, 0),
    MM("matmul q4_1 576x1536 n=40", RK_DT_Q4_1, 40, 576, 1536, 0),
    MM("matmul q8_0 strided rows n=20", RK_DT_Q8_0, 20, 256, 40, F_PAD),
    MM("matmul q4_0 strided rows n=2", RK_DT_Q4_0, 2, 256, 40, F_PAD),
    MM("matmul f32 NaN in row 5", RK_DT_F32, 9, 64, 24, F_NAN),
    MM("matmul q4_K NaN in row 1, n=2", RK_DT_Q4_K, 2, 256, 24, F_NAN),
    MM("matmul f16 m=1", RK_DT_F16, 33, 64, 1, 0),
    /* GET_ROWS: dequantised rows; f32/f16/bf16 are exact conversions */
    GR("get_rows f32", RK_DT_F32, 5, 512, 50, 0),
    GR("get_rows f16", RK_DT_F16, 5, 512, 50, 0),
    GR("get_rows bf16", RK_DT_BF16, 5, 512, 50, 0),
    GR("get_rows q8_0", RK_DT_Q8_0, 5, 512, 50, B_ELT),
    GR("get_rows q4_0", RK_DT_Q4_0, 5, 512, 50, B_ELT),
    GR("get_rows q4_1", RK_DT_Q4_1, 300, 256, 50, B_ELT),
    GR("get_rows q4_K", RK_DT_Q4_K, 5, 512, 50, B_ELT),
    GR("get_rows q6_K", RK_DT_Q6_K, 5, 512, 50, B_ELT),
    /* ATTN: cache rows past pos0 + n_q are NaN in every case (must stay unread) */
    AT("attn decode single key f32", RK_DT_F32, 1, 4, 2, 16, 0, 0),
    AT("attn decode gqa 9/3 pos 700 f32", RK_DT_F32, 1, 9, 3, 64, 700, 0),
    AT("attn decode gqa 9/3 pos 700 f16", RK_DT_F16, 1, 9, 3, 64, 700, 0),
    AT("attn decode gqa 8/2 pos 3000 f16", RK_DT_F16, 1, 8, 2, 64, 3000, 0),
    AT("attn decode mha 4/4 hd 80 f32", RK_DT_F32, 1, 4, 4, 80, 129, 0),
    AT("attn decode n_q=2 pos 600 f16", RK_DT_F16, 2, 9, 3, 64, 600, 0),
    AT("attn prefill 37 rows f32", RK_DT_F32, 37, 4, 2, 32, 0, 0),
    AT("attn prefill 37 rows f16", RK_DT_F16, 37, 4, 2, 32, 0, 0),
    AT("attn chunked prefill 20 at pos 100 gqa 8/2 f16", RK_DT_F16, 20, 8, 2, 64, 100, 0),
    AT("attn chunked prefill 20 at pos 100 gqa 8/2 f32", RK_DT_F32, 20, 8, 2, 64, 100, 0),
    AT("attn chunked prefill 70 at pos 130 9/3 f32", RK_DT_F32, 70, 9, 3, 64, 130, 0),
    AT("attn cache ends at pos0 + n_q (ASan: no read past it)", RK_DT_F16, 7, 4, 2, 32, 70, F_TIGHT),
    AT("attn decode, cache ends at pos0 + 1", RK_DT_F32, 1, 9, 3, 64, 1000, F_TIGHT),
    AT("attn 3-D views 5 at pos 3, hd 6", RK_DT_F32, 5, 4, 4, 6, 3, F_3D),
    AT("attn 3-D views f16 12 at pos 40", RK_DT_F16, 12, 6, 2, 16, 40, F_3D),
    AT("attn NaN in the last visible key", RK_DT_F32, 6, 4, 2, 32, 10, F_NAN),
    AT("attn NaN in the last visible key f16 decode", RK_DT_F16, 1, 9, 3, 64, 900, F_NAN),
    /* ATTN over q8_0 caches (head_dim a multiple of the 32-element block) */
    AT("attn decode gqa 9/3 pos 700 q8_0", RK_DT_Q8_0, 1, 9, 3, 64, 700, 0),
    AT("attn decode gqa 8/2 pos 3000 q8_0 hd 128", RK_DT_Q8_0, 1, 8, 2, 128, 3000, 0),
    AT("attn prefill 37 rows q8_0", RK_DT_Q8_0, 37, 4, 2, 32, 0, 0),
    AT("attn chunked prefill 20 at pos 100 gqa 8/2 q8_0", RK_DT_Q8_0, 20, 8, 2, 64, 100, 0),
    AT("attn q8_0 cache ends at pos0 + n_q", RK_DT_Q8_0, 7, 4, 2, 32, 70, F_TIGHT),
    AT("attn 3-D views q8_0 12 at pos 40", RK_DT_Q8_0, 12, 6, 2, 32, 40, F_3D),
    AT("attn NaN block in the last visible key q8_0 decode", RK_DT_Q8_0, 1, 9, 3, 64, 900, F_NAN),
    /* decode on the rows as stored (head size a multiple of 32): query heads per KV head of
     * 1-6 in one pass, 7 and 12 in two; key counts off the 64-key tiles */
    AT("attn decode 12/2 hd 128 pos 2500 f16", RK_DT_F16, 1, 12, 2, 128, 2500, 0),
    AT("attn decode 12/2 hd 128 pos 2500 q8_0", RK_DT_Q8_0, 1, 12, 2, 128, 2500, 0),
    AT("attn decode 12/2 hd 128 pos 2500 f32", RK_DT_F32, 1, 12, 2, 128, 2500, 0),
    AT("attn decode 24/2 hd 128 pos 333 q8_0", RK_DT_Q8_0, 1, 24, 2, 128, 333, 0),
    AT("attn decode 14/2 hd 64 pos 130 f16", RK_DT_F16, 1, 14, 2, 64, 130, 0),
    AT("attn decode 10/2 hd 32 pos 64 f32", RK_DT_F32, 1, 10, 2, 32, 64, 0),
    AT("attn decode 5/5 hd 96 pos 77 q8_0", RK_DT_Q8_0, 1, 5, 5, 96, 77, 0),
    AT("attn decode 12/2 hd 128, cache ends at pos0 + 1, q8_0", RK_DT_Q8_0, 1, 12, 2, 128, 1000, F_TIGHT),
    AT("attn NaN in the last visible key f16 decode 12/2 hd 128", RK_DT_F16, 1, 12, 2, 128, 900, F_NAN),
    /* ROPE: in place on (n, n_head, head_dim) */
    RO("rope norm", 7, 4, 64, 0, RK_ROPE_NORM, 64, 0),
    RO("rope neox", 7, 4, 64, 0, RK_ROPE_NEOX, 64, 0),
    RO("rope norm partial n_rot 32", 5, 3, 64, 17, RK_ROPE_NORM, 32, 0),
    RO("rope neox partial n_rot 16, out of place", 5, 3, 32, 9, RK_ROPE_NEOX, 16, F_OOP),
    RO("rope neox pos 100000", 3, 2, 128, 100000, RK_ROPE_NEOX, 128, 0),
    RO("rope norm 300 tokens (threads)", 300, 9, 64, 4, RK_ROPE_NORM, 64, 0),
    RO("rope NaN row", 4, 2, 16, 2, RK_ROPE_NEOX, 16, F_NAN),
    /* element ops */
    EL("rmsnorm d=576", RK_OP_RMSNORM, 5, 576, 0, B_ELT),
    EL("rmsnorm d=7 in place", RK_OP_RMSNORM, 3, 7, F_INPLACE, B_ELT),
    EL("rmsnorm no weight", RK_OP_RMSNORM, 4, 64, F_NOW, B_ELT),
    EL("rmsnorm 300 rows (threads)", RK_OP_RMSNORM, 300, 576, 0, B_ELT),
    EL("rmsnorm NaN row", RK_OP_RMSNORM, 4, 33, F_NAN, B_ELT),
    EL("silu_mul d=1536", RK_OP_SILU_MUL, 3, 1536, 0, B_ELT),
    EL("silu_mul 64x1000 in place (threads)", RK_OP_SILU_MUL, 64, 1000, F_INPLACE, B_ELT),
    EL("silu_mul specials (NaN, +-Inf, +-100)", RK_OP_SILU_MUL, 2, 21, F_SPECIAL, B_ELT),
    EL("add 64x576", RK_OP_ADD, 64, 576, 0, 0),
    EL("add 1x9 specials", RK_OP_ADD, 1, 9, F_SPECIAL, 0),
    EL("add_row 33x1536", RK_OP_ADD_ROW, 33, 1536, 0, 0),
    EL("add_row 2x5", RK_OP_ADD_ROW, 2, 5, 0, 0),
    {"cpy_rows f16 at row 7", RK_OP_CPY_ROWS, RK_DT_F16, 5, 192, 16, 0, 0, 0, 7, 0, 0, F_SPECIAL, 0},
    {"cpy_rows f32 at row 3", RK_OP_CPY_ROWS, RK_DT_F32, 5, 192, 16, 0, 0, 0, 3, 0, 0, 0, 0},
    {"cpy_rows f16 600 rows (threads)", RK_OP_CPY_ROWS, RK_DT_F16, 600, 64, 700, 0, 0, 0, 50, 0, 0, 0, 0},
    {"cpy_rows f16 odd width", RK_OP_CPY_ROWS, RK_DT_F16, 3, 13, 4, 0, 0, 0, 1, 0, 0, F_SPECIAL, 0},
    {"cpy_rows q8_0 at row 7 (specials: NaN blocks)", RK_OP_CPY_ROWS, RK_DT_Q8_0, 5, 192, 16, 0, 0, 0, 7, 0, 0,
     F_SPECIAL, 0},
    {"cpy_rows q8_0 600 rows (threads)", RK_OP_CPY_ROWS, RK_DT_Q8_0, 600, 64, 700, 0, 0, 0, 50, 0, 0, 0, 0},
    /* device scale: split-K attention (few query/head pairs over many keys;
     * the decodes at pos 3000 above split too), tiny heads, the weight shapes of a 1.5B model */
    AT("attn chunked prefill 16 at pos 1200 gqa 8/2 f16 (split-K)", RK_DT_F16, 16, 8, 2, 64, 1200, 0),
    AT("attn decode NaN key at pos 1500 f32 (split-K)", RK_DT_F32, 1, 8, 2, 64, 1500, F_NAN),
    AT("attn prefill 300 rows hd 8 f32", RK_DT_F32, 300, 8, 4, 8, 0, 0),
    AT("attn prefill 100 rows at pos 30 mha 4/4 hd 80 f16", RK_DT_F16, 100, 4, 4, 80, 30, 0),
    MM("matmul q4_K 1536 -> 256 n=24", RK_DT_Q4_K, 24, 1536, 256, 0),
    MM("matmul q4_K 8960 -> 64 n=1", RK_DT_Q4_K, 1, 8960, 64, 0),
    MM("matmul q8_0 1536 -> 300 n=8", RK_DT_Q8_0, 8, 1536, 300, 0),
    MM("matmul q8_0 1536 -> 100 n=9", RK_DT_Q8_0, 9, 1536, 100, 0),
    MM("matmul bf16 768 -> 200 n=33 strided", RK_DT_BF16, 33, 768, 200, F_PAD),
    GR("get_rows q6_K 1536", RK_DT_Q6_K, 40, 1536, 300, B_ELT),
    {"cpy_rows q8_0 128 rows of 256 at row 1000", RK_OP_CPY_ROWS, RK_DT_Q8_0, 128, 256, 1200, 0, 0, 0, 1000, 0, 0,
     F_SPECIAL, 0},
    /* RidgeFill's row moves: exact copies; rows not named keep their values */
    {"scatter_rows 7 of 20 x 96", RK_OP_SCATTER_ROWS, RK_DT_F32, 7, 96, 20, 0, 0, 0, 0, 0, 0, 0, 0},
    {"scatter_rows 300 of 512 x 1536 strided specials", RK_OP_SCATTER_ROWS, RK_DT_F32, 300, 1536, 512, 0, 0, 0, 0, 0, 0,
     F_PAD | F_SPECIAL, 0},
    {"scatter_rows 1 of 1 x 5", RK_OP_SCATTER_ROWS, RK_DT_F32, 1, 5, 1, 0, 0, 0, 0, 0, 0, 0, 0},
    GR("get_rows f32 gather 40 of 64 x 1536 (plan compaction)", RK_DT_F32, 40, 1536, 64, 0),
    /* LowRAM's key rebuild (n rows, r = d coefficients, head_dim hd, positions < m): f32
     * sums of r products against cpu_ref's double (B_MM(r)), then a rotation (B_ELT);
     * LR_KEYS' own tests are tests/runtime/test_lowram.c (lr_keys_op_*) */
    LK("lr_keys f16 basis r 24 hd 64 neox", RK_DT_F16, 37, 24, 6000, 64, RK_ROPE_NEOX, 64, 0),
    LK("lr_keys f32 basis r 20 hd 16 norm n_rot 12 strided", RK_DT_F32, 9, 20, 100, 16, RK_ROPE_NORM, 12, F_PAD),
    LK("lr_keys f16 basis r 64 hd 128 neox 700 rows at 100K", RK_DT_F16, 700, 64, 100000, 128, RK_ROPE_NEOX, 128, 0),
    LK("lr_keys f32 basis r 8 hd 80 neox NaN coefficient", RK_DT_F32, 5, 8, 50, 80, RK_ROPE_NEOX, 80, F_NAN),
};
/* LR_ATTN reads a whole codec state (a struct of 17 buffers, not views): its cases are
 * tests/kernels/test_lr_attn.c (CPU backends vs a double formulation) and test_cuda.c
 * (device vs cpu_ref), on the states of lr_attn_case.h */
/* MATMUL_N is a set of MATMULs bit for bit: tests/kernels/test_matmul_n.c compares it with
 * them on every CPU backend (the MATMUL cases above cover each weight against cpu_ref) */
_Static_assert(RK_OP_COUNT == 13, "op count changed: add cases for the new op");

/* ---- fixtures ---------------------------------------------------------- */
typedef struct fixture {
    rk_op_args a;
    void *mem[8];
    int n_mem;
    int32_t *ids;
    const void *out; /* the buffer the op writes: compared whole, padding included */
    size_t out_n;
    uint32_t out_type;
    int64_t out_ne0; /* q8_0 output: elements per row, bytes between rows */
    size_t out_nb1;
} fixture;

static void *fx_alloc(fixture *f, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    cr_assert(p && f->n_mem < 8);
    f->mem[f->n_mem++] = p;
    return p;
}

static void fx_free(fixture *f) {
    for (int i = 0; i < f->n_mem; i++) free(f->mem[i]);
    free(f->ids);
}

static float urand(uint64_t *s, float lo, float hi) {
    return lo + (hi - lo) * (float)((tb_rand_u64(s) >> 40) * (1.0 / 16777216.0));
}

/* rows x d f32 (+pad floats per row, filled with a sentinel) of N(0, sigma^2) */
static rk_view fx_f32(fixture *f, int64_t rows, int64_t d, int64_t pad, float sigma, uint64_t *s) {
    int64_t ld = d + pad;
    float *p = fx_alloc(f, (size_t)(rows * ld) * sizeof(float));
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < ld; i++) p[r * ld + i] = i < d ? sigma * tb_rand_normal(s) : PAD_SENTINEL;
    return (rk_view){.type = RK_DT_F32, .ne = {d, rows, 1, 1}, .nb1 = (size_t)ld * sizeof(float), .data = p};
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

/* rows x k weights of type: random bytes in every block, f16 scales sane. */
static rk_view fx_weight(fixture *f, uint32_t type, int64_t rows, int64_t k, uint64_t *s) {
    uint64_t rb = 0;
    cr_assert(rk_dtype_row_bytes(type, (uint64_t)k, &rb), "k %lld for %s", (long long)k, rk_dtype_name(type));
    uint8_t *p = fx_alloc(f, (size_t)(rb * (uint64_t)rows));
    const rk_dtype_traits *t = rk_dtype_get(type);
    size_t n_blocks = (size_t)(rb * (uint64_t)rows) / t->type_size;
    for (size_t b = 0; b < n_blocks; b++) {
        uint8_t *q = p + b * t->type_size;
        for (uint32_t i = 0; i < t->type_size; i++) q[i] = (uint8_t)tb_rand_u64(s);
        switch (type) {
        case RK_DT_F32: {
            float v = 0.1f * tb_rand_normal(s);
            memcpy(q, &v, 4);
            break;
        }
        case RK_DT_F16: put16(q, rk_f32_to_f16(0.1f * tb_rand_normal(s))); break;
        case RK_DT_BF16: put16(q, rk_f32_to_bf16(0.1f * tb_rand_normal(s))); break;
        case RK_DT_Q4_0: put16(q, rk_f32_to_f16(urand(s, 0.002f, 0.02f))); break;
        case RK_DT_Q8_0: put16(q, rk_f32_to_f16(urand(s, 0.0005f, 0.005f))); break;
        case RK_DT_Q4_1:
            put16(q, rk_f32_to_f16(urand(s, 0.002f, 0.02f)));
            put16(q + 2, rk_f32_to_f16(urand(s, -0.1f, 0.1f)));
            break;
        case RK_DT_Q4_K:
            put16(q, rk_f32_to_f16(urand(s, 0.0005f, 0.005f)));
            put16(q + 2, rk_f32_to_f16(urand(s, 0.0005f, 0.005f)));
            break;
        case RK_DT_Q6_K: put16(q + 208, rk_f32_to_f16(urand(s, 0.0002f, 0.002f))); break;
        default: cr_assert_fail("no weight generator for %s", rk_dtype_name(type));
        }
    }
    return (rk_view){.type = type, .ne = {k, rows, 1, 1}, .nb1 = (size_t)rb, .data = p};
}

/* KV cache (n_ctx, n_kv*hd) of f32/f16/q8_0, rows >= n_valid set to NaN. */
static rk_view fx_cache(fixture *f, uint32_t type, int64_t n_ctx, int64_t n_valid, int n_kv, int hd, bool view3d,
                        uint64_t *s) {
    int64_t w = (int64_t)n_kv * hd;
    uint64_t rb = 0, hb = 0;
    cr_assert(rk_dtype_row_bytes(type, (uint64_t)w, &rb) && rk_dtype_row_bytes(type, (uint64_t)hd, &hb));
    uint8_t *p = fx_alloc(f, (size_t)(n_ctx * (int64_t)rb));
    float *row = malloc((size_t)w * sizeof(float));
    cr_assert(row);
    for (int64_t r = 0; r < n_ctx; r++) {
        uint8_t *dst = p + (size_t)r * rb;
        for (int64_t i = 0; i < w; i++) row[i] = r < n_valid ? tb_rand_normal(s) : NAN;
        if (type == RK_DT_F16)
            for (int64_t i = 0; i < w; i++) ((uint16_t *)dst)[i] = rk_f32_to_f16(row[i]);
        else if (type == RK_DT_Q8_0) tq8_quant(row, dst, w);
        else memcpy(dst, row, (size_t)w * sizeof(float));
    }
    free(row);
    if (view3d) return (rk_view){.type = type, .ne = {hd, n_kv, n_ctx, 1}, .nb1 = (size_t)hb, .data = p};
    return (rk_view){.type = type, .ne = {w, n_ctx, 1, 1}, .nb1 = (size_t)rb, .data = p};
}

static void set_specials(float *p, int64_t n) {
    const float sp[] = {NAN, INFINITY, -INFINITY, 100.0f, -100.0f, 0.0f, -0.0f, 1e-30f, 65520.0f, 1e-8f};
    for (int64_t i = 0; i < n && i < (int64_t)(sizeof sp / sizeof sp[0]); i++) p[i] = sp[i];
}

static void fx_out(fixture *f, const rk_view *v) {
    int64_t rows = v->ne[1] * v->ne[2] * v->ne[3];
    size_t elt = v->type == RK_DT_F16 ? 2 : 4;
    f->out = v->data;
    f->out_n = rows > 0 ? (size_t)(rows - 1) * v->nb1 / elt + (size_t)v->ne[0] : 0;
    if (v->type == RK_DT_Q8_0) f->out_n = (size_t)(rows * v->ne[0]); /* element i: row i / ne0 */
    f->out_type = v->type;
    f->out_ne0 = v->ne[0];
    f->out_nb1 = v->nb1;
}

static void build(const op_case *c, uint64_t seed, fixture *f) {
    memset(f, 0, sizeof *f);
    uint64_t s = seed;
    rk_op_args *a = &f->a;
    a->op = c->op;
    int64_t pad = c->flags & F_PAD ? 3 : 0;
    switch (c->op) {
    case RK_OP_MATMUL:
        a->src0 = fx_weight(f, c->type, c->m, c->d, &s);
        a->src1 = fx_f32(f, c->n, c->d, pad, 1.0f, &s);
        a->dst = fx_f32(f, c->n, c->m, pad, 0.0f, &s);
        if (c->flags & F_NAN) ((float *)a->src1.data)[(c->n > 5 ? 5 : 1) * (a->src1.nb1 / 4) + 3] = NAN;
        fx_out(f, &a->dst);
        break;
    case RK_OP_GET_ROWS:
        a->src0 = fx_weight(f, c->type, c->m, c->d, &s);
        a->dst = fx_f32(f, c->n, c->d, 0, 0.0f, &s);
        f->ids = malloc((size_t)c->n * sizeof(int32_t));
        for (int64_t i = 0; i < c->n; i++) f->ids[i] = (int32_t)(tb_rand_u64(&s) % (uint64_t)c->m);
        a->ids = f->ids;
        fx_out(f, &a->dst);
        break;
    case RK_OP_ATTN: {
        int64_t n_valid = c->pos0 + c->n, n_ctx = n_valid + (c->flags & F_TIGHT ? 0 : 9);
        bool v3 = c->flags & F_3D;
        a->attn = (rk_attn_params){c->n_head, c->n_head_kv, c->hd, 1.0f / sqrtf((float)c->hd), c->pos0};
        a->src0 = fx_f32(f, c->n, (int64_t)c->n_head * c->hd, 0, 1.0f, &s);
        a->src1 = fx_cache(f, c->type, n_ctx, n_valid, c->n_head_kv, c->hd, v3, &s);
        a->src2 = fx_cache(f, c->type, n_ctx, n_valid, c->n_head_kv, c->hd, v3, &s);
        a->dst = fx_f32(f, c->n, (int64_t)c->n_head * c->hd, 0, 0.0f, &s);
        if (v3) {
            a->src0.ne[0] = a->dst.ne[0] = c->hd;
            a->src0.ne[1] = a->dst.ne[1] = c->n_head;
            a->src0.ne[2] = a->dst.ne[2] = c->n;
            a->src0.nb1 = a->dst.nb1 = (size_t)c->hd * 4;
        }
        if (c->flags & F_NAN) { /* key n_valid-1 of KV head 0: only the last query sees it */
            size_t at = (size_t)(n_valid - 1) * (size_t)c->n_head_kv * c->hd + 1;
            if (c->type == RK_DT_F16) ((uint16_t *)a->src1.data)[at] = 0x7e00;
            else if (c->type == RK_DT_Q8_0) /* the scale of that row's first block */
                put16((uint8_t *)a->src1.data + (size_t)(n_valid - 1) * (size_t)c->n_head_kv * c->hd / 32 * 34, 0x7e00);
            else ((float *)a->src1.data)[at] = NAN;
        }
        fx_out(f, &a->dst);
        break;
    }
    case RK_OP_ROPE:
        a->rope = (rk_rope_params){
            .mode = c->mode, .n_rot = c->n_rot, .freq_base = c->pos0 > 1000 ? 1e6f : 10000.0f, .pos0 = c->pos0};
        a->src0 = fx_f32(f, c->n * c->n_head, c->hd, 0, 1.0f, &s);
        a->src0.ne[1] = c->n_head;
        a->src0.ne[2] = c->n;
        if (c->flags & F_NAN) ((float *)a->src0.data)[c->hd + 2] = NAN;
        if (c->flags & F_OOP) {
            a->dst = fx_f32(f, c->n * c->n_head, c->hd, 0, 0.0f, &s);
            a->dst.ne[1] = c->n_head;
            a->dst.ne[2] = c->n;
            fx_out(f, &a->dst);
        } else {
            fx_out(f, &a->src0);
        }
        break;
    case RK_OP_RMSNORM:
        a->src0 = fx_f32(f, c->n, c->d, 0, 3.0f, &s);
        if (!(c->flags & F_NOW)) {
            a->src1 = fx_f32(f, 1, c->d, 0, 0.0f, &s);
            for (int64_t i = 0; i < c->d; i++) ((float *)a->src1.data)[i] = urand(&s, 0.6f, 1.4f);
        }
        a->dst = c->flags & F_INPLACE ? a->src0 : fx_f32(f, c->n, c->d, 0, 0.0f, &s);
        a->eps = 1e-5f;
        if (c->flags & F_NAN) ((float *)a->src0.data)[c->d + 4] = NAN;
        fx_out(f, &a->dst);
        break;
    case RK_OP_SILU_MUL:
        a->src0 = fx_f32(f, c->n, c->d, 0, 3.0f, &s);
        a->src1 = fx_f32(f, c->n, c->d, 0, 1.0f, &s);
        a->dst = c->flags & F_INPLACE ? a->src0 : fx_f32(f, c->n, c->d, 0, 0.0f, &s);
        if (c->flags & F_SPECIAL) set_specials(a->src0.data, c->d);
        fx_out(f, &a->dst);
        break;
    case RK_OP_ADD:
    case RK_OP_ADD_ROW:
        a->dst = fx_f32(f, c->n, c->d, 0, 1.0f, &s);
        a->src0 = fx_f32(f, c->op == RK_OP_ADD ? c->n : 1, c->d, 0, 1.0f, &s);
        if (c->flags & F_SPECIAL) set_specials(a->src0.data, c->d);
        fx_out(f, &a->dst);
        break;
    case RK_OP_CPY_ROWS:
        a->src0 = fx_f32(f, c->n, c->d, 0, 2.0f, &s);
        if (c->flags & F_SPECIAL) set_specials(a->src0.data, c->d);
        a->dst = fx_cache(f, c->type, c->m, c->m, 1, (int)c->d, false, &s);
        a->dst_row0 = c->pos0;
        fx_out(f, &a->dst);
        break;
    case RK_OP_SCATTER_ROWS: {
        a->src0 = fx_f32(f, c->n, c->d, pad, 1.0f, &s);
        if (c->flags & F_SPECIAL) set_specials(a->src0.data, c->d);
        a->dst = fx_f32(f, c->m, c->d, pad, 2.0f, &s);
        /* n distinct rows of m: a partial Fisher-Yates shuffle */
        int32_t *perm = malloc((size_t)c->m * sizeof(int32_t));
        cr_assert(perm);
        for (int64_t i = 0; i < c->m; i++) perm[i] = (int32_t)i;
        for (int64_t i = 0; i < c->n; i++) {
            int64_t j = i + (int64_t)(tb_rand_u64(&s) % (uint64_t)(c->m - i));
            int32_t t = perm[i];
            perm[i] = perm[j], perm[j] = t;
        }
        f->ids = perm;
        a->ids = f->ids;
        fx_out(f, &a->dst);
        break;
    }
    case RK_OP_LR_KEYS: {
        a->rope = (rk_rope_params){.mode = c->mode, .n_rot = c->n_rot, .freq_base = c->m > 10000 ? 1e6f : 10000.0f};
        a->src0 = fx_f32(f, c->n, c->d, pad, 1.0f, &s); /* coefficients (n, r) */
        if (c->flags & F_NAN) ((float *)a->src0.data)[(c->n > 2 ? 2 : 0) * (a->src0.nb1 / 4) + 1] = NAN;
        a->src1 = fx_weight(f, c->type, c->d, c->hd, &s); /* basis (r rows of hd) */
        if (pad) { /* rows further apart than hd: the same rows inside a wider block */
            rk_view w = fx_weight(f, c->type, c->d, c->hd + 32, &s);
            for (int64_t j = 0; j < c->d; j++)
                memcpy((char *)w.data + (size_t)j * w.nb1, (char *)a->src1.data + (size_t)j * a->src1.nb1, a->src1.nb1);
            w.ne[0] = c->hd;
            a->src1 = w;
        }
        a->src2 = fx_f32(f, 2, c->hd, 0, 1.0f, &s); /* mean, then 1/s in [0.5, 2] */
        for (int64_t i = 0; i < c->hd; i++) ((float *)a->src2.data)[c->hd + i] = urand(&s, 0.5f, 2.0f);
        a->dst = fx_f32(f, c->n, c->hd, pad, 0.0f, &s);
        f->ids = malloc((size_t)c->n * sizeof(int32_t));
        cr_assert(f->ids);
        for (int64_t i = 0; i < c->n; i++) f->ids[i] = (int32_t)(tb_rand_u64(&s) % (uint64_t)c->m);
        a->ids = f->ids;
        fx_out(f, &a->dst);
        break;
    }
    case RK_OP_LR_ATTN:
    case RK_OP_MATMUL_N:
    case RK_OP_COUNT: cr_assert_fail("bad op");
    }
}

static rk_backend *make_be(int which) {
    rk_backend *be = cpu_backend(which);
    cr_assert_eq(be->n_threads, which == 0 ? 1 : which == 3 ? 2 : which);
    return be;
}

#define FOR_EACH_BACKEND(be)                    \
    for (int which_ = 0; which_ <= 3; which_++) \
        for (rk_backend *be = make_be(which_); be; rk_backend_destroy(be), be = NULL)

/* Runs the case on be from a fresh fixture; returns the written buffer as double. */
static double *run_case(const op_case *c, rk_backend *be, size_t *n_out) {
    fixture f;
    build(c, 0x5eed0000u + (uint64_t)(c - cases), &f);
    rk_err err = {0};
    rk_status st = rk_backend_run(be, &f.a, &err);
    cr_assert_eq(st, RK_OK, "%s on %s: %s", c->name, be->ops->name, err.msg);
    double *out = malloc(f.out_n * sizeof(double) + 1);
    for (size_t i = 0; i < f.out_n; i++)
        out[i] = f.out_type == RK_DT_Q8_0  ? tq8_get((const uint8_t *)f.out + i / (size_t)f.out_ne0 * f.out_nb1,
                                                     (int64_t)(i % (size_t)f.out_ne0))
                 : f.out_type == RK_DT_F16 ? rk_f16_to_f32(((const uint16_t *)f.out)[i])
                                           : ((const float *)f.out)[i];
    *n_out = f.out_n;
    fx_free(&f);
    return out;
}

/* NaN/Inf parity, then NMSE over the finite entries. */
static void compare_b(const op_case *c, double bound, const char *be_name, const double *got, const double *want,
                      size_t n) {
    double num = 0, den = 0;
    size_t n_nan = 0;
    for (size_t i = 0; i < n; i++) {
        if (want[i] == PAD_SENTINEL || got[i] == PAD_SENTINEL) { /* row padding: never written */
            cr_assert_eq(got[i], want[i], "%s on %s: padding at %zu overwritten", c->name, be_name, i);
            continue;
        }
        cr_assert_eq(isnan(got[i]), isnan(want[i]), "%s on %s: NaN parity at %zu (%g vs ref %g)", c->name, be_name, i,
                     got[i], want[i]);
        if (isnan(want[i])) {
            n_nan++;
            continue;
        }
        if (isinf(want[i]) || isinf(got[i])) {
            cr_assert_eq(got[i], want[i], "%s on %s: Inf parity at %zu (%g vs ref %g)", c->name, be_name, i, got[i],
                         want[i]);
            continue;
        }
        if (c->nmse == 0)
            cr_assert_eq(got[i], want[i], "%s on %s: not exact at %zu (%.9g vs ref %.9g)", c->name, be_name, i, got[i],
                         want[i]);
        num += (got[i] - want[i]) * (got[i] - want[i]);
        den += want[i] * want[i];
    }
    double nmse = den > 0 ? num / den : num;
    cr_assert_leq(nmse, bound, "%s on %s: NMSE %.3g > bound %.3g", c->name, be_name, nmse, bound);
    if (c->flags & F_NAN) cr_assert_gt(n_nan, 0, "%s: the injected NaN did not reach the output", c->name);
    if (c->op == RK_OP_ATTN && !(c->flags & F_NAN))
        cr_assert_eq(n_nan, 0, "%s: NaN cache rows past pos0 + n_q leaked into the output", c->name);
}

#define N_CASES (sizeof cases / sizeof cases[0])

#ifdef RK_OPS_TWIN
/* test_cuda.c's build of this file: the table, the fixtures and compare()
 * through op_twin.h; the tests below are this suite's only. */
#include "op_twin.h"
/* used by this suite's own tests only */
static const struct {
    double *(*run)(const op_case *, rk_backend *, size_t *);
    rk_backend *(*make)(int);
} op_twin_unused_ __attribute__((unused)) = {run_case, make_be};
int op_twin_count(void) { return (int)N_CASES; }
op_twin_info op_twin_case(int i) {
    const op_case *c = &cases[i];
    return (op_twin_info){c->name, c->op, c->type, c->n, c->nmse};
}
double *op_twin_run(int i, rk_backend *be, op_twin_runner run, void *ud, size_t *n_out) {
    const op_case *c = &cases[i];
    fixture f;
    build(c, 0x5eed0000u + (uint64_t)i, &f);
    rk_err err = {0};
    rk_status st = run ? run(be, &f.a, c->op == RK_OP_MATMUL || c->op == RK_OP_GET_ROWS, ud, &err)
                       : rk_backend_run(be, &f.a, &err);
    cr_assert_eq(st, RK_OK, "%s on %s: %s", c->name, be->ops->name, err.msg);
    double *out = malloc(f.out_n * sizeof(double) + 1);
    for (size_t j = 0; j < f.out_n; j++)
        out[j] = f.out_type == RK_DT_Q8_0  ? tq8_get((const uint8_t *)f.out + j / (size_t)f.out_ne0 * f.out_nb1,
                                                     (int64_t)(j % (size_t)f.out_ne0))
                 : f.out_type == RK_DT_F16 ? rk_f16_to_f32(((const uint16_t *)f.out)[j])
                                           : ((const float *)f.out)[j];
    *n_out = f.out_n;
    fx_free(&f);
    return out;
}
void op_twin_compare(int i, const char *be_name, double nmse, const double *got, const double *want, size_t n) {
    compare_b(&cases[i], nmse, be_name, got, want, n);
}
#endif

#ifndef RK_OPS_TABLE_ONLY
/* The parameter is the case index: Criterion copies parameters into the test
 * process, where pointers (the case names) from this one would dangle. */
ParameterizedTestParameters(ops, vs_ref) {
    static int idx[N_CASES];
    for (size_t i = 0; i < N_CASES; i++) idx[i] = (int)i;
    return cr_make_param_array(int, idx, N_CASES);
}

ParameterizedTest(int *ci, ops, vs_ref, .timeout = 120) {
    cr_assert(*ci >= 0 && (size_t)*ci < N_CASES);
    const op_case *c = &cases[*ci];
    rk_err err = {0};
    rk_backend *ref = NULL;
    cr_assert_eq(rk_backend_cpu_ref_create(&ref, &err), RK_OK, "%s", err.msg);
    size_t n_ref = 0, n_got = 0;
    double *want = run_case(c, ref, &n_ref);
    for (int which = 1; which <= 3; which++) {
        rk_backend *cpu = make_be(which);
        char name[32];
        snprintf(name, sizeof name, "%s x%d", which == 3 ? "portable" : "cpu", cpu->n_threads);
        double *got = run_case(c, cpu, &n_got);
        cr_assert_eq(n_got, n_ref);
        const double bound = c->op == RK_OP_MATMUL && which != 3 && rk_qdot_fast(c->type) ? B_MMQ : c->nmse;
        compare_b(c, bound, name, got, want, n_ref);
        /* second run on the same instance: workspaces reused */
        double *again = run_case(c, cpu, &n_got);
        compare_b(c, bound, name, again, want, n_ref);
        free(again);
        free(got);
        rk_backend_destroy(cpu);
    }
    /* the attention NaN must hit exactly the last query row (for KV head 0) */
    if (c->op == RK_OP_ATTN && (c->flags & F_NAN)) {
        int64_t w = (int64_t)c->n_head * c->hd, group = c->n_head / c->n_head_kv;
        for (int64_t t = 0; t < c->n; t++)
            for (int64_t h = 0; h < c->n_head; h++)
                cr_assert_eq(isnan(want[t * w + h * c->hd]), t == c->n - 1 && h < group,
                             "%s: NaN pattern at token %lld head %lld", c->name, (long long)t, (long long)h);
    }
    free(want);
    rk_backend_destroy(ref);
}

/* ---- exact hand-computed cases ------------------------------------------ */
static rk_view v2(uint32_t type, int64_t d, int64_t rows, void *data) {
    size_t elt = type == RK_DT_F16 ? 2 : 4;
    return (rk_view){.type = type, .ne = {d, rows, 1, 1}, .nb1 = (size_t)d * elt, .data = data};
}

Test(exact, rope_unit_vector_pos1) {
    FOR_EACH_BACKEND(be) {
        for (int mode = 0; mode <= 2; mode += 2) {
            float x[8] = {1, 0, 0, 0, 1, 0, 0, 0}; /* 2 heads of 4 */
            rk_op_args a = {.op = RK_OP_ROPE, .src0 = v2(RK_DT_F32, 4, 2, x)};
            a.src0.ne[1] = 2; /* heads */
            a.rope = (rk_rope_params){.mode = mode, .n_rot = 4, .freq_base = 10000.0f, .pos0 = 1};
            rk_err err = {0};
            cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
            /* pair 0 rotates by theta_0 = pos * base^0 = 1 rad; NORM pairs (0,1), NEOX (0,2) */
            int other = mode == RK_ROPE_NEOX ? 2 : 1;
            for (int h = 0; h < 2; h++) {
                cr_assert_float_eq(x[4 * h], cosf(1.0f), 1e-7f, "%s mode %d", be->ops->name, mode);
                cr_assert_float_eq(x[4 * h + other], sinf(1.0f), 1e-7f, "%s mode %d", be->ops->name, mode);
                for (int i = 1; i < 4; i++)
                    if (i != other) cr_assert_eq(x[4 * h + i], 0.0f, "%s mode %d dim %d", be->ops->name, mode, i);
            }
        }
    }
}

Test(exact, rope_pos0_is_identity) {
    FOR_EACH_BACKEND(be) {
        float x[6] = {0.5f, -2, 3, 7, -1.25f, 9}, y[6];
        memcpy(y, x, sizeof x);
        rk_op_args a = {.op = RK_OP_ROPE, .src0 = v2(RK_DT_F32, 6, 1, y)};
        a.rope = (rk_rope_params){.mode = RK_ROPE_NORM, .n_rot = 6, .freq_base = 10000.0f, .pos0 = 0};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        for (int i = 0; i < 6; i++) cr_assert_eq(y[i], x[i], "%s dim %d", be->ops->name, i);
    }
}

Test(exact, attn_single_key_is_v) {
    for (int type = 0; type <= 1; type++) {
        FOR_EACH_BACKEND(be) {
            /* 2 heads sharing 1 KV head of 4; one query at pos 0 sees only key 0 */
            float q[8] = {1, 2, 3, 4, -1, 0, 5, 2}, out[8] = {0};
            float kf[4] = {0.5f, 1, -2, 3}, vf[4] = {1.5f, -2.25f, 3, 0.125f};
            uint16_t kh[4], vh[4];
            for (int i = 0; i < 4; i++) kh[i] = rk_f32_to_f16(kf[i]), vh[i] = rk_f32_to_f16(vf[i]);
            uint32_t t = type ? RK_DT_F16 : RK_DT_F32;
            rk_op_args a = {.op = RK_OP_ATTN,
                            .src0 = v2(RK_DT_F32, 8, 1, q),
                            .dst = v2(RK_DT_F32, 8, 1, out),
                            .src1 = v2(t, 4, 1, type ? (void *)kh : (void *)kf),
                            .src2 = v2(t, 4, 1, type ? (void *)vh : (void *)vf)};
            a.attn = (rk_attn_params){2, 1, 4, 0.5f, 0};
            rk_err err = {0};
            cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
            for (int i = 0; i < 8; i++) cr_assert_eq(out[i], vf[i % 4], "%s type %d at %d", be->ops->name, type, i);
        }
    }
}

Test(exact, attn_two_equal_keys_average) {
    FOR_EACH_BACKEND(be) {
        /* equal keys -> equal weights: output = (v0 + v1) / 2 exactly for these values */
        float q[2] = {0.3f, -0.7f}, out[4] = {0};
        float k[4] = {1, 2, 1, 2}, v[4] = {1, 4, 3, -8};
        rk_op_args a = {.op = RK_OP_ATTN,
                        .src0 = v2(RK_DT_F32, 2, 1, q),
                        .dst = v2(RK_DT_F32, 2, 1, out),
                        .src1 = v2(RK_DT_F32, 2, 2, k),
                        .src2 = v2(RK_DT_F32, 2, 2, v)};
        a.attn = (rk_attn_params){1, 1, 2, 1.0f, 1};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(out[0], 2.0f, "%s", be->ops->name);
        cr_assert_eq(out[1], -2.0f, "%s", be->ops->name);
    }
}

Test(exact, rmsnorm_constant_vector) {
    FOR_EACH_BACKEND(be) {
        /* v = 4 everywhere, eps 0: mean(v^2) = 16, v / 4 = 1, output = weight */
        float x[16], w[16], y[16];
        for (int i = 0; i < 16; i++) x[i] = i < 8 ? 4.0f : -4.0f, w[i] = 0.5f + 0.25f * i;
        rk_op_args a = {.op = RK_OP_RMSNORM,
                        .src0 = v2(RK_DT_F32, 8, 2, x),
                        .src1 = v2(RK_DT_F32, 8, 1, w),
                        .dst = v2(RK_DT_F32, 8, 2, y),
                        .eps = 0.0f};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        for (int i = 0; i < 16; i++) cr_assert_eq(y[i], i < 8 ? w[i] : -w[i % 8], "%s at %d", be->ops->name, i);
    }
}

Test(exact, matmul_small_integers) {
    FOR_EACH_BACKEND(be) {
        /* x (2, 3) . w(2 rows of 3)^T: small integers, exact in f32 */
        float x[6] = {1, 2, 3, -1, 0, 2}, w[6] = {4, 5, 6, 1, -1, 0.5f}, y[4];
        rk_op_args a = {.op = RK_OP_MATMUL,
                        .src0 = v2(RK_DT_F32, 3, 2, w),
                        .src1 = v2(RK_DT_F32, 3, 2, x),
                        .dst = v2(RK_DT_F32, 2, 2, y)};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        const float want[4] = {32, 0.5f, 8, 0};
        for (int i = 0; i < 4; i++) cr_assert_eq(y[i], want[i], "%s at %d", be->ops->name, i);
    }
}

Test(exact, silu_mul_values) {
    FOR_EACH_BACKEND(be) {
        float a0[3] = {0, 1, -2}, b0[3] = {5, 2, 1}, y[3];
        rk_op_args a = {.op = RK_OP_SILU_MUL,
                        .src0 = v2(RK_DT_F32, 3, 1, a0),
                        .src1 = v2(RK_DT_F32, 3, 1, b0),
                        .dst = v2(RK_DT_F32, 3, 1, y)};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(y[0], 0.0f);
        cr_assert_float_eq(y[1], (float)(2.0 / (1.0 + exp(-1.0))), 2e-7f, "%s", be->ops->name);
        cr_assert_float_eq(y[2], (float)(-2.0 / (1.0 + exp(2.0))), 2e-7f, "%s", be->ops->name);
    }
}

Test(exact, cpy_rows_f16_bits) {
    FOR_EACH_BACKEND(be) {
        /* round to nearest even, overflow to inf, subnormals */
        float x[8] = {1.0f, 0.1f, 65504.0f, 65520.0f, -2.0f, 5.9604645e-8f, 1e-9f, 0.33325195f};
        const uint16_t want[8] = {0x3c00, 0x2e66, 0x7bff, 0x7c00, 0xc000, 0x0001, 0x0000, 0x3555};
        uint16_t dst[24];
        for (int i = 0; i < 24; i++) dst[i] = 0xabcd;
        rk_op_args a = {
            .op = RK_OP_CPY_ROWS, .src0 = v2(RK_DT_F32, 8, 1, x), .dst = v2(RK_DT_F16, 8, 3, dst), .dst_row0 = 1};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        for (int i = 0; i < 24; i++)
            cr_assert_eq(dst[i], i >= 8 && i < 16 ? want[i - 8] : 0xabcd, "%s at %d: %#x", be->ops->name, i, dst[i]);
    }
}

Test(exact, get_rows_f32_copies) {
    FOR_EACH_BACKEND(be) {
        float w[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, y[9];
        int32_t ids[3] = {3, 0, 3};
        rk_op_args a = {
            .op = RK_OP_GET_ROWS, .src0 = v2(RK_DT_F32, 3, 4, w), .dst = v2(RK_DT_F32, 3, 3, y), .ids = ids};
        rk_err err = {0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        const float want[9] = {9, 10, 11, 0, 1, 2, 9, 10, 11};
        for (int i = 0; i < 9; i++) cr_assert_eq(y[i], want[i], "%s at %d", be->ops->name, i);
    }
}

/* ---- statuses ------------------------------------------------------------ */
Test(status, unsupported_and_invalid) {
    FOR_EACH_BACKEND(be) {
        float x[64] = {0}, y[64] = {0};
        uint8_t wq[4 * 34] = {0};
        rk_err err = {0};
        /* ATTN on a q4_1 cache; on a q8_0 cache whose heads (16) are not whole blocks */
        rk_op_args a = {.op = RK_OP_ATTN,
                        .src0 = v2(RK_DT_F32, 32, 1, x),
                        .dst = v2(RK_DT_F32, 32, 1, y),
                        .src1 = {RK_DT_Q4_1, {32, 2, 1, 1}, 20, wq},
                        .src2 = {RK_DT_Q4_1, {32, 2, 1, 1}, 20, wq}};
        a.attn = (rk_attn_params){1, 1, 32, 1.0f, 0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, "ATTN") && strstr(err.msg, "q4_1"), "%s", err.msg);
        a.src1 = a.src2 = (rk_view){RK_DT_Q8_0, {32, 2, 1, 1}, 34, wq};
        a.attn = (rk_attn_params){2, 2, 16, 1.0f, 0};
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, "ATTN") && strstr(err.msg, "q8_0"), "%s", err.msg);
        a.attn = (rk_attn_params){1, 1, 32, 1.0f, 0}; /* whole blocks: runs */
        cr_assert_eq(rk_backend_run(be, &a, &err), RK_OK, "%s", err.msg);
        /* CPY_ROWS into q8_0 rows that are not whole blocks */
        rk_op_args cq = {
            .op = RK_OP_CPY_ROWS, .src0 = v2(RK_DT_F32, 16, 1, x), .dst = {RK_DT_Q8_0, {16, 2, 1, 1}, 34, wq}};
        cr_assert_eq(rk_backend_run(be, &cq, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "CPY_ROWS") && strstr(err.msg, "blocks"), "%s", err.msg);
        /* MATMUL with a q8_1 weight (no row functions) */
        rk_op_args m = {.op = RK_OP_MATMUL,
                        .src0 = {RK_DT_Q8_1, {32, 2, 1, 1}, 36, wq},
                        .src1 = v2(RK_DT_F32, 32, 1, x),
                        .dst = v2(RK_DT_F32, 2, 1, y)};
        cr_assert_eq(rk_backend_run(be, &m, &err), RK_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, "MATMUL") && strstr(err.msg, "q8_1"), "%s", err.msg);
        cr_assert_not(be->ops->supports(be, &m));
        /* MATMUL with mismatched k */
        m.src0 = v2(RK_DT_F32, 16, 2, x);
        cr_assert_eq(rk_backend_run(be, &m, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "MATMUL"), "%s", err.msg);
        /* q8_0 row that is not whole blocks */
        m.src0 = (rk_view){RK_DT_Q8_0, {48, 2, 1, 1}, 34, wq};
        m.src1 = v2(RK_DT_F32, 48, 1, x);
        cr_assert_eq(rk_backend_run(be, &m, &err), RK_E_INVALID_ARG);
        /* GET_ROWS id past the vocabulary, and negative */
        int32_t ids[2] = {0, 4};
        rk_op_args g = {
            .op = RK_OP_GET_ROWS, .src0 = v2(RK_DT_F32, 8, 4, x), .dst = v2(RK_DT_F32, 8, 2, y), .ids = ids};
        cr_assert_eq(rk_backend_run(be, &g, &err), RK_E_INVALID_ARG);
        cr_assert(strstr(err.msg, "GET_ROWS") && strstr(err.msg, "out of range"), "%s", err.msg);
        ids[1] = -1;
        cr_assert_eq(rk_backend_run(be, &g, &err), RK_E_INVALID_ARG);
        /* ROPE with an odd head_dim */
        rk_op_args r = {.op = RK_OP_ROPE, .src0 = v2(RK_DT_F32, 7, 1, x)};
        r.rope = (rk_rope_params){.mode = RK_ROPE_NORM, .n_rot = 6, .freq_base = 10000.0f, .pos0 = 0};
        cr_assert_eq(rk_backend_run(be, &r, &err), RK_E_UNSUPPORTED);
        cr_assert(strstr(err.msg, "ROPE"), "%s", err.msg);
        /* ATTN whose cache is shorter than pos0 + n_q, and a bad head split */
        rk_op_args t = {.op = RK_OP_ATTN,
                        .src0 = v2(RK_DT_F32, 8, 1, x),
                        .dst = v2(RK_DT_F32, 8, 1, y),
                        .src1 = v2(RK_DT_F32, 8, 4, x),
                        .src2 = v2(RK_DT_F32, 8, 4, x)};
        t.attn = (rk_attn_params){1, 1, 8, 1.0f, 4};
        cr_assert_eq(rk_backend_run(be, &t, &err), RK_E_INVALID_ARG);
        t.attn = (rk_attn_params){3, 2, 8, 1.0f, 0};
        cr_assert_eq(rk_backend_run(be, &t, &err), RK_E_INVALID_ARG);
        /* CPY_ROWS past the end of dst */
        rk_op_args cp = {
            .op = RK_OP_CPY_ROWS, .src0 = v2(RK_DT_F32, 8, 2, x), .dst = v2(RK_DT_F16, 8, 4, y), .dst_row0 = 3};
        cr_assert_eq(rk_backend_run(be, &cp, &err), RK_E_INVALID_ARG);
        /* NULLs and bad op ids */
        cr_assert_eq(rk_backend_run(be, NULL, &err), RK_E_INVALID_ARG);
        rk_op_args bad = {.op = RK_OP_COUNT};
        cr_assert_eq(rk_backend_run(be, &bad, &err), RK_E_INVALID_ARG);
        rk_op_args nodata = {.op = RK_OP_ADD, .src0 = v2(RK_DT_F32, 4, 1, x), .dst = v2(RK_DT_F32, 4, 1, NULL)};
        cr_assert_eq(rk_backend_run(be, &nodata, &err), RK_E_INVALID_ARG);
        /* empty views are fine */
        rk_op_args e = {.op = RK_OP_ROPE, .src0 = v2(RK_DT_F32, 8, 0, x)};
        e.rope = (rk_rope_params){.mode = RK_ROPE_NEOX, .n_rot = 8, .freq_base = 10000.0f, .pos0 = 0};
        cr_assert_eq(rk_backend_run(be, &e, &err), RK_OK, "%s", err.msg);
        rk_op_args e2 = {.op = RK_OP_MATMUL,
                         .src0 = v2(RK_DT_F32, 8, 3, x),
                         .src1 = v2(RK_DT_F32, 8, 0, x),
                         .dst = v2(RK_DT_F32, 3, 0, y)};
        cr_assert_eq(rk_backend_run(be, &e2, &err), RK_OK, "%s", err.msg);
    }
    rk_err err = {0};
    cr_assert_eq(rk_backend_run(NULL, NULL, &err), RK_E_INVALID_ARG);
    rk_backend_destroy(NULL);
    cr_assert_eq(rk_backend_cpu_create(1, NULL, &err), RK_E_INVALID_ARG);
}

Test(status, default_thread_count) {
    rk_backend *be = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_backend_cpu_create(0, &be, &err), RK_OK, "%s", err.msg);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    cr_assert_eq(be->n_threads, n > 0 ? (int)n : 1);
    rk_backend_destroy(be);
}

/* ---- pool ------------------------------------------------------------------ */
typedef struct pool_probe {
    atomic_int count[8];
    atomic_int bad_n;
    int want_n;
} pool_probe;

static void probe_fn(void *ctx, int i, int n) {
    pool_probe *p = ctx;
    if (n != p->want_n || i < 0 || i >= n) atomic_fetch_add(&p->bad_n, 1);
    else atomic_fetch_add(&p->count[i], 1);
}

Test(pool, every_index_exactly_once) {
    for (int nt = 1; nt <= 4; nt++) {
        rk_pool *pool = NULL;
        rk_err err = {0};
        cr_assert_eq(rk_pool_create(nt, &pool, &err), RK_OK, "%s", err.msg);
        cr_assert_eq(rk_pool_size(pool), nt);
        for (int it = 0; it < 3000; it++) {
            pool_probe p = {.want_n = nt};
            for (int i = 0; i < 8; i++) atomic_init(&p.count[i], 0);
            atomic_init(&p.bad_n, 0);
            if (it % 500 == 499) usleep(2000); /* let the workers fall asleep: condvar path */
            rk_pool_run(pool, probe_fn, &p);
            cr_assert_eq(atomic_load(&p.bad_n), 0, "pool %d: wrong (i, n) passed", nt);
            for (int i = 0; i < 8; i++)
                cr_assert_eq(atomic_load(&p.count[i]), i < nt ? 1 : 0, "pool %d iteration %d: index %d ran %d times",
                             nt, it, i, atomic_load(&p.count[i]));
        }
        rk_pool_destroy(pool);
    }
    rk_pool_destroy(NULL);
    rk_pool *p = NULL;
    rk_err err = {0};
    cr_assert_eq(rk_pool_create(0, &p, &err), RK_E_INVALID_ARG);
}
#endif /* RK_OPS_TABLE_ONLY */
