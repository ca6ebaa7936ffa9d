/* Pinned host blocks and the copy lane of a CUDA backend instance (rk_kernels.h
 * rk_backend_host_alloc .. rk_backend_lane_sync): the GPU KV tiers
 * (runtime/kv/kv_dev.c) keep cold rows in page-locked host memory and move them on
 * a second stream while the instance's stream computes.
 * - lane_copy: an event recorded on the compute stream, the lane waits for it (the copy
 *   sees every op queued before it), then cudaMemcpyAsync on the lane. From and to
 *   pinned memory the copy is truly asynchronous (DMA beside the kernels). to_device with
 *   src in another buffer of this instance is a device-to-device copy on the lane.
 * - lane_join: an event recorded on the lane, the compute stream waits for it (no host
 *   sync: the kernels queued next start when the copies are done).
 * - lane_sync: cudaStreamSynchronize of the lane.
 * The lane, like the compute stream, is non-blocking (no implicit legacy-stream sync).
 * Nothing here may run while a step is recorded (rk_cuda_no_capture). */
#include <stdio.h>
#include <string.h>

#include "cuda_impl.h"

static rk_cuda *impl_of(rk_backend *be) { return (rk_cuda *)be->impl; }

static rk_status lane_init(rk_cuda *c, rk_err *err) {
    if (c->lane_ok) return RK_OK;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->lane, cudaStreamNonBlocking);
    if (e != cudaSuccess) return rk_cuda_fail(err, "lane", "cudaStreamCreateWithFlags", e);
    if ((e = cudaEventCreateWithFlags(&c->ev_compute, cudaEventDisableTiming)) != cudaSuccess) {
        cudaStreamDestroy(c->lane);
        return rk_cuda_fail(err, "lane", "cudaEventCreateWithFlags", e);
    }
    if ((e = cudaEventCreateWithFlags(&c->ev_lane, cudaEventDisableTiming)) != cudaSuccess) {
        cudaEventDestroy(c->ev_compute);
        cudaStreamDestroy(c->lane);
        return rk_cuda_fail(err, "lane", "cudaEventCreateWithFlags", e);
    }
    c->lane_ok = true;
    return RK_OK;
}

void rk_cuda_lane_release(rk_cuda *c) {
    if (!c->lane_ok) return;
    cudaSetDevice(c->device);
    cudaStreamSynchronize(c->lane);
    cudaEventDestroy(c->ev_compute);
    cudaEventDestroy(c->ev_lane);
    cudaStreamDestroy(c->lane);
    c->lane_ok = false;
}

rk_status rk_cuda_host_alloc(rk_backend *be, size_t bytes, void **out, rk_err *err) {
    rk_cuda *c = impl_of(be);
    rk_status cst = rk_cuda_no_capture(c, "host_alloc", err);
    if (cst != RK_OK) return cst;
    void *p = NULL;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault);
    if (e != cudaSuccess) {
        char msg[64];
        snprintf(msg, sizeof msg, "cudaHostAlloc of %zu bytes", bytes);
        cudaGetLastError();
        return rk_err_set(err, RK_E_NOMEM, "cuda: host_alloc: %s: %s", msg, cudaGetErrorString(e));
    }
    memset(p, 0, bytes);
    *out = p;
    return RK_OK;
}

void rk_cuda_host_free(rk_backend *be, void *p) {
    rk_cuda *c = impl_of(be);
    if (!p) return;
    cudaSetDevice(c->device);
    if (c->lane_ok) cudaStreamSynchronize(c->lane); /* a queued copy may still touch it */
    cudaFreeHost(p);
}

rk_status rk_cuda_lane_copy(rk_backend *be, void *dst, const void *src, size_t bytes, bool to_device, rk_err *err) {
    rk_cuda *c = impl_of(be);
    const void *dev = to_device ? dst : src;
    const rk_cuda_block *b = rk_cuda_find_block(c, dev);
    if (!b || bytes > b->bytes - (size_t)((const char *)dev - b->p))
        return rk_err_set(err, RK_E_INVALID_ARG, "cuda: lane copy: %zu bytes at %p are not inside a buffer of this backend",
                          bytes, dev);
    if (to_device && b->prepared)
        return rk_err_set(err, RK_E_INVALID_ARG, "cuda: lane copy: %p is a prepared weight (read-only)", dst);
    /* to_device from another buffer of this backend: a device-to-device copy (kv_dev.c's chunk frames) */
    const rk_cuda_block *sb = to_device ? rk_cuda_find_block(c, src) : NULL;
    if (sb && bytes > sb->bytes - (size_t)((const char *)src - sb->p))
        return rk_err_set(err, RK_E_INVALID_ARG, "cuda: lane copy: %zu bytes at %p run past their device buffer", bytes,
                          src);
    const cudaMemcpyKind kind = !to_device ? cudaMemcpyDeviceToHost : sb ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice;
    rk_status st = rk_cuda_no_capture(c, "lane copy", err);
    if (st == RK_OK) st = lane_init(c, err);
    if (st != RK_OK) return st;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaEventRecord(c->ev_compute, c->stream);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->lane, c->ev_compute, 0);
    if (e == cudaSuccess)
        e = cudaMemcpyAsync(dst, src, bytes, kind, c->lane);
    return e == cudaSuccess ? RK_OK : rk_cuda_fail(err, "lane copy", "cudaMemcpyAsync", e);
}

rk_status rk_cuda_lane_join(rk_backend *be, rk_err *err) {
    rk_cuda *c = impl_of(be);
    if (!c->lane_ok) return RK_OK; /* nothing was ever queued on it */
    rk_status st = rk_cuda_no_capture(c, "lane join", err);
    if (st != RK_OK) return st;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaEventRecord(c->ev_lane, c->lane);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(c->stream, c->ev_lane, 0);
    return e == cudaSuccess ? RK_OK : rk_cuda_fail(err, "lane join", "cudaStreamWaitEvent", e);
}

rk_status rk_cuda_lane_sync(rk_backend *be, rk_err *err) {
    rk_cuda *c = impl_of(be);
    if (!c->lane_ok) return RK_OK;
    rk_status st = rk_cuda_no_capture(c, "lane sync", err);
    if (st != RK_OK) return st;
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess) e = cudaStreamSynchronize(c->lane);
    return e == cudaSuccess ? RK_OK : rk_cuda_fail(err, "lane sync", "lane copies", e);
}
