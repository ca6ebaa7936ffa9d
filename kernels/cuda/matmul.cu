/* MATMUL, dst (n, m) = x (n, k) W^T, row-major, which is column-major
 * dst^T (m, n) = W (k x m, transposed) x^T (k x n); the views' row strides are
 * the leading dimensions.
 * - n <= RK_CUDA_GEMV_MAX (decode): the GEMV kernel on the weights as stored,
 *   every type, f32 accumulation (gemv.cu).
 * - f32 weights: cuBLAS SGEMM in pedantic fp32 (no TF32).
 * - f16 / bf16 weights: cublasGemmEx on the weights as they are, activations
 *   rounded to the same half type, fp32 accumulation (tensor cores).
 * - quantised weights: the same GemmEx on an f16 copy of the matrix, made once
 *   on the device the first time a prepared weight meets the GEMM path and kept
 *   with the weight (memory.cu frees it); an unprepared quantised view (host
 *   memory, op tests) is dequantised into scratch for that call only. */
#include "cuda_dequant.cuh"

#define CU(what, x)                                                                                \
    do {                                                                                           \
        cudaError_t e_ = (x);                                                                      \
        if (e_ != cudaSuccess) return rk_cuda_fail(err, "MATMUL", what, e_);                      \
    } while (0)

static rk_status blas_fail(rk_err *err, const char *what, cublasStatus_t bs, int64_t n, int64_t m, int64_t k) {
    return rk_err_set(err, RK_E_INTERNAL, "cuda: MATMUL: %s (%lld x %lld x %lld): %s", what, (long long)n,
                      (long long)m, (long long)k, cublasGetStatusString(bs));
}

/* The prepared weight whose device copy is at p, or NULL. */
static rk_cuda_weight *prepared_at(rk_cuda *c, const void *p) {
    for (int i = 0; i < c->n_weights; i++)
        if (c->weights[i].dev.data == p) return &c->weights[i];
    return NULL;
}

rk_status rk_cuda_matmul(rk_backend *be, const rk_op_args *a, rk_err *err) {
    rk_cuda *c = (rk_cuda *)be->impl;
    const uint32_t type = a->src0.type;
    int64_t k = a->src0.ne[0], m = rk_cuda_rows(&a->src0), n = rk_cuda_rows(&a->src1);
    if (n == 0 || m == 0) return RK_OK;
    CU("cudaSetDevice", cudaSetDevice(c->device));
    rk_cuda_arg g[3] = {rk_cuda_arg_of(&a->src0, true, false), rk_cuda_arg_of(&a->src1, true, false),
                        rk_cuda_arg_of(&a->dst, false, true)};
    const bool gemv = n <= RK_CUDA_GEMV_MAX && k > 0;
    const bool half_w = type == RK_DT_F16 || type == RK_DT_BF16;
    const bool gemm_half = !gemv && type != RK_DT_F32 && k > 0;
    rk_cuda_weight *pw = gemm_half && !half_w ? prepared_at(c, a->src0.data) : NULL;
    if (pw && !pw->wide) { /* once per weight: its f16 copy, from the device copy */
        rk_status cst = rk_cuda_no_capture(c, "the first GEMM of a weight", err);
        if (cst != RK_OK) return cst;
        void *wide = NULL;
        CU("cudaMalloc (f16 copy of a weight)", cudaMalloc(&wide, (size_t)m * (size_t)k * 2));
        cudaError_t e = rk_cuda_to_half(pw->dev.data, type, pw->dev.nb1, wide, m, k, c->stream);
        if (e != cudaSuccess) {
            cudaFree(wide);
            return rk_cuda_fail(err, "MATMUL", "f16 copy of a weight", e);
        }
        pw->wide = wide;
    }
    /* scratch: x in half (GEMM), plus the weight in f16 when it has no kept copy */
    size_t bx = gemm_half ? (size_t)n * (size_t)k * 2 : 0;
    size_t bw = gemm_half && !half_w && !pw ? (size_t)m * (size_t)k * 2 : 0;
    char *extra = NULL;
    rk_status st = rk_cuda_args_begin(c, "MATMUL", g, 3, rk_cuda_up256(bx) + bw, &extra, err);
    if (st != RK_OK) return st;
    const size_t nbw = rk_cuda_arg_nb1(&g[0]);
    const float *x = (const float *)g[1].dev;
    float *y = (float *)g[2].dev;
    if (k == 0) {
        CU("memset", cudaMemset2DAsync(y, (size_t)g[2].ld * sizeof(float), 0, (size_t)m * sizeof(float), (size_t)n,
                                       c->stream));
    } else if (gemv) {
        CU("GEMV", rk_cuda_gemv(g[0].dev, type, nbw, x, g[1].ld, y, g[2].ld, n, m, k, c->stream));
    } else if (type == RK_DT_F32) {
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t bs = cublasSetMathMode(c->blas, CUBLAS_PEDANTIC_MATH);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasSgemm(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, (const float *)g[0].dev,
                             (int)g[0].ld, x, (int)g[1].ld, &zero, y, (int)g[2].ld);
        if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(err, "cublasSgemm", bs, n, m, k);
    } else {
        const bool bf16 = type == RK_DT_BF16;
        const cudaDataType_t ht = bf16 ? CUDA_R_16BF : CUDA_R_16F;
        void *xh = extra, *wh = NULL;
        int64_t ldw = k;
        if (half_w) {
            wh = g[0].dev;
            ldw = (int64_t)(nbw / 2);
        } else if (pw) {
            wh = pw->wide;
        } else {
            wh = extra + rk_cuda_up256(bx);
            CU("dequantise weights", rk_cuda_to_half(g[0].dev, type, nbw, wh, m, k, c->stream));
        }
        CU("round activations", rk_cuda_act_to_half(x, g[1].ld, xh, bf16, n, k, c->stream));
        const float one = 1.0f, zero = 0.0f;
        cublasStatus_t bs = cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH);
        if (bs == CUBLAS_STATUS_SUCCESS)
            bs = cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)m, (int)n, (int)k, &one, wh, ht, (int)ldw, xh, ht,
                              (int)k, &zero, y, CUDA_R_32F, (int)g[2].ld, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        if (bs != CUBLAS_STATUS_SUCCESS) return blas_fail(err, "cublasGemmEx", bs, n, m, k);
    }
    return rk_cuda_args_end(c, "MATMUL", g, 3, err);
}
