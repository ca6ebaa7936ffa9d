/* Backends by name. Compiled into rk_kernels_any, a library of its own, so
 * that only code which asks for "any" backend links the CUDA one (when the
 * build has it: meson defines RK_HAVE_CUDA for this file) and the base
 * kernels library never depends on CUDA. No registry, no weak symbols: the
 * choice is made at link time by which library a target uses. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "rk_kernels.h"

#define RK_BACKEND_NAMES "cpu, cpu_ref, cpu_portable, cuda, cuda:N"

bool rk_backend_cuda_built(void) {
#if defined(RK_HAVE_CUDA)
    return true;
#else
    return false;
#endif
}

/* "cuda" -> 0, "cuda:N" -> N; -1 for anything else that starts with "cuda". */
static int cuda_device_of(const char *name) {
    if (!name[4]) return 0;
    if (name[4] != ':' || name[5] < '0' || name[5] > '9') return -1;
    char *end = NULL;
    errno = 0;
    long d = strtol(name + 5, &end, 10);
    return errno || *end || d > 1023 ? -1 : (int)d;
}

rk_status rk_backend_create_named(const char *name, int n_threads, rk_backend **out, rk_err *err) {
    if (!out) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: create_named: NULL out");
    if (!name) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: NULL backend name (" RK_BACKEND_NAMES ")");
    if (!strcmp(name, "cpu")) return rk_backend_cpu_create(n_threads, out, err);
    if (!strcmp(name, "cpu_ref")) return rk_backend_cpu_ref_create(out, err);
    if (!strcmp(name, "cpu_portable")) return rk_backend_cpu_portable_create(n_threads, out, err);
    if (!strncmp(name, "cuda", 4)) {
        int dev = cuda_device_of(name);
        if (dev < 0)
            return rk_err_set(err, RK_E_INVALID_ARG, "kernels: backend \"%s\": device (cuda or cuda:N, N 0..1023)",
                              name);
#if defined(RK_HAVE_CUDA)
        return rk_backend_cuda_create(dev, out, err);
#else
        return rk_err_set(err, RK_E_UNSUPPORTED, "cuda: not built (configure with nvcc and cuBLAS)");
#endif
    }
    return rk_err_set(err, RK_E_INVALID_ARG, "kernels: unknown backend \"%s\" (" RK_BACKEND_NAMES ")", name);
}
