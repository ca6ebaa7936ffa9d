/* CUDA backend: factory, op table, the operand resolver and the element ops.
 * Views in this instance's device memory are used in place and an op only
 * queues work on the instance's stream (rk_backend_download / sync wait);
 * host views are staged through device scratch and such an op waits for its
 * result before it returns (the op tests, and runtimes that have not moved a
 * buffer to the device yet). */
#include <stdlib.h>
#include <string.h>

#include "cuda_dequant.cuh"
extern "C" {
#include "ops_impl.h" /* rk_heads_of: the one reading of ATTN views */
}

static rk_cuda *impl_of(rk_backend *be) { return (rk_cuda *)be->impl; }

rk_status rk_cuda_fail(rk_err *err, const char *op, const char *what, cudaError_t e) {
    return rk_err_set(err, e == cudaErrorMemoryAllocation ? RK_E_NOMEM : RK_E_INTERNAL, "cuda: %s: %s: %s (%s)",
                      op, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

rk_status rk_cuda_scratch(rk_cuda *c, size_t bytes, rk_err *err) {
    if (bytes <= c->dcap) return RK_OK;
    rk_status cst = rk_cuda_no_capture(c, "scratch growth", err);
    if (cst != RK_OK) return cst;
    size_t want = bytes + bytes / 4;
    if (c->dbuf) {
        cudaStreamSynchronize(c->stream); /* queued ops may still use the old scratch */
        cudaFree(c->dbuf);
    }
    c->dbuf = NULL;
    c->dcap = 0;
    cudaError_t e = cudaMalloc((void **)&c->dbuf, want);
    if (e != cudaSuccess) {
        c->dbuf = NULL;
        return rk_cuda_fail(err, "scratch", "cudaMalloc", e);
    }
    c->dcap = want;
    return RK_OK;
}

static size_t row_bytes(const rk_view *v) {
    uint64_t rb = 0;
    rk_dtype_row_bytes(v->type, (uint64_t)v->ne[0], &rb); /* checked by rk_op_check */
    return (size_t)rb;
}

size_t rk_cuda_view_bytes(const rk_view *v) { return row_bytes(v) * (size_t)rk_cuda_rows(v); }

size_t rk_cuda_view_extent(const rk_view *v) {
    int64_t rows = rk_cuda_rows(v);
    return rows > 0 ? (size_t)(rows - 1) * v->nb1 + row_bytes(v) : 0;
}

cudaError_t rk_cuda_upload(rk_cuda *c, void *dev, const rk_view *v) {
    size_t rb = row_bytes(v);
    int64_t rows = rk_cuda_rows(v);
    if (rows <= 0 || rb == 0) return cudaSuccess;
    return cudaMemcpy2DAsync(dev, rb, v->data, rows > 1 ? v->nb1 : rb, rb, (size_t)rows, cudaMemcpyHostToDevice,
                             c->stream);
}

cudaError_t rk_cuda_download(rk_cuda *c, const rk_view *v, const void *dev) {
    size_t rb = row_bytes(v);
    int64_t rows = rk_cuda_rows(v);
    if (rows <= 0 || rb == 0) return cudaSuccess;
    return cudaMemcpy2DAsync(v->data, rows > 1 ? v->nb1 : rb, dev, rb, rb, (size_t)rows, cudaMemcpyDeviceToHost,
                             c->stream);
}

#define CU(what, x)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) return rk_cuda_fail(err, on, what, e_);                            \
    } while (0)

/* ---- operands ------------------------------------------------------------- */
rk_status rk_cuda_args_begin(rk_cuda *c, const char *on, rk_cuda_arg *arg, int n, size_t extra, char **extra_p,
                             rk_err *err) {
    size_t total = 0;
    for (int i = 0; i < n; i++) {
        rk_cuda_arg *x = &arg[i];
        x->dev = NULL;
        x->ld = 0;
        x->staged = false;
        x->alias = -1;
        x->off = 0;
        if (!x->v || !x->v->data) continue;
        const rk_view *v = x->v;
        const rk_dtype_traits *t = rk_dtype_get(v->type); /* known: rk_op_check passed */
        const rk_cuda_block *b = rk_cuda_find_block(c, v->data);
        if (b) {
            size_t at = (size_t)((const char *)v->data - b->p), ext = rk_cuda_view_extent(v);
            if (ext > b->bytes - at)
                return rk_err_set(err, RK_E_INVALID_ARG,
                                  "cuda: %s: view of %zu bytes at offset %zu runs past its device buffer (%zu bytes)",
                                  on, ext, at, b->bytes);
            if (x->out && b->prepared)
                return rk_err_set(err, RK_E_INVALID_ARG, "cuda: %s: output is a prepared weight (read-only)", on);
            x->dev = (char *)v->data;
            x->ld = rk_cuda_rows(v) > 1 ? (int64_t)(v->nb1 / t->type_size) : v->ne[0];
            continue;
        }
        x->staged = true;
        x->ld = v->ne[0]; /* staged rows are dense */
        for (int j = 0; j < i; j++)
            if (arg[j].staged && arg[j].alias < 0 && arg[j].v->data == v->data) {
                x->alias = j;
                break;
            }
        if (x->alias >= 0) continue;
        x->off = total;
        total += rk_cuda_up256(rk_cuda_view_bytes(v));
    }
    size_t extra_off = total;
    total += rk_cuda_up256(extra);
    if (total) {
        rk_status st = rk_cuda_scratch(c, total, err);
        if (st != RK_OK) return st;
    }
    for (int i = 0; i < n; i++) {
        rk_cuda_arg *x = &arg[i];
        if (!x->staged) continue;
        int root = x->alias >= 0 ? x->alias : i;
        x->dev = c->dbuf + arg[root].off;
        /* a shared copy is uploaded once, by the first of its views that reads */
        bool first_reader = x->in;
        for (int j = root; j < i && first_reader; j++)
            if ((j == root || arg[j].alias == root) && arg[j].in) first_reader = false;
        if (first_reader) {
            rk_status cst = rk_cuda_no_capture(c, "a host operand", err);
            if (cst != RK_OK) return cst;
            CU("upload", rk_cuda_upload(c, x->dev, x->v));
        }
    }
    if (extra_p) *extra_p = extra ? c->dbuf + extra_off : NULL;
    return RK_OK;
}

rk_status rk_cuda_args_end(rk_cuda *c, const char *on, const rk_cuda_arg *arg, int n, rk_err *err) {
    bool staged = false;
    for (int i = 0; i < n; i++) {
        if (!arg[i].staged) continue;
        rk_status cst = rk_cuda_no_capture(c, "a host operand", err);
        if (cst != RK_OK) return cst;
        staged = true;
        if (arg[i].out) CU("download", rk_cuda_download(c, arg[i].v, arg[i].dev));
    }
    if (staged) CU("synchronize", cudaStreamSynchronize(c->stream));
    return RK_OK;
}

/* ---- element ops ------------------------------------------------------------ */
static rk_status run_elementwise(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = rk_op_name(a->op);
    CU("cudaSetDevice", cudaSetDevice(c->device));
    /* inputs before outputs: a shared staged copy is uploaded by its first reader */
    rk_cuda_arg g[3];
    int n = 0;
    switch (a->op) {
    case RK_OP_RMSNORM:
    case RK_OP_SILU_MUL:
        g[0] = rk_cuda_arg_of(&a->src0, true, false);
        g[1] = rk_cuda_arg_of(&a->src1, true, false);
        g[2] = rk_cuda_arg_of(&a->dst, false, true);
        n = 3;
        break;
    case RK_OP_ROPE:
        g[0] = rk_cuda_arg_of(&a->src0, true, false);
        g[1] = rk_cuda_arg_of(a->dst.data ? &a->dst : &a->src0, false, true);
        n = 2;
        break;
    case RK_OP_ADD:
    case RK_OP_ADD_ROW:
        g[0] = rk_cuda_arg_of(&a->dst, true, true);
        g[1] = rk_cuda_arg_of(&a->src0, true, false);
        n = 2;
        break;
    default: return rk_err_set(err, RK_E_INTERNAL, "cuda: %s routed to the element ops", on);
    }
    rk_status st = rk_cuda_args_begin(c, on, g, n, 0, NULL, err);
    if (st != RK_OK) return st;
    const float *x0 = (const float *)g[0].dev;
    switch (a->op) {
    case RK_OP_RMSNORM:
        CU("kernel", rk_cuda_rmsnorm(x0, g[0].ld, (const float *)g[1].dev, (float *)g[2].dev, g[2].ld,
                                     rk_cuda_rows(&a->src0), a->src0.ne[0], a->eps, c->stream));
        break;
    case RK_OP_ROPE:
        CU("kernel", rk_cuda_rope(x0, g[0].ld, (float *)g[1].dev, g[1].ld, rk_cuda_rows(&a->src0), a->src0.ne[1],
                                  a->src0.ne[0], &a->rope, c->stream));
        break;
    case RK_OP_SILU_MUL:
        CU("kernel", rk_cuda_silu_mul(x0, g[0].ld, (const float *)g[1].dev, g[1].ld, (float *)g[2].dev, g[2].ld,
                                      rk_cuda_rows(&a->dst), a->dst.ne[0], c->stream));
        break;
    default: /* ADD, ADD_ROW: g[0] is dst */
        CU("kernel", rk_cuda_add((float *)g[0].dev, g[0].ld, (const float *)g[1].dev, g[1].ld, rk_cuda_rows(&a->dst),
                                 a->dst.ne[0], a->op == RK_OP_ADD_ROW, c->stream));
        break;
    }
    return rk_cuda_args_end(c, on, g, n, err);
}

/* ---- GET_ROWS, CPY_ROWS, ATTN -------------------------------------------------- */
/* Begins the op's operands g with scratch for n row ids, and uploads a->ids there (from
 * pageable memory: returns once they are staged). */
static rk_status begin_with_ids(rk_cuda *c, const char *on, rk_cuda_arg *g, int ng, const rk_op_args *a, int64_t n,
                                char **ids, rk_err *err) {
    rk_status st = rk_cuda_args_begin(c, on, g, ng, (size_t)n * sizeof(int32_t), ids, err);
    if (st != RK_OK) return st;
    const void *hid = rk_cuda_host_src(c, a->ids, (size_t)n * sizeof(int32_t));
    if (!hid) return rk_cuda_no_capture(c, "ids past the pinned arena", err);
    CU("upload ids", cudaMemcpyAsync(*ids, hid, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    return RK_OK;
}

static rk_status run_get_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = "GET_ROWS";
    int64_t n = rk_cuda_rows(&a->dst), d = a->dst.ne[0];
    if (n == 0 || d == 0) return RK_OK;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_cuda_arg g[2] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->dst, false, true)};
    char *ids = NULL;
    rk_status st = begin_with_ids(c, on, g, 2, a, n, &ids, err);
    if (st != RK_OK) return st;
    CU("kernel", rk_cuda_get_rows(g[0].dev, a->src0.type, rk_cuda_arg_nb1(&g[0]), (const int32_t *)ids,
                                  (float *)g[1].dev, g[1].ld, n, d, c->stream));
    return rk_cuda_args_end(c, on, g, 2, err);
}

