/* ridgekv's stable API (librk): models, tokenizer, sessions with their KV cache policy,
 * sampling, chat templates, RidgeFill. Research settings and diagnostics are in
 * rk_experimental.h, which may change in any release; this header changes only with the
 * major version (fields and functions are only added within one).
 *
 * Errors: every fallible call returns rk_status and fills *err (err may be NULL) with a
 * message that names what is wrong; out-params are written only on success. Nothing in
 * the library prints, reads the environment or exits: settings come in through params.
 *
 * Threads: a model (rk_model) is read-only once loaded and its RoPE set (rk_model_set_rope
 * comes before any session): any number of threads and sessions may use it at once. Ridge
 * maps (rk_ridge_maps) are read-only once loaded and are shared the same way. A session,
 * a sampler, a conversation (rk_gen.h) and a backend are each used by one thread at a time.
 * Sessions of one model may run at once on different threads when each has its own
 * backend; sessions that share a backend (rk_session_params.shared_backend) are used by one
 * thread at a time between them. Functions of no object (parsers, names, defaults,
 * rk_backend_cuda_module) may be called from any thread.
 *
 * Ownership: what a create / load / open call returns is owned by the caller and freed with
 * the matching destroy / close, which accepts NULL. A returned `const` pointer (hparams,
 * warnings, token ids, counters) is borrowed from the object it came from and lives as
 * long as that object, or less where its declaration says so. The *_name functions return
 * strings in static storage. Memory a call documents as malloc'd is the caller's, freed
 * with free(). Pointers a caller passes in are borrowed for the call, unless the
 * declaration says for how long (a session borrows its model, its shared backend and the
 * ridge maps of its fill params; a conversation its model and session). */
#pragma once
#include "rk_base.h"
#include "rk_research_fields.h"

/* ---- version ---------------------------------------------------------------- */
#define RK_VERSION_MAJOR 0
#define RK_VERSION_MINOR 1
#define RK_VERSION_PATCH 0
#define RK_VERSION_NUMBER (RK_VERSION_MAJOR * 10000 + RK_VERSION_MINOR * 100 + RK_VERSION_PATCH)
#define RK_VERSION_STRING_(a, b, c) #a "." #b "." #c
#define RK_VERSION_STRING_X_(a, b, c) RK_VERSION_STRING_(a, b, c)
#define RK_VERSION_STRING RK_VERSION_STRING_X_(RK_VERSION_MAJOR, RK_VERSION_MINOR, RK_VERSION_PATCH)
/* The version of the library linked (RK_VERSION_NUMBER's form; compare with the header's
 * to catch a mismatch), and as "MAJOR.MINOR.PATCH" (static storage). */
RK_API unsigned rk_version_number(void);
RK_API const char *rk_version_string(void);

/* ---- model --------------------------------------------------------------- */
typedef enum rk_arch { RK_ARCH_LLAMA, RK_ARCH_QWEN2, RK_ARCH_QWEN3 } rk_arch;

/* RoPE scaling, in llama.cpp's terms (its --rope-scaling, --rope-scale, --yarn-* flags). */
typedef enum rk_rope_scaling_type {
    RK_ROPE_SCALING_NONE = 0,
    RK_ROPE_SCALING_LINEAR = 1, /* positions divided by factor */
    RK_ROPE_SCALING_YARN = 2,   /* YaRN: high-frequency pairs kept, low ones interpolated, mscale */
} rk_rope_scaling_type;

typedef struct rk_rope_scaling {
    int32_t type;               /* rk_rope_scaling_type */
    float factor;               /* context multiplier: rope freq_scale = 1/factor (1 when none) */
    int32_t orig_ctx;           /* context of the unscaled model (YaRN's n_ctx_orig) */
    float ext_factor;           /* YaRN extrapolation mix: 1 for YaRN, 0 otherwise */
    float attn_factor;          /* magnitude multiplier (1) */
    float beta_fast, beta_slow; /* YaRN ramp ends (32, 1) */
} rk_rope_scaling;

typedef struct rk_hparams {
    rk_arch arch;
    char arch_name[16];
    int32_t n_vocab, n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int32_t n_ctx_train;
    int32_t n_rot;     /* rotated dims per head */
    int32_t rope_mode; /* rk_rope_mode */
    float rope_base;
    float rms_eps;
    bool tied_output;             /* logits use token_embd */
    bool has_qkv_bias;            /* qwen2 */
    bool has_qk_norm;             /* qwen3 */
    rk_rope_scaling rope_scaling; /* in effect: the GGUF's <arch>.rope.scaling.*, or rk_model_set_rope's */
} rk_hparams;

