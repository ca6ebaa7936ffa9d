/* ridgekv public API (librk). Opaque types; every fallible call returns rk_status
 * and fills rk_err (may be NULL). Nothing here prints, reads the environment or exits. */
#pragma once
#include "rk_base.h"

/* ---- model --------------------------------------------------------------- */
typedef enum rk_arch { RK_ARCH_LLAMA, RK_ARCH_QWEN2, RK_ARCH_QWEN3 } rk_arch;

/* RoPE scaling, in llama.cpp's terms (its --rope-scaling, --rope-scale, --yarn-* flags). */
typedef enum rk_rope_scaling_type {
    RK_ROPE_SCALING_NONE = 0,
    RK_ROPE_SCALING_LINEAR = 1, /* positions divided by factor */
    RK_ROPE_SCALING_YARN = 2,   /* YaRN: high-frequency pairs kept, low ones interpolated, mscale */
} rk_rope_scaling_type;

typedef struct rk_rope_scaling {
    int32_t type;         /* rk_rope_scaling_type */
    float factor;         /* context multiplier: rope freq_scale = 1/factor (1 when none) */
    int32_t orig_ctx;     /* context of the unscaled model (YaRN's n_ctx_orig) */
    float ext_factor;     /* YaRN extrapolation mix: 1 for YaRN, 0 otherwise */
    float attn_factor;    /* magnitude multiplier (1) */
    float beta_fast, beta_slow; /* YaRN ramp ends (32, 1) */
} rk_rope_scaling;

typedef struct rk_hparams {
    rk_arch arch;
    char arch_name[16];
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int32_t n_ctx_train;
    int32_t n_rot;        /* rotated dims per head */
    int32_t rope_mode;    /* rk_rope_mode */
    float rope_base;
    float rms_eps;
    bool tied_output;     /* logits use token_embd */
    bool has_qkv_bias;    /* qwen2 */
    bool has_qk_norm;     /* qwen3 */
    rk_rope_scaling rope_scaling; /* in effect: the GGUF's <arch>.rope.scaling.*, or rk_model_set_rope's */
} rk_hparams;

typedef struct rk_model rk_model;

/* Maps the GGUF read-only, validates it and binds every tensor the architecture
 * needs (shapes and types checked). The model owns the mapping. */
rk_status rk_model_load(const char *path, rk_model **out, rk_err *err);
void rk_model_destroy(rk_model *m);
const rk_hparams *rk_model_hparams(const rk_model *m);
/* Changes to the model's RoPE before sessions are created (llama.cpp's flags); a field left
 * at its "keep" value keeps the model's. */
typedef struct rk_rope_override {
    int32_t type;         /* rk_rope_scaling_type; -1: keep (with factor set: linear if none) */
    float factor;         /* --rope-scale; 0: keep */
    int32_t orig_ctx;     /* --yarn-orig-ctx; 0: keep (the GGUF's, else its context_length) */
    float freq_base;      /* --rope-freq-base; 0: keep */
    float ext_factor;     /* --yarn-ext-factor; < 0: 1 for YaRN, 0 otherwise */
    float attn_factor;    /* --yarn-attn-factor; 0: keep */
    float beta_fast, beta_slow; /* --yarn-beta-fast / --yarn-beta-slow; 0: keep */
} rk_rope_override;
rk_rope_override rk_rope_override_default(void);
/* Applies o (RK_E_INVALID_ARG naming the field when a value is out of range or scaling
 * lacks a factor). Call before creating sessions: they read the model's RoPE at creation. */
rk_status rk_model_set_rope(rk_model *m, const rk_rope_override *o, rk_err *err);
/* The longest context the model handles as configured: n_ctx_train, or orig_ctx * factor
 * when RoPE scaling is in effect (whichever is larger). */
int64_t rk_model_n_ctx_max(const rk_model *m);
const char *rk_rope_scaling_name(int32_t type); /* "none", "linear", "yarn" */
bool rk_rope_scaling_parse(const char *s, int32_t *type);
/* Bytes of all weight tensors (as stored). */
uint64_t rk_model_weight_bytes(const rk_model *m);
/* Model name from general.name, or the file name. Borrowed, lives as long as m. */
const char *rk_model_name(const rk_model *m);
/* The parsed GGUF (borrowed) for tools like `info`. */
const struct rk_gguf *rk_model_gguf(const rk_model *m);

/* ---- tokenizer (through the model) ---------------------------------------- */
/* *ids is malloc'd (caller frees). add_special adds BOS when the vocab asks for it;
 * parse_special turns special-token text (<|im_start|>) into its id. */
rk_status rk_model_tokenize(const rk_model *m, const char *text, size_t len, bool add_special,
                            bool parse_special, int32_t **ids, size_t *n_ids, rk_err *err);
/* Bytes of one token as a streaming printer shows them; returns the length and writes
 * buf only when that fits in cap (no NUL). Special tokens give "" unless render_special.
 * A piece may end inside a UTF-8 character: buffer before printing. */
size_t rk_model_token_piece(const rk_model *m, int32_t id, bool render_special, char *buf,
                            size_t cap);
