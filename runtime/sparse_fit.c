/* Sparse attention's calibration: one exact pass over calibration text with the kernel's
 * counters on, then the smallest kept mass per (layer, head) whose mask covers the target
 * share of the exact attention, written as a GGUF file with the model's fingerprint. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plan_impl.h"
#include "rk_experimental.h"
#include "sparse_impl.h"

/* the ladder of kept masses tried, increasing; the last keeps every line with mass */
static const float taus[] = {0.5f, 0.7f, 0.8f, 0.9f, 0.95f, 0.97f, 0.98f, 0.99f, 0.995f, 0.999f, 1.0f};
enum { N_TAU = sizeof taus / sizeof taus[0] };
_Static_assert(N_TAU <= RK_SPARSE_MAX_TAU, "the kernel's ladder limit");

rk_status rk_sparse_calib_write(const rk_model *m, const float *mass, const rk_sparse_params *geometry, float target,
                                uint64_t calib_tokens, void **bytes, size_t *len, rk_err *err) {
    const rk_hparams *hp = &m->hp;
    rk_sparse_params g;
    rk_sparse_resolve(geometry, &g);
    rk_gguf_writer *w = NULL;
    const int64_t ne[2] = {hp->n_head, hp->n_layer};
    rk_status st;
    if ((st = rk_gguf_writer_create(32, &w, err)) ||
        (st = rk_gguf_writer_set_str(w, "general.type", "ridgekv.sparse_attn", err)) ||
        (st = rk_gguf_writer_set_str(w, "general.name", "ridgekv sparse attention calibration", err)) ||
        (st = rk_gguf_writer_set_u32(w, "sparse.block", (uint32_t)g.block, err)) ||
        (st = rk_gguf_writer_set_u32(w, "sparse.sinks", (uint32_t)g.n_sink, err)) ||
        (st = rk_gguf_writer_set_u32(w, "sparse.window", (uint32_t)g.window, err)) ||
        (st = rk_gguf_writer_set_u32(w, "sparse.est", (uint32_t)g.n_est, err)) ||
        (st = rk_gguf_writer_set_f32(w, "sparse.target", target, err)) ||
        (st = rk_gguf_writer_set_u64(w, "sparse.calib_tokens", calib_tokens, err)) ||
        (st = rk_fingerprint_write(w, "sparse.model", m, err)) ||
        (st = rk_gguf_writer_add_tensor(w, "sparse.mass", RK_DT_F32, 2, ne, mass,
                                        (uint64_t)hp->n_layer * (uint64_t)hp->n_head * sizeof(float), err)) ||
        (st = rk_gguf_writer_finish(w, bytes, len, err)))
        goto done;
done:
    rk_gguf_writer_destroy(w);
    return st;
}

rk_status rk_sparse_fit(const rk_model *m, const int32_t *tokens, size_t n, const rk_sparse_fit_params *p, void **bytes,
                        size_t *len, rk_sparse_fit_report *rep, rk_err *err) {
    const rk_hparams *hp = &m->hp;
    const int nl = hp->n_layer, nh = hp->n_head;
    const float target = p->target > 0.0f ? p->target : 0.95f;
    if (!(target <= 1.0f))
        return rk_err_set(err, RK_E_INVALID_ARG, "sparse fit: target %g outside (0, 1]", (double)target);
    int64_t seg = p->segment > 0 ? p->segment : m->hp.n_ctx_train;
    if (seg > (int64_t)n) seg = (int64_t)n;
    rk_sparse_acc acc = {.min_kv = p->min_kv > 0 ? p->min_kv : 2048};
    if (seg < acc.min_kv + 128)
        return rk_err_set(err, RK_E_INVALID_ARG, "sparse fit: %lld tokens per segment, at least %lld needed",
                          (long long)seg, (long long)acc.min_kv + 128);
    rk_session *s = NULL;
    float *mass = malloc((size_t)(nl * nh) * sizeof(float));
    double *cover = calloc((size_t)nl * nh * N_TAU, sizeof(double)), *rows = calloc((size_t)nl * nh, sizeof(double));
    float *logits = malloc((size_t)hp->n_vocab * sizeof(float));
    acc.layer = calloc((size_t)nl, sizeof *acc.layer);
    rk_status st = RK_OK;
    if (!mass || !cover || !rows || !logits || !acc.layer) {
        st = rk_err_set(err, RK_E_NOMEM, "sparse fit: out of memory");
        goto done;
    }
    for (int l = 0; l < nl; l++)
        acc.layer[l] = (rk_attn_sparse_cal){.n_tau = N_TAU,
                                            .tau = taus,
                                            .stride = 8,
                                            .cover = cover + (size_t)l * nh * N_TAU,
                                            .rows = rows + (size_t)l * nh};
    rk_session_params sp = rk_session_params_default();
    sp.n_ctx = (int32_t)seg;
    sp.n_threads = p->n_threads;
    if ((st = rk_session_create(m, &sp, &s, err))) goto done;
    rk_fill_params fp = {.mode = RK_FILL_OFF};
    fp.sparse = p->geometry;
    fp.sparse.on = true;
    fp.sparse.tail = -1;
    fp.sparse.calib = NULL;
    if ((st = rk_session_set_fill(s, &fp, err))) goto done;
    s->pf->sparse_acc = &acc;
    int64_t done_tokens = 0;
    for (int64_t off = 0; off + seg <= (int64_t)n; off += seg) {
        rk_session_reset(s);
        if ((st = rk_session_eval(s, tokens + off, (size_t)seg, logits, false, err))) break;
        done_tokens += seg;
    }
    s->pf->sparse_acc = NULL;
    if (st) goto done;
    double sum_mass = 0, sum_cover = 0, sum_rows = 0;
    for (int64_t i = 0; i < (int64_t)nl * nh; i++) {
        if (rows[i] <= 0) {
            st = rk_err_set(err, RK_E_INVALID_ARG, "sparse fit: no chunk reached %lld keys", (long long)acc.min_kv);
            goto done;
        }
        int t = 0;
        while (t < N_TAU - 1 && cover[i * N_TAU + t] / rows[i] < target) t++;
        mass[i] = taus[t];
        sum_mass += taus[t], sum_cover += cover[i * N_TAU + t] / rows[i], sum_rows += rows[i];
    }
    if ((st = rk_sparse_calib_write(m, mass, &p->geometry, target, (uint64_t)done_tokens, bytes, len, err))) goto done;
    if (rep)
        *rep = (rk_sparse_fit_report){.n_tokens = done_tokens,
                                      .rows = sum_rows / (nl * nh),
                                      .mean_mass = sum_mass / (nl * nh),
                                      .mean_cover = sum_cover / (nl * nh)};
done:
    rk_session_destroy(s);
    free(mass), free(cover), free(rows), free(logits), free(acc.layer);
    return st;
}