typedef struct rk_model rk_model;

/* How a model file is brought into memory. */
typedef struct rk_model_params {
    bool huge_pages; /* copy the weights onto transparent huge pages when the kernel offers them
                          and the copy takes at most half the available memory (faster decode:
                          fewer TLB misses); false: always a plain read-only mapping (default true) */
} rk_model_params;
RK_API rk_model_params rk_model_params_default(void);

/* Maps the GGUF read-only, validates it and binds every tensor the architecture
 * needs (shapes and types checked). The model owns the mapping. p may be NULL: the
 * defaults. rk_model_load is rk_model_load_with(path, NULL, ...). */
RK_API rk_status rk_model_load_with(const char *path, const rk_model_params *p, rk_model **out, rk_err *err);
RK_API rk_status rk_model_load(const char *path, rk_model **out, rk_err *err);
RK_API void rk_model_destroy(rk_model *m);
/* Borrowed, lives as long as m. */
RK_API const rk_hparams *rk_model_hparams(const rk_model *m);
/* Changes to the model's RoPE before sessions are created (llama.cpp's flags); a field left
 * at its "keep" value keeps the model's. */
typedef struct rk_rope_override {
    int32_t type;               /* rk_rope_scaling_type; -1: keep (with factor set: linear if none) */
    float factor;               /* --rope-scale; 0: keep */
    int32_t orig_ctx;           /* --yarn-orig-ctx; 0: keep (the GGUF's, else its context_length) */
    float freq_base;            /* --rope-freq-base; 0: keep */
    float ext_factor;           /* --yarn-ext-factor; < 0: 1 for YaRN, 0 otherwise */
    float attn_factor;          /* --yarn-attn-factor; 0: keep */
    float beta_fast, beta_slow; /* --yarn-beta-fast / --yarn-beta-slow; 0: keep */
} rk_rope_override;
RK_API rk_rope_override rk_rope_override_default(void);
/* Applies o (RK_E_INVALID_ARG naming the field when a value is out of range or scaling
 * lacks a factor). Call before creating sessions: they read the model's RoPE at creation. */
RK_API rk_status rk_model_set_rope(rk_model *m, const rk_rope_override *o, rk_err *err);
/* The longest context the model handles as configured: n_ctx_train, or orig_ctx * factor
 * when RoPE scaling is in effect (whichever is larger). */
RK_API int64_t rk_model_n_ctx_max(const rk_model *m);
RK_API const char *rk_rope_scaling_name(int32_t type); /* "none", "linear", "yarn" */
RK_API bool rk_rope_scaling_parse(const char *s, int32_t *type);
/* Bytes of all weight tensors (as stored). */
RK_API uint64_t rk_model_weight_bytes(const rk_model *m);
/* Model name from general.name, or the file name. Borrowed, lives as long as m. */
RK_API const char *rk_model_name(const rk_model *m);
/* The parsed GGUF (borrowed) for tools like `info`. */
RK_API const struct rk_gguf *rk_model_gguf(const rk_model *m);

/* ---- tokenizer (through the model) ---------------------------------------- */
/* *ids is malloc'd (caller frees). add_special adds BOS when the vocab asks for it;
 * parse_special turns special-token text (<|im_start|>) into its id. */
RK_API rk_status rk_model_tokenize(const rk_model *m, const char *text, size_t len, bool add_special,
                                   bool parse_special, int32_t **ids, size_t *n_ids, rk_err *err);
/* Bytes of one token as a streaming printer shows them; returns the length and writes
 * buf only when that fits in cap (no NUL). Special tokens give "" unless render_special.
 * A piece may end inside a UTF-8 character: buffer before printing. */
RK_API size_t rk_model_token_piece(const rk_model *m, int32_t id, bool render_special, char *buf, size_t cap);
RK_API bool rk_model_token_is_eog(const rk_model *m, int32_t id);
RK_API int32_t rk_model_token_bos(const rk_model *m);
/* True when the vocab asks for BOS at the start of a sequence (tokenizer.ggml.add_bos_token). */
RK_API bool rk_model_add_bos(const rk_model *m);

