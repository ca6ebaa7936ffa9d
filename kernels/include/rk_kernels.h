/* Kernels: per-dtype row functions and one op table per backend.
 * cpu_ref is the scalar oracle (fp32/fp64 accumulation, single thread, never
 * optimised); cpu is AVX2/FMA/F16C with a thread pool; cuda lives in kernels/cuda.
 * Activations are always F32; weights may be any supported dtype. */
#pragma once
#include "rk_base.h"

/* ---- per-dtype row functions ----------------------------------------- */
/* n is a multiple of the dtype's block size. */
typedef void (*rk_to_f32_fn)(const void *src, float *dst, int64_t n);
/* dot(row of weights in dtype, f32 vector) over n elements. */
typedef float (*rk_dot_f32_fn)(const void *w, const float *x, int64_t n);

typedef struct rk_quant_fns {
    rk_to_f32_fn to_f32;
    rk_dot_f32_fn dot;
} rk_quant_fns;

/* Scalar reference; NULL for unsupported types. */
const rk_quant_fns *rk_quant_ref(uint32_t type);
/* AVX2/FMA/F16C version where this CPU has it, else the reference. NULL if unsupported. */
const rk_quant_fns *rk_quant_fast(uint32_t type);
/* f32 -> q8_0 blocks (llama.cpp's block_q8_0, quantize_row_q8_0_ref: d = amax/127
 * stored as f16, q = roundf(x / d)); n a multiple of 32. A block holding a NaN
 * or +-Inf, or whose scale overflows f16, is stored with d = NaN and q = 0, so
 * it reads back as NaN (int8 cannot carry them). The one quantiser of every
 * CPU backend: CPY_ROWS into q8_0 is bit-identical across them. */
void rk_quant_q8_0_from_f32(const float *src, void *dst, int64_t n);
/* Integer dot products against activations quantised to 8 bits once per row
 * (the cpu backend's MATMUL uses them where they exist). An activation row of n
 * elements is n / act_block blocks of act_bytes: act_block 32 (Q4_0, Q4_1,
 * Q8_0 weights: f32 d, int32 sum of the codes, 32 int8 codes) or 256 (Q4_K,
 * Q6_K: f32 d, 16 int16 sums of 16 codes, 256 int8 codes). Codes are
 * nearbyint(x * 127 / amax) in [-127, 127], amax the block's largest |x|, so
 * |x - d q| <= d / 2 per element with d = amax / 127; a block holding a NaN or
 * +-Inf gets d = NaN and reads back as NaN. dot(w, xq, n) = sum w_i * d q_i,
 * exact in the integer part, a few f32 roundings in the scales. Activation
 * buffers (and dot_x4's stride) are 4-byte aligned; weight rows may sit anywhere. */
typedef void (*rk_act_quant_fn)(const float *x, void *dst, int64_t n);
typedef float (*rk_qdot_fn)(const void *w, const void *xq, int64_t n);
typedef struct rk_qdot_fns {
    int act_block;    /* elements per activation block */
    size_t act_bytes; /* bytes per activation block */
    rk_act_quant_fn quant_act;
    rk_qdot_fn dot;
    /* out[r] = dot(w, xq + r * xq_stride, n) for r < 4, bit for bit; NULL: none */
    void (*dot_x4)(const void *w, const void *xq, size_t xq_stride, int64_t n, float *out);
    /* out[i] = dot(w + i * w_stride, xq, n) for i < 2, bit for bit; NULL: none */
    void (*dot_2w)(const void *w, size_t w_stride, const void *xq, int64_t n, float *out);
} rk_qdot_fns;
/* Scalar C versions, for every type above; NULL for other types. */
const rk_qdot_fns *rk_qdot_ref(uint32_t type);
/* AVX2 versions where this CPU has AVX2 (same activation bytes as the scalar
 * quantiser, bit for bit); NULL where there is none. */
