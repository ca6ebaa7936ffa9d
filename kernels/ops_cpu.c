/* cpu backend: the ops split over a persistent thread pool, vector work done
 * by the rk_cpu_kern table (AVX2 when the CPU has it, portable C otherwise),
 * quantised rows through rk_quant_fast (portable variant: rk_quant_ref).
 * Scratch lives in the instance and grows rarely; no per-op allocation once it
 * has reached its working size. */
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ops_impl.h"

#if defined(RK_HAVE_BLAS)
#include <cblas.h>
#endif

/* Below this many activation rows MATMUL is a fused GEMV with the dtype's dot;
 * from here on weights are dequantised tile by tile and multiplied as f32
 * (measured on a 576x1536 q4_1/q8_0/f16 weight: the tiled path wins from 4 rows). */
#define RK_GEMM_MIN_N 4
/* A dequantised weight tile is about this many floats (sits in L2). */
#define RK_GEMM_TILE_FLOATS 32768
/* Integer path: bytes of quantised weight rows per prefill tile (L2-resident). */
#define RK_GEMM_TILE_BYTES 131072
#define RK_QK_K_ELTS 256 /* elements per K-quant block */
/* Attention: query rows (x heads of a KV group) per task, keys per tile,
 * minimum keys per chunk when decode splits the keys. */
#define RK_ATTN_ROWS 128
#define RK_ATTN_KT 64
#define RK_ATTN_MIN_CHUNK 256
#define RK_ATTN_DIRECT_MAX 32 /* most query heads per KV head that attn_direct takes */
#define RK_ATTN_BATCH 128     /* most rows per KV head whose P x V a whole tile takes at once */
/* Element ops go parallel only above this many elements (a pool dispatch
 * costs about half a microsecond, more when the workers have gone to sleep). */
#define RK_PAR_MIN_ELTS 16384

typedef struct cpu_impl {
    rk_pool *pool;
    bool own_pool; /* false: borrowed (rk_backend_cpu_create_with_pool) */
    int n_threads;
    const rk_cpu_kern *k;
    const rk_quant_fns *(*quant)(uint32_t);
    /* integer GEMV against 8-bit activations (rk_qdot_fast); NULL: portable */
    const rk_qdot_fns *(*qdot)(uint32_t);
    /* OpenBLAS sgemm for the f32 tiles; only without AVX2: our 3x4 AVX2 kernel
     * measured 80 GFLOP/s per core against OpenBLAS 0.3.21's 30 on this box. */
    bool use_blas;
    float **tls; /* [n_threads] per-thread scratch of tls_floats */
    size_t tls_floats;
    float *shared; /* shared_floats, partial attention states */
    size_t shared_floats;
} cpu_impl;

/* ---- portable kernels ------------------------------------------------- */
static float gen_dot(const float *a, const float *b, int64_t n) {
    float s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}
static void gen_gemm_nt(int64_t n, int64_t m, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                        float *y, int64_t ldy) {
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) y[i * ldy + j] = gen_dot(x + i * ldx, w + j * ldw, k);
}
static void gen_f16_to_f32(const uint16_t *s, float *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = rk_f16_to_f32(s[i]);
}
static void gen_f32_to_f16(const float *s, uint16_t *d, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = rk_f32_to_f16(s[i]);
}
static float gen_sumsq(const float *x, int64_t n) { return gen_dot(x, x, n); }
static void gen_scale_mul(float *d, const float *x, float s, const float *w, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = x[i] * s * (w ? w[i] : 1.0f);
}
static void gen_silu_mul(float *d, const float *a, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = a[i] / (1.0f + expf(-a[i])) * b[i];
}
static void gen_add(float *d, const float *a, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] += a[i];
}
static float gen_exp_sub(float *s, int64_t n, float m) {
    float sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (s[i] = expf(s[i] - m));
    return sum;
}
static void gen_pv(float *acc, float alpha, const float *p, const float *v, int64_t ldv, int64_t n, int64_t hd) {
    for (int64_t d = 0; d < hd; d++) acc[d] *= alpha;
    for (int64_t j = 0; j < n; j++)
        for (int64_t d = 0; d < hd; d++) acc[d] += p[j] * v[j * ldv + d];
}

static const rk_cpu_kern kern_generic = {
    .name = "generic",
    .dot = gen_dot,
    .gemm_nt = gen_gemm_nt,
    .f16_to_f32 = gen_f16_to_f32,
    .f32_to_f16 = gen_f32_to_f16,
    .sumsq = gen_sumsq,
    .scale_mul = gen_scale_mul,
    .silu_mul = gen_silu_mul,
    .add = gen_add,
    .exp_sub = gen_exp_sub,
    .pv = gen_pv,
};

/* ---- workspace and parallel loop --------------------------------------- */
static void free_tls(cpu_impl *c) {
    if (c->tls)
        for (int i = 0; i < c->n_threads; i++) free(c->tls[i]);
}

/* Makes every thread's scratch hold at least per_thread floats and the
 * shared buffer at least shared floats. Contents are not kept. */
static rk_status ws_reserve(cpu_impl *c, size_t per_thread, size_t shared, rk_err *err) {
    if (per_thread > c->tls_floats) {
        size_t nf = (per_thread + per_thread / 4 + 15) & ~(size_t)15;
        free_tls(c);
        c->tls_floats = 0;
        for (int i = 0; i < c->n_threads; i++) {
            c->tls[i] = aligned_alloc(64, nf * sizeof(float));
            if (!c->tls[i]) {
                for (int j = i; j < c->n_threads; j++) c->tls[j] = NULL;
                return rk_err_set(err, RK_E_NOMEM, "kernels: cpu: scratch of %zu floats x %d threads", nf,
                                  c->n_threads);
            }
        }
        c->tls_floats = nf;
    }
    if (shared > c->shared_floats) {
        size_t nf = (shared + shared / 4 + 15) & ~(size_t)15;
        free(c->shared);
        c->shared_floats = 0;
        c->shared = aligned_alloc(64, nf * sizeof(float));
        if (!c->shared) return rk_err_set(err, RK_E_NOMEM, "kernels: cpu: shared scratch of %zu floats", nf);
        c->shared_floats = nf;
    }
    return RK_OK;
}

typedef void (*range_fn)(void *ctx, int64_t i0, int64_t i1, int tid);

typedef struct par_ctx {
    range_fn fn;
    void *ctx;
    int64_t n, chunk;
    atomic_llong next;
} par_ctx;

