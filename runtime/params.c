/* The library's version, the settings tables (every LowRAM and RidgeFill setting a caller
 * may set by key: name, bounds, meaning) and the defaults of those params. One table per
 * struct is the one list of knobs: rk_lowram_parse (--kv lowram:...) and --help read it. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "rk_experimental.h"

unsigned rk_version_number(void) { return RK_VERSION_NUMBER; }
const char *rk_version_string(void) { return RK_VERSION_STRING; }

/* ---- the table machinery -------------------------------------------------------------- */

typedef enum { S_F32, S_I32, S_U64, S_BOOL, S_DTYPE, S_PATH } slot_type;
enum {
    F_NEG = 1,       /* a flag that clears the field ("nomass" clears resid_mass) */
    F_ZERO_NONE = 2, /* an explicit 0 is stored as -1: the field's 0 means "the default" */
};

typedef struct {
    size_t off; /* of the field in its struct */
    slot_type type;
    int flags;
    size_t cap; /* S_PATH: bytes of the field */
} slot;

#define LOW(field) offsetof(rk_lowram_params, field)
#define FIL(field) offsetof(rk_fill_params, field)
#define KVP(field) offsetof(rk_kv_params, field)

/* choice word -> dtype */
static bool dtype_word(const char *w, uint32_t *t) {
    static const struct {
        const char *w;
        uint32_t t;
    } words[] = {{"f32", RK_DT_F32}, {"f16", RK_DT_F16}, {"int8", RK_DT_Q8_0}, {"int4", RK_DT_Q4_0}};
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        if (!strcmp(w, words[i].w)) return *t = words[i].t, true;
    return false;
}

/* w is one of the "|"-separated words of list */
static bool choice_has(const char *list, const char *w) {
    const size_t n = strlen(w);
    for (const char *s = list; *s;) {
        const char *e = strchr(s, '|');
        const size_t m = e ? (size_t)(e - s) : strlen(s);
        if (m == n && !strncmp(s, w, n)) return true;
        if (!e) break;
        s = e + 1;
    }
    return false;
}

static rk_status set_by_key(const char *what, const rk_param_key *keys, const slot *slots, size_t n, void *dst,
                            const char *key, const char *value, rk_err *err) {
    if (!dst || !key) return rk_err_set(err, RK_E_INVALID_ARG, "%s: NULL params or key", what);
    size_t i = 0;
    while (i < n && strcmp(keys[i].key, key)) i++;
    if (i == n) return rk_err_set(err, RK_E_INVALID_ARG, "%s: unknown key '%.64s'", what, key);
    const rk_param_key *k = &keys[i];
    const slot *sl = &slots[i];
    char *field = (char *)dst + sl->off;
    if (k->kind == RK_PARAM_FLAG) {
        bool on;
        if (!value || !strcmp(value, "1")) on = true;
        else if (!strcmp(value, "0")) on = false;
        else
            return rk_err_set(err, RK_E_INVALID_ARG, "%s: %s is a flag: '%s' alone, %s=1 or %s=0 (got '%.64s')", what,
                              k->key, k->key, k->key, k->key, value);
        *(bool *)field = (sl->flags & F_NEG) ? !on : on;
        return RK_OK;
    }
    if (!value || !*value)
        return rk_err_set(err, RK_E_INVALID_ARG, "%s: %s needs a value (%s=...)", what, k->key, k->key);
    if (k->kind == RK_PARAM_CHOICE) {
        uint32_t t;
        if (!choice_has(k->choices, value) || !dtype_word(value, &t))
            return rk_err_set(err, RK_E_INVALID_ARG, "%s: %s= expects one of %s (got '%.64s')", what, k->key,
                              k->choices, value);
        *(uint32_t *)field = t;
        return RK_OK;
    }
    if (k->kind == RK_PARAM_PATH) {
        if (strlen(value) >= sl->cap)
            return rk_err_set(err, RK_E_INVALID_ARG, "%s: %s= needs a path under %zu bytes (got %zu)", what, k->key,
                              sl->cap, strlen(value));
        strcpy(field, value);
        return RK_OK;
    }
    char *end;
    errno = 0;
    const double x = strtod(value, &end);
    const bool integer = k->kind == RK_PARAM_INTEGER;
    if (errno || end == value || *end || !(x >= k->lo && x <= k->hi) || (integer && x != floor(x)))
        return rk_err_set(err, RK_E_INVALID_ARG, "%s: %s= expects %s in [%.10g, %.10g] (got '%.64s')", what, k->key,
                          integer ? "an integer" : "a number", k->lo, k->hi, value);
    const bool none = (sl->flags & F_ZERO_NONE) && x == 0;
    if (sl->type == S_F32) *(float *)field = none ? -1.0f : (float)x;
    else if (sl->type == S_U64) *(uint64_t *)field = (uint64_t)x;
    else *(int32_t *)field = none ? -1 : (int32_t)x;
    return RK_OK;
}