static rk_status run_cpy_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = "CPY_ROWS";
    int64_t n = rk_cuda_rows(&a->src0), d = a->src0.ne[0];
    if (n == 0 || d == 0) return RK_OK;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    /* a staged cache goes up whole and comes back whole: rows not written keep their bytes */
    rk_cuda_arg g[2] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->dst, true, true)};
    rk_status st = rk_cuda_args_begin(c, on, g, 2, 0, NULL, err);
    if (st != RK_OK) return st;
    size_t nb1 = rk_cuda_arg_nb1(&g[1]);
    CU("kernel", rk_cuda_cpy_rows((const float *)g[0].dev, g[0].ld, g[1].dev + (size_t)a->dst_row0 * nb1,
                                  a->dst.type, nb1, n, d, c->stream));
    return rk_cuda_args_end(c, on, g, 2, err);
}

static rk_status run_scatter_rows(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = "SCATTER_ROWS";
    int64_t n = rk_cuda_rows(&a->src0), d = a->src0.ne[0];
    if (n == 0 || d == 0) return RK_OK;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    /* a staged dst goes up whole and comes back whole: rows not named keep their values */
    rk_cuda_arg g[2] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->dst, true, true)};
    char *ids = NULL;
    rk_status st = begin_with_ids(c, on, g, 2, a, n, &ids, err);
    if (st != RK_OK) return st;
    CU("kernel", rk_cuda_scatter_rows((const float *)g[0].dev, g[0].ld, (const int32_t *)ids, (float *)g[1].dev,
                                      g[1].ld, n, d, c->stream));
    return rk_cuda_args_end(c, on, g, 2, err);
}

