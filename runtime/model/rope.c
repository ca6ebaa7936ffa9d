/* RoPE scaling: read from the GGUF (<arch>.rope.scaling.* keys, as llama.cpp writes them),
 * changed by rk_model_set_rope (the CLI's llama.cpp-named flags), and turned into the
 * kernels' rk_rope_params for the forward pass and the KV caches. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "model_impl.h"

const char *rk_rope_scaling_name(int32_t type) {
    switch (type) {
    case RK_ROPE_SCALING_LINEAR: return "linear";
    case RK_ROPE_SCALING_YARN: return "yarn";
    default: return "none";
    }
}

bool rk_rope_scaling_parse(const char *s, int32_t *type) {
    if (!s) return false;
    if (!strcmp(s, "none")) *type = RK_ROPE_SCALING_NONE;
    else if (!strcmp(s, "linear")) *type = RK_ROPE_SCALING_LINEAR;
    else if (!strcmp(s, "yarn")) *type = RK_ROPE_SCALING_YARN;
    else return false;
    return true;
}

rk_rope_override rk_rope_override_default(void) {
    rk_rope_override o = {.type = -1, .ext_factor = -1.0f};
    return o;
}

static rk_status opt_f32(const rk_gguf *g, const char *arch, const char *suffix, float *out, bool *found, rk_err *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    float v;
    rk_status st = rk_gguf_get_f32(g, key, &v, err);
    if (st == RK_E_NOT_FOUND) {
        if (found) *found = false;
        return RK_OK;
    }
    if (st) return st;
    if (!isfinite(v)) return rk_err_set(err, RK_E_MISMATCH, "model: key '%s' is not a finite number", key);
    if (found) *found = true;
    *out = v;
    return RK_OK;
}

/* Checks a scaling in effect; names the field and the flag that sets it. */
static rk_status check(const rk_rope_scaling *r, float freq_base, rk_err *err) {
    if ((unsigned)r->type > RK_ROPE_SCALING_YARN)
        return rk_err_set(err, RK_E_INVALID_ARG, "rope: scaling type %d unknown (none, linear or yarn)", (int)r->type);
    if (!(freq_base > 0.0f) || !isfinite(freq_base))
        return rk_err_set(err, RK_E_INVALID_ARG, "rope: freq base %g must be positive (--rope-freq-base)",
                          (double)freq_base);
    if (r->type != RK_ROPE_SCALING_NONE && !(r->factor >= 1.0f && r->factor <= 1024.0f))
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "rope: %s scaling needs a factor in [1, 1024] (--rope-scale N; got %g)",
                          rk_rope_scaling_name(r->type), (double)r->factor);
    if (r->orig_ctx <= 0 || r->orig_ctx > (1 << 24))
        return rk_err_set(err, RK_E_INVALID_ARG, "rope: original context %d out of range (--yarn-orig-ctx)",
                          (int)r->orig_ctx);
    if (!(r->ext_factor >= 0.0f && r->ext_factor <= 1.0f))
        return rk_err_set(err, RK_E_INVALID_ARG, "rope: YaRN ext factor %g not in [0, 1] (--yarn-ext-factor)",
                          (double)r->ext_factor);
    if (!(r->attn_factor > 0.0f && r->attn_factor <= 100.0f))
        return rk_err_set(err, RK_E_INVALID_ARG, "rope: YaRN attn factor %g not in (0, 100] (--yarn-attn-factor)",
                          (double)r->attn_factor);
    if (!(r->beta_fast > 0.0f) || !(r->beta_slow > 0.0f) || !(r->beta_fast > r->beta_slow))
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "rope: YaRN betas fast %g / slow %g must be positive with fast > slow "
                          "(--yarn-beta-fast, --yarn-beta-slow)",
                          (double)r->beta_fast, (double)r->beta_slow);
    return RK_OK;
}