/* ---- LowRAM: asymmetric KV compression at decode (SPEC §3) ----------------------
 * At the end of the first eval call that leaves enough rows, the codec fits (on the
 * prompt's own keys) a low-rank basis of the pre-RoPE keys of adjacent layers and, per
 * layer, a ridge predictor of the values from the rebuilt keys; the hardest rows keep an
 * int4 value residual. Sinks and a recent window stay exact; older rows live only
 * compressed. Decode attention rebuilds the chunks of rows whose landmark (mean key)
 * scores highest for the query, within a row budget. docs/LOWRAM.md has the costs.
 *
 * Start from rk_lowram_params_default(). The fields below are the stable choices; the
 * struct also stores research settings (rk_research_fields.h), which are set by key with
 * rk_lowram_params_set (rk_experimental.h), bounds checked. */
typedef struct rk_lowram_params {
    float ratio;          /* target compression of the compressed rows against f16 (default 6; 0: the
                             default): sets the basis rank */
    int32_t n_threads;    /* codec threads (0: the session's) */
    char predictor[1024]; /* a predictor file from `ridgekv calibrate --lowram` (offline basis and value
                             predictor, checked against the model) or "": fitted on the prompt */
    RK_LOWRAM_RESEARCH_FIELDS
} rk_lowram_params;

RK_API rk_lowram_params rk_lowram_params_default(void);
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
    rk_lowram_params lowram; /* used when kind == RK_KV_LOWRAM */
    /* Memory tiers (docs/TIERS.md), f16 / f32 / q8 / lowram: at most budget bytes of K/V
     * rows stay in memory (the sink chunk and the recent window always do); the other
     * chunks spill to an unlinked file in spill_dir (NULL: /tmp) and are read back when
     * attention needs them. 0: all in memory. Results are bit-identical to the
     * all-in-memory cache. Not part of the policy's spec (rk_kv_params_format) or of its KV
     * blocks. How the spill file is written and how a LowRAM budget is counted are research
     * settings (rk_kv_params_set, rk_experimental.h). */
    uint64_t budget;
    const char *spill_dir; /* borrowed for rk_session_create */
    RK_KV_RESEARCH_FIELDS
    /* The GPU KV tiers (a backend with memory of its own, f16 / f32 under budget:
     * runtime/kv/kv_dev.c): pinned host bytes for the cold layers' rows. 0: every cold
     * layer pinned. Else the cold layers past it go on to a spill file in spill_dir (the
     * block store; spill_backend, spill_buffered apply) and are read back when used. */
    uint64_t host_budget;
} rk_kv_params;

RK_API rk_kv_params rk_kv_params_default(void);   /* f16; lowram = rk_lowram_params_default() */
RK_API const char *rk_kv_kind_name(rk_kv_kind k); /* "f16", "f32", "q8", "lowram", "q4" */
/* Parses "f16", "f32", "q8", "q4" or "lowram[:opts]" (opts: ratio=R, threads=N, pred=FILE and
 * the research keys of rk_lowram_params_set, comma-separated, pred last) into *out,
 * which is written only on success. RK_E_INVALID_ARG names what is wrong. */
RK_API rk_status rk_kv_params_parse(const char *spec, rk_kv_params *out, rk_err *err);
/* Writes the canonical spec of p ("f16", "lowram:rank=64,...") into buf (cap bytes). */
RK_API void rk_kv_params_format(const rk_kv_params *p, char *buf, size_t cap);

/* ---- session: one sequence with its KV cache ------------------------------- */
typedef enum rk_backend_kind { RK_BACKEND_CPU, RK_BACKEND_CPU_REF, RK_BACKEND_CUDA } rk_backend_kind;
RK_API const char *rk_backend_kind_name(rk_backend_kind k); /* "cpu", "cpu_ref", "cuda" */
RK_API bool rk_backend_kind_parse(const char *s, rk_backend_kind *out);

/* A compute backend (kernels' op table + its memory, pool, handles). Sessions create their
 * own unless given one to share: one backend (one thread pool) per process is the rule
 * for programs that hold several sessions. */
typedef struct rk_backend rk_backend;
/* RK_E_UNSUPPORTED with the reason ("cuda: not built ...", "cuda: no device ...").
 * n_threads <= 0: all cores (cpu). */
RK_API rk_status rk_backend_open(rk_backend_kind kind, int n_threads, rk_backend **out, rk_err *err);
RK_API void rk_backend_close(rk_backend *be); /* accepts NULL */
/* Names the CUDA backend module file (libridgekv-cuda.so) that the first cuda backend of the
 * process loads, instead of looking beside the executable, in the build tree and in the
 * install tree. The module is loaded once per process: RK_E_INVALID_ARG when it was already
 * looked up from another file. path is copied. A build without CUDA accepts any path. */