bool rk_model_token_is_eog(const rk_model *m, int32_t id);
int32_t rk_model_token_bos(const rk_model *m);
/* True when the vocab asks for BOS at the start of a sequence (tokenizer.ggml.add_bos_token). */
bool rk_model_add_bos(const rk_model *m);

/* ---- LowRAM: asymmetric KV compression at decode (SPEC §3) ----------------------
 * At the end of the first eval call that leaves enough rows, the codec fits (on the
 * prompt's own keys) a rank-r basis of the pre-RoPE keys of `group` adjacent layers
 * stacked, and per layer a value predictor V̂ = coef·W + b (ridge, closed form, i.e. a
 * linear function of the rebuilt keys K̃); residuals V − V̂ are kept, int8, for the
 * hardest `resid_share` of rows per (layer, KV head). Sinks and the last `window` rows
 * stay exact in the codec's own buffers (as do the rows of an eval until it ends); older
 * rows live only compressed, and each later block of `chunk` rows is compressed with the
 * same basis and predictor. Decode attention (<= 4 query rows) rebuilds only the chunks whose landmark
 * (mean key) scores highest for the query, within `budget` rows, plus sinks and window;
 * longer evals and `dense` rebuild every chunk, fused with an online softmax; chunks
 * left out enter as one summary row each (mean key, mean coefficients, chunk size). With
 * query_pca the basis minimises the expected logit error E[(q·Δk)²] instead of the key
 * error: keys are weighted per dimension by the prefill queries' second moments. */
