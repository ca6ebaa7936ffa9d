/* ridgekv public API (librk). Opaque types; every fallible call returns rk_status
 * and fills rk_err (may be NULL). Nothing here prints, reads the environment or exits. */
#pragma once
#include "rk_base.h"

/* ---- model --------------------------------------------------------------- */
typedef enum rk_arch { RK_ARCH_LLAMA, RK_ARCH_QWEN2, RK_ARCH_QWEN3 } rk_arch;

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
} rk_hparams;

typedef struct rk_model rk_model;

/* Maps the GGUF read-only, validates it and binds every tensor the architecture
 * needs (shapes and types checked). The model owns the mapping. */
rk_status rk_model_load(const char *path, rk_model **out, rk_err *err);
void rk_model_destroy(rk_model *m);
const rk_hparams *rk_model_hparams(const rk_model *m);
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

/* ---- session: one sequence with its KV cache ------------------------------- */
typedef enum rk_backend_kind { RK_BACKEND_CPU, RK_BACKEND_CPU_REF } rk_backend_kind;

typedef struct rk_session_params {
    int32_t n_ctx;        /* 0: the model's training context */
    int32_t n_threads;    /* 0: all cores */
    int32_t n_batch;      /* prefill chunk in tokens; 0: 512 */
    uint32_t kv_type;     /* RK_DT_F16 (default when 0 is passed... use rk_session_params_default) or RK_DT_F32 */
    rk_backend_kind backend;
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
/* Optional progress callback during eval (tokens done, tokens total). */
void rk_session_set_progress(rk_session *s, void (*fn)(void *ud, int64_t done, int64_t total),
                             void *ud);

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