RK_API rk_status rk_backend_cuda_module(const char *path, rk_err *err);

typedef struct rk_session_params {
    int32_t n_ctx;     /* 0: the model's training context; above rk_model_n_ctx_max: RK_E_CONTEXT
                             unless ctx_overflow_ok */
    int32_t n_threads; /* 0: all cores */
    int32_t n_batch;   /* prefill chunk in tokens; 0: 512 */
    rk_kv_params kv;   /* KV policy, fixed for the session's life (default f16) */
    rk_backend_kind backend;
    rk_backend *shared_backend; /* borrowed (outlives the session); NULL: own backend of `backend` kind */
    bool ctx_overflow_ok;       /* accept n_ctx past what the model was trained for (rk_session_warning says so) */
    bool cuda_graphs;           /* run each decode step as one recorded unit where the backend records steps
                             (CUDA graphs) and the KV policy allows it (f16 / f32 without a budget);
                             default false: opt-in while they have only run on a simulated device */
} rk_session_params;

RK_API rk_session_params rk_session_params_default(void);

typedef struct rk_session rk_session;

/* The session borrows m, which must outlive it. */
RK_API rk_status rk_session_create(const rk_model *m, const rk_session_params *p, rk_session **out, rk_err *err);
RK_API void rk_session_destroy(rk_session *s);
/* Appends n tokens at the current position and runs them through the model in chunks.
 * logits: NULL, or n_vocab floats for the last token (all_rows false), or n * n_vocab
 * floats, row i predicting the token after ids[i] (all_rows true).
 * RK_E_CONTEXT (nothing changed) when the tokens do not fit the context. */
RK_API rk_status rk_session_eval(rk_session *s, const int32_t *ids, size_t n, float *logits, bool all_rows,
                                 rk_err *err);
RK_API void rk_session_reset(rk_session *s);
RK_API int64_t rk_session_n_past(const rk_session *s);
RK_API int64_t rk_session_n_ctx(const rk_session *s);
/* Bytes of KV cache state per token (all layers, K and V) and in total as allocated. */
RK_API uint64_t rk_session_kv_bytes_per_token(const rk_session *s);
/* Optional progress callback, called after each prefill chunk of rk_session_eval with
 * (tokens done, tokens total). Returning false cancels: eval returns RK_E_CANCELLED and
 * the session is as it was before that eval call. */
typedef bool (*rk_progress_fn)(void *ud, int64_t done, int64_t total);
RK_API void rk_session_set_progress(rk_session *s, rk_progress_fn fn, void *ud);
/* Forgets every token from position n on (n <= n_past): the next eval continues at n. */
RK_API rk_status rk_session_truncate(rk_session *s, int64_t n, rk_err *err);
/* The token ids evaluated so far (n_past of them). Borrowed; valid until the next eval,
 * truncate or reset. */
RK_API const int32_t *rk_session_tokens(const rk_session *s);
/* Exports cache rows [row0, row1) of every layer as one self-describing block (*blk
 * malloc'd, *n bytes): a header (magic, format version, KV policy, model fingerprint,
 * row range, the token ids of those rows, a checksum) and the policy's own encoding
 * (plain rows, q8 blocks, or LowRAM's compressed rows). For the document cache, chat's
 * /save and the spill tier. */
RK_API rk_status rk_session_kv_export(const rk_session *s, int64_t row0, int64_t row1, void **blk, size_t *n,
                                      rk_err *err);
/* Appends the rows of a block made by rk_session_kv_export (same model, same KV policy)
 * at n_past, which must equal the block's row0; the block's token ids become the
 * session's. A truncated, corrupt or foreign block gives RK_E_FORMAT / RK_E_MISMATCH
 * naming what is wrong, and the session is unchanged. LowRAM exports and imports its
 * whole state only (rows [0, n_past) into a session at n_past 0); other ranges give
 * RK_E_UNSUPPORTED. */
RK_API rk_status rk_session_kv_import(rk_session *s, const void *blk, size_t n, rk_err *err);