const rk_qdot_fns *rk_qdot_fast(uint32_t type);
/* True when the running CPU has AVX2, FMA and F16C (and the build compiled them). */
bool rk_cpu_has_avx2(void);

/* ---- tensors as seen by ops ------------------------------------------ */
/* ne[0] is innermost. Rows are contiguous; row r of a 2-D view starts at
 * data + r * nb1. Activations are f32 with nb1 = ne[0]*4 unless stated. */
typedef struct rk_view {
    uint32_t type;
    int64_t ne[4];
    size_t nb1; /* bytes between rows */
    void *data;
} rk_view;

/* View conventions every backend follows (rk_backend_run checks them and
 * answers RK_E_INVALID_ARG otherwise):
 * - a view is ne[1]*ne[2]*ne[3] rows of ne[0] elements, row r at data + r*nb1;
 *   ne[2], ne[3] left at 0 read as 1; nb1 is a multiple of the element size.
 * - ROPE: src0 is 3-D {head_dim, n_head, n}: rows are heads, a row's token is
 *   row / ne[1]. dst.data NULL or equal to src0.data: in place; else the result
 *   goes to dst (same shape).
 * - ATTN q, dst and the K/V caches: 2-D {heads*head_dim, tokens} (nb1 = token
 *   stride) or 3-D {head_dim, heads, tokens} (nb1 = head stride, tokens heads*nb1
 *   apart). Cache rows at or past pos0 + n_q are never read. A q8_0 cache
 *   counts ne[0] and nb1 the same way (elements, bytes): head_dim is then a
 *   multiple of 32, so every head row is whole blocks.
 * - RMSNORM: src1.data NULL means no weight (1).
 * - CPY_ROWS: dst_row0 counts rows of dst (tokens of a 2-D cache view).
 * - MATMUL: dst must not overlap src0 or src1.
 * - GET_ROWS of f32 rows is a row gather (dst row i = src0 row ids[i]): RidgeFill's plan
 *   compacts rows with it; dst must not overlap src0.
 * - SCATTER_ROWS (the plan's inverse move): f32 src0 (n, d) and dst (rows, d), any row
 *   strides; ids (host memory, n entries) distinct and < rows of dst; rows of dst not
 *   named keep their values; dst must not overlap src0. */
typedef enum rk_op {
    RK_OP_GET_ROWS,     /* dst (n, d) f32 = dequant rows ids[] of src0 (vocab, d) any dtype */
    RK_OP_MATMUL,       /* dst (n, m) f32 = src1 (n, k) f32 x src0^T, src0 (m rows of k) any dtype */
    RK_OP_RMSNORM,      /* dst (rows, d) = src0 / sqrt(mean(src0^2) + eps) * src1 (d) ; in place ok */
    RK_OP_ROPE,         /* in place on src0 (n, n_head, head_dim) f32, position pos0 + i for row i */
    RK_OP_ATTN,         /* causal attention over a KV cache; see rk_attn_params */
    RK_OP_SILU_MUL,     /* dst = silu(src0) * src1, elementwise; in place ok */
    RK_OP_ADD,          /* dst += src0, elementwise */
    RK_OP_ADD_ROW,      /* dst (n, d) += src0 (d), a bias row broadcast */
    RK_OP_CPY_ROWS,     /* dst rows (f32, f16, q8_0) at dst_row0.. = src0 f32 rows (converted) */
    RK_OP_LR_KEYS,      /* LowRAM: post-RoPE keys of one KV head rebuilt from coefficients; see below */
    RK_OP_SCATTER_ROWS, /* dst row ids[i] = src0 row i (f32 rows), i < rows of src0; see below */
    RK_OP_LR_ATTN,      /* LowRAM decode: selection + key rebuild + sparse attention, fused; see below */
    RK_OP_MATMUL_N,     /* dst_i = src1 x w_i^T for up to RK_MATMUL_N_MAX weights of one input; see below */
    RK_OP_COUNT
} rk_op;
_Static_assert(RK_OP_COUNT == 13, "op count changed: update every backend table and op-case table");