/* ---- LowRAM --------------------------------------------------------------------------- */

#define NUM(k, lo, hi, h) \
    { k, RK_PARAM_NUMBER, lo, hi, NULL, h }
#define INT(k, lo, hi, h) \
    { k, RK_PARAM_INTEGER, lo, hi, NULL, h }
#define FLAG(k, h) \
    { k, RK_PARAM_FLAG, 0, 1, NULL, h }
#define CHOICE(k, c, h) \
    { k, RK_PARAM_CHOICE, 0, 0, c, h }

static const rk_param_key lowram_keys[] = {
    NUM("ratio", 1, 1000,
        "target compression of the compressed rows against f16; sets the basis rank when "
        "rank and energy are unset (default 6)"),
    INT("threads", 1, 1024, "codec threads (default: the session's)"),
    {"pred", RK_PARAM_PATH, 0, 0, NULL,
     "predictor file from `ridgekv calibrate --lowram`: offline key bases "
     "and value predictors (default: fitted on the prompt); last in a spec"},
    /* key basis */
    INT("rank", 1, 1 << 20, "basis rank per layer group, capped at the key dim (default: from energy or ratio)"),
    NUM("energy", 0.01, 1, "rank keeping this share of the centred key energy (default: unused)"),
    INT("group", 1, 4096, "adjacent layers sharing a key basis (default 3)"),
    FLAG("qpca", "basis minimising the expected logit error E[(q.dk)^2] (keys weighted per dim by the "
                 "prefill queries' second moments) instead of the key error"),
    INT("fitrows", 16, 1 << 24, "rows (strided) of the key Gram matrix (default 4096)"),
    NUM("lambda", 1e-9, 1e6, "value predictor ridge strength relative to tr(C'C)/r (default 1e-3)"),
    /* exact rows and chunks */
    INT("window", 1, 1 << 24, "recent rows kept exact (default 128)"),
    INT("sinks", 0, 1 << 16, "first rows kept exact (default 4; 0: none)"),
    INT("chunk", 1, 32, "rows per landmark chunk and per compressed block (default 16)"),
    INT("pfit", 0, 1 << 24,
        "a long eval fits once this many of its rows have passed every layer, then "
        "compresses chunk by chunk, so the exact prompt never coexists with its compressed "
        "form (default 0: fit at the end of the eval)"),
    INT("start", 0, 1 << 24,
        "no fit until the context holds this many rows; below it every row stays exact "
        "(default 3072, at most half the model's context; 0: as soon as a chunk leaves "
        "the window)"),
    FLAG("nostage", "the fitting eval runs chunk-major and fits at its end, holding every layer's exact rows at "
                    "once (default: each layer group fitted and its exact rows freed as the prefill passes it)"),
    FLAG("rowattn", "long evals after the fit attend row by row instead of rebuilding each layer's rows once for "
                    "the backend's attention"),
    CHOICE("exact", "f16|f32", "exact rows (sinks, window, rows not yet compressed): f16 (default) or f32"),
    CHOICE("coef", "int8|f16|f32",
           "key coefficients: int8 with one f16 scale per row (default), f16, or f32 "
           "(bases and predictors then f32 too)"),
    /* value residuals */
    NUM("resid", 0, 1, "share of compressed rows per (layer, KV head) that keep a value residual (default 0.25)"),
    CHOICE("rtype", "int4|int8|f16",
           "residuals: int4 with one f16 scale per row and head (default on the CPU), "
           "int8 (default on a device backend) or f16"),
    FLAG("mass", "rank residuals by ||d||^2 weighted by the attention the last prompt queries give each row "
                 "(default)"),
    FLAG("nomass", "rank residuals by ||d||^2 alone"),
    NUM("vkeep", 0, 1,
        "share of compressed rows per (layer, KV head) that keep their residual because the last "
        "prompt queries' pooled attention points at them; part of resid (default 0.1)"),
    INT("vpool", 0, 4096, "rows either side over which vkeep and vpin max-pool attention (default 8; 0: none)"),
    INT("obs", 1, 4096, "last prompt queries observed for evict, mass and vkeep (default 32)"),
    NUM("evict", 0, 0.95, "share of compressed rows dropped at the fit by SnapKV scores (default 0)"),
    FLAG("keys_only", "values stored exact (f16), no value predictor: only keys are compressed"),
    INT("vrank", 0, 1 << 20, "coefficients the value predictor reads (default 128; 0: all)"),
    /* decode selection */
    INT("budget", 1, 1 << 24,
        "compressed rows attended per query and (layer, KV head) (default 640); with topp "
        "the most rows one decode step may rebuild"),
    NUM("topp", 0, 1,
        "per (layer, KV head) keep the best chunks until the estimated attention mass left out is "
        "at most 1 - topp for every query head (default 0: a fixed budget)"),
    INT("minch", 1, 1 << 20, "with topp: at least this many chunks (default 2)"),
    INT("vpin", 0, 32,
        "chunks per (layer, KV head) holding the most pooled attention of the last prompt queries, "
        "attended whatever their landmark scores, inside the budget (default 4; 0 on a device "
        "backend)"),
    FLAG("bound", "select chunks by an upper bound of q.k (per-dim key min/max per chunk; 2 more f16 rows per "
                  "chunk) instead of q.mean"),
    INT("coarse", 0, 1 << 16,
        "two-level selection: coarse groups of this many chunks scored first (default 0: "
        "one level; fixed budget only, not with topp or bound)"),
    NUM("ckeep", 1, 1 << 20,
        "with coarse: the coarse groups kept, as a multiple of those that would hold the "
        "budget (default 4)"),
    NUM("spread", 0, 10,
        "a chunk's score adds this times the log-mass its keys' spread adds to the landmark's "
        "(default 0: off)"),
    NUM("hyst", 0, 100,
        "nats added to the score of a chunk whose keys are in the key cache, so that selection "
        "churn rebuilds fewer keys (default and 0: off)"),
    FLAG("summ", "unselected chunks enter attention as one summary row each (mean key, mean value, size)"),
    FLAG("nosumm", "unselected chunks are left out (default)"),
    FLAG("csumm", "summary rows from mean coefficients (r per chunk) instead of value-space means"),
    FLAG("dense", "attend every compressed row (for checking)"),
    INT("dl0", 0, 1 << 16, "first layer of [dl0, dl1), which attend every compressed row (default none)"),
    INT("dl1", 0, 1 << 16, "end of [dl0, dl1)"),
    INT("el0", 0, 1 << 16, "first layer of [el0, el1), which select with ebudget rows (default none)"),
    INT("el1", 0, 1 << 16, "end of [el0, el1)"),
    INT("ebudget", 1, 1 << 24, "rows layers [el0, el1) attend per query and KV head (default: budget)"),
    INT("full", 0, 8,
        "at most this many layers attend every chunk: those whose landmark selection missed the "
        "most of the last prompt queries' attention at the fit, at least fullmin (default 2; 0 on "
        "a device backend)"),
    NUM("fullmin", 0, 1, "the least missed share that makes a layer full (default 0.02)"),
    /* decode key cache */
    INT("krank", 1, 1 << 20, "decode rebuilds keys from the first krank coefficients (default: all)"),
    CHOICE("kcache", "int8|f16",
           "decode's cache of rebuilt keys: int8 with one f16 scale per row and head "
           "(default) or f16"),
    INT("kslots", 1, 1 << 16,
        "key-cache chunks per (layer, KV head) beyond budget / chunk (default: 576 rows' "
        "worth, more for long contexts)"),
    INT("kbatch", 1, 1 << 20,
        "chunks one key-rebuild batch holds (default: the largest budgeted layer's choice, "
        "at least 64)"),
    FLAG("nocache", "no cache of rebuilt keys between decode steps"),
};

