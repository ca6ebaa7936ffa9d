/* ridgekv's experimental API (librk): research settings, set by key with checked bounds,
 * and diagnostics. Not stable: keys, bounds, structs and functions here may change or go in
 * any release (zstd's ZSTD_STATIC_LINKING_ONLY section plays this part there). The rules of
 * rk.h hold: rk_status returns with rk_err last, nothing prints, reads the environment or
 * exits; the thread and ownership rules are rk.h's. */
#pragma once
#include "rk.h"

/* ---- settings by key -------------------------------------------------------------- */
typedef enum rk_param_kind {
    RK_PARAM_NUMBER,  /* a decimal number in [lo, hi] */
    RK_PARAM_INTEGER, /* an integer in [lo, hi] */
    RK_PARAM_FLAG,    /* "key" alone or key=1 sets it, key=0 clears it */
    RK_PARAM_CHOICE,  /* one of the words in `choices` */
    RK_PARAM_PATH,    /* a file path: the rest of a spec, so it comes last */
} rk_param_kind;

/* One key of a settings table. Static storage: valid for the life of the process. */
typedef struct rk_param_key {
    const char *key;
    rk_param_kind kind;
    double lo, hi;       /* NUMBER, INTEGER: the accepted range */
    const char *choices; /* CHOICE: the accepted words, "|"-separated */
    const char *help;    /* what it does, and what 0 (or its absence) means */
} rk_param_key;

/* Sets one LowRAM setting from text: "budget", "1024". A FLAG takes value NULL (set), "1" or
 * "0"; some flags are the negation of another key ("nomass", "summ"). RK_E_INVALID_ARG
 * naming the key and its range (or choices) when the value does not parse or lies outside
 * it, or naming the key when it is unknown; *p is unchanged then. The stable keys (ratio,
 * threads, pred) are in the table too. Checks against the model (chunk <= 32, KV heads, ...)
 * happen at session creation. */
RK_API rk_status rk_lowram_params_set(rk_lowram_params *p, const char *key, const char *value, rk_err *err);
/* The LowRAM keys (*n of them), in the order --help lists them. */
RK_API const rk_param_key *rk_lowram_params_keys(size_t *n);
/* Parses "key=value,flag,..." (the part after "lowram:" of --kv) into *p, from its current
 * values, one rk_lowram_params_set per item; "pred=FILE" takes the rest of the spec (the
 * path may hold commas), so it comes last. *p is written only on success. */
RK_API rk_status rk_lowram_parse(const char *spec, rk_lowram_params *p, rk_err *err);

/* The same for RidgeFill's research settings (and its stable keys "tail", "keep"). */
RK_API rk_status rk_fill_params_set(rk_fill_params *p, const char *key, const char *value, rk_err *err);
RK_API const rk_param_key *rk_fill_params_keys(size_t *n);

/* The same for the memory tiers' research settings (rk_kv_params: spill file, budget
 * accounting; the stable keys "budget" (bytes) and "host_budget" too). */
RK_API rk_status rk_kv_params_set(rk_kv_params *p, const char *key, const char *value, rk_err *err);
RK_API const rk_param_key *rk_kv_params_keys(size_t *n);

/* ---- sparse attention's calibration (ridgekv prepare --sparse) ------------------------ */
/* One exact pass over calibration text, segment by segment: in every chunk whose last row
 * sees min_kv keys or more, each head's lines are estimated as rk_sparse_params says and,
 * for each of a ladder of kept masses (0.5 .. 1), the exact attention mass that the mask
 * built at that setting covers is measured over every 8th row. Each (layer, head) gets the
 * smallest setting whose mask covers `target` of the attention on average. The file is a
 * GGUF (general.type ridgekv.sparse_attn): tensor sparse.mass f32 [n_head, n_layer], the
 * geometry (sparse.block, .sinks, .window, .est), the target, the calibration tokens and the
 * model fingerprint (sparse.model.*). */
typedef struct rk_sparse_fit_params {
    float target;              /* mean exact mass each head's mask keeps; 0: 0.95 */
    int32_t segment;           /* tokens per exact eval; 0: the model's context, at most the text */
    int32_t min_kv;            /* keys a chunk's last row must see to be measured; 0: 2048 */
    int32_t n_threads;         /* 0: all cores */
    rk_sparse_params geometry; /* block, n_sink, window, n_est (0: defaults); other fields unused */
} rk_sparse_fit_params;
typedef struct rk_sparse_fit_report {
    int64_t n_tokens;  /* tokens evaluated */
    double rows;       /* query rows measured per head (mean over layers and heads) */
    double mean_mass;  /* mean over (layer, head) of the chosen setting */
    double mean_cover; /* mean over (layer, head) of the exact mass its mask covered */
} rk_sparse_fit_report;
/* *bytes (malloc'd, the caller frees) and *len: the file. RK_E_INVALID_ARG when no chunk
 * of the text reaches min_kv keys. */