static void par_worker(void *vp, int tid, int nt) {
    (void)nt;
    par_ctx *p = vp;
    for (;;) {
        int64_t i0 = atomic_fetch_add_explicit(&p->next, p->chunk, memory_order_relaxed);
        if (i0 >= p->n) break;
        p->fn(p->ctx, i0, i0 + p->chunk < p->n ? i0 + p->chunk : p->n, tid);
    }
}

/* fn over [0, n) in chunks handed out dynamically; inline when one chunk. */
static void par_for(cpu_impl *c, int64_t n, int64_t chunk, range_fn fn, void *ctx) {
    if (n <= 0) return;
    if (chunk < 1) chunk = 1;
    if (c->n_threads == 1 || n <= chunk) {
        fn(ctx, 0, n, 0);
        return;
    }
    par_ctx p = {.fn = fn, .ctx = ctx, .n = n, .chunk = chunk};
    atomic_init(&p.next, 0);
    rk_pool_run(c->pool, par_worker, &p);
}

/* Rows per chunk for a row-wise op of d elements per row: about four chunks
 * per thread, serial when the op is too small to pay for a dispatch. */
static int64_t row_chunk(const cpu_impl *c, int64_t rows, int64_t d) {
    if (rows * d < RK_PAR_MIN_ELTS) return rows;
    int64_t ch = (rows + 4 * c->n_threads - 1) / (4 * c->n_threads);
    int64_t min_rows = d > 0 ? (RK_PAR_MIN_ELTS / 4 + d - 1) / d : 1;
    return ch > min_rows ? ch : min_rows;
}

/* ---- GET_ROWS ----------------------------------------------------------- */
typedef struct rows_ctx {
    const rk_op_args *a;
    const cpu_impl *c;
    const rk_quant_fns *q; /* GET_ROWS of a non-f32 table */
} rows_ctx;

static void get_rows_range(void *vp, int64_t i0, int64_t i1, int tid) {
    (void)tid;
    const rows_ctx *x = vp;
    const rk_op_args *a = x->a;
    int64_t d = a->dst.ne[0];
    for (int64_t i = i0; i < i1; i++) {
        const char *src = (const char *)a->src0.data + (size_t)a->ids[i] * a->src0.nb1;
        float *out = rk_row_f32(&a->dst, i);
        if (a->src0.type == RK_DT_F32) memcpy(out, src, (size_t)d * sizeof(float));
        else x->q->to_f32(src, out, d);
    }
}

static rk_status cpu_get_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)err;
    cpu_impl *c = be->impl;
    int64_t n = rk_view_rows(&a->dst);
    rows_ctx x = {a, c, c->quant(a->src0.type)};
    par_for(c, n, row_chunk(c, n, a->dst.ne[0]), get_rows_range, &x);
    return RK_OK;
}

/* ---- MATMUL, MATMUL_N --------------------------------------------------- */
/* One weight of a matmul set (MATMUL: a set of one). Its units (decode: weight rows,
 * prefill: tiles) are [off, off + n_units) of the set's one index space, so one pool
 * dispatch covers every weight. */
typedef struct mm_part {
    rk_view w, dst;
    const rk_quant_fns *q; /* NULL for f32 weights */
    const rk_qdot_fns *qd; /* non-NULL: integer dots against the quantised rows xq */
    uint8_t *xq;           /* n activation rows of xq_row bytes (shared by parts of one format) */
    size_t xq_row;
    int64_t m, mb, off, n_units;
} mm_part;

typedef struct mm_ctx {
    const rk_view *x; /* (n, k) f32 activations */
    cpu_impl *c;
    mm_part p[RK_MATMUL_N_MAX];
    int n_w;
    const mm_part *cur; /* quant_rows, gemm_tiles: the one part they work on */
    bool gemv;          /* set_range's units are weight rows (else integer tiles) */
    int64_t n, k;
} mm_ctx;

/* Decode: rows [j0, j1) of part p, each weight row read once and dotted with every activation row. */
static void part_gemv(const mm_ctx *x, const mm_part *p, int64_t j0, int64_t j1) {
    if (p->qd) {
        int64_t j = j0;
        if (x->n == 1 && p->qd->dot_2w) { /* two weight rows per call, bit-identical to dot */
            float *y = rk_row_f32(&p->dst, 0);
            for (; j + 2 <= j1; j += 2)
                p->qd->dot_2w((const char *)p->w.data + (size_t)j * p->w.nb1, p->w.nb1, p->xq, x->k, y + j);
        }
        for (; j < j1; j++) {
            const void *w = (const char *)p->w.data + (size_t)j * p->w.nb1;
            for (int64_t t = 0; t < x->n; t++)
                rk_row_f32(&p->dst, t)[j] = p->qd->dot(w, p->xq + (size_t)t * p->xq_row, x->k);
        }
        return;
    }
    for (int64_t j = j0; j < j1; j++) {
        const void *w = (const char *)p->w.data + (size_t)j * p->w.nb1;
        for (int64_t t = 0; t < x->n; t++) {
            const float *xt = rk_row_f32(x->x, t);
            rk_row_f32(&p->dst, t)[j] = p->q ? p->q->dot(w, xt, x->k) : x->c->k->dot(w, xt, x->k);
        }
    }
}

/* Integer path, prefill: tiles [t0, t1) of part p, a tile of mb weight rows (it stays in
 * L2) against every quantised activation row, with the GEMV's dot for each pair: a row's
 * result does not depend on the chunk or batch it came in. */
static void part_q_tiles(const mm_ctx *x, const mm_part *p, int64_t t0, int64_t t1) {
    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t j0 = tile * p->mb, j1 = j0 + p->mb < p->m ? j0 + p->mb : p->m;
        int64_t t = 0;
        if (p->qd->dot_x4) /* four activation rows per weight row read: bit-identical to dot */
            for (; t + 4 <= x->n; t += 4) {
                const uint8_t *xt = p->xq + (size_t)t * p->xq_row;
                float *y[4] = {rk_row_f32(&p->dst, t), rk_row_f32(&p->dst, t + 1), rk_row_f32(&p->dst, t + 2),
                               rk_row_f32(&p->dst, t + 3)};
                for (int64_t j = j0; j < j1; j++) {
                    float o[4];
                    p->qd->dot_x4((const char *)p->w.data + (size_t)j * p->w.nb1, xt, p->xq_row, x->k, o);
                    y[0][j] = o[0], y[1][j] = o[1], y[2][j] = o[2], y[3][j] = o[3];
                }
            }
        for (; t < x->n; t++) {
            const uint8_t *xt = p->xq + (size_t)t * p->xq_row;
            float *y = rk_row_f32(&p->dst, t);
            for (int64_t j = j0; j < j1; j++)
                y[j] = p->qd->dot((const char *)p->w.data + (size_t)j * p->w.nb1, xt, x->k);
        }
    }
}