static const slot lowram_slots[] = {
    {LOW(ratio), S_F32, 0, 0},
    {LOW(n_threads), S_I32, 0, 0},
    {LOW(predictor), S_PATH, 0, sizeof(((rk_lowram_params *)0)->predictor)},
    {LOW(rank), S_I32, 0, 0},
    {LOW(energy), S_F32, 0, 0},
    {LOW(group), S_I32, 0, 0},
    {LOW(query_pca), S_BOOL, 0, 0},
    {LOW(max_fit_rows), S_I32, 0, 0},
    {LOW(lambda), S_F32, 0, 0},
    {LOW(window), S_I32, 0, 0},
    {LOW(n_sink), S_I32, F_ZERO_NONE, 0},
    {LOW(chunk), S_I32, 0, 0},
    {LOW(prefill_fit), S_I32, 0, 0},
    {LOW(fit_min), S_I32, F_ZERO_NONE, 0},
    {LOW(no_stage), S_BOOL, 0, 0},
    {LOW(row_attn), S_BOOL, 0, 0},
    {LOW(exact_type), S_DTYPE, 0, 0},
    {LOW(coef_type), S_DTYPE, 0, 0},
    {LOW(resid_share), S_F32, 0, 0},
    {LOW(resid_type), S_DTYPE, 0, 0},
    {LOW(resid_mass), S_BOOL, 0, 0},
    {LOW(resid_mass), S_BOOL, F_NEG, 0},
    {LOW(mass_keep), S_F32, 0, 0},
    {LOW(mass_pool), S_I32, F_ZERO_NONE, 0},
    {LOW(obs_window), S_I32, 0, 0},
    {LOW(evict), S_F32, 0, 0},
    {LOW(values_exact), S_BOOL, 0, 0},
    {LOW(value_rank), S_I32, 0, 0},
    {LOW(budget), S_I32, 0, 0},
    {LOW(topp), S_F32, 0, 0},
    {LOW(min_chunks), S_I32, 0, 0},
    {LOW(mass_pin), S_I32, 0, 0},
    {LOW(bound), S_BOOL, 0, 0},
    {LOW(coarse), S_I32, 0, 0},
    {LOW(coarse_keep), S_F32, 0, 0},
    {LOW(spread), S_F32, 0, 0},
    {LOW(hyst), S_F32, F_ZERO_NONE, 0},
    {LOW(no_summary), S_BOOL, F_NEG, 0},
    {LOW(no_summary), S_BOOL, 0, 0},
    {LOW(coef_summary), S_BOOL, 0, 0},
    {LOW(dense), S_BOOL, 0, 0},
    {LOW(dense_l0), S_I32, 0, 0},
    {LOW(dense_l1), S_I32, 0, 0},
    {LOW(early_l0), S_I32, 0, 0},
    {LOW(early_l1), S_I32, 0, 0},
    {LOW(early_budget), S_I32, 0, 0},
    {LOW(full_layers), S_I32, 0, 0},
    {LOW(full_min), S_F32, 0, 0},
    {LOW(key_rank), S_I32, 0, 0},
    {LOW(kc_type), S_DTYPE, 0, 0},
    {LOW(kc_extra), S_I32, 0, 0},
    {LOW(key_batch), S_I32, 0, 0},
    {LOW(no_cache), S_BOOL, 0, 0},
};
_Static_assert(sizeof lowram_keys / sizeof lowram_keys[0] == sizeof lowram_slots / sizeof lowram_slots[0],
               "one slot per LowRAM key");

