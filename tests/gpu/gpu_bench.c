/* gpu_bench: the ceilings and the GPU targets' two ratios, in one run on a
 * lent GPU (tests/gpu/check.sh calls it; not a test):
 *   - the device-to-device copy bandwidth (cudaMemcpy of 2 GiB; bytes read + written),
 *   - the cuBLAS bf16 GEMM rate (8192^3, random data, fp32 accumulation),
 *   - per weight type, the backend's MATMUL on qwen2.5-1.5b's ffn_up (1536 -> 8960) from
 *     a synthetic file: decode GEMV (n = 1) as weight bytes per second against the copy
 *     bandwidth, and prefill GEMM (n = 512) as FLOP/s against the cuBLAS bf16 rate.
 * Each figure: 3 warm-up runs, then the median of 7 timed batches of 20 (host clock after a
 * sync). One JSON object on stdout. Exit 77 without a GPU. */
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gguf.h"
#include "rk_kernels.h"
#include "rk_synth.h"

#define CK(x)                                                                   \
    do {                                                                        \
        cudaError_t e_ = (x);                                                   \
        if (e_ != cudaSuccess) {                                                \
            fprintf(stderr, "gpu_bench: %s: %s\n", #x, cudaGetErrorString(e_)); \
            exit(1);                                                            \
        }                                                                       \
    } while (0)

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

typedef void (*work_fn)(void *ctx);

/* median seconds of one call of fn (7 batches of reps after 3 warm-ups) */
static double time_it(work_fn fn, void *ctx, int reps, void (*sync)(void *), void *sctx) {
    for (int i = 0; i < 3; i++) fn(ctx);
    sync(sctx);
    double t[7];
    for (int b = 0; b < 7; b++) {
        double t0 = rk_time_now();
        for (int i = 0; i < reps; i++) fn(ctx);
        sync(sctx);
        t[b] = (rk_time_now() - t0) / reps;
    }
    qsort(t, 7, sizeof t[0], cmp_d);
    return t[3];
}

static void dev_sync(void *u) {
    (void)u;
    CK(cudaDeviceSynchronize());
}

typedef struct copy_ctx {
    void *a, *b;
    size_t n;
} copy_ctx;
static void do_copy(void *u) {
    copy_ctx *c = u;
    CK(cudaMemcpyAsync(c->b, c->a, c->n, cudaMemcpyDeviceToDevice, 0));
}

typedef struct gemm_ctx {
    cublasHandle_t h;
    void *a, *b, *c;
    int n;
} gemm_ctx;
static void do_gemm(void *u) {
    gemm_ctx *g = u;
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t s =
        cublasGemmEx(g->h, CUBLAS_OP_T, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->a, CUDA_R_16BF, g->n, g->b, CUDA_R_16BF,
                     g->n, &zero, g->c, CUDA_R_32F, g->n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "gpu_bench: cublasGemmEx: %s\n", cublasGetStatusString(s));
        exit(1);
    }
}

typedef struct op_ctx {
    rk_backend *be;
    rk_op_args a;
} op_ctx;
static void do_op(void *u) {
    op_ctx *o = u;
    rk_err err = {0};
    if (rk_backend_run(o->be, &o->a, &err) != RK_OK) {
        fprintf(stderr, "gpu_bench: %s\n", err.msg);
        exit(1);
    }
}
static void be_sync(void *u) {
    rk_err err = {0};
    if (rk_backend_sync(u, &err) != RK_OK) {
        fprintf(stderr, "gpu_bench: %s\n", err.msg);
        exit(1);
    }
}

/* random bytes, then every 16-bit word made a small finite bf16 (no NaN / Inf / zeros) */
static void fill_bf16(void *dev, size_t n_elems, uint64_t seed) {
    uint16_t *h = malloc(n_elems * 2);
    if (!h) exit(1);
    for (size_t i = 0; i < n_elems; i++) {
        uint64_t r = rk_splitmix64(&seed);
        float v = ((float)(r >> 40) / 16777216.0f - 0.5f) * 0.1f + 1e-3f;
        h[i] = rk_f32_to_bf16(v);
    }
    CK(cudaMemcpy(dev, h, n_elems * 2, cudaMemcpyHostToDevice));
    free(h);
}