/* ---- sampling ------------------------------------------------------------- */
typedef struct rk_sampler_params {
    float temp;            /* <= 0: greedy (argmax, ties to the lowest id) */
    int32_t top_k;         /* <= 0: off */
    float top_p;           /* >= 1: off */
    float min_p;           /* <= 0: off */
    float repeat_penalty;  /* 1: off */
    int32_t repeat_last_n; /* tokens of history the penalties look at (repeat, frequency, presence) */
    uint64_t seed;
    float frequency_penalty; /* logit -= count * f for each id seen count times in the window; 0: off */
    float presence_penalty;  /* logit -= p for each id seen in the window; 0: off */
    /* DRY (llama.cpp's "don't repeat yourself"): when the history ends with a sequence that
     * occurred before, the token that followed it then loses
     * dry_multiplier * dry_base^(len - dry_allowed_length), len the repeated length (at least
     * dry_allowed_length); a match never extends across a sequence-breaker token
     * (rk_sampler_set_dry_breakers). */
    float dry_multiplier;       /* 0: off */
    float dry_base;             /* > 1 */
    int32_t dry_allowed_length; /* repeats shorter than this go free */
    int32_t dry_penalty_last_n; /* tokens of history DRY looks at; -1: all of it */
    bool penalize_prompt;       /* rk_generate: the penalties also see the prompt (false: only the
                                   generated tokens, so copying from a document is not penalised) */
} rk_sampler_params;

/* temp 0.8, top-k 40, top-p 0.95, min-p 0.05 (llama.cpp's); repeat penalty 1 (off) over 64
 * tokens; frequency and presence 0; DRY on: multiplier 0.8, base 1.75, allowed length 2,
 * the whole answer; the penalties see the answer only. */
RK_API rk_sampler_params rk_sampler_params_default(void);

typedef struct rk_sampler rk_sampler;
RK_API rk_status rk_sampler_create(const rk_sampler_params *p, int32_t n_vocab, rk_sampler **out, rk_err *err);
RK_API void rk_sampler_destroy(rk_sampler *s);
/* Picks a token from logits (modified in place by the penalty). history: earlier ids. */
RK_API int32_t rk_sampler_sample(rk_sampler *s, float *logits, const int32_t *history, size_t n_history);

/* ---- chat templates ---------------------------------------------------------- */
typedef enum rk_chat_family {
    RK_CHAT_CHATML, /* <|im_start|>role\n...<|im_end|>\n : Qwen, SmolLM, fallback */
    RK_CHAT_LLAMA3, /* <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|> */
    RK_CHAT_LLAMA2, /* [INST] <<SYS>>...<</SYS>> ... [/INST] */
    RK_CHAT_ZEPHYR, /* <|role|>\n...</s>\n */
} rk_chat_family;

typedef struct rk_chat_msg {
    const char *role; /* "system", "user", "assistant" */
    const char *content;
} rk_chat_msg;

/* Family recognised from the GGUF's tokenizer.chat_template (ChatML when absent or unknown). */
RK_API rk_chat_family rk_model_chat_family(const rk_model *m);
RK_API const char *rk_chat_family_name(rk_chat_family f);
/* Formats messages into *out (malloc'd, NUL-terminated). add_assistant opens the
 * assistant turn for generation. The text contains special-token markup: tokenize
 * it with parse_special = true. */
RK_API rk_status rk_chat_format(rk_chat_family f, const rk_chat_msg *msgs, size_t n, bool add_assistant, char **out,
                                rk_err *err);
/* The system prompt the model's template inserts when a conversation does not start with
 * one ("" when it inserts none): Qwen2.5 "You are Qwen, created by Alibaba Cloud. You are a
 * helpful assistant.", SmolLM2 "You are a helpful AI assistant named SmolLM, trained by
 * Hugging Face". Recognised in ChatML templates as a literal system turn (not built from
 * messages[0]). Borrowed, lives as long as m. */
RK_API const char *rk_model_chat_default_system(const rk_model *m);
/* rk_chat_format with the model's family and rules: the default system prompt goes first
 * when msgs (n > 0) does not start with a system message, as the template does. */
RK_API rk_status rk_model_chat_format(const rk_model *m, const rk_chat_msg *msgs, size_t n, bool add_assistant,
                                      char **out, rk_err *err);

/* ---- RidgeFill (SPEC §2) ------------------------------------------------------
 * Layers below the split run exactly for every prompt row. For a bulk row (a prompt
 * row with at least `tail` prompt tokens after it in the same eval call) each late
 * layer l >= split gets its input predicted from the split stream, x̂_l = W_l x_S + b_l,
 * and runs only the cache writers (attention norm, K/V projection, k-norm, RoPE, cache
 * write). Tail rows, kept rows and decode steps run exactly. */
