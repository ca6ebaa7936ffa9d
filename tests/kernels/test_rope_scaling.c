/* RoPE scaling (linear, YaRN) against an independent Python computation of the published
 * formulas (the YaRN paper as Hugging Face's _compute_yarn_parameters writes it: inverse
 * frequencies blended by a linear ramp over the correction range, attention factor
 * 0.1 ln(s) + 1 on cos and sin), run by the test: the per-pair angles, mscale, the
 * correction range, and rotated vectors at positions past the original context on every
 * CPU backend (and CUDA when a device answers). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_kernels.h"

/* argv: base n_rot factor orig beta_fast beta_slow kind(0 linear, 1 yarn) then positions.
 * Prints "lo hi", "mscale", n_rot/2 inverse frequencies, then per position the rotation of
 * x_j = sin(0.37 j + 0.1) (head_dim = n_rot, neox pairing (i, i + n_rot/2)). */
static const char *ref_py =
    "import math,sys\n"
    "base,dim,factor,orig,bf,bs=float(sys.argv[1]),int(sys.argv[2]),float(sys.argv[3]),int(sys.argv[4]),float(sys.argv[5]),float(sys.argv[6])\n"
    "yarn=sys.argv[7]=='1'; pos=[int(p) for p in sys.argv[8:]]\n"
    "def cdim(rot): return (dim*math.log(orig/(rot*2*math.pi)))/(2*math.log(base))\n"
    "lo=max(math.floor(cdim(bf)),0); hi=min(math.ceil(cdim(bs)),dim-1)\n"
    "if lo==hi: hi+=0.001\n"
    "pf=[base**(2*i/dim) for i in range(dim//2)]\n"
    "if yarn:\n"
    "  ext=[1-min(1,max(0,(i-lo)/(hi-lo))) for i in range(dim//2)]\n"
    "  inv=[(1/(factor*p))*(1-e)+(1/p)*e for p,e in zip(pf,ext)]\n"
    "  ms=0.1*math.log(factor)+1\n"
    "else:\n"
    "  inv=[1/(factor*p) for p in pf]; ms=1.0\n"
    "print(lo,hi); print(repr(ms))\n"
    "for v in inv: print(repr(v))\n"
    "x=[math.sin(0.37*j+0.1) for j in range(dim)]; h=dim//2\n"
    "for p in pos:\n"
    "  y=list(x)\n"
    "  for i in range(h):\n"
    "    c=math.cos(p*inv[i])*ms; s=math.sin(p*inv[i])*ms\n"
    "    y[i]=x[i]*c-x[i+h]*s; y[i+h]=x[i]*s+x[i+h]*c\n"
    "  print(' '.join(repr(v) for v in y))\n";

typedef struct ref_out {
    double lo, hi, mscale;
    double *inv; /* (n_rot/2) */
    double *rot; /* (n_pos, n_rot) */
} ref_out;

static void run_ref(const rk_rope_params *p, double factor, bool yarn, const int64_t *pos, int n_pos, ref_out *o) {
    char cmd[8192];
    int w =
        snprintf(cmd, sizeof cmd, "python3 -c \"$RK_ROPE_PY\" %.17g %d %.17g %d %.17g %.17g %d", (double)p->freq_base,
                 p->n_rot, factor, p->n_ctx_orig, (double)p->beta_fast, (double)p->beta_slow, yarn ? 1 : 0);
    for (int i = 0; i < n_pos; i++) w += snprintf(cmd + w, sizeof cmd - (size_t)w, " %lld", (long long)pos[i]);
    setenv("RK_ROPE_PY", ref_py, 1);
    FILE *f = popen(cmd, "r");
    cr_assert(f, "cannot run python3");
    const int half = p->n_rot / 2;
    o->inv = calloc((size_t)half, sizeof(double));
    o->rot = calloc((size_t)n_pos * p->n_rot, sizeof(double));
    int ok = fscanf(f, "%lf %lf %lf", &o->lo, &o->hi, &o->mscale) == 3;
    for (int i = 0; ok && i < half; i++) ok = fscanf(f, "%lf", &o->inv[i]) == 1;
    for (int i = 0; ok && i < n_pos * p->n_rot; i++) ok = fscanf(f, "%lf", &o->rot[i]) == 1;
    int rc = pclose(f);
    cr_assert(ok && rc == 0, "the Python reference failed (rc %d): is python3 installed?", rc);
}