static rk_status run_lr_keys(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = "LR_KEYS";
    const int64_t n = rk_cuda_rows(&a->src0), r = a->src0.ne[0], hd = a->dst.ne[0];
    if (n == 0) return RK_OK;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_cuda_arg g[4] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->src1, true, false),
                        rk_cuda_arg_of(&a->src2, true, false), rk_cuda_arg_of(&a->dst, false, true)};
    const int half = a->rope.n_rot / 2;
    double freq[RK_ATTN_MAX_HD]; /* n_rot <= hd <= RK_ATTN_MAX_HD (supports) */
    rk_rope_freqs(&a->rope, freq);
    const size_t ids_bytes = rk_cuda_up256((size_t)n * sizeof(int32_t));
    char *extra = NULL;
    rk_status st = rk_cuda_args_begin(c, on, g, 4, ids_bytes + (size_t)half * sizeof(double), &extra, err);
    if (st != RK_OK) return st;
    /* from pageable memory: both are staged before the calls return */
    const void *hid = rk_cuda_host_src(c, a->ids, (size_t)n * sizeof(int32_t));
    const void *hfr = hid ? rk_cuda_host_src(c, freq, (size_t)half * sizeof(double)) : NULL;
    if (!hfr) return rk_cuda_no_capture(c, "ids past the pinned arena", err);
    CU("upload ids", cudaMemcpyAsync(extra, hid, (size_t)n * sizeof(int32_t), cudaMemcpyHostToDevice, c->stream));
    CU("upload angles", cudaMemcpyAsync(extra + ids_bytes, hfr, (size_t)half * sizeof(double), cudaMemcpyHostToDevice,
                                        c->stream));
    CU("kernel", rk_cuda_lr_keys((const float *)g[0].dev, g[0].ld, g[1].dev, a->src1.type == RK_DT_F16,
                                 rk_cuda_arg_nb1(&g[1]), (const float *)g[2].dev, g[2].ld, (const int32_t *)extra,
                                 (const double *)(extra + ids_bytes), (float *)g[3].dev, g[3].ld, n, (int)r, (int)hd,
                                 a->rope.n_rot, a->rope.mode == RK_ROPE_NEOX, c->stream));
    return rk_cuda_args_end(c, on, g, 4, err);
}