/* Units [u0, u1) of the set: each part's share of them (decode rows or integer tiles). */
static void set_range(void *vp, int64_t u0, int64_t u1, int tid) {
    (void)tid;
    const mm_ctx *x = vp;
    for (int i = 0; i < x->n_w; i++) {
        const mm_part *p = &x->p[i];
        int64_t lo = u0 > p->off ? u0 : p->off, hi = u1 < p->off + p->n_units ? u1 : p->off + p->n_units;
        if (lo >= hi) continue;
        if (x->gemv) part_gemv(x, p, lo - p->off, hi - p->off);
        else part_q_tiles(x, p, lo - p->off, hi - p->off);
    }
}

/* Integer path: activation rows r0..r1 of the current part's format to 8-bit blocks. */
static void quant_rows(void *vp, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const mm_ctx *x = vp;
    for (int64_t t = r0; t < r1; t++)
        x->cur->qd->quant_act(rk_row_f32(x->x, t), x->cur->xq + (size_t)t * x->cur->xq_row, x->k);
}

/* Prefill: a tile of mb weight rows of the current part is dequantised into this thread's
 * scratch (mb, k) and multiplied with all n activation rows into dst columns. */
static void gemm_tiles(void *vp, int64_t t0, int64_t t1, int tid) {
    const mm_ctx *x = vp;
    const mm_part *p = x->cur;
    int64_t ldx = (int64_t)(x->x->nb1 / sizeof(float)), ldy = (int64_t)(p->dst.nb1 / sizeof(float));
    if (x->n == 1) ldx = x->k, ldy = p->m;
    for (int64_t tile = t0; tile < t1; tile++) {
        int64_t j0 = tile * p->mb, mb = p->m - j0 < p->mb ? p->m - j0 : p->mb;
        const float *w;
        int64_t ldw;
        if (!p->q) {
            w = (const float *)((const char *)p->w.data + (size_t)j0 * p->w.nb1);
            ldw = (int64_t)(p->w.nb1 / sizeof(float));
        } else {
            float *buf = x->c->tls[tid]; /* (mb, k) */
            for (int64_t j = 0; j < mb; j++)
                p->q->to_f32((const char *)p->w.data + (size_t)(j0 + j) * p->w.nb1, buf + j * x->k, x->k);
            w = buf;
            ldw = x->k;
        }
        if (mb == 1) ldw = x->k;
        const float *xs = x->x->data;
        float *y = (float *)p->dst.data + j0;
#if defined(RK_HAVE_BLAS)
        if (x->c->use_blas) {
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)x->n, (int)mb, (int)x->k, 1.0f, xs, (int)ldx, w,
                        (int)ldw, 0.0f, y, (int)ldy);
            continue;
        }
#endif
        x->c->k->gemm_nt(x->n, mb, x->k, xs, ldx, w, ldw, y, ldy);
    }
}

/* Decode rows split over the threads: about four chunks each, serial when small. */
static int64_t gemv_chunk(const cpu_impl *c, int64_t m, int64_t k, int64_t n) {
    return m * k * n < 4 * RK_PAR_MIN_ELTS ? m : (m + 4 * c->n_threads - 1) / (4 * c->n_threads);
}

/* Prefill of a part off the integer path: dequantised f32 tiles (a GEMV past int sizes). */
static rk_status part_f32(mm_ctx *x, mm_part *p, rk_err *err) {
    cpu_impl *c = x->c;
    if (x->k > INT32_MAX || p->m > INT32_MAX || x->n > INT32_MAX) {
        mm_ctx one = *x;
        one.n_w = 1, one.p[0] = *p, one.p[0].off = 0, one.p[0].n_units = p->m, one.gemv = true;
        par_for(c, p->m, gemv_chunk(c, p->m, x->k, x->n), set_range, &one);
        return RK_OK;
    }
    int64_t mb = RK_GEMM_TILE_FLOATS / x->k;
    int64_t fair = (p->m + 2 * c->n_threads - 1) / (2 * c->n_threads); /* >= 2 tiles per thread */
    if (mb > fair) mb = fair;
    p->mb = mb < 16 ? 16 : (mb + 3) & ~(int64_t)3;
    if (p->q) {
        rk_status st = ws_reserve(c, (size_t)(p->mb * x->k), 0, err);
        if (st != RK_OK) return st;
    }
    x->cur = p;
    par_for(c, (p->m + p->mb - 1) / p->mb, 1, gemm_tiles, x);
    return RK_OK;
}

/* The set's weights against one activation. Bit for bit the same per weight whatever the
 * set: every output is one call of the weight's dot (or its bit-identical dot_2w / dot_x4),
 * on activation blocks of the same quantiser. */