typedef struct rk_lowram_params {
    float ratio;          /* rank from this target compression of compressed rows vs f16 (0: 6);
                             used when rank == 0 and energy == 0 */
    int32_t rank;         /* basis rank per layer group (0: from energy or ratio; capped at the dim) */
    float energy;         /* rank keeping this share of centred key energy (0: unused) */
    int32_t group;        /* adjacent layers sharing a basis (0: 3) */
    int32_t window;       /* recent rows kept exact (0: 128) */
    int32_t n_sink;       /* first rows kept exact (0: 4; -1: none) */
    int32_t chunk;        /* rows per landmark chunk and per compressed block (0: 16; 1..32) */
    float resid_share;    /* share of compressed rows per (layer, KV head) with a residual
                             (< 0: 0.25; 0: none; 1: all) */
    bool resid_mass;      /* rank residuals by ||δ||² weighted by the attention mass the last
                             prompt queries give each row (default on; off: ||δ||² alone) */
    bool values_exact;    /* ablation "keys only": values stored exact (f16), no predictor */
    float mass_keep;      /* share of compressed rows per (layer, KV head) whose residual is kept
                             whatever its ||δ||², chosen by the last prompt queries' attention mass
                             max-pooled over mass_pool rows either side (the rows a question points
                             at keep their values); part of resid_share, not added to it (0: none) */
    int32_t mass_pool;    /* rows either side for mass_keep's and mass_pin's pooling (0: 8; -1: none) */
    int32_t mass_pin;     /* sparse decode attends, per (layer, KV head), the mass_pin chunks holding the
                             most pooled mass of the last prompt queries at the fit, whatever their
                             landmark scores, inside the budget (at most 32; 0: none; -1, the
                             default: 4, none in a session on a device backend, whose fused decode
                             op selects by landmarks alone) */
    int32_t budget;       /* compressed rows attended per query and (layer, KV head) (0: 640); with
                             topp the most rows one decode step may rebuild */
    float topp;           /* decode: per (layer, KV head) keep the best chunks until the estimated
                             attention mass left out (landmark scores against sinks + window +
                             every chunk) is at most 1 - topp for every query head (0: a fixed budget) */
    int32_t min_chunks;   /* with topp: at least this many chunks (0: 2) */
    int32_t key_rank;     /* decode rebuilds keys from the first key_rank coefficients (0: all) */
    int32_t value_rank;   /* the value predictor uses the first value_rank coefficients only (its other
                             rows are 0), so attention sums value_rank of them per row (default 128;
                             0: all) */
    float hyst;           /* decode: a chunk whose keys are in the key cache gets this many nats added
                             to its selection score, so that selection churn rebuilds fewer keys
                             (0: default; < 0: off) */
    int32_t kc_extra;     /* decode's key cache holds budget / chunk + kc_extra chunks per (layer, KV head)
                             (0: 576 rows' worth, 576 / chunk: 36 chunks of 16 rows, 72 of 8) */
    int32_t key_batch;    /* decode: chunks one key-rebuild batch holds (0: the largest budgeted layer's
                             choice, at least 64): a full layer's first step takes several batches */
    int32_t coarse;       /* decode: two-level selection, coarse groups of this many chunks (landmark =
                             the row-weighted mean of their landmarks, built at decode); the best
                             coarse groups are kept and only their chunks' landmarks are scored
                             (0 or 1: one level; fixed-budget selection only, not topp or bound) */
    float coarse_keep;    /* with coarse: keep coarse_keep x (budget / chunk) / coarse groups, i.e. this
                             multiple of the groups that would hold the budget (0: 4; at least 1) */
    int32_t prefill_fit;  /* a long eval fits once this many of its rows have passed every layer and
                             then compresses chunk by chunk, so the exact prompt never coexists with
                             its compressed form (0, the default: fit at the end of the eval;
                             pfit=3072 measured TTFT 1.30x exact's at 8K, docs/LOWRAM.md) */
    int32_t fit_min;      /* no fit (every row stays exact, attention is the backend's exact ATTN) until
                             the context holds this many rows; below it LowRAM costs what f16 does.
                             0: the default, 3072 rows (the decode crossover on the 2-core CPU), at most
                             half the model's context (rk_model_n_ctx_max); < 0 (spec start=0): as
                             soon as a chunk leaves the window */
    uint32_t kc_type;     /* decode's key cache: RK_DT_Q8_0 (default: int8, one f16 scale per row and head)
                             or RK_DT_F16; 0 (F32): the default */
    bool dense;           /* attend to every compressed row (for checking) */
    float spread;         /* decode: a chunk's score (selection and summary row) adds this times the
                             log-mass its keys' spread adds to the landmark's (Gaussian estimate
                             Var(q·k)/2d from each RoPE pair's mean |k|² over the window rows less
                             the landmark's; 0: off) */
    int32_t dense_l0, dense_l1; /* decode: layers [dense_l0, dense_l1) attend every compressed row
                             (per-layer attribution of the selection's loss; default none) */
    int32_t early_l0, early_l1; /* decode: layers [early_l0, early_l1) select with early_budget rows
                             instead of budget (the layers whose attention spreads widest; default none) */
    int32_t early_budget; /* compressed rows those layers attend per query and KV head (0: budget) */
    int32_t full_layers;  /* decode: at most this many layers attend every compressed chunk (their keys
                             all in the key cache): those whose landmark selection missed the most of
                             the last prompt queries' attention at the fit (stats.sel_miss), if
                             at least full_min (-1, the default: 2; none in a session on a device
                             backend; 0: none; at most 8) */
    float full_min;       /* the least missed share that makes a layer full (0: 0.02) */
    bool no_summary;      /* unselected chunks are dropped, not one summary row each (the default since
                             the seventh session: the summaries cost KL at 8K; `summ` keeps them) */
    bool coef_summary;    /* ablation: decode sums unselected chunks' mean coefficients (r per chunk)
                             instead of their value-space summaries (head_dim per chunk) */
    bool no_cache;        /* ablation: no cache of rebuilt keys between decode steps */
    bool no_stage;        /* ablation: the eval that fits runs chunk-major and fits at its end, holding
                             every layer's exact prompt at once (default: staged, each group of
                             layers fitted and its exact rows given back as the prefill finishes it) */
    bool row_attn;        /* ablation: long evals after the fit by the row-by-row dense path instead of
                             rebuilding the layer's rows once for the backend's ATTN (lowram_dense.c) */
    bool bound;           /* select chunks by an upper bound of q·k (per-dim key min/max per chunk,
                             Quest-style; 2 more f16 rows per chunk) instead of q·mean */
    bool query_pca;       /* key basis by query-weighted logit error, not key energy (no gain measured) */
    uint32_t coef_type;   /* key coefficients: RK_DT_Q8_0 (default: int8, one f16 scale per row),
                             RK_DT_F16 or RK_DT_F32 (then bases and predictors are f32 too: the
                             checking setup); start from rk_lowram_params_default() (F32 is 0) */
    uint32_t resid_type;  /* RK_DT_Q4_0 (int4, one f16 scale per row and head), RK_DT_Q8_0 (int8,
                             same scale) or RK_DT_F16; RK_DT_F32 (the default): unset, int4, or int8
                             in a session on a device backend (its fused decode op reads int8) */
    float evict;          /* share of compressed rows dropped at the fit by SnapKV scores (0..0.95) */
    int32_t obs_window;   /* last prompt queries observed for evict / resid_mass (0: 32) */
    float lambda;         /* predictor ridge strength relative to tr(CᵀC)/r (<= 0: 1e-3) */
    int32_t max_fit_rows; /* rows used for the key Gram matrix (strided; 0: 4096) */
    uint32_t exact_type;  /* exact rows (sinks, window, rows not yet compressed): RK_DT_F16 (default)
                             or RK_DT_F32 (the checking setup) */
    int32_t n_threads;    /* codec threads (0: the session's) */
    char predictor[1024]; /* predictor file (offline basis + predictor init) or "" */
} rk_lowram_params;

rk_lowram_params rk_lowram_params_default(void);
/* Parses "key=value,flag,..." (the part after "lowram:" of --kv) into *p, starting from
 * its current values. Keys: ratio, rank, energy, group, window, sinks, chunk, resid,
 * budget, topp, minch, krank, vrank, hyst, kslots, coarse, ckeep, pfit, evict, obs, lambda, fitrows, threads,
 * start, spread, vkeep, vpool, vpin, dl0, dl1, el0, el1, ebudget, full, fullmin, kbatch, kcache=int8|f16, coef=f16|f32|int8, rtype=int8|int4|f16, exact=f16|f32,
 * pred=FILE (must come last: the rest of the spec is the path); flags: dense, mass,
 * nomass, keys_only, nosumm, csumm, qpca, bound, nocache. */
rk_status rk_lowram_parse(const char *spec, rk_lowram_params *p, rk_err *err);