int main(void) {
    int n_dev = 0;
    if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
        fprintf(stderr, "gpu_bench: no CUDA device\n");
        return 77;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("{\"device\":\"%s\",\"sm\":%d%d", prop.name, prop.major, prop.minor);
    /* copy bandwidth */
    copy_ctx cc = {NULL, NULL, (size_t)2 << 30};
    CK(cudaMalloc(&cc.a, cc.n));
    CK(cudaMalloc(&cc.b, cc.n));
    CK(cudaMemset(cc.a, 1, cc.n));
    double t_copy = time_it(do_copy, &cc, 5, dev_sync, NULL);
    double copy_bw = 2.0 * (double)cc.n / t_copy; /* read + write */
    CK(cudaFree(cc.a));
    CK(cudaFree(cc.b));
    printf(",\"copy_GBps_read_plus_write\":%.1f", copy_bw / 1e9);
    /* cuBLAS bf16 */
    gemm_ctx gc = {NULL, NULL, NULL, NULL, 8192};
    size_t nn = (size_t)gc.n * gc.n;
    if (cublasCreate(&gc.h) != CUBLAS_STATUS_SUCCESS) return 1;
    CK(cudaMalloc(&gc.a, nn * 2));
    CK(cudaMalloc(&gc.b, nn * 2));
    CK(cudaMalloc(&gc.c, nn * 4));
    fill_bf16(gc.a, nn, 1);
    fill_bf16(gc.b, nn, 2);
    double t_gemm = time_it(do_gemm, &gc, 3, dev_sync, NULL);
    double bf16_rate = 2.0 * (double)nn * gc.n / t_gemm;
    CK(cudaFree(gc.a));
    CK(cudaFree(gc.b));
    CK(cudaFree(gc.c));
    cublasDestroy(gc.h);
    printf(",\"cublas_bf16_TFLOPs\":%.1f,\"types\":[", bf16_rate / 1e12);
    /* the backend's MATMUL per type */
    const char *types[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q4_k", "q6_k"};
    for (int ti = 0; ti < 8; ti++) {
        rk_synth_params sp = {"qwen2.5-1.5b", types[ti], 320, 1, 7};
        void *bytes = NULL;
        size_t len = 0;
        rk_err err = {0};
        rk_gguf *g = NULL;
        if (rk_synth_build(&sp, &bytes, &len, &err) || rk_gguf_parse(bytes, len, &g, &err)) {
            fprintf(stderr, "gpu_bench: %s\n", err.msg);
            return 1;
        }
        const rk_gguf_tensor *t = rk_gguf_find_tensor(g, "blk.0.ffn_up.weight");
        rk_backend *be = NULL;
        if (!t || rk_backend_cuda_create(0, &be, &err)) {
            fprintf(stderr, "gpu_bench: %s\n", t ? err.msg : "no ffn_up");
            return 1;
        }
        uint64_t rb = 0;
        rk_dtype_row_bytes(t->type, (uint64_t)t->ne[0], &rb);
        rk_view w = {t->type, {t->ne[0], t->ne[1], 1, 1}, (size_t)rb, (void *)t->data}, wd;
        const int64_t k = t->ne[0], m = t->ne[1], nmax = 512;
        void *x = NULL, *y = NULL;
        if (rk_backend_prepare(be, &w, &wd, &err) || rk_backend_alloc(be, (size_t)(nmax * k) * 4, &x, &err) ||
            rk_backend_alloc(be, (size_t)(nmax * m) * 4, &y, &err)) {
            fprintf(stderr, "gpu_bench: %s\n", err.msg);
            return 1;
        }
        float *hx = malloc((size_t)(nmax * k) * 4);
        uint64_t s = 3;
        for (int64_t i = 0; i < nmax * k; i++) hx[i] = (float)(rk_splitmix64(&s) >> 40) / 16777216.0f - 0.5f;
        rk_backend_upload(be, x, hx, (size_t)(nmax * k) * 4, &err);
        free(hx);
        double res[2];
        for (int pass = 0; pass < 2; pass++) {
            int64_t n = pass ? nmax : 1;
            op_ctx oc = {be, {.op = RK_OP_MATMUL}};
            oc.a.src0 = wd;
            oc.a.src1 = (rk_view){RK_DT_F32, {k, n, 1, 1}, (size_t)k * 4, x};
            oc.a.dst = (rk_view){RK_DT_F32, {m, n, 1, 1}, (size_t)m * 4, y};
            res[pass] = time_it(do_op, &oc, pass ? 5 : 50, be_sync, be);
        }
        double wbytes = (double)rb * (double)m, flops = 2.0 * (double)nmax * (double)k * (double)m;
        printf("%s{\"type\":\"%s\",\"weight_bytes\":%.0f,\"gemv_us\":%.2f,\"gemv_GBps\":%.1f,"
               "\"gemv_vs_copy\":%.3f,\"gemm_512_us\":%.1f,\"gemm_TFLOPs\":%.2f,\"gemm_vs_cublas_bf16\":%.3f}",
               ti ? "," : "", types[ti], wbytes, res[0] * 1e6, wbytes / res[0] / 1e9, wbytes / res[0] / copy_bw,
               res[1] * 1e6, flops / res[1] / 1e12, flops / res[1] / bf16_rate);
        fflush(stdout);
        rk_backend_free(be, x);
        rk_backend_free(be, y);
        rk_backend_destroy(be);
        rk_gguf_destroy(g);
        free(bytes);
    }
    printf("]}\n");
    return 0;
}
