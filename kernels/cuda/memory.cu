/* Device memory of a CUDA backend instance: blocks handed out by
 * rk_backend_alloc, prepared weights (uploaded once, cached by host pointer),
 * host <-> device copies on the instance's stream. A sorted registry of the
 * blocks tells an op whether a view is device memory (use it in place) or
 * host memory (stage it). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_impl.h"

static rk_cuda *impl_of(rk_backend *be) { return (rk_cuda *)be->impl; }

/* Index of the first block starting after p. */
static int upper(const rk_cuda *c, uintptr_t p) {
    int lo = 0, hi = c->n_blocks;
    while (lo < hi) {
        int mid = lo + (hi - lo) / 2;
        if ((uintptr_t)c->blocks[mid].p <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

const rk_cuda_block *rk_cuda_find_block(const rk_cuda *c, const void *p) {
    uintptr_t q = (uintptr_t)p;
    int i = upper(c, q);
    if (i == 0) return NULL;
    const rk_cuda_block *b = &c->blocks[i - 1];
    return q < (uintptr_t)b->p + b->bytes ? b : NULL;
}

static rk_status add_block(rk_cuda *c, char *p, size_t bytes, bool prepared, rk_err *err) {
    if (c->n_blocks == c->cap_blocks) {
        int cap = c->cap_blocks ? 2 * c->cap_blocks : 64;
        rk_cuda_block *nb = (rk_cuda_block *)realloc(c->blocks, (size_t)cap * sizeof *nb);
        if (!nb) return rk_err_set(err, RK_E_NOMEM, "cuda: block registry of %d entries", cap);
        c->blocks = nb;
        c->cap_blocks = cap;
    }
    int i = upper(c, (uintptr_t)p);
    memmove(c->blocks + i + 1, c->blocks + i, (size_t)(c->n_blocks - i) * sizeof *c->blocks);
    c->blocks[i] = rk_cuda_block{p, bytes, prepared};
    c->n_blocks++;
    return RK_OK;
}

/* bytes (>= 1) of device memory, registered; zeroed on the stream when asked. */
static rk_status new_block(rk_cuda *c, const char *what, size_t bytes, bool prepared, bool zero, char **out,
                           rk_err *err) {
    if (bytes == 0) bytes = 1;
    char *p = NULL;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaMalloc((void **)&p, bytes);
    if (e != cudaSuccess) {
        char msg[96];
        snprintf(msg, sizeof msg, "cudaMalloc of %zu bytes", bytes);
        return rk_cuda_fail(err, what, msg, e);
    }
    if (zero && (e = cudaMemsetAsync(p, 0, bytes, c->stream)) != cudaSuccess) {
        cudaFree(p);
        return rk_cuda_fail(err, what, "cudaMemsetAsync", e);
    }
    rk_status st = add_block(c, p, bytes, prepared, err);
    if (st != RK_OK) {
        cudaFree(p);
        return st;
    }
    *out = p;
    return RK_OK;
}

rk_status rk_cuda_mem_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    rk_status cst = rk_cuda_no_capture(impl_of(be), "alloc", err);
    if (cst != RK_OK) return cst;
    char *p = NULL;
    rk_status st = new_block(impl_of(be), "alloc", bytes, false, true, &p, err);
    if (st == RK_OK) *out = p;
    return st;
}

void rk_cuda_mem_free(rk_backend *be, void *p) {
    rk_cuda *c = impl_of(be);
    int i = upper(c, (uintptr_t)p) - 1;
    if (i < 0 || c->blocks[i].p != (char *)p || c->blocks[i].prepared) return; /* not ours to free */
    rk_cuda_no_capture(c, "free", NULL); /* the sync below ends a capture (it then fails) */
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->stream); /* queued work may still read it */
    if (c->lane_ok) cudaStreamSynchronize(c->lane); /* and lane copies (lane.cu) */
    cudaFree(p);
    memmove(c->blocks + i, c->blocks + i + 1, (size_t)(c->n_blocks - i - 1) * sizeof *c->blocks);
    c->n_blocks--;
}

/* [p, p + bytes) inside one block; writable unless a prepared weight. */
static const rk_cuda_block *span(const rk_cuda *c, const void *p, size_t bytes) {
    const rk_cuda_block *b = rk_cuda_find_block(c, p);
    if (!b || bytes > b->bytes - (size_t)((const char *)p - b->p)) return NULL;
    return b;
}

rk_status rk_cuda_mem_upload(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const rk_cuda_block *b = span(c, dst, bytes);
    if (!b)
        return rk_err_set(err, RK_E_INVALID_ARG, "cuda: upload: %zu bytes at %p are not inside a buffer of this backend",
                          bytes, dst);
    if (b->prepared) return rk_err_set(err, RK_E_INVALID_ARG, "cuda: upload: %p is a prepared weight (read-only)", dst);
    rk_status cst = rk_cuda_no_capture(c, "upload", err);
    if (cst != RK_OK) return cst;
    cudaError_t e = cudaSetDevice(c->device);
    /* from pageable memory this returns once src has been staged */
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->stream);
    return e == cudaSuccess ? RK_OK : rk_cuda_fail(err, "upload", "cudaMemcpyAsync", e);
}