/* ---- KV cache policy: chosen when the session is created ----------------------------
 * f16 / f32: plain rows; q8: int8 rows with one f16 scale per 32 values (llama.cpp's
 * q8_0 KV, the baseline LowRAM must beat at equal bytes); q4: 4-bit codes with one f16
 * scale per 32 values (llama.cpp's q4_0, 18 bytes per 32: 3.56x less than f16, the
 * alternative at about LowRAM's bytes); lowram: the codec above. The values are those of
 * KV blocks and document caches: new kinds go at the end. */
typedef enum rk_kv_kind { RK_KV_F16 = 0, RK_KV_F32, RK_KV_Q8, RK_KV_LOWRAM, RK_KV_Q4 } rk_kv_kind;
enum { RK_KV_KIND_LAST = RK_KV_Q4 };

typedef struct rk_kv_params {
    rk_kv_kind kind;
    rk_lowram_params lowram;  /* used when kind == RK_KV_LOWRAM */
    /* Memory tiers (runtime/kv/kv_tier.c, docs/TIERS.md), f16 / f32 / q8 only: at most
     * budget bytes of K/V rows stay in memory (the sink chunk and the recent window
     * always do); the other chunks spill (raw frames; zstd with spill_level) to an unlinked file in
     * spill_dir (NULL: /tmp) and are read back when attention needs them. 0: all in
     * memory. Results are bit-identical to the all-in-memory cache. Not part of the
     * policy's spec (rk_kv_params_format) or of its KV blocks. */
    uint64_t budget;
    const char *spill_dir;    /* borrowed for rk_session_create */
    int32_t spill_level;      /* zstd level of spilled chunks; <= 0: raw frames (the default: zstd does not pay there) */
    int32_t spill_backend;    /* 0: io_uring when usable, 1: io_uring, 2: pread/pwrite threads */
    bool spill_buffered;      /* the spill file without O_DIRECT (reads may come from the page cache) */
    /* lowram: false (default): budget bounds the chunk data that can move (coefficient and
     * residual rows of complete chunks); the per-step state (landmarks, bounds, bases,
     * predictors, exact window, key cache) stays resident on top, reported as fixed_bytes.
     * true: budget covers the codec's whole state (docs/TIERS.md, "How the budget is counted"). */
    bool budget_whole;
    /* The GPU KV tiers (a backend with memory of its own, f16 / f32 under budget:
     * runtime/session/kv_dev.c): pinned host bytes for the cold layers' rows. 0: every cold
     * layer pinned. Else the cold layers past it go on to a spill file in spill_dir (the
     * block store; spill_backend, spill_buffered apply) and are read back when used. */
    uint64_t host_budget;
} rk_kv_params;

rk_kv_params rk_kv_params_default(void); /* f16; lowram = rk_lowram_params_default() */
const char *rk_kv_kind_name(rk_kv_kind k); /* "f16", "f32", "q8", "lowram", "q4" */
/* Parses "f16", "f32", "q8", "q4" or "lowram[:opts]" (opts as rk_lowram_parse) into *out,
 * which is written only on success. RK_E_INVALID_ARG names what is wrong. */
rk_status rk_kv_params_parse(const char *spec, rk_kv_params *out, rk_err *err);
/* Writes the canonical spec of p ("f16", "lowram:rank=64,...") into buf (cap bytes). */
void rk_kv_params_format(const rk_kv_params *p, char *buf, size_t cap);

/* ---- session: one sequence with its KV cache ------------------------------- */
typedef enum rk_backend_kind { RK_BACKEND_CPU, RK_BACKEND_CPU_REF, RK_BACKEND_CUDA } rk_backend_kind;
const char *rk_backend_kind_name(rk_backend_kind k); /* "cpu", "cpu_ref", "cuda" */
bool rk_backend_kind_parse(const char *s, rk_backend_kind *out);

/* A compute backend (kernels' op table + its memory, pool, handles). Sessions create their
 * own unless given one to share: one backend (one thread pool) per process is the rule
 * for programs that hold several sessions. */
typedef struct rk_backend rk_backend;
/* RK_E_UNSUPPORTED with the reason ("cuda: not built ...", "cuda: no device ...").
 * n_threads <= 0: all cores (cpu). */
rk_status rk_backend_open(rk_backend_kind kind, int n_threads, rk_backend **out, rk_err *err);
void rk_backend_close(rk_backend *be); /* accepts NULL */

typedef struct rk_session_params {
    int32_t n_ctx;        /* 0: the model's training context; above rk_model_n_ctx_max: RK_E_CONTEXT
                             unless ctx_overflow_ok */
    int32_t n_threads;    /* 0: all cores */
    int32_t n_batch;      /* prefill chunk in tokens; 0: 512 */
    rk_kv_params kv;      /* KV policy, fixed for the session's life (default f16) */
    rk_backend_kind backend;
    rk_backend *shared_backend; /* borrowed (outlives the session); NULL: own backend of `backend` kind */
    bool ctx_overflow_ok; /* accept n_ctx past what the model was trained for (rk_session_warning says so) */
} rk_session_params;

rk_session_params rk_session_params_default(void);

typedef struct rk_session rk_session;