typedef enum rk_rope_mode {
    RK_ROPE_NORM = 0, /* rotate pairs (2i, 2i+1): llama */
    RK_ROPE_NEOX = 2, /* rotate pairs (i, i + n_rot/2): qwen2, qwen3 */
} rk_rope_mode;

typedef struct rk_rope_params {
    int mode;        /* rk_rope_mode */
    int n_rot;       /* rotated dims per head (<= head_dim, even) */
    float freq_base; /* theta_i = pos * freq_base^(-2i/n_rot) */
    int64_t pos0;
    /* RoPE scaling, as llama.cpp's ggml_rope_ext (zero-initialised: none). Pair i's angle is
     * pos * freq_base^(-2i/n_rot) * (freq_scale * (1 - r_i) + r_i), r_i = ramp_i * ext_factor,
     * ramp_i = 1 - clamp((i - lo) / max(0.001, hi - lo), 0, 1), [lo, hi] the YaRN correction
     * dims of (n_ctx_orig, beta_fast, beta_slow); cos and sin are multiplied by
     * rk_rope_mscale(). Linear scaling: freq_scale = 1/factor, ext_factor 0. */
    float freq_scale;           /* 1/factor; 0 reads as 1 */
    float ext_factor;           /* YaRN extrapolation mix (1 for YaRN, 0 for none/linear) */
    float attn_factor;          /* multiplies the magnitude; 0 reads as 1 */
    float beta_fast, beta_slow; /* YaRN ramp ends in rotations (llama.cpp: 32, 1) */
    int n_ctx_orig;             /* the context the model was trained on (YaRN only) */
} rk_rope_params;

/* The angle per position of each rotated pair: freq[i], i < n_rot/2, in double (every
 * backend forms pos * freq[i] in double, so large positions keep their precision). */
void rk_rope_freqs(const rk_rope_params *p, double *freq);
/* The factor on cos and sin: attn_factor * (ext_factor != 0 ? 1 + 0.1 ln(1/freq_scale) : 1)
 * (YaRN's attention temperature: the q.k logits grow by its square). */
double rk_rope_mscale(const rk_rope_params *p);
/* YaRN's correction range [lo, hi] in pairs (llama.cpp's ggml_rope_yarn_corr_dims). */
void rk_rope_yarn_corr_dims(const rk_rope_params *p, double dims[2]);

/* Query rows i = 0..n_q-1 sit at positions pos0 + i and attend to cache rows
 * 0..pos0+i (causal). K and V caches: (n_ctx, n_head_kv, head_dim), type f32,
 * f16 or q8_0 (head_dim % 32 == 0; rows written by CPY_ROWS, i.e.
 * rk_quant_q8_0_from_f32), row stride nb1 = row bytes of n_head_kv*head_dim. Query head h uses KV head
 * h / (n_head / n_head_kv). dst (n_q, n_head*head_dim) f32. Never builds the
 * n_q x n_kv score matrix: tiles with an online softmax. */
typedef struct rk_attn_params {
    int n_head, n_head_kv, head_dim;
    float scale; /* usually 1/sqrt(head_dim) */
    int64_t pos0;
} rk_attn_params;

/* RK_OP_LR_KEYS (runtime/kv LowRAM's decode key rebuild, docs/LOWRAM.md): row k of dst
 * (n, hd) f32 = RoPE at position ids[k] of (src0[k] · src1) ∘ src2[1] + src2[0], where
 * src0 (n, r) f32 are a row's coefficients, src1 (r rows of hd, any row stride) F16 or F32
 * the basis columns of the head, src2 (2 rows of hd) f32 the mean and the per-dim 1/s.
 * rope: mode, n_rot, freq_base (pos0 unused: the positions are ids, >= 0). lr_rope_cs:
 * optional (lr_rope_rows, n_rot) table of (cos, sin) pairs per position, angle pos·freq[i]
 * formed in double and rounded to f32 (ids < lr_rope_rows); NULL: the backend forms the
 * angles itself. */