static rk_status matmul_set(cpu_impl *c, mm_ctx *x, rk_err *err) {
    if (x->n == 0) return RK_OK;
    const bool decode = x->n < RK_GEMM_MIN_N;
    size_t xq_off[RK_MATMUL_N_MAX], xq_bytes = 0;
    bool quantises[RK_MATMUL_N_MAX];
    for (int i = 0; i < x->n_w; i++) {
        mm_part *p = &x->p[i];
        p->m = rk_view_rows(&p->w);
        p->q = p->w.type == RK_DT_F32 ? NULL : c->quant(p->w.type);
        /* Integer path (quantised weights, AVX2): each activation row quantised once to
         * 8-bit blocks, then every output is an integer dot of a weight row with it. Prefill
         * takes it only for the 256-element K-quant blocks: with 32-element blocks (Q4_0,
         * Q4_1, Q8_0) the per-block scale work made the integer tiles slower than
         * dequantised f32 tiles (docs/PERFORMANCE.md). */
        p->qd = p->q && c->qdot ? c->qdot(p->w.type) : NULL;
        if (p->qd && (x->k % p->qd->act_block || (!decode && (p->qd->act_block != RK_QK_K_ELTS || !p->qd->dot_x4))))
            p->qd = NULL;
        if (x->k == 0) {
            for (int64_t t = 0; t < x->n; t++) memset(rk_row_f32(&p->dst, t), 0, (size_t)p->m * sizeof(float));
            p->m = 0;
        }
        quantises[i] = false;
        if (!p->qd || p->m == 0) continue;
        p->xq_row = (size_t)(x->k / p->qd->act_block) * p->qd->act_bytes;
        int j = 0; /* an earlier part with the same activation blocks shares them */
        while (j < i && !(x->p[j].qd && x->p[j].m && x->p[j].qd->quant_act == p->qd->quant_act)) j++;
        if (j < i) {
            xq_off[i] = xq_off[j];
        } else {
            xq_off[i] = xq_bytes, quantises[i] = true;
            xq_bytes += (size_t)x->n * p->xq_row;
        }
    }
    if (xq_bytes) {
        rk_status st = ws_reserve(c, 0, (xq_bytes + sizeof(float) - 1) / sizeof(float), err);
        if (st != RK_OK) return st;
    }
    /* the set's units: decode rows of every part, or the integer parts' prefill tiles */
    int64_t units = 0;
    for (int i = 0; i < x->n_w; i++) {
        mm_part *p = &x->p[i];
        p->off = units, p->n_units = 0;
        if (p->m == 0 || (!decode && !p->qd)) continue;
        if (p->qd) {
            p->xq = (uint8_t *)c->shared + xq_off[i];
            x->cur = p;
            if (quantises[i] && decode) quant_rows(x, 0, x->n, 0);
            else if (quantises[i]) par_for(c, x->n, row_chunk(c, x->n, x->k), quant_rows, x);
        }
        if (decode) {
            p->n_units = p->m;
        } else {
            int64_t mb = RK_GEMM_TILE_BYTES / (int64_t)p->w.nb1;
            int64_t fair = (p->m + 2 * c->n_threads - 1) / (2 * c->n_threads); /* >= 2 tiles per thread */
            if (mb > fair) mb = fair;
            p->mb = mb < 4 ? 4 : mb;
            p->n_units = (p->m + p->mb - 1) / p->mb;
        }
        units += p->n_units;
    }
    x->gemv = decode;
    if (units) par_for(c, units, decode ? gemv_chunk(c, units, x->k, x->n) : 1, set_range, x);
    if (decode) return RK_OK;
    for (int i = 0; i < x->n_w; i++) /* prefill off the integer path, weight by weight */
        if (x->p[i].m && !x->p[i].qd) {
            rk_status st = part_f32(x, &x->p[i], err);
            if (st != RK_OK) return st;
        }
    return RK_OK;
}

static rk_status cpu_matmul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    mm_ctx x = {.x = &a->src1, .c = be->impl, .n_w = 1, .n = rk_view_rows(&a->src1), .k = a->src1.ne[0]};
    x.p[0].w = a->src0, x.p[0].dst = a->dst;
    return matmul_set(be->impl, &x, err);
}

static rk_status cpu_matmul_n(rk_backend *be, const rk_op_args *a, rk_err *err) {
    mm_ctx x = {.x = &a->src1, .c = be->impl, .n_w = a->mm->n_w, .n = rk_view_rows(&a->src1), .k = a->src1.ne[0]};
    for (int i = 0; i < x.n_w; i++) x.p[i].w = a->mm->w[i], x.p[i].dst = a->mm->dst[i];
    return matmul_set(be->impl, &x, err);
}

/* ---- RMSNORM, SILU_MUL, ADD, ADD_ROW, CPY_ROWS -------------------------- */
static void rmsnorm_range(void *vp, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rows_ctx *x = vp;
    const rk_op_args *a = x->a;
    int64_t d = a->src0.ne[0];
    for (int64_t r = r0; r < r1; r++) {
        const float *s = rk_row_f32(&a->src0, r);
        double ms = (double)x->c->k->sumsq(s, d) / (double)d;
        x->c->k->scale_mul(rk_row_f32(&a->dst, r), s, (float)(1.0 / sqrt(ms + a->eps)), a->src1.data, d);
    }
}

static void silu_mul_range(void *vp, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rows_ctx *x = vp;
    for (int64_t r = r0; r < r1; r++)
        x->c->k->silu_mul(rk_row_f32(&x->a->dst, r), rk_row_f32(&x->a->src0, r), rk_row_f32(&x->a->src1, r),
                          x->a->dst.ne[0]);
}

static void add_range(void *vp, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rows_ctx *x = vp;
    bool bcast = x->a->op == RK_OP_ADD_ROW;
    for (int64_t r = r0; r < r1; r++)
        x->c->k->add(rk_row_f32(&x->a->dst, r), rk_row_f32(&x->a->src0, bcast ? 0 : r), x->a->dst.ne[0]);
}

static void cpy_rows_range(void *vp, int64_t r0, int64_t r1, int tid) {
    (void)tid;
    const rows_ctx *x = vp;
    const rk_op_args *a = x->a;
    int64_t d = a->src0.ne[0];
    for (int64_t r = r0; r < r1; r++) {
        char *dst = (char *)a->dst.data + (size_t)(a->dst_row0 + r) * a->dst.nb1;
        if (a->dst.type == RK_DT_F16) x->c->k->f32_to_f16(rk_row_f32(&a->src0, r), (uint16_t *)dst, d);
        else if (a->dst.type == RK_DT_Q8_0) rk_quant_q8_0_from_f32(rk_row_f32(&a->src0, r), dst, d);
        else memmove(dst, rk_row_f32(&a->src0, r), (size_t)d * sizeof(float));
    }
}

static rk_status run_rows(rk_backend *be, const rk_op_args *a, range_fn fn) {
    cpu_impl *c = be->impl;
    rows_ctx x = {a, c, NULL};
    const rk_view *v = a->op == RK_OP_CPY_ROWS ? &a->src0 : &a->dst;
    int64_t rows = rk_view_rows(v);
    par_for(c, rows, row_chunk(c, rows, v->ne[0]), fn, &x);
    return RK_OK;
}

static rk_status cpu_rmsnorm(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)err;
    return run_rows(be, a, rmsnorm_range);
}
static rk_status cpu_silu_mul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)err;
    return run_rows(be, a, silu_mul_range);
}
static rk_status cpu_add(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)err;
    return run_rows(be, a, add_range);
}
static rk_status cpu_cpy_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    (void)err;
    return run_rows(be, a, cpy_rows_range);
}

/* ---- ROPE --------------------------------------------------------------- */
typedef struct rope_ctx {
    const rk_op_args *a;
    cpu_impl *c;
    const double *freq; /* (n_rot/2) */
    double mscale;      /* rk_rope_mscale: on cos and sin */
} rope_ctx;