rk_status rk_cuda_mem_download(rk_backend *be, void *dst, const void *src, size_t bytes, rk_err *err) {
    rk_cuda *c = impl_of(be);
    if (!span(c, src, bytes))
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "cuda: download: %zu bytes at %p are not inside a buffer of this backend", bytes, src);
    rk_status cst = rk_cuda_no_capture(c, "download", err);
    if (cst != RK_OK) return cst;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, c->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? RK_OK : rk_cuda_fail(err, "download", "queued work or copy", e);
}

rk_status rk_cuda_sync(rk_backend *be, rk_err *err) {
    rk_cuda *c = impl_of(be);
    rk_status cst = rk_cuda_no_capture(c, "sync", err);
    if (cst != RK_OK) return cst;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    return e == cudaSuccess ? RK_OK : rk_cuda_fail(err, "sync", "queued work", e);
}

static int64_t dim(const rk_view *v, int i) { return i >= 2 && v->ne[i] == 0 ? 1 : v->ne[i]; }

static bool same_view(const rk_view *a, const rk_view *b) {
    if (a->type != b->type || a->nb1 != b->nb1) return false;
    for (int i = 0; i < 4; i++)
        if (dim(a, i) != dim(b, i)) return false;
    return true;
}

rk_status rk_cuda_prepare(rk_backend *be, const rk_view *w, rk_view *out, rk_err *err) {
    rk_cuda *c = impl_of(be);
    rk_status cst = rk_cuda_no_capture(c, "prepare", err);
    if (cst != RK_OK) return cst;
    for (int i = 0; i < c->n_weights; i++) {
        if (c->weights[i].host.data != w->data) continue;
        if (!same_view(&c->weights[i].host, w))
            return rk_err_set(err, RK_E_INVALID_ARG,
                              "cuda: prepare: %p was prepared as %s {%lld, %lld} nb1 %zu, now %s {%lld, %lld} nb1 %zu "
                              "(prepare whole tensors)",
                              w->data, rk_dtype_name(c->weights[i].host.type), (long long)c->weights[i].host.ne[0],
                              (long long)rk_cuda_rows(&c->weights[i].host), c->weights[i].host.nb1,
                              rk_dtype_name(w->type), (long long)w->ne[0], (long long)rk_cuda_rows(w), w->nb1);
        *out = c->weights[i].dev;
        return RK_OK;
    }
    const rk_cuda_block *b = rk_cuda_find_block(c, w->data);
    if (b) { /* already device memory of this instance */
        if (rk_cuda_view_extent(w) > b->bytes - (size_t)((const char *)w->data - b->p))
            return rk_err_set(err, RK_E_INVALID_ARG, "cuda: prepare: view runs past its device buffer");
        *out = *w;
        return RK_OK;
    }
    if (c->n_weights == c->cap_weights) {
        int cap = c->cap_weights ? 2 * c->cap_weights : 64;
        rk_cuda_weight *nw = (rk_cuda_weight *)realloc(c->weights, (size_t)cap * sizeof *nw);
        if (!nw) return rk_err_set(err, RK_E_NOMEM, "cuda: prepare: weight table of %d entries", cap);
        c->weights = nw;
        c->cap_weights = cap;
    }
    size_t bytes = rk_cuda_view_bytes(w);
    char *p = NULL;
    rk_status st = new_block(c, "prepare", bytes, true, false, &p, err);
    if (st != RK_OK) return st;
    /* waits, so w's memory may go (and a bad copy is reported here, not later) */
    cudaError_t e = rk_cuda_upload(c, p, w);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
    if (e != cudaSuccess) {
        st = rk_cuda_fail(err, "prepare", "upload", e);
        int i = upper(c, (uintptr_t)p) - 1; /* the block just added */
        memmove(c->blocks + i, c->blocks + i + 1, (size_t)(c->n_blocks - i - 1) * sizeof *c->blocks);
        c->n_blocks--;
        cudaFree(p);
        return st;
    }
    rk_view dev = *w;
    dev.data = p;
    uint64_t rb = 0;
    rk_dtype_row_bytes(w->type, (uint64_t)w->ne[0], &rb); /* checked by rk_backend_prepare */
    dev.nb1 = (size_t)rb;
    c->weights[c->n_weights++] = rk_cuda_weight{*w, dev, NULL};
    *out = dev;
    return RK_OK;
}

void rk_cuda_mem_release(rk_cuda *c) {
    if (c->n_blocks || c->n_weights) cudaSetDevice(c->device);
    for (int i = 0; i < c->n_blocks; i++) cudaFree(c->blocks[i].p);
    for (int i = 0; i < c->n_weights; i++)
        if (c->weights[i].wide) cudaFree(c->weights[i].wide);
    free(c->blocks);
    free(c->weights);
    c->blocks = NULL;
    c->weights = NULL;
    c->n_blocks = c->cap_blocks = c->n_weights = c->cap_weights = 0;
}