/* RK_OP_LR_ATTN (LowRAM's sparse decode attention over one layer's compressed cache, the
 * codec's state in backend memory; runtime/kv/lowram_attn.c's sparse path with int8
 * coefficients and int8 residuals, docs/LOWRAM.md, docs/GPU.md). Query rows i < n_q
 * (src0 (n_q, n_head*head_dim) f32, post-RoPE, at positions attn.pos0 + i), dst the same
 * shape; attn gives n_head, n_head_kv, head_dim, scale, pos0. Per KV head h and state row
 * j (query row j / grp, query head h*grp + j % grp, grp = n_head / n_head_kv):
 * - selection: chunk ch (rows [ch*chunk, ...) of the n_rows stored rows) scores
 *   max_j q_j . lmk[ch] (f16 landmark, head h's slice); the n_sel best are chosen (ties:
 *   lower index first), all when n_sel >= the chunk count;
 * - a chosen chunk's keys are rebuilt, k = f16(RoPE_pos(mean + (c . B) * winv)) with c the
 *   row's int8 codes times its f16 scale, B this layer's basis columns of head h, pos the
 *   row's stored position, angles pos * freq[i] in double, cos / sin rounded to f32; its
 *   rows are attended (no causal mask: stored rows lie before every query) with value
 *   c W + b + δ, δ the row's int8 residual when mask bit set (slot base[ch] + the rank of
 *   the bit among the chunk's set bits); with key_int8 the rebuilt keys are rounded as
 *   the codec's int8 key cache holds them instead (runtime/kv lr_encode_row): per row and
 *   head s = f16(max_d |k_d| / 127), k_d = clamp(rint(k_d * (1/s)), -127, 127) * s (s 0: 0);
 * - with summaries, every other chunk is one row: key = landmark, value = cmean W + b,
 *   log(rows) added to its score;
 * - exact rows: sinks [0, n_sink) from sk / sv and [x_lo, pos0 + i] from xk / xv (row
 *   p % x_cap), causal.
 * One softmax over all of them; out = Σ a v / Σ a. Every pointer is backend memory of the
 * instance running the op. */
/* most state rows (n_q x query heads per KV head) of one LR_ATTN call */
#define RK_LR_ATTN_MAX_STATE 256
typedef struct rk_lr_attn_args {
    int chunk; /* rows per chunk (1..32) */
    int r;     /* coefficients per stored row */
    int n_sel; /* chunks attended exactly per KV head */
    bool summaries;
    bool key_int8;        /* rebuilt keys rounded as the int8 key cache (kcache=int8), else f16 */
    int n_rot, rope_mode; /* RoPE of the rebuilt keys; freq (n_rot/2) angle per position */
    const double *freq;
    int64_t n_sink;                /* exact sink rows (positions 0..n_sink-1) in sk / sv */
    int64_t x_lo, x_cap;           /* exact positions [x_lo, pos0 + n_q) in xk / xv at row p % x_cap */
    int64_t n_rows;                /* compressed stored rows */
    const void *sk, *sv, *xk, *xv; /* f16 rows of kv_dim = n_head_kv * head_dim */
    const int32_t *pos;            /* (n_rows) stored position of each row */
    const uint8_t *coef;           /* (n_rows) rows of coef_bytes: f16 scale, then r int8 codes */
    size_t coef_bytes;
    const uint16_t *basis; /* (r rows, ldb apart) f16: column h*head_dim + d is head h's dim d */
    int64_t ldb;
    const float *mean, *winv; /* (kv_dim) this layer's slices */
    const uint16_t *lmk;      /* (chunks, kv_dim) f16 landmarks */
    const uint16_t *cmean;    /* (chunks, r) f16 mean coefficients */
    const uint16_t *W;        /* (r, kv_dim) f16 value predictor */
    const float *b;           /* (kv_dim) */
    const uint8_t *res;       /* head h: res + h*res_hstride bytes, slots of res_bytes: f16 scale, head_dim int8 */
    size_t res_bytes, res_hstride;
    const uint32_t *mask; /* head h: mask + h*mb_hstride, (chunks) bit k: row k has a residual */
    const int32_t *base;  /* head h: base + h*mb_hstride, (chunks) residual slot of the chunk's first */
    int64_t mb_hstride;
} rk_lr_attn_args;

