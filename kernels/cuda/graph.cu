/* Recorded steps: CUDA graphs for the decode step (rk_kernels.h rk_backend_step_begin).
 * step_begin puts the instance's stream in capture mode: every op after it records its
 * kernels and copies instead of running them. step_end ends the capture and, when the
 * capture holds, brings the executable graph of the last step up to date with
 * cudaGraphExecUpdate (a decode step only moves its positions and grid sizes: same
 * topology, new parameters), instantiating a new one only when the update is refused
 * (the topology changed: split-K attention starting, say), then launches it on the
 * stream. The ids an op takes from host memory go through a pinned arena: the recorded
 * copy reads its slot when the graph runs, right after the capture that filled it
 * (step_end launches before anything can overwrite the arena: the next step begins
 * after the logits download waited for this one). Anything that must not happen while
 * the stream records (a transfer from pageable memory, a sync, a prepare, scratch or
 * block allocation, a host operand) fails and marks the capture broken; step_end then
 * fails and nothing of the step ran: the session runs it again without recording. */
#include <stdio.h>
#include <string.h>

#include "cuda_impl.h"

enum { PINNED_BYTES = 64 * 1024 };

static rk_cuda *impl_of(rk_backend *be) { return (rk_cuda *)be->impl; }

rk_status rk_cuda_no_capture(rk_cuda *c, const char *on, rk_err *err) {
    if (!c->capturing) return RK_OK;
    if (!c->capture_bad) snprintf(c->capture_why, sizeof c->capture_why, "%s", on);
    c->capture_bad = true;
    return rk_err_set(err, RK_E_UNSUPPORTED, "cuda: %s while a step is recorded", on);
}

const void *rk_cuda_host_src(rk_cuda *c, const void *src, size_t bytes) {
    if (!c->capturing) return src;
    size_t at = rk_cuda_up256(c->pinned_used);
    if (!c->pinned || bytes > c->pinned_cap || at > c->pinned_cap - bytes) return NULL;
    memcpy(c->pinned + at, src, bytes);
    c->pinned_used = at + bytes;
    return c->pinned + at;
}

rk_status rk_cuda_step_begin(rk_backend *be, rk_err *err) {
    rk_cuda *c = impl_of(be);
    if (c->capturing) return rk_err_set(err, RK_E_INVALID_ARG, "cuda: step_begin inside a recorded step");
    cudaError_t e = cudaSetDevice(c->device);
    if (e == cudaSuccess && !c->pinned) {
        e = cudaHostAlloc((void **)&c->pinned, PINNED_BYTES, cudaHostAllocDefault);
        if (e == cudaSuccess) c->pinned_cap = PINNED_BYTES;
        else c->pinned = NULL;
    }
    if (e == cudaSuccess) e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
        cudaGetLastError();
        return rk_cuda_fail(err, "step_begin", "stream capture", e);
    }
    c->capturing = true;
    c->capture_bad = false;
    c->capture_why[0] = 0;
    c->pinned_used = 0;
    return RK_OK;
}

rk_status rk_cuda_step_end(rk_backend *be, bool run, rk_err *err) {
    rk_cuda *c = impl_of(be);
    if (!c->capturing) return rk_err_set(err, RK_E_INVALID_ARG, "cuda: step_end without step_begin");
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    c->capturing = false;
    const bool bad = c->capture_bad || e != cudaSuccess || !g;
    if (e != cudaSuccess) cudaGetLastError(); /* an invalidated capture leaves its error behind */
    if (bad || !run) {
        if (g) cudaGraphDestroy(g);
        if (!bad) return RK_OK;
        c->n_failed++;
        return rk_err_set(err, RK_E_UNSUPPORTED, "cuda: the recorded step broke (%s)",
                          c->capture_why[0] ? c->capture_why : cudaGetErrorString(e));
    }
    if (c->exec) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(c->exec, g, &info) == cudaSuccess) {
            c->n_update++;
        } else { /* another topology: a new executable graph */
            cudaGetLastError();
            cudaGraphExecDestroy(c->exec);
            c->exec = NULL;
        }
    }
    if (!c->exec) {
        e = cudaGraphInstantiate(&c->exec, g, 0);
        if (e != cudaSuccess) {
            cudaGetLastError();
            c->exec = NULL;
            cudaGraphDestroy(g);
            c->n_failed++;
            return rk_cuda_fail(err, "step_end", "cudaGraphInstantiate", e);
        }
        c->n_instantiate++;
    }
    cudaGraphDestroy(g); /* the executable graph keeps what it needs */
    e = cudaGraphLaunch(c->exec, c->stream);
    if (e != cudaSuccess) {
        c->n_failed++;
        return rk_cuda_fail(err, "step_end", "cudaGraphLaunch", e);
    }
    c->n_launch++;
    return RK_OK;
}

void rk_cuda_graph_release(rk_cuda *c) {
    if (c->capturing) { /* destroyed mid-step: end the capture, drop it */
        cudaGraph_t g = NULL;
        if (cudaStreamEndCapture(c->stream, &g) == cudaSuccess && g) cudaGraphDestroy(g);
        cudaGetLastError();
        c->capturing = false;
    }
    if (c->exec) cudaGraphExecDestroy(c->exec);
    if (c->pinned) cudaFreeHost(c->pinned);
    c->exec = NULL;
    c->pinned = NULL;
    c->pinned_cap = c->pinned_used = 0;
}
