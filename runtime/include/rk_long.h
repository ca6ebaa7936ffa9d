/* Long prompts without flags: what a prompt of a given length needs from the model's RoPE,
 * the KV policy and the KV budget (runtime/defaults.c). The CLI's ask, run, chat, serve
 * and bench --fill default all take their defaults from rk_long_defaults; the caller reports
 * the outcome and applies it (rk_model_set_rope before sessions, rk_session_params). */
#pragma once
#include "rk.h"

/* Prompts of at least this many tokens get q8 KV by default (when no --kv was given):
 * llama.cpp's q8_0 KV stores 1.88x fewer bytes than f16 for a KL of 0.0035 (docs/KV.md),
 * and from 16K tokens on the KV is no longer small beside the weights (Qwen2.5-1.5B: 448
 * MiB of f16 KV at 16K, 2.7 GiB at 100K, against 1.1 GB of weights). */
#define RK_LONG_Q8_MIN_TOKENS 16384
#define RK_LONG_SPARSE_BATCH 1024

typedef enum rk_long_rope {
    RK_LONG_ROPE_NONE = 0, /* the prompt fits the trained context: the RoPE stays as it is */
    RK_LONG_ROPE_APPLY,    /* the documented scaling (rope below) is needed: apply it */
    RK_LONG_ROPE_FILE,     /* needed, and the GGUF's own scaling is already in effect */
    RK_LONG_ROPE_FLAGS,    /* needed, and the caller's explicit RoPE flags cover it */
    RK_LONG_ROPE_TOO_LONG, /* the prompt (or -c) exceeds what any scaling in reach allows: refuse */
} rk_long_rope;

typedef enum rk_long_kv_why {
    RK_LONG_KV_DEFAULT = 0, /* short prompt: the session's default (f16) */
    RK_LONG_KV_EXPLICIT,    /* the caller chose the policy (--kv) */
    RK_LONG_KV_LONG,        /* q8: the prompt has RK_LONG_Q8_MIN_TOKENS tokens or more */
    RK_LONG_KV_MEMORY,      /* q8: f16 rows would take more than half the free memory */
} rk_long_kv_why;

typedef struct rk_long_request {
    int64_t n_prompt;           /* prompt tokens; 0: not known yet (chat, serve) */
    int64_t n_rows;             /* rows the session should hold: prompt + answer room; 0: n_prompt. Past the
                                   trained context they turn scaling on; the context is capped at the
                                   scaled limit, and only a prompt (or -c) past it is refused */
    int32_t n_ctx;              /* -c as given (0: none): kept when it holds n_rows */
    uint64_t free_bytes;        /* memory available now (MemAvailable); 0: unknown (no budget, no memory rule) */
    rk_rope_scaling documented; /* the model's documented scaling (type, factor; orig_ctx 0: n_ctx_train) when
                                   its file carries none (type NONE: none known) */
    bool rope_explicit;         /* RoPE flags were given: the model's RoPE is left as they set it */
    bool kv_explicit;           /* --kv was given */
    rk_kv_kind kv_kind;         /* with kv_explicit: its kind */
    bool budget_explicit;       /* --kv-budget was given */
    bool overflow_ok;           /* --ctx-overflow-ok: a context past the trained one without scaling */
    bool exact;                 /* the exact reference (bench --fill off): only what the length needs, i.e. the
                                   RoPE scaling; f16 KV (whatever kv_explicit says), no budget, no sparse
                                   attention */
} rk_long_request;

typedef struct rk_long_defaults {
    rk_long_rope rope;         /* what the RoPE needs */
    rk_rope_override rope_set; /* with RK_LONG_ROPE_APPLY: pass to rk_model_set_rope */
    int64_t n_ctx_train;       /* the model's trained context */
    int64_t n_ctx_max;         /* with the scaling decided here (or in effect) */
    int64_t n_rows;            /* rows needed (the request's, or n_prompt) */
    int32_t n_ctx;             /* the session's context: -c, 0 (the model's), or past the trained context the
                                 rows rounded up to 256, at most n_ctx_max */
    rk_kv_kind kv;             /* the KV policy's kind (the request's with kv_explicit) */
    rk_long_kv_why kv_why;
    uint64_t kv_budget;    /* bytes of KV to keep in memory (the rest spills): set only when the rows in
                                 the chosen kind would take more than 3/4 of the free memory, to half of it;
                                 0: no budget */
    uint64_t kv_f16_bytes; /* f16 KV of n_rows rows */
    uint64_t kv_bytes;     /* KV of n_rows rows in the chosen kind (before the budget) */
    /* The sparse prefill attention of the default: 1 from 8192 prompt tokens, else 0 = dense. rk_long_defaults
     * sets it in one place (defaults.c, sparse_default); the exact request never sets it. */
    int32_t sparse;
    /* The prefill chunk (rk_session_params.n_batch) of the default: RK_LONG_SPARSE_BATCH rows with
     * sparse attention (each chunk estimates its heads' lines once, over every key, so longer
     * chunks pay it less often), else 0 = the session's. The caller's -b wins. */
    int32_t n_batch;
} rk_long_defaults;

/* Fills *out for a prompt of r->n_prompt tokens (r->n_rows rows) on m as it is now (its
 * RoPE as loaded and as the caller's flags set it). Never fails for a long prompt: a
 * prompt past every limit gets RK_LONG_ROPE_TOO_LONG, for the caller to refuse with the
 * numbers. RK_E_INVALID_ARG for a NULL argument, negative counts or a documented scaling
 * with a factor below 1. */
rk_status rk_long_defaults_get(const rk_model *m, const rk_long_request *r, rk_long_defaults *out, rk_err *err);
/* KV bytes of n_rows rows of m in kind (f16, f32, q8, q4; lowram: f16's). */
uint64_t rk_long_kv_bytes(const rk_model *m, rk_kv_kind kind, int64_t n_rows);