/* LR_ATTN: the codec's state must be device memory of this instance (it is uploaded once
 * and kept there: staging it per call would move the whole compressed cache); q and dst
 * may be host views (staged, as every op). */
static rk_status run_lr_attn(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = "LR_ATTN";
    const rk_lr_attn_args *L = a->lr;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    const struct { const void *p; const char *what; } st_ptr[] = {
        {L->freq, "freq"}, {L->xk, "xk"}, {L->xv, "xv"}, {L->mean, "mean"}, {L->winv, "winv"}, {L->W, "W"},
        {L->b, "b"}, {L->n_sink ? L->sk : NULL, "sk"}, {L->n_sink ? L->sv : NULL, "sv"},
        {L->n_rows ? L->pos : NULL, "pos"}, {L->n_rows ? L->coef : NULL, "coef"}, {L->n_rows ? L->basis : NULL, "basis"},
        {L->n_rows ? L->lmk : NULL, "lmk"}, {L->n_rows ? L->cmean : NULL, "cmean"}, {L->n_rows ? L->res : NULL, "res"},
        {L->n_rows ? L->mask : NULL, "mask"}, {L->n_rows ? L->base : NULL, "base"}};
    for (size_t i = 0; i < sizeof st_ptr / sizeof st_ptr[0]; i++)
        if (st_ptr[i].p && !rk_cuda_find_block(c, st_ptr[i].p))
            return rk_err_set(err, RK_E_UNSUPPORTED, "cuda: %s: the codec state (%s) must be device memory of this backend",
                              on, st_ptr[i].what);
    rk_cuda_arg g[2] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->dst, false, true)};
    int n_units = 0;
    const size_t need = rk_cuda_lr_attn_scratch(a, &n_units);
    char *extra = NULL;
    rk_status st = rk_cuda_args_begin(c, on, g, 2, need, &extra, err);
    if (st != RK_OK) return st;
    CU("kernel", rk_cuda_lr_attn(a, (const float *)g[0].dev, g[0].ld, (float *)g[1].dev, g[1].ld, extra, c->stream));
    return rk_cuda_args_end(c, on, g, 2, err);
}