/* The session borrows m, which must outlive it. */
rk_status rk_session_create(const rk_model *m, const rk_session_params *p, rk_session **out,
                            rk_err *err);
void rk_session_destroy(rk_session *s);
/* Appends n tokens at the current position and runs them through the model in chunks.
 * logits: NULL, or n_vocab floats for the last token (all_rows false), or n * n_vocab
 * floats, row i predicting the token after ids[i] (all_rows true).
 * RK_E_CONTEXT (nothing changed) when the tokens do not fit the context. */
rk_status rk_session_eval(rk_session *s, const int32_t *ids, size_t n, float *logits,
                          bool all_rows, rk_err *err);
void rk_session_reset(rk_session *s);
int64_t rk_session_n_past(const rk_session *s);
int64_t rk_session_n_ctx(const rk_session *s);
/* Bytes of KV cache state per token (all layers, K and V) and in total as allocated. */
uint64_t rk_session_kv_bytes_per_token(const rk_session *s);
/* Optional progress callback, called after each prefill chunk of rk_session_eval with
 * (tokens done, tokens total). Returning false cancels: eval returns RK_E_CANCELLED and
 * the session is as it was before that eval call. */
typedef bool (*rk_progress_fn)(void *ud, int64_t done, int64_t total);
void rk_session_set_progress(rk_session *s, rk_progress_fn fn, void *ud);
/* Forgets every token from position n on (n <= n_past): the next eval continues at n. */
rk_status rk_session_truncate(rk_session *s, int64_t n, rk_err *err);
/* The token ids evaluated so far (n_past of them). Borrowed; valid until the next eval,
 * truncate or reset. */
const int32_t *rk_session_tokens(const rk_session *s);
/* Exports cache rows [row0, row1) of every layer as one self-describing block (*blk
 * malloc'd, *n bytes): a header (magic, format version, KV policy, model fingerprint,
 * row range, the token ids of those rows, a checksum) and the policy's own encoding
 * (plain rows, q8 blocks, or LowRAM's compressed rows). For the document cache, chat's
 * /save and the spill tier. */
rk_status rk_session_kv_export(const rk_session *s, int64_t row0, int64_t row1, void **blk, size_t *n, rk_err *err);
/* Appends the rows of a block made by rk_session_kv_export (same model, same KV policy)
 * at n_past, which must equal the block's row0; the block's token ids become the
 * session's. A truncated, corrupt or foreign block gives RK_E_FORMAT / RK_E_MISMATCH
 * naming what is wrong, and the session is unchanged. LowRAM exports and imports its
 * whole state only (rows [0, n_past) into a session at n_past 0); other ranges give
 * RK_E_UNSUPPORTED. */
rk_status rk_session_kv_import(rk_session *s, const void *blk, size_t n, rk_err *err);

/* ---- sampling ------------------------------------------------------------- */
typedef struct rk_sampler_params {
    float temp;            /* <= 0: greedy (argmax, ties to the lowest id) */
    int32_t top_k;         /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int32_t repeat_last_n; /* tokens of history the penalty looks at */
    uint64_t seed;
} rk_sampler_params;

rk_sampler_params rk_sampler_params_default(void);

typedef struct rk_sampler rk_sampler;
rk_status rk_sampler_create(const rk_sampler_params *p, int32_t n_vocab, rk_sampler **out,
                            rk_err *err);
void rk_sampler_destroy(rk_sampler *s);
/* Picks a token from logits (modified in place by the penalty). history: earlier ids. */
int32_t rk_sampler_sample(rk_sampler *s, float *logits, const int32_t *history, size_t n_history);

/* ---- chat templates ---------------------------------------------------------- */
typedef enum rk_chat_family {
    RK_CHAT_CHATML,  /* <|im_start|>role\n...<|im_end|>\n : Qwen, SmolLM, fallback */
    RK_CHAT_LLAMA3,  /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    RK_CHAT_LLAMA2,  /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
    RK_CHAT_ZEPHYR,  /* <|role|>\n...</s>\n */
} rk_chat_family;

typedef struct rk_chat_msg {
    const char *role;     /* "system", "user", "assistant" */
    const char *content;
} rk_chat_msg;

/* Family recognised from the GGUF's tokenizer.chat_template (ChatML when absent or unknown). */
rk_chat_family rk_model_chat_family(const rk_model *m);
const char *rk_chat_family_name(rk_chat_family f);
/* Formats messages into *out (malloc'd, NUL-terminated). add_assistant opens the
 * assistant turn for generation. The text contains special-token markup: tokenize
 * it with parse_special = true. */
rk_status rk_chat_format(rk_chat_family f, const rk_chat_msg *msgs, size_t n, bool add_assistant,
                         char **out, rk_err *err);
/* The system prompt the model's template inserts when a conversation does not start with
 * one ("" when it inserts none): Qwen2.5 "You are Qwen, created by Alibaba Cloud. You are a
 * helpful assistant.", SmolLM2 "You are a helpful AI assistant named SmolLM, trained by
 * Hugging Face". Recognised in ChatML templates as a literal system turn (not built from
 * messages[0]). Borrowed, lives as long as m. */
const char *rk_model_chat_default_system(const rk_model *m);
/* rk_chat_format with the model's family and rules: the default system prompt goes first
 * when msgs (n > 0) does not start with a system message, as the template does. */