rk_status rk_model_read_rope_scaling(rk_model *m, rk_err *err) {
    rk_hparams *hp = &m->hp;
    const char *a = hp->arch_name;
    rk_rope_scaling r = {RK_ROPE_SCALING_NONE, 1.0f, hp->n_ctx_train, 0.0f, 1.0f, 32.0f, 1.0f};
    char key[128];
    snprintf(key, sizeof key, "%s.rope.scaling.type", a);
    rk_str ts;
    rk_status st = rk_gguf_get_str(m->gguf, key, &ts, err);
    bool has_type = st == RK_OK;
    if (st && st != RK_E_NOT_FOUND) return st;
    if (has_type) {
        char t[32];
        snprintf(t, sizeof t, "%.*s", (int)(ts.len < 31 ? ts.len : 31), ts.ptr);
        if (!rk_rope_scaling_parse(t, &r.type))
            return rk_err_set(err, RK_E_UNSUPPORTED, "model: %s = '%s' is not supported (none, linear or yarn)", key,
                              t);
    }
    bool has_factor = false, has_linear = false;
    float linear = 0;
    if ((st = opt_f32(m->gguf, a, "rope.scaling.factor", &r.factor, &has_factor, err)) ||
        (st = opt_f32(m->gguf, a, "rope.scale_linear", &linear, &has_linear, err)))
        return st;
    if (!has_type && has_linear && linear > 1.0f) { /* the older single key */
        r.type = RK_ROPE_SCALING_LINEAR;
        r.factor = linear;
    }
    if (r.type == RK_ROPE_SCALING_NONE) r.factor = 1.0f;
    uint32_t orig;
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", a);
    if ((st = rk_gguf_get_u32(m->gguf, key, &orig, err)) == RK_OK) {
        if (orig == 0 || orig > (1u << 24))
            return rk_err_set(err, RK_E_MISMATCH, "model: %s = %u is out of range", key, orig);
        r.orig_ctx = (int32_t)orig;
    } else if (st != RK_E_NOT_FOUND) {
        return st;
    }
    r.ext_factor = r.type == RK_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    if ((st = opt_f32(m->gguf, a, "rope.scaling.yarn_ext_factor", &r.ext_factor, NULL, err)) ||
        (st = opt_f32(m->gguf, a, "rope.scaling.attn_factor", &r.attn_factor, NULL, err)) ||
        (st = opt_f32(m->gguf, a, "rope.scaling.yarn_attn_factor", &r.attn_factor, NULL, err)) ||
        (st = opt_f32(m->gguf, a, "rope.scaling.yarn_beta_fast", &r.beta_fast, NULL, err)) ||
        (st = opt_f32(m->gguf, a, "rope.scaling.yarn_beta_slow", &r.beta_slow, NULL, err)))
        return st;
    if (r.type != RK_ROPE_SCALING_YARN) r.ext_factor = 0.0f;
    if (check(&r, hp->rope_base, err)) {
        if (err) err->code = RK_E_MISMATCH;
        rk_err_wrap(err, "model: the GGUF's rope.scaling keys");
        return RK_E_MISMATCH;
    }
    hp->rope_scaling = r;
    return RK_OK;
}

rk_status rk_model_set_rope(rk_model *m, const rk_rope_override *o, rk_err *err) {
    if (!m || !o) return rk_err_set(err, RK_E_INVALID_ARG, "rope: NULL model or override");
    rk_hparams *hp = &m->hp;
    rk_rope_scaling r = hp->rope_scaling;
    float base = o->freq_base != 0.0f ? o->freq_base : hp->rope_base;
    const int32_t before = r.type;
    if (o->type >= 0) r.type = o->type;
    else if (o->factor != 0.0f && r.type == RK_ROPE_SCALING_NONE) r.type = RK_ROPE_SCALING_LINEAR;
    if (o->factor != 0.0f) r.factor = o->factor;
    if (r.type == RK_ROPE_SCALING_NONE) r.factor = 1.0f;
    else if (before == RK_ROPE_SCALING_NONE && o->factor == 0.0f)
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "rope: %s scaling needs a factor: the model has no rope.scaling.factor (--rope-scale N, "
                          "e.g. 4 for 4x its %d-token context)",
                          rk_rope_scaling_name(r.type), (int)r.orig_ctx);
    if (o->orig_ctx != 0) r.orig_ctx = o->orig_ctx;
    if (o->ext_factor >= 0.0f) r.ext_factor = o->ext_factor;
    else if (o->type >= 0 || before != r.type) r.ext_factor = r.type == RK_ROPE_SCALING_YARN ? 1.0f : 0.0f;
    if (r.type != RK_ROPE_SCALING_YARN) r.ext_factor = 0.0f;
    if (o->attn_factor != 0.0f) r.attn_factor = o->attn_factor;
    if (o->beta_fast != 0.0f) r.beta_fast = o->beta_fast;
    if (o->beta_slow != 0.0f) r.beta_slow = o->beta_slow;
    rk_status st = check(&r, base, err);
    if (st) return st;
    hp->rope_scaling = r;
    hp->rope_base = base;
    return RK_OK;
}

int64_t rk_model_n_ctx_max(const rk_model *m) {
    const rk_hparams *hp = &m->hp;
    const rk_rope_scaling *r = &hp->rope_scaling;
    int64_t n = hp->n_ctx_train;
    if (r->type != RK_ROPE_SCALING_NONE) {
        int64_t scaled = (int64_t)floor((double)r->orig_ctx * r->factor);
        if (scaled > n) n = scaled;
    }
    return n;
}

void rk_model_rope_params(const rk_model *m, int64_t pos0, rk_rope_params *out) {
    const rk_hparams *hp = &m->hp;
    const rk_rope_scaling *r = &hp->rope_scaling;
    memset(out, 0, sizeof *out);
    out->mode = hp->rope_mode;
    out->n_rot = hp->n_rot;
    out->freq_base = hp->rope_base;
    out->pos0 = pos0;
    out->freq_scale = r->type != RK_ROPE_SCALING_NONE ? 1.0f / r->factor : 1.0f;
    out->ext_factor = r->type == RK_ROPE_SCALING_YARN ? r->ext_factor : 0.0f;
    out->attn_factor = r->attn_factor;
    out->beta_fast = r->beta_fast;
    out->beta_slow = r->beta_slow;
    out->n_ctx_orig = r->orig_ctx;
}
