/* Persistent worker pool. One dispatch = bump a generation counter; workers
 * spin on it for a short while (decode issues hundreds of small ops per token,
 * so the common wake-up is a cache-line transfer, not a syscall) and then
 * sleep on a condition variable. The caller runs index 0 itself and waits on a
 * pending counter the same way. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "rk_kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define RK_CPU_RELAX() _mm_pause()
#else
#define RK_CPU_RELAX() ((void)0)
#endif

/* How long a thread spins before it sleeps. Long enough to cover the gap
 * between two ops of a decode step, short enough not to burn a core between
 * requests. */
#define RK_POOL_SPIN_S 200e-6

typedef struct rk_pool_worker {
    rk_pool *pool;
    int idx;
} rk_pool_worker;

struct rk_pool {
    /* written by the caller per dispatch, read by workers after they see gen */
    void (*fn)(void *ctx, int i, int n);
    void *ctx;
    int n;
    int n_started;
    bool mu_ok, run_lock_ok, cv_work_ok, cv_done_ok;
    pthread_t *threads;
    rk_pool_worker *workers;
    pthread_mutex_t run_lock; /* one dispatch at a time */
    pthread_mutex_t mu;       /* guards sleeping only */
    pthread_cond_t cv_work, cv_done;
    alignas(64) atomic_uint gen;
    atomic_int sleepers;
    atomic_bool stop;
    alignas(64) atomic_int pending;
    atomic_int done_waiter;
};

/* Spins until *v != old (or, for the pending counter, == 0) or the budget
 * runs out; checks the clock only every 256 pauses. */
static bool spin_gen(const atomic_uint *v, unsigned old, unsigned *seen) {
    double t0 = 0;
    for (unsigned it = 0;; it++) {
        unsigned g = atomic_load_explicit(v, memory_order_acquire);
        if (g != old) {
            *seen = g;
            return true;
        }
        RK_CPU_RELAX();
        if ((it & 255u) == 255u) {
            sched_yield(); /* lets a descheduled peer run when threads outnumber cores */
            double t = rk_time_now();
            if (it == 255u) t0 = t;
            else if (t - t0 > RK_POOL_SPIN_S) return false;
        }
    }
}

static bool spin_zero(const atomic_int *v) {
    double t0 = 0;
    for (unsigned it = 0;; it++) {
        if (atomic_load_explicit(v, memory_order_acquire) == 0) return true;
        RK_CPU_RELAX();
        if ((it & 255u) == 255u) {
            sched_yield(); /* lets a descheduled peer run when threads outnumber cores */
            double t = rk_time_now();
            if (it == 255u) t0 = t;
            else if (t - t0 > RK_POOL_SPIN_S) return false;
        }
    }
}

static void *worker_main(void *arg) {
    rk_pool_worker *w = arg;
    rk_pool *p = w->pool;
    unsigned seen = 0; /* gen is 0 when the threads start */
    for (;;) {
        unsigned g;
        if (!spin_gen(&p->gen, seen, &g)) {
            /* sleepers++ before re-reading gen pairs with the caller's gen++
             * before reading sleepers (both seq_cst): one of the two sees the other. */
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while ((g = atomic_load(&p->gen)) == seen) pthread_cond_wait(&p->cv_work, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
        }
        seen = g;
        if (atomic_load(&p->stop)) break;
        p->fn(p->ctx, w->idx, p->n);
        if (atomic_fetch_sub(&p->pending, 1) == 1 && atomic_load(&p->done_waiter)) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_broadcast(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

void rk_pool_destroy(rk_pool *p) {
    if (!p) return;
    if (p->n_started > 0) {
        atomic_store(&p->stop, true);
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->gen, 1);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
        for (int i = 0; i < p->n_started; i++) pthread_join(p->threads[i], NULL);
    }
    if (p->cv_done_ok) pthread_cond_destroy(&p->cv_done);
    if (p->cv_work_ok) pthread_cond_destroy(&p->cv_work);
    if (p->mu_ok) pthread_mutex_destroy(&p->mu);
    if (p->run_lock_ok) pthread_mutex_destroy(&p->run_lock);
    free(p->threads);
    free(p->workers);
    free(p);
}

rk_status rk_pool_create(int n_threads, rk_pool **out, rk_err *err) {
    if (!out || n_threads < 1 || n_threads > 1024)
        return rk_err_set(err, RK_E_INVALID_ARG, "kernels: pool size %d (expected 1..1024)", n_threads);
    rk_status st = RK_OK;
    size_t sz = (sizeof(rk_pool) + 63) & ~(size_t)63;
    rk_pool *p = aligned_alloc(64, sz);
    if (!p) return rk_err_set(err, RK_E_NOMEM, "kernels: pool allocation");
    memset(p, 0, sizeof *p);
    atomic_init(&p->gen, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->pending, 0);
    atomic_init(&p->done_waiter, 0);
    p->n = n_threads;
    int rc = 0;
    if ((rc = pthread_mutex_init(&p->run_lock, NULL)) != 0) goto fail;
    p->run_lock_ok = true;
    if ((rc = pthread_mutex_init(&p->mu, NULL)) != 0) goto fail;
    p->mu_ok = true;
    if ((rc = pthread_cond_init(&p->cv_work, NULL)) != 0) goto fail;
    p->cv_work_ok = true;
    if ((rc = pthread_cond_init(&p->cv_done, NULL)) != 0) goto fail;
    p->cv_done_ok = true;
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) {
            rc = ENOMEM;
            goto fail;
        }
        for (int i = 1; i < n_threads; i++) {
            p->workers[i - 1] = (rk_pool_worker){p, i};
            if ((rc = pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i - 1])) != 0) goto fail;
            p->n_started++;
        }
    }
    *out = p;
    return RK_OK;
fail:
    st = rk_err_set(err, rc == ENOMEM || rc == EAGAIN ? RK_E_NOMEM : RK_E_INTERNAL,
                    "kernels: pool of %d threads: %s (thread %d)", n_threads, strerror(rc), p->n_started + 1);
    rk_pool_destroy(p);
    return st;
}

int rk_pool_size(const rk_pool *p) { return p ? p->n : 0; }

void rk_pool_run(rk_pool *p, void (*fn)(void *ctx, int i, int n), void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->run_lock);
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    atomic_fetch_add(&p->gen, 1); /* publishes fn, ctx, pending */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv_work);
        pthread_mutex_unlock(&p->mu);
    }
    fn(ctx, 0, p->n);
    if (!spin_zero(&p->pending)) {
        pthread_mutex_lock(&p->mu);
        atomic_store(&p->done_waiter, 1);
        while (atomic_load(&p->pending) != 0) pthread_cond_wait(&p->cv_done, &p->mu);
        atomic_store(&p->done_waiter, 0);
        pthread_mutex_unlock(&p->mu);
    }
    pthread_mutex_unlock(&p->run_lock);
}