static rk_status run_attn(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = "ATTN";
    const rk_attn_params *p = &a->attn;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_cuda_arg g[4] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->src1, true, false),
                        rk_cuda_arg_of(&a->src2, true, false), rk_cuda_arg_of(&a->dst, false, true)};
    rk_heads q0;
    if (!rk_heads_of(&a->src0, p->n_head, p->head_dim, &q0)) /* checked by rk_op_check */
        return rk_err_set(err, RK_E_INTERNAL, "cuda: ATTN: q view");
    const int group = p->n_head / p->n_head_kv;
    const int64_t n_q = q0.n_tok, n_kv = p->pos0 + n_q;
    if (n_q == 0) return RK_OK;
    int64_t split_len = 0;
    int n_split = rk_cuda_attn_splits(n_q, group, p->n_head_kv, n_kv, c->n_sm, &split_len);
    size_t part = n_split > 1 ? (size_t)n_split * (size_t)p->n_head_kv * (size_t)(n_q * group) *
                                    (size_t)(p->head_dim + 2) * sizeof(float)
                              : 0;
    char *extra = NULL;
    rk_status st = rk_cuda_args_begin(c, on, g, 4, part, &extra, err);
    if (st != RK_OK) return st;
    rk_view v[4];
    rk_heads hq, hk, hv, ho;
    for (int i = 0; i < 4; i++) v[i] = rk_cuda_arg_view(&g[i]);
    if (!rk_heads_of(&v[0], p->n_head, p->head_dim, &hq) || !rk_heads_of(&v[1], p->n_head_kv, p->head_dim, &hk) ||
        !rk_heads_of(&v[2], p->n_head_kv, p->head_dim, &hv) || !rk_heads_of(&v[3], p->n_head, p->head_dim, &ho))
        return rk_err_set(err, RK_E_INTERNAL, "cuda: ATTN: device views");
    rk_cuda_attn_args x;
    x.q = hq.data, x.k = hk.data, x.v = hv.data, x.o = ho.data;
    x.q_tok = hq.tok_nb, x.q_head = hq.head_nb, x.k_tok = hk.tok_nb, x.k_head = hk.head_nb;
    x.v_tok = hv.tok_nb, x.v_head = hv.head_nb, x.o_tok = ho.tok_nb, x.o_head = ho.head_nb;
    x.n_q = n_q, x.pos0 = p->pos0, x.group = group, x.n_head_kv = p->n_head_kv, x.hd = p->head_dim;
    x.scale = p->scale, x.n_split = n_split, x.split_len = split_len, x.part = (float *)extra;
    CU("kernel", rk_cuda_attn(&x, a->src1.type, c->stream));
    return rk_cuda_args_end(c, on, g, 4, err);
}

static bool f32(const rk_view *v) { return v->type == RK_DT_F32; }
static bool cache_type(uint32_t t) { return t == RK_DT_F32 || t == RK_DT_F16 || t == RK_DT_Q8_0; }

/* cuBLAS takes int dimensions and leading dimensions */
static bool int_ok(const rk_view *v) {
    const rk_dtype_traits *t = rk_dtype_get(v->type);
    return t && v->ne[0] <= INT32_MAX && rk_cuda_rows(v) <= INT32_MAX && v->nb1 / t->type_size <= INT32_MAX;
}