typedef enum rk_fill_mode {
    RK_FILL_OFF = 0,
    RK_FILL_SPEED,    /* every bulk row filled */
    RK_FILL_QUALITY,  /* sinks + the rows the question attends to stay exact (question-aware) */
    RK_FILL_IDENTITY, /* W_l = I, b_l = 0: the training-free baseline */
    RK_FILL_PLUMB,    /* the fill path fed exact inputs: must equal OFF (oracle test) */
} rk_fill_mode;

RK_API const char *rk_fill_mode_name(rk_fill_mode m);
/* Parses "off|speed|quality|identity|plumb"; false when unknown. */
RK_API bool rk_fill_mode_parse(const char *s, rk_fill_mode *out);
/* The exact tail a mode gets when rk_fill_params.tail is 0: 1536 for speed (the tail where
 * its ΔNLL and TTFT targets both held, docs/RIDGEFILL.md), 2048 for every other mode. */
RK_API int32_t rk_fill_default_tail(rk_fill_mode m);
/* The group (rk_fill_params.group) a mode gets by default: 16 for speed and quality (late
 * layers attend to runs of up to 16 filled rows as one row; docs/RIDGEFILL.md), 0
 * (ungrouped) for identity and plumb. */
RK_API int32_t rk_fill_default_group(rk_fill_mode m);

typedef struct rk_ridge_maps rk_ridge_maps;

/* Maps a ridge-map file read-only and checks it against m: a file fitted on another
 * model is refused (RK_E_MISMATCH naming both); the same weights in another
 * quantisation give RK_OK with a note in warning (empty when none). */
RK_API rk_status rk_ridge_maps_load(const char *path, const rk_model *m, rk_ridge_maps **out, char *warning,
                                    size_t warning_cap, rk_err *err);
RK_API void rk_ridge_maps_destroy(rk_ridge_maps *r);
RK_API int32_t rk_ridge_maps_split(const rk_ridge_maps *r);

/* ---- Sparse attention of long prefills (docs/RIDGEFILL.md, "Sparse attention") -----------
 * The prompt rows that run full attention (every row below the RidgeFill split, the exact
 * rows of late layers, every row of an exact prefill) attend, per query head, only to the key
 * blocks that head's vertical (same key) and slash (same distance) lines select: lines are
 * estimated per chunk from the last n_est rows' exact attention, picked until they cover
 * `mass` of it (a calibration file gives each layer and head its own mass), and the first
 * n_sink rows and the `window` rows before each block are always attended. Calls whose keys
 * are fewer than min_kv, the last `tail` rows of an eval call, and decode steps attend
 * densely, bit for bit as with sparse off. CPU backends only (a device session ignores it);
 * not with RidgeFill's grouped late layers (rk_fill_params.group), which are already short. */
typedef struct rk_sparse_calib rk_sparse_calib;
typedef struct rk_sparse_params {
    bool on;                      /* false: exact attention (the default of a zeroed struct) */
    int32_t min_kv;               /* keys a chunk's last row must see before it goes sparse; 0: 8192 */
    float mass;                   /* attention mass the lines keep, (0, 1]; 0: 0.95 (or the calibration's) */
    int32_t n_sink;               /* first rows every query sees; 0: 64 */
    int32_t window;               /* rows before each query block every query sees; 0: 1024 */
    int32_t tail;                 /* last rows of an eval call attending densely; 0: 512, < 0: none */
    int32_t block;                /* rows of a query or key block; 0: 64 */
    int32_t n_est;                /* last rows of a chunk that estimate the lines; 0: 64 */
    const rk_sparse_calib *calib; /* borrowed per-head masses, or NULL; must outlive its use */
} rk_sparse_params;
/* The recommended setting for long documents: on, every other field 0 (its default above). */
RK_API rk_sparse_params rk_sparse_params_default(void);
/* Parses "off", "on", or "on:key=value:..." with keys min, mass, sinks, window, tail, block,
 * est over *p (calib untouched); RK_E_INVALID_ARG naming the key, its range or the item. */
RK_API rk_status rk_sparse_params_parse(const char *spec, rk_sparse_params *p, rk_err *err);
/* Maps a calibration file (ridgekv prepare --sparse) and checks it against m: another
 * model's file is refused (RK_E_MISMATCH), as is one with out-of-range or NaN masses
 * (RK_E_FORMAT); another quantisation of the same weights only fills warning. */
