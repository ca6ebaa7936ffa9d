/* The storage of the research settings inside rk.h's parameter structs, which callers hold
 * by value (so the fields must be part of the struct: the idiom of CPython's PyObject_HEAD).
 * Not API: a field's name, type, place and meaning may change in any release. Set them by
 * key with rk_lowram_params_set, rk_fill_params_set and rk_kv_params_set (rk_experimental.h),
 * which check bounds; the key tables there (rk_lowram_params_keys, rk_fill_params_keys,
 * rk_kv_params_keys) say what each does and what its 0 means. The key is in brackets. */
#pragma once
#include <stdbool.h>
#include <stdint.h>

/* rk_lowram_params */
#define RK_LOWRAM_RESEARCH_FIELDS                                                                     \
    /* key basis */                                                                                   \
    int32_t rank;         /* [rank] basis rank per layer group (0: from energy or ratio) */           \
    float energy;         /* [energy] rank keeping this share of the key energy */                    \
    int32_t group;        /* [group] adjacent layers sharing a basis */                               \
    bool query_pca;       /* [qpca] basis by query-weighted logit error */                            \
    int32_t max_fit_rows; /* [fitrows] rows of the key Gram matrix */                                 \
    float lambda;         /* [lambda] value predictor ridge strength */                               \
    /* exact rows and chunks */                                                                       \
    int32_t window;      /* [window] recent rows kept exact */                                        \
    int32_t n_sink;      /* [sinks] first rows kept exact (-1: none) */                               \
    int32_t chunk;       /* [chunk] rows per landmark chunk */                                        \
    int32_t prefill_fit; /* [pfit] rows past every layer that start the fit of a long eval */         \
    int32_t fit_min;     /* [start] rows before the first fit (-1: none) */                           \
    uint32_t exact_type; /* [exact] dtype of the exact rows */                                        \
    uint32_t coef_type;  /* [coef] dtype of the key coefficients */                                   \
    /* value residuals */                                                                             \
    float resid_share;   /* [resid] share of rows with a residual */                                  \
    uint32_t resid_type; /* [rtype] dtype of the residuals (F32: by backend) */                       \
    bool resid_mass;     /* [mass] rank residuals by attention mass */                                \
    float mass_keep;     /* [vkeep] share kept by the last queries' attention mass */                 \
    int32_t mass_pool;   /* [vpool] rows either side for mass pooling (-1: none) */                   \
    int32_t obs_window;  /* [obs] last prompt queries observed */                                     \
    float evict;         /* [evict] share of compressed rows dropped at the fit */                    \
    bool values_exact;   /* [keys_only] values stored exact, no predictor */                          \
    int32_t value_rank;  /* [vrank] coefficients the value predictor reads */                         \
    /* decode selection */                                                                            \
    int32_t budget;             /* [budget] compressed rows attended per query and KV head */         \
    float topp;                 /* [topp] chunks kept until this attention mass */                    \
    int32_t min_chunks;         /* [minch] least chunks with topp */                                  \
    int32_t mass_pin;           /* [vpin] chunks pinned by the last queries' mass (-1: by backend) */ \
    bool bound;                 /* [bound] select by a q.k upper bound */                             \
    int32_t coarse;             /* [coarse] two-level selection, chunks per coarse group */           \
    float coarse_keep;          /* [ckeep] coarse groups kept, multiple of the budget's */            \
    float spread;               /* [spread] score bonus for a chunk's key spread */                   \
    float hyst;                 /* [hyst] score bonus of cached chunks (-1: off) */                   \
    bool no_summary;            /* [nosumm] unselected chunks dropped, no summary row */              \
    bool coef_summary;          /* [csumm] summaries in coefficient space */                          \
    bool dense;                 /* [dense] attend every compressed row */                             \
    int32_t dense_l0, dense_l1; /* [dl0, dl1] layers attending every row */                           \
    int32_t early_l0, early_l1; /* [el0, el1] layers with early_budget */                             \
    int32_t early_budget;       /* [ebudget] their budget */                                          \
    int32_t full_layers;        /* [full] layers attending every chunk (-1: by backend) */            \
    float full_min;             /* [fullmin] least missed share of a full layer */                    \
    /* decode key cache */                                                                            \
    int32_t key_rank;  /* [krank] coefficients rebuilding keys */                                     \
    uint32_t kc_type;  /* [kcache] dtype of rebuilt keys */                                           \
    int32_t kc_extra;  /* [kslots] spare chunks per (layer, KV head) */                               \
    int32_t key_batch; /* [kbatch] chunks per rebuild batch */                                        \
    bool no_cache;     /* [nocache] no cache of rebuilt keys */                                       \
    bool no_stage;     /* [nostage] the fitting eval holds every layer's exact rows */                \
    bool row_attn;     /* [rowattn] long evals row by row after the fit */

/* rk_fill_params */
#define RK_FILL_RESEARCH_FIELDS                                                                                          \
    int32_t split;        /* [split] split layer without maps (identity, plumb) */                                       \
    int32_t n_sink;       /* [sinks] first rows kept exact */                                                            \
    bool layer_major;     /* [layer_major] early layers over the whole prompt first */                                   \
    bool question_aware;  /* [question_aware] select as quality does */                                                  \
    bool keep_selection;  /* [keep_selection] later evals do not re-score */                                             \
    int32_t obs;          /* [obs] last prompt rows that score */                                                        \
    int32_t score_layers; /* [score_layers] layers below the split that score */                                         \
    int32_t score_skip;   /* [score_skip] layers right below the split left out (-1: none) */                            \
    int32_t pool;         /* [pool] max-pool radius of the scores (-1: none) */                                          \
    int32_t baseline;     /* [baseline] rows before the question subtracted (-1: none) */                                \
    int32_t band;         /* [band] last bulk rows kept out of the keep share */                                         \
    int32_t group;        /* [group] late layers attend runs of filled rows as one row */                                \
    int32_t                                                                                                              \
        rescore_rows; /* [rescore_rows] most rows a later question adds exact (0: the work of 1024 rows at 2048 keys) */ \
    int32_t                                                                                                              \
        pool_after; /* [pool_after] rows after a row a later question scores high that share its score (-1: pool's) */   \
    int32_t                                                                                                              \
        stream_file;   /* [stream_file] KiB from which the kept split stream lives in a file (0: 65536; -1: never) */    \
    int32_t keep_rows; /* [keep_rows] bulk rows quality keeps exact at least, to a quarter of the bulk (-1: none) */

/* rk_kv_params: the memory tiers' spill file and budget accounting */
#define RK_KV_RESEARCH_FIELDS                                                                     \
    int32_t spill_level;   /* [spill_level] zstd level of spilled chunks (<= 0: raw frames) */    \
    int32_t spill_backend; /* [spill_backend] 0: io_uring when usable, 1: io_uring, 2: threads */ \
    bool spill_buffered;   /* [spill_buffered] spill file without O_DIRECT */                     \
    bool budget_whole;     /* [budget_whole] a LowRAM budget covers the codec's whole state */