static bool cuda_supports(const rk_backend *be, const rk_op_args *a) {
    (void)be;
    if (!a) return false;
    switch (a->op) {
    case RK_OP_RMSNORM: return f32(&a->dst) && f32(&a->src0) && (!a->src1.data || f32(&a->src1));
    case RK_OP_ROPE: return f32(&a->src0) && (!a->dst.data || f32(&a->dst)) && a->src0.ne[0] % 2 == 0;
    case RK_OP_SILU_MUL: return f32(&a->dst) && f32(&a->src0) && f32(&a->src1);
    case RK_OP_ADD:
    case RK_OP_ADD_ROW: return f32(&a->dst) && f32(&a->src0);
    case RK_OP_MATMUL:
        return f32(&a->dst) && f32(&a->src1) && rk_cuda_weight_type(a->src0.type) && int_ok(&a->src0) &&
               int_ok(&a->src1) && int_ok(&a->dst);
    case RK_OP_GET_ROWS: return f32(&a->dst) && rk_cuda_weight_type(a->src0.type);
    case RK_OP_CPY_ROWS: return f32(&a->src0) && cache_type(a->dst.type) && (a->dst.type != RK_DT_Q8_0 || a->dst.ne[0] % 32 == 0);
    case RK_OP_ATTN:
        /* K and V of one type; q8_0 head rows whole blocks; head_dim within the kernel's tiles */
        return f32(&a->dst) && f32(&a->src0) && cache_type(a->src1.type) && a->src2.type == a->src1.type &&
               (a->src1.type != RK_DT_Q8_0 || a->attn.head_dim % 32 == 0) && a->attn.head_dim >= 1 &&
               a->attn.head_dim <= RK_ATTN_MAX_HD && !a->attn_kv_pos && !a->attn_kv_bias && !a->attn_sparse;
    case RK_OP_SCATTER_ROWS: return f32(&a->dst) && f32(&a->src0);
    case RK_OP_LR_KEYS:
        /* one block per row: r coefficients and hd values in shared memory */
        return f32(&a->dst) && f32(&a->src0) && (f32(&a->src1) || a->src1.type == RK_DT_F16) && f32(&a->src2) &&
               a->dst.ne[0] >= 1 && a->dst.ne[0] <= RK_ATTN_MAX_HD && a->src0.ne[0] <= INT32_MAX &&
               rk_cuda_lr_keys_smem((int)a->src0.ne[0], (int)a->dst.ne[0]) <= RK_LR_KEYS_MAX_SMEM;
    case RK_OP_LR_ATTN: {
        /* q rows of the state in shared memory beside one 32-key tile; combine's shared floats */
        if (!a->lr || a->attn.n_head_kv <= 0 || a->attn.head_dim < 1 || a->attn.head_dim > RK_ATTN_MAX_HD) return false;
        const int64_t ns = rk_cuda_rows(&a->src0) * (a->attn.n_head / a->attn.n_head_kv);
        return f32(&a->dst) && f32(&a->src0) && ns * a->attn.head_dim <= 4096 && a->lr->r <= 4096 &&
               rk_cuda_lr_attn_smem((int)ns, a->attn.head_dim) <= 48 * 1024;
    }
    default: return false;
    }
}

static void cuda_destroy(rk_backend *be) {
    rk_cuda *c = impl_of(be);
    if (!c) return;
    if (c->stream_ok || c->blas_ok || c->dbuf || c->n_blocks) cudaSetDevice(c->device);
    rk_cuda_graph_release(c);
    rk_cuda_lane_release(c);
    rk_cuda_mem_release(c);
    if (c->dbuf) cudaFree(c->dbuf);
    if (c->blas_ok) cublasDestroy(c->blas);
    if (c->stream_ok) cudaStreamDestroy(c->stream);
    free(c);
}

