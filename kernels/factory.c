/* Backends by name. Compiled into rk_kernels_any, a library of its own, so that
 * the base kernels library never depends on CUDA. The CUDA backend is a module
 * (libridgekv-cuda.so, kernels/meson.build) loaded with dlopen the first time a
 * "cuda" backend is asked for: a CPU run never maps the CUDA runtime or cuBLAS.
 * No registry, no weak symbols: one entry point looked up by name. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rk_kernels.h"

#define RK_BACKEND_NAMES "cpu, cpu_ref, cpu_portable, cuda, cuda:N"

bool rk_backend_cuda_built(void) {
#if defined(RK_HAVE_CUDA)
    return true;
#else
    return false;
#endif
}

#if defined(RK_HAVE_CUDA)
typedef rk_status (*cuda_create_fn)(int device, rk_backend **out, rk_err *err);
/* The module is process state by nature (dlopen): loaded once, under this lock, from the
 * file rk_backend_cuda_module named or from the default places. */
static pthread_mutex_t cuda_lock = PTHREAD_MUTEX_INITIALIZER;
static bool cuda_tried;
static cuda_create_fn cuda_create;
static char cuda_path[PATH_MAX]; /* named by rk_backend_cuda_module; "" : the default places */
static char cuda_why[1024];

/* dlopen one candidate; on failure keep the loader's reason for the error message. */
static bool cuda_try(const char *path, bool must_exist) {
    if (!path || !*path) return false;
    if (!must_exist && access(path, F_OK) != 0) return false;
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(cuda_why, sizeof cuda_why, "cuda: cannot load the CUDA backend module %s: %s", path,
                 e ? e : "unknown dlopen error");
        return true; /* found but unusable: report this one, look no further */
    }
    cuda_create = (cuda_create_fn)(uintptr_t)dlsym(h, "rk_backend_cuda_create");
    if (!cuda_create) {
        snprintf(cuda_why, sizeof cuda_why, "cuda: %s is not a ridgekv CUDA module (no rk_backend_cuda_create)", path);
        dlclose(h);
    }
    return true;
}

/* The named file, else beside the executable, the build tree, the install tree. Called
 * under cuda_lock, once. */
static void cuda_load(void) {
    cuda_tried = true;
    snprintf(cuda_why, sizeof cuda_why,
             "cuda: the CUDA backend module " RK_CUDA_MODULE_NAME
             " was not found (looked beside the executable, in " RK_CUDA_MODULE_BUILD " and " RK_CUDA_MODULE_INSTALL
             "; rk_backend_cuda_module names another file)");
    if (cuda_path[0]) {
        cuda_try(cuda_path, true);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        char beside[PATH_MAX + 64];
        if (slash) {
            *slash = '\0';
            snprintf(beside, sizeof beside, "%s/%s", exe, RK_CUDA_MODULE_NAME);
            if (cuda_try(beside, false)) return;
        }
    }
    if (cuda_try(RK_CUDA_MODULE_BUILD, false)) return;
    cuda_try(RK_CUDA_MODULE_INSTALL, false);
}
#endif

rk_status rk_backend_cuda_module(const char *path, rk_err *err) {
    if (!path || !*path) return rk_err_set(err, RK_E_INVALID_ARG, "kernels: cuda module: empty path");
    if (strlen(path) >= PATH_MAX)
        return rk_err_set(err, RK_E_INVALID_ARG, "kernels: cuda module path longer than %d bytes", PATH_MAX - 1);
#if defined(RK_HAVE_CUDA)
    rk_status st = RK_OK;
    pthread_mutex_lock(&cuda_lock);
    if (cuda_tried && strcmp(path, cuda_path))
        st = rk_err_set(err, RK_E_INVALID_ARG,
                        "kernels: the CUDA backend module was already looked up (%s); "
                        "name the file before the first cuda backend",
                        cuda_path[0] ? cuda_path : "default places");
    else snprintf(cuda_path, sizeof cuda_path, "%s", path);
    pthread_mutex_unlock(&cuda_lock);
    return st;
#else
    return RK_OK; /* nothing to load: a cuda backend gives "cuda: not built" */
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
        pthread_mutex_lock(&cuda_lock);
        if (!cuda_tried) cuda_load();
        cuda_create_fn create = cuda_create;
        if (!create) rk_err_set(err, RK_E_UNSUPPORTED, "%s", cuda_why);
        pthread_mutex_unlock(&cuda_lock);
        return create ? create(dev, out, err) : RK_E_UNSUPPORTED;
#else
        return rk_err_set(err, RK_E_UNSUPPORTED, "cuda: not built (configure with nvcc and cuBLAS)");
#endif
    }
    return rk_err_set(err, RK_E_INVALID_ARG, "kernels: unknown backend \"%s\" (" RK_BACKEND_NAMES ")", name);
}
