/* Internal to kernels/cuda: the CUDA backend instance, its device-memory
 * registry, the operand resolver every op uses, and one launcher per op file.
 * Only .cu files include this (C never sees a CUDA header). */
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

/* rk_kernels.h is C11; C++ spells its static assertion differently. */
#ifndef _Static_assert
#define _Static_assert static_assert
#endif
extern "C" {
#include "rk_kernels.h"
}

/* A device block this instance handed out: rk_backend_alloc (owned by the
 * caller until rk_backend_free) or a prepared weight (owned by the instance). */
typedef struct rk_cuda_block {
    char *p;
    size_t bytes;
    bool prepared;
} rk_cuda_block;

/* A prepared weight: the host view it came from and its dense device copy. */
typedef struct rk_cuda_weight {
    rk_view host, dev;
    void *wide; /* quantised weights: dense f16 (m, k) copy for the GEMM path, made on first use; or NULL */
} rk_cuda_weight;

/* Everything mutable lives here: stream, cuBLAS handle, device scratch, the
 * registry. The op table is per instance too (C++ has no array designators
 * for a const one). */
typedef struct rk_cuda rk_cuda;
struct rk_cuda {
    rk_backend be;
    rk_backend_ops ops;
    int device;
    int n_sm;            /* multiprocessors: sizes the split-K of attention */
    cudaStream_t stream; /* every copy and kernel of the instance, in order */
    bool stream_ok;
    cublasHandle_t blas;
    bool blas_ok;
    char *dbuf; /* device scratch: staged host operands, widened weights; grows rarely */
    size_t dcap;
    rk_cuda_block *blocks; /* sorted by p */
    int n_blocks, cap_blocks;
    rk_cuda_weight *weights; /* in prepare order */
    int n_weights, cap_weights;
    /* recorded steps (graph.cu): the stream is capturing between step_begin and step_end */
    bool capturing, capture_bad;
    char capture_why[96]; /* the first call that broke the capture */
    cudaGraphExec_t exec; /* the last step's executable graph, updated in place when it can be */
    char *pinned;         /* pinned host arena for the ids of recorded ops (their copies read it at launch) */
    size_t pinned_cap, pinned_used;
    uint64_t n_launch, n_update, n_instantiate, n_failed;
    /* the copy lane (lane.cu): a second stream, made on first use, and its two events */
    cudaStream_t lane;
    cudaEvent_t ev_compute, ev_lane;
    bool lane_ok;
};

/* ---- memory (memory.cu) ------------------------------------------------- */
rk_status rk_cuda_prepare(rk_backend *be, const rk_view *w, rk_view *out, rk_err *err);
rk_status rk_cuda_mem_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err);
void rk_cuda_mem_free(rk_backend *be, void *p);
rk_status rk_cuda_mem_upload(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err);
rk_status rk_cuda_mem_download(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err);
rk_status rk_cuda_sync(rk_backend *be, rk_err *err);
/* Frees every block and the registry (destroy). */
void rk_cuda_mem_release(rk_cuda *c);
/* The block holding p, or NULL when p is not device memory of this instance. */
const rk_cuda_block *rk_cuda_find_block(const rk_cuda *c, const void *p);

/* ---- pinned host blocks and the copy lane (lane.cu) ---------------------- */
rk_status rk_cuda_host_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err);
void rk_cuda_host_free(rk_backend *be, void *p);
rk_status rk_cuda_lane_copy(rk_backend *be, void *dst, const void *src, size_t bytes, bool to_device, rk_err *err);
rk_status rk_cuda_lane_join(rk_backend *be, rk_err *err);
rk_status rk_cuda_lane_sync(rk_backend *be, rk_err *err);
/* Waits for and destroys the lane (destroy). */
void rk_cuda_lane_release(rk_cuda *c);

/* ---- recorded steps (graph.cu) ------------------------------------------- */
rk_status rk_cuda_step_begin(rk_backend *be, rk_err *err);
rk_status rk_cuda_step_end(rk_backend *be, bool run, rk_err *err);
void rk_cuda_graph_release(rk_cuda *c);
/* RK_OK outside a capture; inside one, marks it broken and fails (call `on` may not run
 * while the stream records: a host transfer, sync, prepare or scratch growth). */
rk_status rk_cuda_no_capture(rk_cuda *c, const char *on, rk_err *err);
/* Where an op's host-memory ids are copied from: src itself, or, while capturing, a slot
 * of the pinned arena holding a copy (the recorded copy reads it when the graph runs);
 * NULL (capture broken) when the arena is full. */
const void *rk_cuda_host_src(rk_cuda *c, const void *src, size_t bytes);

/* ---- operands (backend.cu) ---------------------------------------------- */
/* One view an op reads and/or writes. Views inside a block of the instance are
 * used where they are; any other view is host memory, staged densely in
 * scratch (uploaded when read, downloaded when written), and the op then waits
 * for its result. Two host views with the same data share one staged copy (in
 * place ops). */