/* RK_OP_MATMUL_N: the weights that read one activation (a layer's Q, K and V; gate and up)
 * as one op. mm->w[i] (m_i rows of k, any dtype MATMUL takes) against src1 (n, k) f32 into
 * mm->dst[i] (n, m_i) f32, i < mm->n_w (1..RK_MATMUL_N_MAX); src0 and dst are unused. Each
 * dst[i] is bit for bit what MATMUL(dst[i], w[i], src1) gives on the same backend; the dsts
 * must not overlap src1, the weights or each other. The cpu backend runs the set as one pool
 * dispatch (the activation quantised once per activation format, decode rows of every
 * weight split together). A backend without a kernel for it (NULL entry) runs it as its
 * MATMULs in order: rk_backend_run does, and rk_backend_check_ops counts it as present
 * wherever MATMUL is. */
#define RK_MATMUL_N_MAX 3
typedef struct rk_matmul_n_args {
    int n_w;
    rk_view w[RK_MATMUL_N_MAX];
    rk_view dst[RK_MATMUL_N_MAX];
} rk_matmul_n_args;

typedef struct rk_op_args {
    rk_op op;
    rk_view dst, src0, src1, src2; /* ATTN: src0 = q, src1 = K cache, src2 = V cache */
    const int32_t *ids;            /* GET_ROWS */
    int64_t dst_row0;              /* CPY_ROWS */
    float eps;                     /* RMSNORM */
    rk_rope_params rope;
    rk_attn_params attn;
    /* ATTN, optional (NULL: the cache as above): the attn_n_kv rows of src1/src2 sit at
     * positions attn_kv_pos[j] (non-decreasing, host memory), and query row i sees the rows
     * with attn_kv_pos[j] <= pos0 + i; attn_kv_bias (NULL: 0) is added to row j's scaled
     * score. A row standing for c rows with the same key and value takes bias log c
     * (RidgeFill's grouped filled rows, runtime/prefill/fill_group.c). Host backends only
     * (CUDA's supports() refuses it). */
    const int32_t *attn_kv_pos;
    const float *attn_kv_bias;
    int64_t attn_n_kv;
    /* ATTN, optional (NULL: dense): block-sparse attention, rk_attn_sparse.h. Host backends
     * only (CUDA's supports() refuses it). */
    const struct rk_attn_sparse *attn_sparse;
    const float *lr_rope_cs; /* LR_KEYS: host table or NULL */
    int64_t lr_rope_rows;
    const rk_lr_attn_args *lr;  /* LR_ATTN (host struct; its pointers are backend memory) */
    const rk_matmul_n_args *mm; /* MATMUL_N (host struct) */
} rk_op_args;

typedef struct rk_backend rk_backend;
typedef struct rk_pool rk_pool;
typedef rk_status (*rk_op_fn)(rk_backend *be, const rk_op_args *a, rk_err *err);