rk_lowram_params rk_lowram_params_default(void) {
    rk_lowram_params p;
    memset(&p, 0, sizeof p);
    /* ratio 6, 16-row chunks, budget 640, int4 residuals: 4.3x fewer bytes than f16 at 8K
     * with decode as fast as larger chunks (docs/LOWRAM.md) */
    p.ratio = 6.0f;
    p.group = 3;
    p.window = 128;
    p.n_sink = 4;
    p.chunk = 16;
    p.resid_share = 0.25f;
    p.resid_mass = true;
    p.mass_keep = 0.1f; /* the rows the question points at keep their values */
    p.mass_pin = -1;    /* 4, or none in a session on a device backend (its fused op selects by landmarks) */
    p.full_layers = -1; /* 2, or none in a session on a device backend */
    p.budget = 640;
    p.no_summary = true; /* summary rows of unselected chunks cost KL and time at 8K */
    p.value_rank = 128;  /* the KL of all coefficients at a fraction of the attention work */
    p.hyst = -1;         /* off */
    p.coef_type = RK_DT_Q8_0;
    p.resid_type = RK_DT_F32; /* F32: int4, or int8 in a session on a device backend (its fused op reads int8) */
    p.kc_type = RK_DT_Q8_0;   /* int8 key cache: twice the chunks of an f16 one in the same bytes */
    p.exact_type = RK_DT_F16;
    p.obs_window = 32;
    p.lambda = 1e-3f;
    p.max_fit_rows = 4096;
    return p;
}