rk_status rk_model_chat_format(const rk_model *m, const rk_chat_msg *msgs, size_t n, bool add_assistant,
                               char **out, rk_err *err);

/* ---- RidgeFill (SPEC §2) ------------------------------------------------------
 * Layers below the split run exactly for every prompt row. For a bulk row (a prompt
 * row with at least `tail` prompt tokens after it in the same eval call) each late
 * layer l >= split gets its input predicted from the split stream, x̂_l = W_l x_S + b_l,
 * and runs only the cache writers (attention norm, K/V projection, k-norm, RoPE, cache
 * write). Tail rows, kept rows and decode steps run exactly. */
typedef enum rk_fill_mode {
    RK_FILL_OFF = 0,
    RK_FILL_SPEED,     /* every bulk row filled */
    RK_FILL_QUALITY,   /* sinks + the rows the question attends to stay exact (question-aware) */
    RK_FILL_IDENTITY,  /* W_l = I, b_l = 0: the training-free baseline */
    RK_FILL_PLUMB,     /* the fill path fed exact inputs: must equal OFF (oracle test) */
} rk_fill_mode;

const char *rk_fill_mode_name(rk_fill_mode m);
/* Parses "off|speed|quality|identity|plumb"; false when unknown. */
bool rk_fill_mode_parse(const char *s, rk_fill_mode *out);
/* The exact tail a mode gets when rk_fill_params.tail is 0: 1536 for speed (the tail where
 * its ΔNLL and TTFT targets both held, docs/RIDGEFILL.md), 2048 for every other mode. */
int32_t rk_fill_default_tail(rk_fill_mode m);
/* The group (rk_fill_params.group) a mode gets by default: 16 for speed and quality (late
 * layers attend to runs of up to 16 filled rows as one row; docs/RIDGEFILL.md), 0
 * (ungrouped) for identity and plumb. */
int32_t rk_fill_default_group(rk_fill_mode m);

typedef struct rk_ridge_maps rk_ridge_maps;

/* Maps a ridge-map file read-only and checks it against m: a file fitted on another
 * model is refused (RK_E_MISMATCH naming both); the same weights in another
 * quantisation give RK_OK with a note in warning (empty when none). */
rk_status rk_ridge_maps_load(const char *path, const rk_model *m, rk_ridge_maps **out,
                             char *warning, size_t warning_cap, rk_err *err);
void rk_ridge_maps_destroy(rk_ridge_maps *r);
int32_t rk_ridge_maps_split(const rk_ridge_maps *r);

typedef struct rk_fill_params {
    rk_fill_mode mode;
    int32_t tail;              /* exact tail T; 0: rk_fill_default_tail(mode) (the CLI refuses < 512;
                                  the library allows >= 1) */
    int32_t split;             /* used by identity without maps; else the map's split */
    int32_t n_sink;            /* quality: first rows kept exact (0: 4) */
    float keep_share;          /* quality: share of bulk rows kept exact by score (<0: file default, 0.1) */
    const rk_ridge_maps *maps; /* borrowed; required for speed/quality */
    bool layer_major;          /* layers 0..S-1 over the whole prompt before any late layer
                                  (n x n_embd floats more; same result as chunk-major) */
    /* Question-aware selection (quality mode always; other fill modes when question_aware):
     * after the layer-major phase, every bulk row is scored by the softmax attention the
     * last `obs` prompt rows pay it at `score_layers` layers below the split (summed over
     * query heads and layers; SmolLM2 measured: the two layers right below the split point
     * at punctuation, not at facts, hence score_skip), max-pooled over `pool` rows either side; the
     * top keep_share of the bulk rows plus the n_sink first rows stay exact. */
    int32_t obs;               /* 0: 32 */
    int32_t score_layers;      /* 0: 3 */
    int32_t score_skip;        /* layers right below the split left out of scoring (0: 2; < 0: none):
                                  scoring layers are [S - skip - score_layers, S - skip) */
    int32_t pool;              /* 0: 8 (a fact's value follows the words the question matches); < 0: none */
    int32_t baseline;          /* the rows just before the question whose attention (scaled to obs
                                  rows) is subtracted, so rows every query attends to (punctuation
                                  sinks) do not win (0: obs; < 0: none) */
    int32_t band;              /* recency band: the last `band` bulk rows (those nearest the exact
                                  tail) are kept exact out of the keep share, the rest of the share
                                  goes by score (0: none; clipped to the share) */
    bool question_aware;       /* speed/identity/plumb: select as quality does (tests, studies) */
    bool keep_selection;       /* a later eval call does not re-score the kept bulk rows (below) */
    int32_t group;             /* grouped attention (0: off): in a prefill from row 0 on a host backend,
                                  late layers' exact rows attend to each run of up to `group`
                                  consecutive filled rows as one row (mean K, mean V, score bias
                                  log count): less attention work, the cache itself unchanged
                                  (decode reads every filled row); 1: the same path, no grouping */
} rk_fill_params;

