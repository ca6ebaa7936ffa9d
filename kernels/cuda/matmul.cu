/* MATMUL with cuBLAS SGEMM: f16/bf16 weights are widened to f32 on the device
 * first. Row-major dst (n, m) = x (n, k) W^T is column-major
 * dst^T (m, n) = W (as k x m, transposed) x^T (k x n). */
#include "cuda_impl.h"

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

#define CU(what, x)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) return rk_cuda_fail(err, "MATMUL", what, e_);                      \
    } while (0)

rk_status rk_cuda_matmul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = (rk_cuda *)be->impl;
    int64_t k = a->src0.ne[0], m = rk_cuda_rows(&a->src0), n = rk_cuda_rows(&a->src1);
    if (n == 0 || m == 0) return RK_OK;
    size_t bw = rk_cuda_view_bytes(&a->src0), bx = rk_cuda_view_bytes(&a->src1), by = rk_cuda_view_bytes(&a->dst);
    size_t bw32 = a->src0.type == RK_DT_F32 ? 0 : (size_t)m * (size_t)k * 4;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_status st = rk_cuda_scratch(c, up256(bw) + up256(bw32) + up256(bx) + up256(by) + 256, err);
    if (st != RK_OK) return st;
    char *p = c->dbuf;
    void *dw = p;
    float *dw32 = (float *)(p + up256(bw));
    float *dx = (float *)(p + up256(bw) + up256(bw32));
    float *dy = (float *)(p + up256(bw) + up256(bw32) + up256(bx));
    CU("upload", rk_cuda_upload(c, dw, &a->src0));
    CU("upload", rk_cuda_upload(c, dx, &a->src1));
    const float *w = (const float *)dw;
    if (bw32) {
        CU("widen weights", rk_cuda_to_f32(dw, a->src0.type, dw32, m * k, c->stream));
        w = dw32;
    }
    const float one = 1.0f, zero = 0.0f;
    if (k == 0) {
        CU("memset", cudaMemsetAsync(dy, 0, by, c->stream));
    } else {
        cublasStatus_t bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, w, (int)k,
                                        dx, (int)k, &zero, dy, (int)m);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return rk_err_set(err, RK_E_INTERNAL, "cuda: MATMUL: cublasSgemm (%lld x %lld x %lld): %s", (long long)n,
                              (long long)m, (long long)k, cublasGetStatusString(bs));
    }
    CU("download", rk_cuda_download(c, &a->dst, dy));
    CU("synchronize", cudaStreamSynchronize(c->stream));
    return RK_OK;
}