rk_status rk_lowram_params_set(rk_lowram_params *p, const char *key, const char *value, rk_err *err) {
    return set_by_key("lowram", lowram_keys, lowram_slots, sizeof lowram_keys / sizeof lowram_keys[0], p, key, value,
                      err);
}

const rk_param_key *rk_lowram_params_keys(size_t *n) {
    if (n) *n = sizeof lowram_keys / sizeof lowram_keys[0];
    return lowram_keys;
}

rk_status rk_lowram_parse(const char *spec, rk_lowram_params *p, rk_err *err) {
    if (!p) return rk_err_set(err, RK_E_INVALID_ARG, "lowram: NULL params");
    rk_lowram_params q = *p;
    char tok[1200];
    for (const char *s = spec ? spec : ""; *s;) {
        if (!strncmp(s, "pred=", 5)) { /* the rest of the spec is the path */
            if (!s[5]) return rk_err_set(err, RK_E_INVALID_ARG, "lowram: pred= needs a path");
            rk_status st = rk_lowram_params_set(&q, "pred", s + 5, err);
            if (st) return st;
            break;
        }
        const char *e = strchr(s, ',');
        const size_t n = e ? (size_t)(e - s) : strlen(s);
        if (n >= sizeof tok) return rk_err_set(err, RK_E_INVALID_ARG, "lowram: option too long (%zu bytes)", n);
        memcpy(tok, s, n);
        tok[n] = '\0';
        s = e ? e + 1 : s + n;
        if (!n) continue;
        char *v = strchr(tok, '=');
        if (v) *v++ = '\0';
        rk_status st = rk_lowram_params_set(&q, tok, v, err);
        if (st) return st;
    }
    *p = q;
    return RK_OK;
}

/* ---- RidgeFill -------------------------------------------------------------------------- */

static const rk_param_key fill_keys[] = {
    INT("tail", 1, 1 << 24, "prompt rows at the end that run exactly (default: rk_fill_default_tail of the mode)"),
    NUM("keep", 0, 1, "quality: share of bulk rows kept exact by score (default: the map file's, else 0.1)"),
    INT("split", 1, 4096, "split layer of identity and plumb without maps (with maps: the map file's)"),
    INT("sinks", 1, 4096, "first rows question-aware selection keeps exact (default 4)"),
    FLAG("layer_major", "layers below the split run over the whole prompt before any late layer (n x n_embd "
                        "floats more; the same result as chunk-major)"),
    FLAG("question_aware", "speed, identity, plumb: select the rows kept exact as quality does"),
    FLAG("keep_selection", "a later eval call does not re-score the kept bulk rows"),
    INT("obs", 1, 4096, "last prompt rows whose attention scores the bulk rows (default 32)"),
    INT("score_layers", 1, 4096, "layers below the split whose attention scores (default 3)"),
    INT("score_skip", 0, 4096, "layers right below the split left out of scoring (default 2; 0: none)"),
    INT("pool", 0, 4096, "rows either side over which scores are max-pooled (default 8; 0: none)"),
    INT("baseline", 0, 1 << 20,
        "rows just before the question whose attention is subtracted, so rows every "
        "query attends do not win (default: obs; 0: none)"),
    INT("band", 0, 1 << 24, "the last bulk rows (nearest the tail) kept exact out of the keep share (default 0)"),
    INT("group", 0, 4096,
        "late layers' exact rows attend each run of up to this many filled rows as one row "
        "(mean K, mean V) in a prefill from row 0 on a host backend (default 0: off)"),
    INT("rescore_rows", 0, 1 << 24,
        "most document rows a later question makes exact beside the document's own selection, so its "
        "re-scoring runs at most twice that many rows through the late layers (default 0: the work of "
        "1024 rows attending to 2048 keys, so fewer rows for longer documents)"),
    INT("pool_after", 0, 4096,
        "a later question's re-scoring: rows after a row it scores high that share that score, so the words "
        "after the ones a question matches (a fact's value) come with them (default 16; 0: pool's radius)"),
    INT("stream_file", 0, 1 << 30,
        "KiB from which the split stream kept for later questions lives in an unlinked file in the KV's spill "
        "directory, its pages held only while read (default 65536, 64 MiB; 0: always in memory)"),
    INT("keep_rows", 0, 1 << 24,
        "quality: bulk rows kept exact at least, while they are at most RK_FILL_KEEP_MAX (a quarter) of the bulk, "
        "so a short document keeps more of its context exact than the share gives (default: 4096 when the share "
        "is the map file's, none when keep is given; 0: none)"),
};