/* Per token: cos/sin of its n_rot/2 angles once (fp64 angle), then every head. */
static void rope_tokens(void *vp, int64_t t0, int64_t t1, int tid) {
    const rope_ctx *x = vp;
    const rk_op_args *a = x->a;
    const rk_view *out = a->dst.data ? &a->dst : &a->src0;
    int64_t n_head = a->src0.ne[1], hd = a->src0.ne[0];
    int half = a->rope.n_rot / 2;
    bool neox = a->rope.mode == RK_ROPE_NEOX;
    float *cs = x->c->tls[tid], *sn = cs + half; /* (n_rot/2) cos, (n_rot/2) sin */
    for (int64_t t = t0; t < t1; t++) {
        double pos = (double)(a->rope.pos0 + t);
        for (int i = 0; i < half; i++) {
            cs[i] = (float)(cos(pos * x->freq[i]) * x->mscale);
            sn[i] = (float)(sin(pos * x->freq[i]) * x->mscale);
        }
        for (int64_t h = 0; h < n_head; h++) {
            const float *s = rk_row_f32(&a->src0, t * n_head + h);
            float *y = rk_row_f32(out, t * n_head + h);
            if (neox) {
                for (int i = 0; i < half; i++) {
                    float x0 = s[i], x1 = s[i + half];
                    y[i] = x0 * cs[i] - x1 * sn[i];
                    y[i + half] = x0 * sn[i] + x1 * cs[i];
                }
            } else {
                for (int i = 0; i < half; i++) {
                    float x0 = s[2 * i], x1 = s[2 * i + 1];
                    y[2 * i] = x0 * cs[i] - x1 * sn[i];
                    y[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
                }
            }
            if (y != s) memcpy(y + 2 * half, s + 2 * half, (size_t)(hd - 2 * half) * sizeof(float));
        }
    }
}

static rk_status cpu_rope(rk_backend *be, const rk_op_args *a, rk_err *err) {
    cpu_impl *c = be->impl;
    int half = a->rope.n_rot / 2;
    if (rk_view_rows(&a->src0) == 0) return RK_OK;
    rk_status st = ws_reserve(c, (size_t)(2 * half), (size_t)half * 2, err);
    if (st != RK_OK) return st;
    double *freq = (double *)c->shared; /* (n_rot/2) doubles = n_rot floats */
    rk_rope_freqs(&a->rope, freq);
    rope_ctx x = {a, c, freq, rk_rope_mscale(&a->rope)};
    int64_t n_tok = rk_view_rows(&a->src0) / a->src0.ne[1];
    par_for(c, n_tok, row_chunk(c, n_tok, a->src0.ne[1] * a->src0.ne[0]), rope_tokens, &x);
    return RK_OK;
}

/* ---- ATTN --------------------------------------------------------------- */
/* Work unit: (block of query rows, key chunk), all heads. Each K/V tile of
 * RK_ATTN_KT keys is read once for every KV head (a tile is contiguous in the
 * cache) and converted from f16 or q8_0 once for the block's rows (about
 * RK_ATTN_ROWS query vectors per KV head, so that the conversion is a small
 * share of the arithmetic); the query vectors of a KV group then take it as a
 * small GEMM, each keeping an online softmax state (max M, sum L, acc), and on
 * tiles every row sees whole, P x V runs for all rows at once. A decode step
 * (one query row) skips the conversion: attn_direct. Keys are split into chunks
 * only when the query blocks cannot keep the threads busy (decode); chunk
 * partials are merged afterwards. Scratch rows are ordered [kv head][token][head
 * in group]. */
typedef struct attn_ctx {
    const rk_op_args *a;
    cpu_impl *c;
    rk_heads q, k, v, o;
    int group, qb_rows, n_qb, n_chunks;
    int64_t chunk_keys, R; /* R = qb_rows * n_head rows per task */
    int64_t n_kv;          /* key rows: pos0 + n_q, or attn.n_kv with positioned rows */
    size_t part_floats;    /* per task: R x (2 + head_dim) */
    bool rows_direct;      /* one query row: attn_direct on the rows as stored */
} attn_ctx;

/* Per-thread scratch (floats): qs, acc (R, hd); s (qb_rows*group, KT); kb, vb (KT, kv_dim); M, L (R). */
static size_t attn_tls_floats(const attn_ctx *x, int64_t hd, int64_t kv_dim) {
    return (size_t)(2 * x->R * hd + (int64_t)x->qb_rows * x->group * RK_ATTN_KT + 2 * RK_ATTN_KT * kv_dim + 2 * x->R +
                    16);
}

/* n elements of a cache row (f32, f16 or q8_0: whole blocks) to f32. */
static void kv_to_f32(const attn_ctx *x, uint32_t type, const char *src, float *dst, int64_t n) {
    if (type == RK_DT_F32) memcpy(dst, src, (size_t)n * sizeof(float));
    else if (type == RK_DT_F16) x->c->k->f16_to_f32((const uint16_t *)src, dst, n);
    else x->c->quant(type)->to_f32(src, dst, n);
}

/* Keys j0..j0+kt of every KV head as f32 rows *ld floats apart (head hk at + hk*hd). */
static const float *kv_tile(const attn_ctx *x, const rk_heads *h, uint32_t type, int64_t j0, int64_t kt, float *buf,
                            int64_t *ld) {
    const char *base = h->data + (size_t)j0 * h->tok_nb;
    int64_t hd = x->a->attn.head_dim, n_kv = x->a->attn.n_head_kv, kv_dim = n_kv * hd;
    if (type == RK_DT_F32 && h->head_nb == (size_t)hd * sizeof(float)) {
        *ld = (int64_t)(h->tok_nb / sizeof(float));
        return (const float *)base;
    }
    uint64_t hb = 0;
    rk_dtype_row_bytes(type, (uint64_t)hd, &hb); /* whole blocks: checked by supports() */
    bool adjacent = h->head_nb == (size_t)hb;    /* heads packed: a token's row at once */
    for (int64_t j = 0; j < kt; j++) {
        const char *row = base + (size_t)j * h->tok_nb;
        if (adjacent) {
            kv_to_f32(x, type, row, buf + j * kv_dim, kv_dim);
            continue;
        }
        for (int64_t hk = 0; hk < n_kv; hk++)
            kv_to_f32(x, type, row + (size_t)hk * h->head_nb, buf + j * kv_dim + hk * hd, hd);
    }
    *ld = kv_dim;
    return buf;
}

/* Keys visible to a query at position pos: all keys < pos + 1, or with positioned rows the
 * count of rows whose position is <= pos (binary search; kv_pos non-decreasing). */
static int64_t attn_visible(const rk_op_args *a, int64_t n_kv, int64_t pos) {
    if (!a->attn_kv_pos) return pos + 1 < n_kv ? pos + 1 : n_kv;
    int64_t lo = 0, hi = n_kv;
    while (lo < hi) {
        const int64_t mid = lo + (hi - lo) / 2;
        if (a->attn_kv_pos[mid] <= pos) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

float rk_cpu_row_max(const float *s, int64_t n) {
    float m[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int64_t j = 0;
    for (; j + 4 <= n; j += 4)
        for (int u = 0; u < 4; u++) m[u] = s[j + u] > m[u] ? s[j + u] : m[u];
    for (; j < n; j++) m[0] = s[j] > m[0] ? s[j] : m[0];
    const float a = m[0] > m[1] ? m[0] : m[1], b = m[2] > m[3] ? m[2] : m[3];
    return a > b ? a : b;
}

/* One row's online-softmax step over the scores s[0..lim) of keys j0..: the key bias
 * added, s turned into e^(s - M'), M and L updated; returns the factor e^(M - M') on the
 * row's earlier accumulation (0 before its first key). */
static float softmax_step(const attn_ctx *x, float *s, int64_t lim, int64_t j0, float *M, float *L) {
    const float *bias = x->a->attn_kv_bias;
    if (bias)
        for (int64_t j = 0; j < lim; j++) s[j] += bias[j0 + j];
    const float mx = rk_cpu_row_max(s, lim), m_new = mx > *M ? mx : *M;
    const float alpha = *M == -INFINITY ? 0.0f : expf(*M - m_new);
    *L = *L * alpha + x->c->k->exp_sub(s, lim, m_new);
    *M = m_new;
    return alpha;
}

/* One query row's heads (decode) over keys [kbeg, kend): the kernels take each KV head's
 * rows as stored, converting every key and value once in registers for the whole group
 * (kv_tile's f32 copies cost as much as the group's arithmetic when the group is a
 * single token's heads). The same online softmax as attn_tasks' tile loop. */
static void attn_direct(const attn_ctx *x, int64_t t0, int64_t kbeg, int64_t kend, const float *qs, float *acc,
                        float *sc, float *M, float *L) {
    const rk_op_args *a = x->a;
    const rk_cpu_kern *kn = x->c->k;
    const int64_t hd = a->attn.head_dim, g = x->group, pos0 = a->attn.pos0;
    const int64_t lim_all = a->attn_kv_pos ? attn_visible(a, x->n_kv, pos0 + t0) : pos0 + t0 + 1;
    float alpha[RK_ATTN_DIRECT_MAX];
    for (int64_t j0 = kbeg; j0 < kend; j0 += RK_ATTN_KT) {
        int64_t lim = (lim_all < kend ? lim_all : kend) - j0; /* causal */
        if (lim <= 0) break;
        if (lim > RK_ATTN_KT) lim = RK_ATTN_KT;
        for (int hk = 0; hk < a->attn.n_head_kv; hk++) {
            const char *kr = x->k.data + (size_t)j0 * x->k.tok_nb + (size_t)hk * x->k.head_nb;
            const char *vr = x->v.data + (size_t)j0 * x->v.tok_nb + (size_t)hk * x->v.head_nb;
            const int64_t r0 = hk * g;
            kn->qk_rows(a->src1.type, (int)g, qs + r0 * hd, hd, kr, x->k.tok_nb, lim, hd, sc, RK_ATTN_KT, RK_ATTN_KT);
            for (int64_t rr = 0; rr < g; rr++) {
                const int64_t r = r0 + rr;
                alpha[rr] = softmax_step(x, sc + rr * RK_ATTN_KT, lim, j0, &M[r], &L[r]);
            }
            kn->pv_rows(a->src2.type, (int)g, acc + r0 * hd, hd, alpha, sc, RK_ATTN_KT, vr, x->v.tok_nb, lim, hd,
                        RK_ATTN_KT);
        }
    }
}

static void attn_tasks(void *vp, int64_t i0, int64_t i1, int tid) {
    const attn_ctx *x = vp;
    const rk_op_args *a = x->a;
    const rk_cpu_kern *kn = x->c->k;
    const int64_t hd = a->attn.head_dim, pos0 = a->attn.pos0, R = x->R, g = x->group;
    const int n_kv = a->attn.n_head_kv;
    const int64_t RG = (int64_t)x->qb_rows * g; /* rows per KV head */
    float *qs = x->c->tls[tid];                 /* (R, hd) scaled queries */
    float *acc = qs + R * hd;                   /* (R, hd) */
    float *sc = acc + R * hd;                   /* (RG, KT) scores, then probabilities */
    float *kb = sc + RG * RK_ATTN_KT;           /* (KT, kv_dim) */
    float *vb = kb + RK_ATTN_KT * n_kv * hd;    /* (KT, kv_dim) */
    float *M = vb + RK_ATTN_KT * n_kv * hd, *L = M + R;
    for (int64_t task = i0; task < i1; task++) {
        int64_t chunk = task % x->n_chunks, qb = task / x->n_chunks;
        int64_t t0 = qb * x->qb_rows, t1 = t0 + x->qb_rows;
        if (t1 > x->q.n_tok) t1 = x->q.n_tok;
        int64_t nr = (t1 - t0) * g; /* valid rows per KV head */
        for (int hk = 0; hk < n_kv; hk++)
            for (int64_t rr = 0; rr < nr; rr++) {
                int64_t r = hk * RG + rr, t = t0 + rr / g, h = hk * g + rr % g;
                kn->scale_mul(qs + r * hd, (const float *)(x->q.data + t * x->q.tok_nb + h * x->q.head_nb),
                              a->attn.scale, NULL, hd);
                memset(acc + r * hd, 0, (size_t)hd * sizeof(float));
                M[r] = -INFINITY;
                L[r] = 0;
            }
        int64_t kbeg = chunk * x->chunk_keys, kend = kbeg + x->chunk_keys;
        const int64_t vis = attn_visible(a, x->n_kv, pos0 + t1 - 1); /* the block's last query */
        if (kend > vis) kend = vis;
        if (x->rows_direct) {
            attn_direct(x, t0, kbeg, kend, qs, acc, sc, M, L);
            kend = kbeg; /* done */
        }
        for (int64_t j0 = kbeg; j0 < kend; j0 += RK_ATTN_KT) {
            int64_t kt = kend - j0 < RK_ATTN_KT ? kend - j0 : RK_ATTN_KT, ldk, ldv;
            const float *kp = kv_tile(x, &x->k, a->src1.type, j0, kt, kb, &ldk);
            const float *vp2 = kv_tile(x, &x->v, a->src2.type, j0, kt, vb, &ldv);
            /* every row sees the whole tile (the block's first query sees its last key): P x V
             * for all rows at once, each value vector loaded once for several rows */
            const int64_t first = a->attn_kv_pos ? attn_visible(a, x->n_kv, pos0 + t0) : pos0 + t0 + 1;
            const bool whole = kn->pv_rows && hd % 32 == 0 && first - j0 >= kt && nr <= RK_ATTN_BATCH;
            float alpha[RK_ATTN_BATCH];
            for (int hk = 0; hk < n_kv; hk++) {
                kn->gemm_nt(nr, kt, hd, qs + hk * RG * hd, hd, kp + hk * hd, ldk, sc, RK_ATTN_KT);
                for (int64_t rr = 0; rr < nr; rr++) {
                    int64_t r = hk * RG + rr;
                    int64_t lim =
                        (a->attn_kv_pos ? attn_visible(a, x->n_kv, pos0 + t0 + rr / g) : pos0 + t0 + rr / g + 1) -
                        j0; /* causal */
                    if (lim <= 0) continue;
                    if (lim > kt) lim = kt;
                    float *s = sc + rr * RK_ATTN_KT;
                    const float al = softmax_step(x, s, lim, j0, &M[r], &L[r]);
                    if (whole) alpha[rr] = al;
                    else kn->pv(acc + r * hd, al, s, vp2 + hk * hd, ldv, lim, hd);
                }
                if (whole)
                    kn->pv_rows(RK_DT_F32, (int)nr, acc + hk * RG * hd, hd, alpha, sc, RK_ATTN_KT,
                                (const char *)(vp2 + hk * hd), (size_t)ldv * sizeof(float), kt, hd, 0);
            }
        }
        for (int hk = 0; hk < n_kv; hk++)
            for (int64_t rr = 0; rr < nr; rr++) {
                int64_t r = hk * RG + rr, t = t0 + rr / g, h = hk * g + rr % g;
                if (x->n_chunks == 1) {
                    kn->scale_mul((float *)(x->o.data + t * x->o.tok_nb + h * x->o.head_nb), acc + r * hd, 1.0f / L[r],
                                  NULL, hd);
                } else {
                    float *part = x->c->shared + (size_t)task * x->part_floats + r * (2 + hd); /* M, L, acc */
                    part[0] = M[r];
                    part[1] = L[r];
                    memcpy(part + 2, acc + r * hd, (size_t)hd * sizeof(float));
                }
            }
    }
}

/* out = sum_c acc_c e^(M_c - M) / sum_c L_c e^(M_c - M), M = max_c M_c;
 * chunks no key of which is visible (M_c = -inf) drop out. */
static void attn_merge(const attn_ctx *x) {
    const int64_t hd = x->a->attn.head_dim, g = x->group, RG = (int64_t)x->qb_rows * g;
    for (int64_t qb = 0; qb < x->n_qb; qb++) {
        int64_t t0 = qb * x->qb_rows, t1 = t0 + x->qb_rows;
        if (t1 > x->q.n_tok) t1 = x->q.n_tok;
        size_t task0 = (size_t)qb * x->n_chunks;
        for (int hk = 0; hk < x->a->attn.n_head_kv; hk++)
            for (int64_t rr = 0; rr < (t1 - t0) * g; rr++) {
                int64_t r = hk * RG + rr, t = t0 + rr / g, h = hk * g + rr % g;
                float *out = (float *)(x->o.data + t * x->o.tok_nb + h * x->o.head_nb);
                float mx = -INFINITY, l = 0;
                for (int c = 0; c < x->n_chunks; c++) {
                    float mc = x->c->shared[(task0 + c) * x->part_floats + r * (2 + hd)];
                    mx = mc > mx ? mc : mx;
                }
                memset(out, 0, (size_t)hd * sizeof(float));
                for (int c = 0; c < x->n_chunks; c++) {
                    const float *p = x->c->shared + (task0 + c) * x->part_floats + r * (2 + hd);
                    if (p[0] == -INFINITY) continue;
                    float w = expf(p[0] - mx);
                    l += p[1] * w;
                    for (int64_t d = 0; d < hd; d++) out[d] += p[2 + d] * w;
                }
                for (int64_t d = 0; d < hd; d++) out[d] /= l;
            }
    }
}

static rk_status cpu_attn(rk_backend *be, const rk_op_args *a, rk_err *err) {
    if (a->attn_sparse) return rk_attn_sparse_run(be, a, false, cpu_attn, err);
    cpu_impl *c = be->impl;
    const rk_attn_params *p = &a->attn;
    attn_ctx x = {.a = a, .c = c, .group = p->n_head / p->n_head_kv};
    rk_heads_of(&a->src0, p->n_head, p->head_dim, &x.q);
    rk_heads_of(&a->src1, p->n_head_kv, p->head_dim, &x.k);
    rk_heads_of(&a->src2, p->n_head_kv, p->head_dim, &x.v);
    rk_heads_of(&a->dst, p->n_head, p->head_dim, &x.o);
    int64_t n_q = x.q.n_tok, n_kv = a->attn_kv_pos ? a->attn_n_kv : p->pos0 + n_q;
    if (n_q == 0) return RK_OK;
    x.n_kv = n_kv;
    /* about RK_ATTN_ROWS query vectors per KV head share each tile */
    x.qb_rows = x.group >= RK_ATTN_ROWS ? 1 : RK_ATTN_ROWS / x.group;
    if (x.qb_rows > n_q) x.qb_rows = (int)n_q;
    x.n_qb = (int)((n_q + x.qb_rows - 1) / x.qb_rows);
    x.R = (int64_t)x.qb_rows * p->n_head;
    int64_t want = 4 * (int64_t)c->n_threads;
    x.n_chunks = 1;
    if (c->n_threads > 1 && x.n_qb < want) {
        int64_t by_work = (want + x.n_qb - 1) / x.n_qb, by_size = n_kv / RK_ATTN_MIN_CHUNK;
        x.n_chunks = (int)(by_work < by_size ? by_work : by_size);
        if (x.n_chunks < 1) x.n_chunks = 1;
    }
    x.chunk_keys = (n_kv + x.n_chunks - 1) / x.n_chunks;
    x.chunk_keys = (x.chunk_keys + RK_ATTN_KT - 1) / RK_ATTN_KT * RK_ATTN_KT;
    x.part_floats = (size_t)(x.R * (2 + p->head_dim));
    x.rows_direct = n_q == 1 && c->k->qk_rows && x.group <= RK_ATTN_DIRECT_MAX && p->head_dim % 32 == 0 &&
                    (a->src1.type == RK_DT_F32 || a->src1.type == RK_DT_F16 || a->src1.type == RK_DT_Q8_0) &&
                    (a->src2.type == RK_DT_F32 || a->src2.type == RK_DT_F16 || a->src2.type == RK_DT_Q8_0);
    int64_t n_tasks = (int64_t)x.n_qb * x.n_chunks;
    rk_status st = ws_reserve(c, attn_tls_floats(&x, p->head_dim, (int64_t)p->n_head_kv * p->head_dim),
                              x.n_chunks > 1 ? (size_t)n_tasks * x.part_floats : 0, err);
    if (st != RK_OK) return st;
    /* serial when the whole op is a few microseconds of work */
    bool tiny = n_q * n_kv * p->n_head * p->head_dim < 4 * RK_PAR_MIN_ELTS;
    par_for(c, n_tasks, tiny ? n_tasks : 1, attn_tasks, &x);
    if (x.n_chunks > 1) attn_merge(&x);
    return RK_OK;
}

/* ---- for ops in other files ----------------------------------------------- */
const rk_cpu_kern *rk_cpu_kern_of(const rk_backend *be) { return ((const cpu_impl *)be->impl)->k; }

void rk_cpu_par_for(rk_backend *be, int64_t n, int64_t chunk, void (*fn)(void *ctx, int64_t i0, int64_t i1, int tid),
                    void *ctx) {
    par_for(be->impl, n, chunk, fn, ctx);
}

rk_status rk_cpu_scratch(rk_backend *be, size_t per_thread, size_t shared, float *const **tls, float **shared_out,
                         rk_err *err) {
    cpu_impl *c = be->impl;
    rk_status st = ws_reserve(c, per_thread, shared, err);
    if (st != RK_OK) return st;
    *tls = c->tls;
    *shared_out = c->shared;
    return RK_OK;
}

/* ---- table -------------------------------------------------------------- */
static bool cpu_supports(const rk_backend *be, const rk_op_args *a) {
    return rk_cpu_supports_common(a, ((const cpu_impl *)be->impl)->quant);
}

static void cpu_destroy(rk_backend *be) {
    cpu_impl *c = be->impl;
    if (c) {
        if (c->own_pool) rk_pool_destroy(c->pool);
        free_tls(c);
        free(c->tls);
        free(c->shared);
        free(c);
    }
    free(be);
}

static rk_pool *cpu_pool(rk_backend *be) { return ((cpu_impl *)be->impl)->pool; }

static const rk_backend_ops cpu_ops = {
    .name = "cpu",
    .op =
        {
            [RK_OP_GET_ROWS] = cpu_get_rows,
            [RK_OP_MATMUL] = cpu_matmul,
            [RK_OP_RMSNORM] = cpu_rmsnorm,
            [RK_OP_ROPE] = cpu_rope,
            [RK_OP_ATTN] = cpu_attn,
            [RK_OP_SILU_MUL] = cpu_silu_mul,
            [RK_OP_ADD] = cpu_add,
            [RK_OP_ADD_ROW] = cpu_add,
            [RK_OP_CPY_ROWS] = cpu_cpy_rows,
            [RK_OP_LR_KEYS] = rk_cpu_lr_keys,
            [RK_OP_SCATTER_ROWS] = rk_ref_scatter_rows,
            [RK_OP_LR_ATTN] = rk_ref_lr_attn,
            [RK_OP_MATMUL_N] = cpu_matmul_n,
        },
    .supports = cpu_supports,
    .destroy = cpu_destroy,
    .pool = cpu_pool, /* memory: host defaults (no prepare, no repacking) */
};
_Static_assert(RK_OP_COUNT == 13, "op count changed: add the op to cpu_ops");

/* pool NULL: the backend creates and owns one of n_threads. */
static rk_status cpu_create(int n_threads, bool portable, rk_pool *pool, rk_backend **out, rk_err *err) {
    if (!out) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: cpu: NULL out");
    if (pool) n_threads = rk_pool_size(pool);
    if (n_threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = n > 0 ? (int)(n < 256 ? n : 256) : 1;
    }
    rk_status st;
    rk_backend *be = calloc(1, sizeof *be);
    cpu_impl *c = calloc(1, sizeof *c);
    if (!be || !c) {
        st = rk_err_set(err, RK_E_NOMEM, "kernels: cpu: backend allocation");
        goto fail;
    }
    be->ops = &cpu_ops;
    be->impl = c;
    be->n_threads = n_threads;
    c->n_threads = n_threads;
    c->k = &kern_generic;
    c->quant = portable ? rk_quant_ref : rk_quant_fast;
    c->qdot = portable ? NULL : rk_qdot_fast;
#if defined(RK_HAVE_AVX2)
    if (!portable && rk_cpu_has_avx2()) c->k = &rk_cpu_kern_avx2;
#endif
#if defined(RK_HAVE_BLAS)
    if (c->k == &kern_generic) {
        /* Threads come from our pool; each sgemm call covers one weight tile. */
        c->use_blas = true;
        openblas_set_num_threads(1);
    }
#endif
    c->tls = calloc((size_t)n_threads, sizeof *c->tls);
    if (!c->tls) {
        st = rk_err_set(err, RK_E_NOMEM, "kernels: cpu: scratch table");
        goto fail;
    }
    if (pool) {
        c->pool = pool;
    } else {
        st = rk_pool_create(n_threads, &c->pool, err);
        if (st != RK_OK) goto fail;
        c->own_pool = true;
    }
    *out = be;
    return RK_OK;
fail:
    if (be) {
        be->impl = c;
        cpu_destroy(be);
    } else {
        free(c);
    }
    return st;
}

rk_status rk_backend_cpu_create(int n_threads, rk_backend **out, rk_err *err) {
    return cpu_create(n_threads, false, NULL, out, err);
}

rk_status rk_backend_cpu_create_with_pool(rk_pool *pool, rk_backend **out, rk_err *err) {
    if (!pool) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: cpu: NULL pool");
    return cpu_create(0, false, pool, out, err);
}

rk_status rk_backend_cpu_portable_create(int n_threads, rk_backend **out, rk_err *err) {
    return cpu_create(n_threads, true, NULL, out, err);
}