/* The product's fill (what ridgekv ask, chat and serve use with maps): quality mode, the
 * mode's default tail, grouped attention in runs of rk_fill_default_group(RK_FILL_QUALITY),
 * keep_share from the map file (-1), every other field 0 (its documented default). maps is
 * NULL: set it (speed and quality need maps), or set mode to RK_FILL_OFF. A session never
 * given rk_session_set_fill prefills exactly (RK_FILL_OFF). */
rk_fill_params rk_fill_params_default(void);

/* Applies to the following rk_session_eval calls. */
rk_status rk_session_set_fill(rk_session *s, const rk_fill_params *p, rk_err *err);

/* Work counters since the session was created (tests and eval use them). */
typedef struct rk_session_counters {
    uint64_t exact_rows[256];  /* rows that ran Q/attention/O/MLP, per layer (first 256) */
    uint64_t filled_rows[256]; /* rows whose K/V came from a predicted input, per layer */
    /* decode steps run as one recorded unit (RIDGEKV_CUDA_GRAPHS=1 on a backend that records
     * steps: CUDA graphs), and those whose recording failed and ran again unrecorded */
    uint64_t graph_steps, graph_fallbacks;
    /* --kv lowram on a device backend: attention calls of the fused device op (LR_ATTN) and of
     * the codec on the host (prefill, options the op lacks) */
    uint64_t lowram_dev_attn, lowram_host_attn;
} rk_session_counters;
const rk_session_counters *rk_session_get_counters(const rk_session *s);
/* Of rows [row0, row0 + n), how many the last question-aware selection kept exact (sinks
 * included; rows outside its bulk region are not counted); -1 when no eval call of this
 * session has made a selection. Eval uses it to say whether a needle was kept. */
int64_t rk_session_fill_kept(const rk_session *s, int64_t row0, int64_t n);
/* Re-scoring (issue 10 item 4): a question-aware call keeps its bulk rows' split stream
 * (f16). A later eval call of >= 2 rows with no bulk rows of its own (the question after a
 * document, also one loaded from the document cache) runs layers 0..S-1 over its rows,
 * scores the kept rows by its last `obs` rows, and, from the first row whose status
 * changes, recomputes the newly selected rows exactly through the late layers and gives
 * dropped ones their predicted K/V again: the cache then holds what that selection would
 * have made of the kept rows. Plain f16/f32/q8 caches without a budget only. */
typedef struct rk_fill_rescore_stats {
    int64_t calls;       /* eval calls that re-scored */
    int64_t scored;      /* rows scored by the last one */
    int64_t changed;     /* rows whose status it changed */
    int64_t recomputed;  /* rows it ran exactly through the late layers */
    int64_t refilled;    /* rows it gave predicted K/V again */
    double seconds;      /* its scoring + recomputation time (without the call's own rows) */
} rk_fill_rescore_stats;
void rk_session_fill_rescore_stats(const rk_session *s, rk_fill_rescore_stats *out);
/* The kept stream (borrowed; valid until the next eval, truncate or set), or false. */
typedef struct rk_fill_stream {
    int64_t row0, n;        /* bulk rows [row0, row0 + n) */
    int32_t n_embd, split;
    const uint16_t *x;      /* (n, n_embd) f16 split stream */
    const float *base;      /* (n) baseline attention per query row */
    const uint8_t *keep;    /* (n) the selection the cache holds */
} rk_fill_stream;
bool rk_session_fill_stream(const rk_session *s, rk_fill_stream *out);
/* Copies a stream in (document cache load): rows must lie in [0, n_past), n_embd match. */
rk_status rk_session_fill_stream_set(rk_session *s, const rk_fill_stream *in, rk_err *err);

/* Model fingerprint: architecture, shapes, tokenizer hash and a hash of selected
 * weight tensors (hex string, 16 chars each part). */
typedef struct rk_fingerprint {
    char arch[16];
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    uint64_t tokenizer_hash;
    uint64_t weights_hash;    /* of norm weights (quantisation independent) */
    uint64_t quant_hash;      /* of the raw bytes of selected matrices (quantisation dependent) */
} rk_fingerprint;
void rk_model_fingerprint(const rk_model *m, rk_fingerprint *out);

/* ---- evaluation hooks (eval splice) ---------------------------------------------
 * After the next eval call has written its bulk rows and before any tail row reads
 * them, copy K and/or V rows [0, bulk_end) of layers [lo, hi) from `exact` (a session
 * of the same model and KV type that evaluated the same tokens without fill). */
rk_status rk_session_set_splice(rk_session *s, const rk_session *exact, int lo, int hi, bool keys,
                                bool values, rk_err *err);
void rk_session_clear_splice(rk_session *s);

typedef struct rk_kv_error {
    double total;      /* Σ ||k_a - k_b||² over rows and heads */
    double norm_part;  /* Σ (|k_a| - |k_b|)²: the share due to scale */
    double dir_part;   /* Σ 2|k_a||k_b|(1 - cos): the share due to direction (total = norm + dir) */
    double ref_energy; /* Σ ||k_b||² */
} rk_kv_error;
/* Compares cache rows [row0, row1) of layer l (keys or values) of a against b (the
 * reference), per KV head. */
rk_status rk_session_kv_compare(const rk_session *a, const rk_session *b, int layer, int64_t row0, int64_t row1,
                                bool values, rk_kv_error *out, rk_err *err);


