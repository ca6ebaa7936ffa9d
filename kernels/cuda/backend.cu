/* CUDA backend: factory, op table, host<->device transfers and the element
 * ops. The op API hands over host pointers, so every op copies its inputs in
 * and its output out on the instance's stream and waits (enough for the op
 * tests; the forward pass will keep tensors resident later). */
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"

static rk_cuda *impl_of(rk_backend *be) { return (rk_cuda *)be->impl; }

rk_status rk_cuda_fail(rk_err *err, const char *op, const char *what, cudaError_t e) {
    return rk_err_set(err, e == cudaErrorMemoryAllocation ? RK_E_NOMEM : RK_E_INTERNAL, "cuda: %s: %s: %s (%s)",
                      op, what, cudaGetErrorName(e), cudaGetErrorString(e));
}

rk_status rk_cuda_scratch(rk_cuda *c, size_t bytes, rk_err *err) {
    if (bytes <= c->dcap) return RK_OK;
    size_t want = bytes + bytes / 4;
    if (c->dbuf) cudaFree(c->dbuf);
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

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

#define CU(what, x)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) return rk_cuda_fail(err, on, what, e_);                            \
    } while (0)

/* Uploads src0 (and src1 when used) to scratch, runs the op in place on the
 * src0 copy, downloads it into dst. */
static rk_status run_elementwise(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const char *on = rk_op_name(a->op);
    bool two = a->op != RK_OP_ROPE && (a->op != RK_OP_RMSNORM || a->src1.data);
    const rk_view *x = a->op == RK_OP_ADD || a->op == RK_OP_ADD_ROW ? &a->dst : &a->src0;
    const rk_view *y = a->op == RK_OP_ADD || a->op == RK_OP_ADD_ROW ? &a->src0 : &a->src1;
    size_t bx = rk_cuda_view_bytes(x), by = two ? rk_cuda_view_bytes(y) : 0;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_status st = rk_cuda_scratch(c, up256(bx) + up256(by) + 256, err);
    if (st != RK_OK) return st;
    float *dx = (float *)c->dbuf, *dy = (float *)(c->dbuf + up256(bx));
    CU("upload", rk_cuda_upload(c, dx, x));
    if (two) CU("upload", rk_cuda_upload(c, dy, y));
    int64_t rows = rk_cuda_rows(x), d = x->ne[0];
    switch (a->op) {
    case RK_OP_RMSNORM: CU("kernel", rk_cuda_rmsnorm(dx, two ? dy : NULL, dx, rows, d, a->eps, c->stream)); break;
    case RK_OP_ROPE:
        CU("kernel", rk_cuda_rope(dx, rows, a->src0.ne[1], d, a->rope.n_rot, a->rope.mode == RK_ROPE_NEOX,
                                  a->rope.freq_base, a->rope.pos0, c->stream));
        break;
    case RK_OP_SILU_MUL: CU("kernel", rk_cuda_silu_mul(dx, dy, dx, rows * d, c->stream)); break;
    case RK_OP_ADD:
    case RK_OP_ADD_ROW: CU("kernel", rk_cuda_add(dx, dy, rows, d, a->op == RK_OP_ADD_ROW, c->stream)); break;
    default: return rk_err_set(err, RK_E_INTERNAL, "cuda: %s routed to the element ops", on);
    }
    const rk_view *out = a->op == RK_OP_ROPE && !a->dst.data ? &a->src0 : &a->dst;
    CU("download", rk_cuda_download(c, out, dx));
    CU("synchronize", cudaStreamSynchronize(c->stream));
    return RK_OK;
}

static bool f32(const rk_view *v) { return v->type == RK_DT_F32; }

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
        /* cuBLAS takes int dimensions */
        return f32(&a->dst) && f32(&a->src1) &&
               (a->src0.type == RK_DT_F32 || a->src0.type == RK_DT_F16 || a->src0.type == RK_DT_BF16) &&
               a->src0.ne[0] <= INT32_MAX && rk_cuda_rows(&a->src0) <= INT32_MAX && rk_cuda_rows(&a->src1) <= INT32_MAX;
    default: return false;
    }
}

static void cuda_destroy(rk_backend *be) {
    rk_cuda *c = impl_of(be);
    if (!c) return;
    if (c->stream_ok || c->blas_ok || c->dbuf) cudaSetDevice(c->device);
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
    c->ops.supports = cuda_supports;
    c->ops.destroy = cuda_destroy;
    const char *on = "create";
    cublasStatus_t bs;
    if ((e = cudaSetDevice(device)) != cudaSuccess) goto cuda_fail;
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