typedef struct rk_cuda_arg {
    const rk_view *v; /* NULL or v->data NULL: absent (no RMSNORM weight) */
    bool in, out;
    /* resolved */
    char *dev;  /* row 0 on the device */
    int64_t ld; /* elements of v->type between rows */
    bool staged;
    int alias;  /* staged copy shared with arg[alias], or -1 */
    size_t off; /* staged copy in scratch */
} rk_cuda_arg;

static inline rk_cuda_arg rk_cuda_arg_of(const rk_view *v, bool in, bool out) {
    rk_cuda_arg a = {v, in, out, NULL, 0, false, -1, 0};
    return a;
}

/* Resolves arg[0..n), reserves scratch for the staged copies plus extra bytes
 * (*extra: 256-aligned, NULL when extra is 0) and queues the uploads. */
rk_status rk_cuda_args_begin(rk_cuda *c, const char *on, rk_cuda_arg *arg, int n, size_t extra, char **extra_p,
                             rk_err *err);
/* Queues the downloads of staged outputs and, when anything was staged, waits
 * (the host views must hold the result on return). */
rk_status rk_cuda_args_end(rk_cuda *c, const char *on, const rk_cuda_arg *arg, int n, rk_err *err);

/* ---- launchers (kernels/cuda/<op>.cu) -------------------------------------- */
/* Row-major arrays with row strides in elements (ld*), rows of d floats. */
cudaError_t rk_cuda_rmsnorm(const float *x, int64_t ldx, const float *w, float *y, int64_t ldy, int64_t rows, int64_t d,
                            float eps, cudaStream_t s);
/* x -> y (y may be x): rows = n_tok * n_head head rows of hd; row r is token
 * r / n_head at pos0 + token; dims past n_rot copied when y is not x. */
cudaError_t rk_cuda_rope(const float *x, int64_t ldx, float *y, int64_t ldy, int64_t rows, int64_t n_head, int64_t hd,
                         const rk_rope_params *rope, cudaStream_t s);
cudaError_t rk_cuda_silu_mul(const float *a, int64_t lda, const float *b, int64_t ldb, float *y, int64_t ldy,
                             int64_t rows, int64_t d, cudaStream_t s);
/* y[r][i] += a[bcast ? i : r*lda + i] */
cudaError_t rk_cuda_add(float *y, int64_t ldy, const float *a, int64_t lda, int64_t rows, int64_t d, bool bcast,
                        cudaStream_t s);
/* f16 / bf16 rows (ld elements apart) -> dense f32 (rows, k) */
cudaError_t rk_cuda_to_f32(const void *src, uint32_t type, int64_t ld, float *dst, int64_t rows, int64_t k,
                           cudaStream_t s);

/* Device scratch of at least bytes (contents not kept). Waits for queued work
 * before it frees a smaller one. */
rk_status rk_cuda_scratch(rk_cuda *c, size_t bytes, rk_err *err);
/* Rows of a host view <-> dense device rows (row_bytes apart), on c->stream. */
cudaError_t rk_cuda_upload(rk_cuda *c, void *dev, const rk_view *v);
cudaError_t rk_cuda_download(rk_cuda *c, const rk_view *v, const void *dev);
/* Dense bytes of a view's rows; bytes a strided view spans ((rows-1)*nb1 + row). */
size_t rk_cuda_view_bytes(const rk_view *v);
size_t rk_cuda_view_extent(const rk_view *v);
/* "cuda: <op>: <what>: <cuda name> (<cuda text>)"; status NOMEM for allocation failures. */
rk_status rk_cuda_fail(rk_err *err, const char *op, const char *what, cudaError_t e);

rk_status rk_cuda_matmul(rk_backend *be, const rk_op_args *a, rk_err *err);

/* GET_ROWS (get_rows.cu): dst row r = row ids_dev[r] of src (rows nb1 bytes apart), any weight type. */
cudaError_t rk_cuda_get_rows(const void *src, uint32_t type, size_t nb1, const int32_t *ids_dev, float *dst,
                             int64_t ldd, int64_t n, int64_t d, cudaStream_t s);
/* CPY_ROWS (cpy_rows.cu): n rows of d floats (ldx apart) -> rows nb1 bytes apart from dst_row0, as type
 * f32, f16 or q8_0 (bit-identical to rk_quant_q8_0_from_f32). */
cudaError_t rk_cuda_cpy_rows(const float *x, int64_t ldx, void *dst_row0, uint32_t type, size_t nb1, int64_t n,
                             int64_t d, cudaStream_t s);

