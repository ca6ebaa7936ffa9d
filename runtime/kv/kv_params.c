/* KV policy names and parameters of the public API (rk.h): the default policy, the --kv
 * spec parser (f16, f32, q8, q4, lowram[:opts]; LowRAM's options: lowram.c). */
#include <stdio.h>
#include <string.h>

#include "kv_impl.h"

static const char *const kv_names[] = {"f16", "f32", "q8", "lowram", "q4"};

const char *rk_kv_kind_name(rk_kv_kind k) { return (unsigned)k <= RK_KV_KIND_LAST ? kv_names[k] : "unknown"; }

rk_kv_params rk_kv_params_default(void) {
    rk_kv_params p = {RK_KV_F16, rk_lowram_params_default(), 0, NULL, 0, 0, false, false, 0};
    return p;
}

rk_status rk_kv_params_parse(const char *spec, rk_kv_params *out, rk_err *err) {
    rk_kv_params p = rk_kv_params_default();
    if (!spec) spec = "";
    size_t n = strcspn(spec, ":");
    int k = -1;
    for (int i = 0; i <= RK_KV_KIND_LAST; i++)
        if (strlen(kv_names[i]) == n && !strncmp(spec, kv_names[i], n)) k = i;
    if (k < 0 || (spec[n] == ':' && k != RK_KV_LOWRAM))
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: '%.64s' is not a KV policy (f16, f32, q8, q4, lowram[:opts])",
                          spec);
    p.kind = (rk_kv_kind)k;
    if (spec[n] == ':') {
        rk_status st = rk_lowram_parse(spec + n + 1, &p.lowram, err);
        if (st) return st;
    }
    *out = p;
    return RK_OK;
}

void rk_kv_params_format(const rk_kv_params *p, char *buf, size_t cap) {
    if (!cap) return;
    snprintf(buf, cap, "%s", rk_kv_kind_name(p->kind));
}