extern "C" rk_status rk_backend_cuda_create(int device, rk_backend **out, rk_err *err) {
    if (!out) return rk_err_set(err, RK_E_INVALID_ARG, "cuda: NULL out");
    int n_dev = 0;
    cudaError_t e = cudaGetDeviceCount(&n_dev);
    if (e != cudaSuccess || n_dev == 0) {
        rk_status st = rk_err_set(err, RK_E_UNSUPPORTED, "cuda: no device (%s)",
                                  e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        cudaGetLastError(); /* leave no pending error for later runtime calls */
        return st;
    }
    if (device < 0 || device >= n_dev)
        return rk_err_set(err, RK_E_INVALID_ARG, "cuda: device %d out of range (< %d)", device, n_dev);
    rk_status st;
    rk_cuda *c = (rk_cuda *)calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "cuda: backend allocation");
    c->device = device;
    c->be.impl = c;
    c->be.n_threads = 1;
    c->be.ops = &c->ops;
    c->ops.name = "cuda";
    c->ops.op[RK_OP_RMSNORM] = run_elementwise;
    c->ops.op[RK_OP_ROPE] = run_elementwise;
    c->ops.op[RK_OP_SILU_MUL] = run_elementwise;
    c->ops.op[RK_OP_ADD] = run_elementwise;
    c->ops.op[RK_OP_ADD_ROW] = run_elementwise;
    c->ops.op[RK_OP_MATMUL] = rk_cuda_matmul;
    c->ops.op[RK_OP_GET_ROWS] = run_get_rows;
    c->ops.op[RK_OP_CPY_ROWS] = run_cpy_rows;
    c->ops.op[RK_OP_ATTN] = run_attn;
    c->ops.op[RK_OP_SCATTER_ROWS] = run_scatter_rows;
    c->ops.op[RK_OP_LR_KEYS] = run_lr_keys;
    c->ops.op[RK_OP_LR_ATTN] = run_lr_attn;
    c->ops.supports = cuda_supports;
    c->ops.destroy = cuda_destroy;
    c->ops.prepare = rk_cuda_prepare;
    c->ops.mem_alloc = rk_cuda_mem_alloc;
    c->ops.mem_free = rk_cuda_mem_free;
    c->ops.upload = rk_cuda_mem_upload;
    c->ops.download = rk_cuda_mem_download;
    c->ops.sync = rk_cuda_sync;
    c->ops.missing_hint = NULL; /* every op has a kernel */
    c->ops.step_begin = rk_cuda_step_begin;
    c->ops.step_end = rk_cuda_step_end;
    c->ops.host_alloc = rk_cuda_host_alloc;
    c->ops.host_free = rk_cuda_host_free;
    c->ops.lane_copy = rk_cuda_lane_copy;
    c->ops.lane_join = rk_cuda_lane_join;
    c->ops.lane_sync = rk_cuda_lane_sync;
    const char *on = "create";
    cublasStatus_t bs;
    if ((e = cudaSetDevice(device)) != cudaSuccess) goto cuda_fail;
    if ((e = cudaDeviceGetAttribute(&c->n_sm, cudaDevAttrMultiProcessorCount, device)) != cudaSuccess) goto cuda_fail;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) goto cuda_fail;
    c->stream_ok = true;
    if ((bs = cublasCreate(&c->blas)) != CUBLAS_STATUS_SUCCESS) {
        st = rk_err_set(err, bs == CUBLAS_STATUS_ALLOC_FAILED ? RK_E_NOMEM : RK_E_INTERNAL, "cuda: cublasCreate: %s",
                        cublasGetStatusString(bs));
        goto fail;
    }
    c->blas_ok = true;
    /* plain fp32 SGEMM: no TF32 shortcuts, results comparable with cpu_ref */
    if ((bs = cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH)) != CUBLAS_STATUS_SUCCESS ||
        (bs = cublasSetStream(c->blas, c->stream)) != CUBLAS_STATUS_SUCCESS) {
        st = rk_err_set(err, RK_E_INTERNAL, "cuda: cuBLAS setup: %s", cublasGetStatusString(bs));
        goto fail;
    }
    *out = &c->be;
    return RK_OK;
cuda_fail:
    st = rk_cuda_fail(err, on, "device setup", e);
fail:
    cuda_destroy(&c->be);
    return st;
}