static void check_case(rk_rope_params p, double factor, bool yarn) {
    const int64_t pos[] = {0, 1, 4095, 32767, 65536, 131071};
    const int n_pos = 6, half = p.n_rot / 2;
    ref_out r;
    run_ref(&p, factor, yarn, pos, n_pos, &r);
    /* frequencies and mscale: the same closed forms in double, only rounding apart */
    double freq[512];
    rk_rope_freqs(&p, freq);
    for (int i = 0; i < half; i++)
        cr_expect(fabs(freq[i] - r.inv[i]) <= 1e-13 * r.inv[i], "pair %d: freq %.17g, reference %.17g", i, freq[i],
                  r.inv[i]);
    cr_expect(fabs(rk_rope_mscale(&p) - r.mscale) <= 1e-14, "mscale %.17g, reference %.17g", rk_rope_mscale(&p),
              r.mscale);
    if (yarn) {
        double dims[2];
        rk_rope_yarn_corr_dims(&p, dims);
        cr_expect(dims[0] == r.lo && (dims[1] == r.hi || fabs(dims[1] + 0.001 - r.hi) < 1e-9),
                  "correction range [%g, %g], reference [%g, %g]", dims[0], dims[1], r.lo, r.hi);
    }
    /* rotated vectors: one head of n_rot dims at each position. The kernels round cos/sin
     * and the two products to float32 (angles in double): |error| <= ~4 * 2^-24 * mscale
     * per element of |x| <= 1; the bound allows 2^-20. */
    const char *names[] = {"cpu_ref", "cpu", "cuda"};
    for (int b = 0; b < 3; b++) {
        rk_backend *be = NULL;
        rk_err e = {0};
        rk_status st = rk_backend_create_named(names[b], 2, &be, &e);
        if (st && b == 2) {
            cr_log_info("cuda not checked: %s", e.msg);
            continue;
        }
        cr_assert_eq(st, RK_OK, "%s: %s", names[b], e.msg);
        for (int k = 0; k < n_pos; k++) {
            float x[512];
            for (int j = 0; j < p.n_rot; j++) x[j] = (float)sin(0.37 * j + 0.1);
            rk_op_args a = {.op = RK_OP_ROPE};
            a.src0 = (rk_view){.type = RK_DT_F32, .ne = {p.n_rot, 1, 1, 1}, .nb1 = (size_t)p.n_rot * 4, .data = x};
            a.rope = p;
            a.rope.pos0 = pos[k];
            cr_assert_eq(rk_backend_run(be, &a, &e), RK_OK, "%s: %s", names[b], e.msg);
            double worst = 0;
            int at = 0;
            for (int j = 0; j < p.n_rot; j++) {
                double d = fabs(x[j] - r.rot[k * p.n_rot + j]);
                if (d > worst) worst = d, at = j;
            }
            cr_expect(worst <= 0x1p-20 * r.mscale, "%s %s factor %g pos %lld: dim %d off by %.3g", names[b],
                      yarn ? "yarn" : "linear", factor, (long long)pos[k], at, worst);
        }
        rk_backend_destroy(be);
    }
    free(r.inv);
    free(r.rot);
}

static rk_rope_params yarn_params(float base, int n_rot, float factor, int orig) {
    rk_rope_params p = {.mode = RK_ROPE_NEOX,
                        .n_rot = n_rot,
                        .freq_base = base,
                        .freq_scale = 1.0f / factor,
                        .ext_factor = 1.0f,
                        .attn_factor = 1.0f,
                        .beta_fast = 32.0f,
                        .beta_slow = 1.0f,
                        .n_ctx_orig = orig};
    return p;
}

/* Qwen2.5 with YaRN factor 4 (its README's 128K setting): base 1e6, head 128, 32K trained. */
Test(rope_scaling, yarn_qwen25_factor4_matches_python) { check_case(yarn_params(1e6f, 128, 4.0f, 32768), 4.0, true); }

/* a llama-like head (base 1e4, 64 dims, 8K) at factor 8: a wide correction range */
Test(rope_scaling, yarn_llama_factor8_matches_python) { check_case(yarn_params(1e4f, 64, 8.0f, 8192), 8.0, true); }

Test(rope_scaling, linear_factor4_matches_python) {
    rk_rope_params p = {.mode = RK_ROPE_NEOX,
                        .n_rot = 128,
                        .freq_base = 1e6f,
                        .freq_scale = 0.25f,
                        .n_ctx_orig = 32768,
                        .beta_fast = 32.0f,
                        .beta_slow = 1.0f};
    check_case(p, 4.0, false);
}

/* YaRN's temperature: q.k logits of two rotated vectors at the same position grow by mscale^2
 * = (1 + 0.1 ln 4)^2 = 1.29641... for factor 4 (the rotation itself preserves the dot). */
Test(rope_scaling, yarn_scales_dot_products_by_mscale_squared) {
    rk_rope_params p = yarn_params(1e6f, 128, 4.0f, 32768);
    p.pos0 = 77777;
    const double ms = 1.0 + 0.1 * log(4.0);
    cr_expect(fabs(rk_rope_mscale(&p) - ms) < 1e-15);
    rk_backend *be = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_backend_create_named("cpu_ref", 1, &be, &e), RK_OK, "%s", e.msg);
    float q[128], k[128];
    double dot0 = 0, dot1 = 0;
    for (int j = 0; j < 128; j++)
        q[j] = (float)cos(0.11 * j), k[j] = (float)sin(0.23 * j + 1), dot0 += (double)q[j] * k[j];
    rk_op_args a = {.op = RK_OP_ROPE, .rope = p};
    a.src0 = (rk_view){.type = RK_DT_F32, .ne = {128, 1, 1, 1}, .nb1 = 512, .data = q};
    cr_assert_eq(rk_backend_run(be, &a, &e), RK_OK, "%s", e.msg);
    a.src0.data = k;
    cr_assert_eq(rk_backend_run(be, &a, &e), RK_OK, "%s", e.msg);
    for (int j = 0; j < 128; j++) dot1 += (double)q[j] * k[j];
    cr_expect(fabs(dot1 / dot0 - ms * ms) < 1e-5, "dot ratio %.9g, mscale^2 %.9g", dot1 / dot0, ms * ms);
    rk_backend_destroy(be);
}

/* Zero-initialised scaling fields are plain RoPE: freq_base^(-2i/n_rot), mscale 1. */
Test(rope_scaling, zero_fields_are_plain_rope) {
    rk_rope_params p = {.mode = RK_ROPE_NORM, .n_rot = 64, .freq_base = 10000.0f};
    double f[32];
    rk_rope_freqs(&p, f);
    for (int i = 0; i < 32; i++) cr_expect(fabs(f[i] - pow(10000.0, -2.0 * i / 64)) <= 1e-15 * f[0]);
    cr_expect_eq(rk_rope_mscale(&p), 1.0);
}
