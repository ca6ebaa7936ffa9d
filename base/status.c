#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "rk_base.h"

static const char *const status_names[RK_STATUS_COUNT] = {
    [RK_OK] = "RK_OK",
    [RK_E_INVALID_ARG] = "RK_E_INVALID_ARG",
    [RK_E_NOMEM] = "RK_E_NOMEM",
    [RK_E_IO] = "RK_E_IO",
    [RK_E_NOT_FOUND] = "RK_E_NOT_FOUND",
    [RK_E_UNSUPPORTED] = "RK_E_UNSUPPORTED",
    [RK_E_CONTEXT] = "RK_E_CONTEXT",
    [RK_E_CHECKSUM] = "RK_E_CHECKSUM",
    [RK_E_MISMATCH] = "RK_E_MISMATCH",
    [RK_E_GGUF_MAGIC] = "RK_E_GGUF_MAGIC",
    [RK_E_GGUF_VERSION] = "RK_E_GGUF_VERSION",
    [RK_E_GGUF_TRUNCATED] = "RK_E_GGUF_TRUNCATED",
    [RK_E_GGUF_COUNT] = "RK_E_GGUF_COUNT",
    [RK_E_GGUF_DUPLICATE] = "RK_E_GGUF_DUPLICATE",
    [RK_E_GGUF_TYPE] = "RK_E_GGUF_TYPE",
    [RK_E_GGUF_ALIGN] = "RK_E_GGUF_ALIGN",
    [RK_E_GGUF_OVERLAP] = "RK_E_GGUF_OVERLAP",
    [RK_E_GGUF_BOUNDS] = "RK_E_GGUF_BOUNDS",
    [RK_E_GGUF_DIM] = "RK_E_GGUF_DIM",
    [RK_E_GGUF_BLOCK] = "RK_E_GGUF_BLOCK",
    [RK_E_INTERNAL] = "RK_E_INTERNAL",
    [RK_E_CANCELLED] = "RK_E_CANCELLED",
    [RK_E_FORMAT] = "RK_E_FORMAT",
};

rk_status rk_err_set(rk_err *err, rk_status code, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->code = code;
    }
    return code;
}

rk_status rk_err_wrap(rk_err *err, const char *fmt, ...) {
    if (!err) return RK_E_INTERNAL;
    char out[sizeof err->msg];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, sizeof out, fmt, ap);
    va_end(ap);
    size_t used = n < 0 ? 0 : (size_t)n < sizeof out ? (size_t)n : sizeof out - 1;
    /* append ": <old message>" by hand: the result is cut at the buffer's end */
    const char *parts[2] = {": ", err->msg};
    for (int k = 0; k < 2; k++)
        for (const char *p = parts[k]; *p && used + 1 < sizeof out; p++) out[used++] = *p;
    out[used] = '\0';
    memcpy(err->msg, out, used + 1);
    return err->code;
}

void rk_err_clear(rk_err *err) {
    if (err) {
        err->code = RK_OK;
        err->msg[0] = '\0';
    }
}

const char *rk_status_name(rk_status s) {
    if ((unsigned)s < RK_STATUS_COUNT && status_names[s]) return status_names[s];
    return "RK_E_UNKNOWN";
}
