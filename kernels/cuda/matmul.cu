/* MATMUL with cuBLAS SGEMM: f16/bf16 weights are widened to f32 in scratch
 * first. Row-major dst (n, m) = x (n, k) W^T is column-major
 * dst^T (m, n) = W (as k x m, transposed) x^T (k x n); the views' row strides
 * are the leading dimensions. */
#include "cuda_impl.h"

#define CU(what, x)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) return rk_cuda_fail(err, "MATMUL", what, e_);                      \
    } while (0)

rk_status rk_cuda_matmul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = (rk_cuda *)be->impl;
    int64_t k = a->src0.ne[0], m = rk_cuda_rows(&a->src0), n = rk_cuda_rows(&a->src1);
    if (n == 0 || m == 0) return RK_OK;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_cuda_arg g[3] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->src1, true, false),
                        rk_cuda_arg_of(&a->dst, false, true)};
    size_t bw32 = a->src0.type == RK_DT_F32 ? 0 : (size_t)m * (size_t)k * sizeof(float); /* (m, k) widened */
    char *wide = NULL;
    rk_status st = rk_cuda_args_begin(c, "MATMUL", g, 3, bw32, &wide, err);
    if (st != RK_OK) return st;
    const float *w = (const float *)g[0].dev;
    int64_t ldw = g[0].ld;
    if (bw32) {
        CU("widen weights", rk_cuda_to_f32(g[0].dev, a->src0.type, g[0].ld, (float *)wide, m, k, c->stream));
        w = (const float *)wide;
        ldw = k;
    }
    float *y = (float *)g[2].dev;
    if (k == 0) {
        CU("memset", cudaMemset2DAsync(y, (size_t)g[2].ld * sizeof(float), 0, (size_t)m * sizeof(float), (size_t)n,
                                       c->stream));
    } else {
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, w, (int)ldw,
                                        (const float *)g[1].dev, (int)g[1].ld, &zero, y, (int)g[2].ld);
        if (bs != CUBLAS_STATUS_SUCCESS)
            return rk_err_set(err, RK_E_INTERNAL, "cuda: MATMUL: cublasSgemm (%lld x %lld x %lld): %s", (long long)n,
                              (long long)m, (long long)k, cublasGetStatusString(bs));
    }
    return rk_cuda_args_end(c, "MATMUL", g, 3, err);
}
