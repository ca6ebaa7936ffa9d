/* devsim: a backend with memory of its own whose addresses the host cannot dereference
 * (tagged non-canonical pointers), running the cpu backend's kernels behind the tags; the
 * device-path tests (test_devsim.c, test_devsim_tiers.c) run sessions on it. */
#ifndef RK_TEST_DEVSIM_H
#define RK_TEST_DEVSIM_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rk.h"
#include "rk_kernels.h"
#include "tb.h"

#define TAG ((uintptr_t)1 << 62) /* bit 62 set, 63 clear: not a canonical x86-64 / AArch64 address */

typedef struct devsim {
    rk_backend be;
    rk_backend_ops ops;
    rk_backend *inner; /* cpu, 1 thread */
    int n_alloc;
    size_t n_down; /* bytes downloaded: the logits rows, KV reads */
    /* recorded steps (as CUDA graphs are): ops between step_begin and step_end are kept
     * and run by step_end; a transfer meanwhile breaks the recording */
    bool recording, broken;
    rk_op_args *rec;
    int n_rec, cap_rec;
    int n_steps, n_ran, fail_every; /* step_end calls; recordings run; every fail_every-th end fails */
    /* bytes of backend memory live now and at most (a size header sits before each block) */
    size_t live, peak;
    /* pinned host blocks and the copy lane (GPU KV tiers): lane copies are queued and run
     * at the next join or sync (lane_defer) or at once; queued copies count as in flight */
    bool lane_defer;
    struct ds_copy {
        void *dst;
        const void *src;
        size_t n;
        bool to_device;
    } * lane;
    int n_lane, cap_lane, n_host;
    size_t lane_up, lane_down, lane_d2d; /* host to device, device to host, device to device */
    int n_joins;
} devsim;

devsim *devsim_create(void);
/* stories260K from ../shared, or a generated llama without it */
const char *model_path(char *buf, size_t cap);
/* a session on backend be (n_ctx 128, 16-row batches, 1 thread) with the KV spec kv */
rk_session *session_on(const rk_model *m, rk_backend *be, const char *kv, rk_err *err, rk_status *st);
/* The same with rk_session_params.cuda_graphs (recorded decode steps) as given. */
rk_session *session_on_graphs(const rk_model *m, rk_backend *be, const char *kv, bool cuda_graphs, rk_err *err,
                              rk_status *st);
rk_model *load_tiny(tb_tiny_spec sp);
#endif