typedef struct rk_backend_ops {
    const char *name;
    rk_op_fn op[RK_OP_COUNT]; /* NULL = unsupported */
    /* dtype / shape limits; false -> the caller must fall back or fail */
    bool (*supports)(const rk_backend *be, const rk_op_args *a);
    void (*destroy)(rk_backend *be);
    /* Memory (contracts at rk_backend_prepare .. rk_backend_sync). A NULL entry
     * means host memory: prepare answers the view itself, mem_alloc is a
     * 64-byte aligned zeroed host block, upload/download are memcpy, sync
     * returns at once. */
    rk_status (*prepare)(rk_backend *be, const rk_view *w, rk_view *out, rk_err *err);
    rk_status (*mem_alloc)(rk_backend *be, size_t bytes, void **out, rk_err *err);
    void (*mem_free)(rk_backend *be, void *p);
    rk_status (*upload)(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err);
    rk_status (*download)(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err);
    rk_status (*sync)(rk_backend *be, rk_err *err);
    rk_pool *(*pool)(rk_backend *be); /* NULL: no thread pool */
    /* Said after "op X not implemented yet" by rk_backend_check_ops, e.g.
     * "the CUDA issue adds it"; NULL says nothing more. */
    const char *missing_hint;
    /* Recorded steps (optional, NULL: none; rk_backend_step_begin / _end below). */
    rk_status (*step_begin)(rk_backend *be, rk_err *err);
    rk_status (*step_end)(rk_backend *be, bool run, rk_err *err);
    /* Pinned host blocks and the copy lane (optional, NULL: host blocks from the heap, lane
     * copies are plain upload / download; rk_backend_host_alloc .. _lane_sync below). */
    rk_status (*host_alloc)(rk_backend *be, size_t bytes, void **out, rk_err *err);
    void (*host_free)(rk_backend *be, void *p);
    rk_status (*lane_copy)(rk_backend *be, void *dst, const void *src, size_t bytes, bool to_device, rk_err *err);
    rk_status (*lane_join)(rk_backend *be, rk_err *err);
    rk_status (*lane_sync)(rk_backend *be, rk_err *err);
} rk_backend_ops;

struct rk_backend {
    const rk_backend_ops *ops;
    int n_threads;
    void *impl; /* backend-owned state: pool, workspaces, handles */
};

/* n_threads <= 0: all online cores. */
rk_status rk_backend_cpu_ref_create(rk_backend **out, rk_err *err);
rk_status rk_backend_cpu_create(int n_threads, rk_backend **out, rk_err *err);
/* The cpu backend on a pool the caller owns (borrowed: it must outlive the
 * backend); n_threads = rk_pool_size(pool). This is how one process keeps one
 * pool: whoever owns the process-level state (model, engine) creates the pool
 * once and hands it to every cpu backend and to its own parallel loops. Two
 * backends on one pool may run ops from two threads: rk_pool_run serialises
 * their parallel sections. */
rk_status rk_backend_cpu_create_with_pool(rk_pool *pool, rk_backend **out, rk_err *err);
/* The cpu backend as it runs on a CPU without AVX2: portable C kernels,
 * rk_quant_ref row functions, OpenBLAS sgemm when built with it. For tests and
 * comparisons on machines that have AVX2. */
rk_status rk_backend_cpu_portable_create(int n_threads, rk_backend **out, rk_err *err);
/* CUDA backend on device `device` (kernels/cuda, built only with nvcc + cuBLAS:
 * link rk_kernels_cuda_dep, which defines RK_HAVE_CUDA=1, or reach it through
 * rk_backend_create_named and rk_kernels_any_dep, which load it from the module
 * libridgekv-cuda.so on first use). RK_E_UNSUPPORTED
 * "cuda: no device (...)" when the machine has no usable GPU. RMSNORM, ROPE,
 * SILU_MUL, ADD, ADD_ROW and MATMUL (f32/f16/bf16 weights, cuBLAS) so far.
 * Views in device memory (rk_backend_alloc / rk_backend_prepare of this
 * instance) are used in place and ops only queue work on the instance's
 * stream; views anywhere else are host memory, staged through device scratch,
 * and such an op waits for its result before it returns. */
rk_status rk_backend_cuda_create(int device, rk_backend **out, rk_err *err);
void rk_backend_destroy(rk_backend *be); /* accepts NULL */