/* A note from session creation (a predictor file fitted on another quantisation of the
 * same weights, ...), or "". Borrowed, lives as long as s. */
const char *rk_session_warning(const rk_session *s);

/* Bytes that hold the KV state of the tokens so far, by part. total = the sum of the
 * parts above it. Without LowRAM only `exact` is non-zero. */
typedef struct rk_kv_bytes {
    uint64_t exact;       /* plain K/V rows still resident: sinks + window (+ rows not yet compressed) */
    uint64_t coef;        /* key coefficients (and their int8 scales) */
    uint64_t bases;       /* per group: mean, dim weights (f32) and rank-r basis (f16) */
    uint64_t predictors;  /* per layer: W (r, kv_dim) (f16) and b (f32) */
    uint64_t residuals;   /* value residual rows (and scales) */
    uint64_t landmarks;   /* per chunk: mean key per layer, mean coefficients per group (f16);
                             open-chunk sums (f32) */
    uint64_t meta;        /* positions, residual masks/offsets, thresholds, RoPE table */
    uint64_t key_cache;   /* decode's cache of rebuilt keys: (budget/chunk + 2) chunks per
                             (layer, KV head), f16, with slot tags */
    uint64_t total;
    uint64_t f16_equiv;   /* plain f16 K/V of the same tokens, for ratios */
    uint64_t scratch;     /* transient buffers (not in total) */
    int64_t n_tokens, n_exact_rows, n_compressed_rows, n_evicted_rows;
} rk_kv_bytes;
void rk_session_kv_bytes(const rk_session *s, rk_kv_bytes *out);

/* What the last fit found (zeros before it). */
typedef struct rk_lowram_stats {
    bool fitted;
    int32_t n_group, rank_min, rank_max;
    double key_rel_err;       /* discarded / total centred key energy over the fit rows */
    double value_r2_mean;     /* mean over (layer, KV head) of the predictor's R² on the prompt */
    float value_r2[256][8];   /* per layer (first 256) and KV head (first 8) */
    int64_t n_resid_rows;     /* residual rows stored, all layers and heads */
    double seconds_fit;       /* end-of-prefill fit + first compression */
    double seconds_compress;  /* later blocks, total */
    uint64_t rows_rebuilt;    /* key rows rebuilt by attention, all layers and heads */
    uint64_t rows_attended;   /* rows attended (plain + rebuilt), all layers and heads */
    uint64_t lmk_scored;      /* chunk landmarks scored by decode's selection (per query step, layer and
                                 KV head), all layers and heads */
    uint64_t lmk_coarse;      /* coarse landmarks scored (coarse=) */
    /* per layer (first 256): the share of the last prompt queries' attention that a budget-sized
     * landmark selection of compressed chunks leaves out, mean over queries and KV heads,
     * measured at the fit (-1: not measured); the layers made full by it (full_layers) */
    float sel_miss[256];
    int32_t n_full, full_l[8];
} rk_lowram_stats;
void rk_session_lowram_stats(const rk_session *s, rk_lowram_stats *out);

/* The memory tiers' counters (rk_kv_params.budget; zeros without a budget). A "chunk" is
 * the K or the V rows of one layer over a fixed run of positions. */
typedef struct rk_kv_tier_stats {
    bool on;
    uint64_t budget, resident_bytes, spilled_bytes; /* resident: chunks kept in memory now
                                                       (hot and kept; not the ones read back);
                                                       spilled: in the store or being written */
    int32_t chunk_rows;
    uint64_t hits, misses;         /* chunks attention found in memory / read back */
    uint64_t bytes_read, bytes_read_stored; /* read back: raw, and as stored (zstd frames) */
    uint64_t bytes_spilled, bytes_spilled_stored;
    uint64_t prefetched;           /* of the misses, read ahead of their layer */
    double stall_s;                /* attention waiting for reads */
    double io_wait_s;              /* all waits in the block store */
    uint64_t spill_errors;         /* spills that failed (the chunk then stays in memory) */
    uint64_t sel_chunks, sel_repeat; /* lowram: chunks decode selected (after a first step), of
                                        them selected by the same (layer, head) the step before */
    char backend[16];              /* io_uring or threads */
    uint64_t fixed_bytes;          /* lowram: resident state that never moves (in resident_bytes) */
    uint64_t budget_peak;          /* lowram: most bytes of movable rows resident after a layer */
    /* devtier (host_budget): pinned host bytes held; the spill file's block reads / writes
     * and their raw bytes */
    uint64_t host_bytes, disk_reads, disk_writes, disk_bytes_read, disk_bytes_written;
    /* devtier, residency by chunk: the device frames of dev_chunk_rows rows (K and V) the
     * budget buys past the resident layers and the two slots (dev_chunk_bytes), the chunks
     * they hold now (the sinks' chunk and the newest of each cold layer), and the bytes copied
     * between them and the slots (device to device; not in bytes_read) */
    int32_t dev_chunk_rows;
    uint64_t dev_chunks, dev_chunk_bytes, bytes_dev;
} rk_kv_tier_stats;
void rk_session_kv_tier_stats(const rk_session *s, rk_kv_tier_stats *out);