/* SCATTER_ROWS (scatter_rows.cu): row ids_dev[i] of y (ldy apart) = row i of x, i < n, rows of d floats. */
cudaError_t rk_cuda_scatter_rows(const float *x, int64_t ldx, const int32_t *ids_dev, float *y, int64_t ldy, int64_t n,
                                 int64_t d, cudaStream_t s);
/* LR_KEYS (lr_keys.cu): cf (n, r) ldc apart, basis r rows of hd (f16 or f32, nbb bytes apart), mw the mean
 * row and the 1/s row ldm apart, positions ids_dev, freq_dev the n_rot/2 angles per position (double). */
#define RK_LR_KEYS_MAX_SMEM (48 * 1024)
size_t rk_cuda_lr_keys_smem(int r, int hd);
cudaError_t rk_cuda_lr_keys(const float *cf, int64_t ldc, const void *basis, bool f16, size_t nbb, const float *mw,
                            int64_t ldm, const int32_t *ids_dev, const double *freq_dev, float *y, int64_t ldy,
                            int64_t n, int r, int hd, int n_rot, bool neox, cudaStream_t s);

/* LR_ATTN (lr_attn.cu): every pointer of a->lr and q / o device memory. scratch bytes and
 * the unit count from rk_cuda_lr_attn_scratch; shared memory per unit block. */
size_t rk_cuda_lr_attn_smem(int ns, int hd);
size_t rk_cuda_lr_attn_scratch(const rk_op_args *a, int *n_units);
cudaError_t rk_cuda_lr_attn(const rk_op_args *a, const float *q, int64_t ldq, float *o, int64_t ldo, char *scratch,
                            cudaStream_t s);

/* MATMUL helpers (gemv.cu). n <= RK_CUDA_GEMV_MAX rows take the GEMV on the stored weights. */
#define RK_CUDA_GEMV_MAX 8
cudaError_t rk_cuda_gemv(const void *w, uint32_t type, size_t nbw, const float *x, int64_t ldx, float *y, int64_t ldy,
                         int64_t n, int64_t m, int64_t k, cudaStream_t s);
/* m rows of k (nbw bytes apart) of any weight type -> dense f16, or bf16 when type is bf16 */
cudaError_t rk_cuda_to_half(const void *w, uint32_t type, size_t nbw, void *out, int64_t m, int64_t k, cudaStream_t s);
cudaError_t rk_cuda_act_to_half(const float *x, int64_t ldx, void *out, bool bf16, int64_t rows, int64_t k,
                                cudaStream_t s);

/* ATTN (attn.cu). Byte strides between tokens and between heads of one token (rk_heads). */
#define RK_ATTN_TK 32         /* keys per shared-memory tile */
#define RK_ATTN_MAX_HD 128    /* head_dim limit of the kernel (shared memory, registers) */
#define RK_ATTN_SPLIT_MIN 256 /* split-K never cuts the keys finer than this */
typedef struct rk_cuda_attn_args {
    const char *q, *k, *v;
    char *o;
    size_t q_tok, q_head, k_tok, k_head, v_tok, v_head, o_tok, o_head;
    int64_t n_q, pos0;
    int group, n_head_kv, hd;
    float scale;
    int n_split;
    int64_t split_len;
    float *part; /* n_split * n_head_kv * n_q * group * (hd + 2) floats when n_split > 1 */
} rk_cuda_attn_args;
size_t rk_cuda_attn_smem(int hd);
/* Splits of the n_kv keys for this many pairs on n_sm multiprocessors; *split_len keys each. */
int rk_cuda_attn_splits(int64_t n_q, int group, int n_head_kv, int64_t n_kv, int n_sm, int64_t *split_len);
cudaError_t rk_cuda_attn(const rk_cuda_attn_args *a, uint32_t type, cudaStream_t s);

static inline int64_t rk_cuda_rows(const rk_view *v) {
    return v->ne[1] * (v->ne[2] ? v->ne[2] : 1) * (v->ne[3] ? v->ne[3] : 1);
}

/* Bytes between rows of a resolved operand on the device (staged copies are dense). */
static inline size_t rk_cuda_arg_nb1(const rk_cuda_arg *x) {
    uint64_t rb = 0;
    rk_dtype_row_bytes(x->v->type, (uint64_t)x->v->ne[0], &rb);
    return x->staged || rk_cuda_rows(x->v) <= 1 ? (size_t)rb : x->v->nb1;
}
/* The operand's view as the device sees it (data on the device, dense when staged). */
static inline rk_view rk_cuda_arg_view(const rk_cuda_arg *x) {
    rk_view v = *x->v;
    v.data = x->dev;
    v.nb1 = rk_cuda_arg_nb1(x);
    return v;
}

static inline size_t rk_cuda_up256(size_t n) { return (n + 255) & ~(size_t)255; }

/* Grid for a grid-stride loop over n items. */
static inline unsigned rk_cuda_blocks(int64_t n, int threads) {
    int64_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}