/* By name: "cpu" (n_threads as rk_backend_cpu_create), "cpu_ref", "cpu_portable",
 * "cuda" (device 0) or "cuda:N". Lives in rk_kernels_any (link
 * rk_kernels_any_dep), which links the CUDA backend when the build has it, so
 * the base kernels library never depends on CUDA. Statuses: RK_E_INVALID_ARG
 * for an unknown name (the message lists the known ones); RK_E_UNSUPPORTED
 * "cuda: not built (configure with nvcc and cuBLAS)" in a build without CUDA,
 * "cuda: no device (...)" without a usable GPU. */
rk_status rk_backend_create_named(const char *name, int n_threads, rk_backend **out, rk_err *err);
/* Names the CUDA backend module file (libridgekv-cuda.so) that the first "cuda" backend of
 * the process loads, instead of looking beside the executable, in the build tree and in the
 * install tree. The module is loaded once per process: RK_E_INVALID_ARG when it was already
 * looked up from another file. path is copied. A build without CUDA accepts any path. */
RK_API rk_status rk_backend_cuda_module(const char *path, rk_err *err);
/* True when this build can create "cuda" backends (whether a GPU is present is
 * only known by trying). Also in rk_kernels_any. */
bool rk_backend_cuda_built(void);

/* Runs one op: checks support, then dispatches. */
rk_status rk_backend_run(rk_backend *be, const rk_op_args *a, rk_err *err);
/* Statuses of rk_backend_run: RK_E_UNSUPPORTED (op missing from the table or
 * supports() false; the message names the op and the dtypes), RK_E_INVALID_ARG
 * (shapes, strides, ids, params), RK_E_NOMEM (scratch growth). An instance runs
 * one op at a time: it owns its thread pool and scratch. */

/* Before any work starts: RK_E_UNSUPPORTED naming the first of ops[0..n) the
 * backend has no kernel for ("cuda: op GET_ROWS not implemented yet (the CUDA
 * issue adds it)"); RK_E_INVALID_ARG for an op id out of range or n < 0. Dtype
 * limits are still supports()' answer at run time. */
rk_status rk_backend_check_ops(const rk_backend *be, const rk_op *ops, int n, rk_err *err);

/* ---- backend memory ---------------------------------------------------- */
/* Weights and buffers live where the backend computes. A pointer from
 * rk_backend_alloc or a prepared view's data is backend memory: only this
 * instance's ops, upload, download and free may touch it (on cuda it is a
 * device address; on cpu and cpu_ref it is ordinary host memory). Views may
 * point anywhere inside a block (data + offset); ATTN caches, activations and
 * scratch can all live there. ids of GET_ROWS are always host memory. */

/* Prepares weight view w once for this backend; *out is the view its ops take.
 * cpu and cpu_ref: *out = *w (no copy, no repacking: w's memory must outlive
 * every use of *out). cuda: a dense device copy (nb1 = row bytes) uploaded the
 * first time this w->data is prepared and cached in the instance: preparing
 * the same view again returns the same copy without a transfer; the copy is
 * freed by rk_backend_destroy, and w's memory may go once this returns. The
 * same data with another type or shape is RK_E_INVALID_ARG (prepare whole
 * tensors). Statuses: RK_E_INVALID_ARG (bad view: unknown dtype, rows not whole
 * blocks, nb1 too small, NULL data), RK_E_NOMEM, RK_E_INTERNAL (device errors,
 * with the library's text). *out is written only on success. */
rk_status rk_backend_prepare(rk_backend *be, const rk_view *w, rk_view *out, rk_err *err);
/* bytes of zero-filled backend memory, 64-byte aligned (bytes 0 gives a valid
 * block too); free it with rk_backend_free on the same instance before that
 * instance is destroyed. *out written only on success. */
rk_status rk_backend_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err);
void rk_backend_free(rk_backend *be, void *p); /* accepts NULL; p from rk_backend_alloc only */
/* Host src -> backend dst (inside a block of this instance). Returns once src
 * may be reused; ordered before every op run after it. */