RK_API rk_status rk_sparse_fit(const rk_model *m, const int32_t *tokens, size_t n, const rk_sparse_fit_params *p,
                               void **bytes, size_t *len, rk_sparse_fit_report *rep, rk_err *err);
/* A file of given masses (n_layer, n_head) and geometry (zeros: defaults): tests and tools. */
RK_API rk_status rk_sparse_calib_write(const rk_model *m, const float *mass, const rk_sparse_params *geometry,
                                       float target, uint64_t calib_tokens, void **bytes, size_t *len, rk_err *err);

/* ---- LowRAM diagnostics ---------------------------------------------------------- */
/* What the last fit found (zeros before it). */
typedef struct rk_lowram_stats {
    bool fitted;
    int32_t n_group, rank_min, rank_max;
    int32_t n_layer, n_head_kv; /* the shapes of value_r2 and sel_miss */
    double key_rel_err;         /* discarded / total centred key energy over the fit rows */
    double value_r2_mean;       /* mean over (layer, KV head) of the predictor's R² on the prompt */
    /* (n_layer, n_head_kv) the predictor's R² per layer and KV head; NULL before the fit.
     * Borrowed from the session: valid until its next eval, truncate, reset, import or destroy. */
    const float *value_r2;
    int64_t n_resid_rows;    /* residual rows stored, all layers and heads */
    double seconds_fit;      /* end-of-prefill fit + first compression */
    double seconds_compress; /* later blocks, total */
    uint64_t rows_rebuilt;   /* key rows rebuilt by attention, all layers and heads */
    uint64_t rows_attended;  /* rows attended (plain + rebuilt), all layers and heads */
    uint64_t lmk_scored;     /* chunk landmarks scored by decode's selection (per query step, layer and
                                 KV head), all layers and heads */
    uint64_t lmk_coarse;     /* coarse landmarks scored (coarse=) */
    /* (n_layer) the share of the last prompt queries' attention that a budget-sized landmark
     * selection of compressed chunks leaves out, mean over queries and KV heads, measured at
     * the fit (-1: not measured); borrowed as value_r2 is; NULL before the codec exists */
    const float *sel_miss;
    int32_t n_full, full_l[8]; /* the layers that attend every chunk (key full), chosen by sel_miss */
} rk_lowram_stats;
RK_API void rk_session_lowram_stats(const rk_session *s, rk_lowram_stats *out);

/* Re-scoring's counters (rk.h, rk_session_fill_stream: what re-scoring is). */
typedef struct rk_fill_rescore_stats {
    int64_t calls;      /* eval calls that re-scored */
    int64_t scored;     /* rows scored by the last one */
    int64_t changed;    /* rows whose status it changed */
    int64_t recomputed; /* rows it ran exactly through the late layers */
    int64_t refilled;   /* rows it gave predicted K/V again */
    double seconds;     /* its scoring + recomputation time (without the call's own rows) */
} rk_fill_rescore_stats;
RK_API void rk_session_fill_rescore_stats(const rk_session *s, rk_fill_rescore_stats *out);

/* ---- evaluation hooks (eval splice) ---------------------------------------------
 * After the next eval call has written its bulk rows and before any tail row reads
 * them, copy K and/or V rows [0, bulk_end) of layers [lo, hi) from `exact` (a session
 * of the same model and KV type that evaluated the same tokens without fill; borrowed
 * until that eval call returns). */
RK_API rk_status rk_session_set_splice(rk_session *s, const rk_session *exact, int lo, int hi, bool keys, bool values,
                                       rk_err *err);
RK_API void rk_session_clear_splice(rk_session *s);

typedef struct rk_kv_error {
    double total;      /* Σ ||k_a - k_b||² over rows and heads */
    double norm_part;  /* Σ (|k_a| - |k_b|)²: the share due to scale */
    double dir_part;   /* Σ 2|k_a||k_b|(1 - cos): the share due to direction (total = norm + dir) */
    double ref_energy; /* Σ ||k_b||² */
} rk_kv_error;
/* Compares cache rows [row0, row1) of layer l (keys or values) of a against b (the
 * reference), per KV head. */
RK_API rk_status rk_session_kv_compare(const rk_session *a, const rk_session *b, int layer, int64_t row0, int64_t row1,
                                       bool values, rk_kv_error *out, rk_err *err);