RK_API rk_status rk_sparse_calib_load(const char *path, const rk_model *m, rk_sparse_calib **out, char *warning,
                                      size_t warning_cap, rk_err *err);
RK_API void rk_sparse_calib_destroy(rk_sparse_calib *c);
/* The mass a layer's head keeps (the file's), or -1 outside the model. */
RK_API float rk_sparse_calib_mass(const rk_sparse_calib *c, int layer, int head);
/* Sparse attention's work since the session was created: calls (or parts of them) that ran
 * sparse and dense, and of the sparse parts' causal (query block, head, key block) triples
 * how many were computed. */
typedef struct rk_sparse_stats {
    uint64_t calls_sparse, calls_dense, blocks_done, blocks_causal;
} rk_sparse_stats;
RK_API void rk_session_sparse_stats(const rk_session *s, rk_sparse_stats *out);

/* Start from rk_fill_params_default(). The fields below are the stable choices; the research
 * settings (rk_research_fields.h) are set by key with rk_fill_params_set (rk_experimental.h). */
typedef struct rk_fill_params {
    rk_fill_mode mode;
    int32_t tail;              /* exact tail T; 0: rk_fill_default_tail(mode) (at least 1) */
    const rk_ridge_maps *maps; /* borrowed: must outlive the session or its next rk_session_set_fill;
                                  required for speed and quality */
    float keep_share;          /* quality: share of bulk rows kept exact by score (< 0: the map
                                  file's default, else 0.1) */
    RK_FILL_RESEARCH_FIELDS
    rk_sparse_params sparse; /* sparse attention of the full-attention rows (any mode, off too);
                                rk_fill_params_default() leaves it off */
} rk_fill_params;
/* The product's fill (what ridgekv ask, chat and serve use with maps): quality mode, the
 * mode's default tail, grouped attention in runs of rk_fill_default_group(RK_FILL_QUALITY),
 * keep_share from the map file (-1), every other field 0 (its documented default). maps is
 * NULL: set it (speed and quality need maps), or set mode to RK_FILL_OFF. A session never
 * given rk_session_set_fill prefills exactly (RK_FILL_OFF). */
RK_API rk_fill_params rk_fill_params_default(void);

/* Applies to the following rk_session_eval calls. */
RK_API rk_status rk_session_set_fill(rk_session *s, const rk_fill_params *p, rk_err *err);

/* Work counters since the session was created (tests and eval use them). */
typedef struct rk_session_counters {
    /* decode steps run as one recorded unit (rk_session_params.cuda_graphs on a backend that
     * records steps: CUDA graphs), and those whose recording failed and ran again unrecorded */
    uint64_t graph_steps, graph_fallbacks;
    /* --kv lowram on a device backend: attention calls of the fused device op (LR_ATTN) and of
     * the codec on the host (prefill, options the op lacks) */
    uint64_t lowram_dev_attn, lowram_host_attn;
} rk_session_counters;
RK_API const rk_session_counters *rk_session_get_counters(const rk_session *s);
/* Rows of layer `layer` since the session was created: *exact those that ran
 * Q/attention/O/MLP, *filled those whose K/V came from a predicted input (either pointer may
 * be NULL). A layer outside [0, n_layer) gives zeros. */
RK_API void rk_session_layer_rows(const rk_session *s, int layer, uint64_t *exact, uint64_t *filled);
/* Of rows [row0, row0 + n), how many the last question-aware selection kept exact (sinks
 * included; rows outside its bulk region are not counted); -1 when no eval call of this
 * session has made a selection. Eval uses it to say whether a needle was kept. */
RK_API int64_t rk_session_fill_kept(const rk_session *s, int64_t row0, int64_t n);
/* Re-scoring: a question-aware call keeps its bulk rows' split stream
 * (f16). A later eval call of >= 2 rows with no bulk rows of its own (the question after a
 * document, also one loaded from the document cache) runs layers 0..S-1 over its rows,
 * scores the kept rows by its last `obs` rows, and, from the first row whose status
 * changes, recomputes the newly selected rows exactly through the late layers and gives
 * dropped ones their predicted K/V again: the cache then holds what that selection would
 * have made of the kept rows. Plain f16/f32/q8 caches without a budget only. The stream is
 * what the document cache keeps beside a document's KV rows (rk_doc_stream_save). */