rk_status rk_backend_upload(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err);
/* Backend src -> host dst. Waits for every op run before it, so this is where
 * a GPU backend synchronises and where errors of earlier queued work surface
 * (cuda: "cuda: download: <error>"). */
rk_status rk_backend_download(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err);
/* Waits for all queued work (timing, error checks); a no-op on host backends. */
rk_status rk_backend_sync(rk_backend *be, rk_err *err);
/* Recorded steps (cuda: CUDA graphs). step_begin: the ops run after it are recorded, not
 * run, until step_end, which (run true) runs the recording as one unit, queued like an op
 * (cuda: the captured graph updates the executable graph of the last step when only its
 * parameters changed, else is instantiated, then launched), or (run false) drops it.
 * Between the two, ids and parameters are taken as they are at record time, and no
 * upload, download, sync, prepare or scratch growth may happen: such a call fails, and
 * step_end then fails too (RK_E_UNSUPPORTED). When step_end fails nothing of the step
 * ran: the caller runs it again unrecorded. RK_E_UNSUPPORTED from step_begin on a backend
 * without them. */
rk_status rk_backend_step_begin(rk_backend *be, rk_err *err);
rk_status rk_backend_step_end(rk_backend *be, bool run, rk_err *err);

/* ---- pinned host blocks and the copy lane (GPU KV tiers) --------------------------------- */
/* host_alloc: bytes of zeroed host memory the backend copies from and to at full speed
 * (cuda: cudaHostAlloc, page-locked; host backends: a 64-byte aligned heap block); the host
 * reads and writes it directly, but it is not backend memory (an op view on it is staged).
 * Free it with rk_backend_host_free on the same instance, after rk_backend_lane_sync when
 * lane copies touched it.
 * lane_copy: queues a copy between a pinned host block and backend memory (to_device: host
 * src -> backend dst; else backend src -> host dst; to_device with src in backend memory of
 * the same instance: a device-to-device copy) on the copy lane (cuda: a second stream). It starts after every op queued before it (it may read what they wrote) and
 * runs beside the ops queued after it; lane copies run in the order queued. A backend
 * without a lane copies at once (upload / download).
 * lane_join: every op queued after it waits for the lane copies queued before it (cuda: an
 * event the compute stream waits on; no host sync).
 * lane_sync: the host waits for every lane copy queued (before reading or reusing a host
 * block a copy writes or reads); errors of lane copies surface here. */
rk_status rk_backend_host_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err);
void rk_backend_host_free(rk_backend *be, void *p); /* accepts NULL */
rk_status rk_backend_lane_copy(rk_backend *be, void *dst, const void *src, size_t bytes, bool to_device, rk_err *err);
rk_status rk_backend_lane_join(rk_backend *be, rk_err *err);
rk_status rk_backend_lane_sync(rk_backend *be, rk_err *err);

/* The thread pool of a cpu backend (owned by it, or the one it borrowed), for
 * runtime loops that want the same threads (LowRAM codec); NULL for cpu_ref
 * and cuda. Do not run ops of a backend on this pool from inside a job on it:
 * rk_pool_run does not nest. */
rk_pool *rk_backend_pool(rk_backend *be);

/* "MATMUL" etc.; "UNKNOWN_OP" out of range. */
const char *rk_op_name(rk_op op);

/* ---- thread pool (used by the cpu backend and runtime) ----------------- */
rk_status rk_pool_create(int n_threads, rk_pool **out, rk_err *err);
void rk_pool_destroy(rk_pool *p);
int rk_pool_size(const rk_pool *p);
/* Runs fn(ctx, i, n) for i in 0..n-1 on the pool's threads (caller included) and
 * waits for all. n is usually the pool size. */
void rk_pool_run(rk_pool *p, void (*fn)(void *ctx, int i, int n), void *ctx);
/* rk_pool_run from several threads is serialised; fn must not call rk_pool_run
 * on the same pool. Idle workers spin ~200 us, then sleep on a condvar. */