static const slot fill_slots[] = {
    {FIL(tail), S_I32, 0, 0},
    {FIL(keep_share), S_F32, 0, 0},
    {FIL(split), S_I32, 0, 0},
    {FIL(n_sink), S_I32, 0, 0},
    {FIL(layer_major), S_BOOL, 0, 0},
    {FIL(question_aware), S_BOOL, 0, 0},
    {FIL(keep_selection), S_BOOL, 0, 0},
    {FIL(obs), S_I32, 0, 0},
    {FIL(score_layers), S_I32, 0, 0},
    {FIL(score_skip), S_I32, F_ZERO_NONE, 0},
    {FIL(pool), S_I32, F_ZERO_NONE, 0},
    {FIL(baseline), S_I32, F_ZERO_NONE, 0},
    {FIL(band), S_I32, 0, 0},
    {FIL(group), S_I32, 0, 0},
    {FIL(rescore_rows), S_I32, 0, 0},
    {FIL(pool_after), S_I32, F_ZERO_NONE, 0},
    {FIL(stream_file), S_I32, F_ZERO_NONE, 0},
    {FIL(keep_rows), S_I32, F_ZERO_NONE, 0},
};
_Static_assert(sizeof fill_keys / sizeof fill_keys[0] == sizeof fill_slots / sizeof fill_slots[0],
               "one slot per RidgeFill key");

rk_status rk_fill_params_set(rk_fill_params *p, const char *key, const char *value, rk_err *err) {
    return set_by_key("ridgefill", fill_keys, fill_slots, sizeof fill_keys / sizeof fill_keys[0], p, key, value, err);
}

const rk_param_key *rk_fill_params_keys(size_t *n) {
    if (n) *n = sizeof fill_keys / sizeof fill_keys[0];
    return fill_keys;
}

/* ---- memory tiers ----------------------------------------------------------------------- */

static const rk_param_key kv_keys[] = {
    INT("budget", 0, 1125899906842624.0,
        "bytes of K/V rows kept in memory; the rest spills (default 0: all in "
        "memory)"),
    INT("host_budget", 0, 1125899906842624.0,
        "device backends: pinned host bytes for the cold layers' rows, the "
        "rest in the spill file (default 0: every cold layer pinned)"),
    INT("spill_level", 0, 22, "zstd level of spilled chunks (default 0: raw frames)"),
    INT("spill_backend", 0, 2, "spill file I/O: 0 io_uring when usable (default), 1 io_uring, 2 pread/pwrite threads"),
    FLAG("spill_buffered", "the spill file without O_DIRECT (reads may come from the page cache)"),
    FLAG("budget_whole", "a LowRAM budget covers the codec's whole state, not only the chunk rows that can move "
                         "(docs/TIERS.md)"),
};

static const slot kv_slots[] = {
    {KVP(budget), S_U64, 0, 0},        {KVP(host_budget), S_U64, 0, 0},     {KVP(spill_level), S_I32, 0, 0},
    {KVP(spill_backend), S_I32, 0, 0}, {KVP(spill_buffered), S_BOOL, 0, 0}, {KVP(budget_whole), S_BOOL, 0, 0},
};
_Static_assert(sizeof kv_keys / sizeof kv_keys[0] == sizeof kv_slots / sizeof kv_slots[0], "one slot per KV key");

rk_status rk_kv_params_set(rk_kv_params *p, const char *key, const char *value, rk_err *err) {
    return set_by_key("kv", kv_keys, kv_slots, sizeof kv_keys / sizeof kv_keys[0], p, key, value, err);
}

const rk_param_key *rk_kv_params_keys(size_t *n) {
    if (n) *n = sizeof kv_keys / sizeof kv_keys[0];
    return kv_keys;
}