/* The kept stream (borrowed; valid until the next eval, truncate or set), or false. */
typedef struct rk_fill_stream {
    int64_t row0, n; /* bulk rows [row0, row0 + n) */
    int32_t n_embd, split;
    const uint16_t *x;   /* (n, n_embd) f16 split stream */
    const float *base;   /* (n) baseline attention per query row */
    const uint8_t *keep; /* (n) the selection the cache holds */
} rk_fill_stream;
RK_API bool rk_session_fill_stream(const rk_session *s, rk_fill_stream *out);
/* Copies a stream in (document cache load): rows must lie in [0, n_past), n_embd match. */
RK_API rk_status rk_session_fill_stream_set(rk_session *s, const rk_fill_stream *in, rk_err *err);

/* Model fingerprint: architecture, shapes, tokenizer hash and a hash of selected
 * weight tensors (hex string, 16 chars each part). */
typedef struct rk_fingerprint {
    char arch[16];
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_ff, n_vocab;
    uint64_t tokenizer_hash;
    uint64_t weights_hash; /* of norm weights (quantisation independent) */
    uint64_t quant_hash;   /* of the raw bytes of selected matrices (quantisation dependent) */
} rk_fingerprint;
RK_API void rk_model_fingerprint(const rk_model *m, rk_fingerprint *out);

/* A note from session creation (a predictor file fitted on another quantisation of the
 * same weights, ...), or "". Borrowed, lives as long as s. */
RK_API const char *rk_session_warning(const rk_session *s);

/* Bytes that hold the KV state of the tokens so far, by part. total = the sum of the
 * parts above it. Without LowRAM only `exact` is non-zero. */
typedef struct rk_kv_bytes {
    uint64_t exact;      /* plain K/V rows still resident: sinks + window (+ rows not yet compressed) */
    uint64_t coef;       /* key coefficients (and their int8 scales) */
    uint64_t bases;      /* per group: mean, dim weights (f32) and rank-r basis (f16) */
    uint64_t predictors; /* per layer: W (r, kv_dim) (f16) and b (f32) */
    uint64_t residuals;  /* value residual rows (and scales) */
    uint64_t landmarks;  /* per chunk: mean key per layer, mean coefficients per group (f16);
                             open-chunk sums (f32) */
    uint64_t meta;       /* positions, residual masks/offsets, thresholds, RoPE table */
    uint64_t key_cache;  /* decode's cache of rebuilt keys: (budget/chunk + 2) chunks per
                             (layer, KV head), f16, with slot tags */
    uint64_t total;
    uint64_t f16_equiv; /* plain f16 K/V of the same tokens, for ratios */
    uint64_t scratch;   /* transient buffers (not in total) */
    int64_t n_tokens, n_exact_rows, n_compressed_rows, n_evicted_rows;
} rk_kv_bytes;
RK_API void rk_session_kv_bytes(const rk_session *s, rk_kv_bytes *out);

/* The memory tiers' counters (rk_kv_params.budget; zeros without a budget). A "chunk" is
 * the K or the V rows of one layer over a fixed run of positions. */
typedef struct rk_kv_tier_stats {
    bool on;
    uint64_t budget, resident_bytes, spilled_bytes; /* resident: chunks kept in memory now
                                                       (hot and kept; not the ones read back);
                                                       spilled: in the store or being written */
    int32_t chunk_rows;
    uint64_t hits, misses;                  /* chunks attention found in memory / read back */
    uint64_t bytes_read, bytes_read_stored; /* read back: raw, and as stored (zstd frames) */
    uint64_t bytes_spilled, bytes_spilled_stored;
    uint64_t prefetched;             /* of the misses, read ahead of their layer */
    double stall_s;                  /* attention waiting for reads */
    double io_wait_s;                /* all waits in the block store */
    uint64_t spill_errors;           /* spills that failed (the chunk then stays in memory, over the
                                        budget: the budget is not kept) */
    char spill_error[160];           /* the first failed spill's reason ("" while none failed) */
    uint64_t resident_peak;          /* most bytes of rows held in memory at the end of an eval's
                                        layer pass (f16 / f32 / q8 tiers; lowram: budget_peak) */
    uint64_t sel_chunks, sel_repeat; /* lowram: chunks decode selected (after a first step), of
                                        them selected by the same (layer, head) the step before */
    char backend[16];                /* io_uring or threads */
    uint64_t fixed_bytes;            /* lowram: resident state that never moves (in resident_bytes) */
    uint64_t budget_peak;            /* lowram: most bytes of movable rows resident after a layer */
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
RK_API void rk_session_kv_tier_stats(const rk_session *s, rk_kv_tier_stats *out);
