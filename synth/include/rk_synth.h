/* Synthetic models: a random-weight GGUF of a named real shape (tensor names,
 * shapes and metadata as the loader expects them) with a small valid
 * SentencePiece-style tokenizer, so that benchmarks and device checks run
 * anywhere without downloading a model. The weights are random blocks whose
 * dequantised values have mean 0 and standard deviation ~ gain / sqrt(fan_in):
 * activations stay finite through every layer, logits are well spread. The
 * text such a model writes is noise; its cost per token is the real model's. */
#pragma once
#include "rk_base.h"

typedef struct rk_synth_params {
    const char *shape; /* smollm2-135m, qwen2.5-1.5b, qwen3-0.6b, llama-3.2-1b */
    const char *type;  /* f32 f16 bf16 q8_0 q4_0 q4_1 q4_k q6_k q4_k_m */
    int64_t n_vocab;   /* 0: the real model's vocabulary size; else >= RK_SYNTH_MIN_VOCAB */
    int n_layer;       /* 0: the real model's layer count; else 1 .. that count */
    uint64_t seed;     /* same params + seed -> same bytes */
} rk_synth_params;

#define RK_SYNTH_MIN_VOCAB 320 /* 3 specials + 256 byte tokens + a few pieces */

typedef struct rk_synth_shape {
    const char *name, *arch;
    int n_embd, n_layer, n_head, n_head_kv, head_dim, n_ff;
    int64_t n_vocab, n_ctx;
    float rope_base, rms_eps;
} rk_synth_shape;

/* The known shapes, NULL-name terminated. */
const rk_synth_shape *rk_synth_shapes(void);
/* Comma-separated shape names / type names, for usage text and errors. */
const char *rk_synth_shape_names(void);
const char *rk_synth_type_names(void);

/* Tensor type a tensor of row length ne0 gets under `type` (q4_k_m: q6_k for
 * token_embd, attn_v and ffn_down on llama.cpp's use_more_bits layers, q4_k
 * elsewhere); a K type on a row that is not whole 256-blocks falls back to
 * q4_1 (q4_k) or q8_0 (q6_k), as llama.cpp falls back for such rows. Returns
 * false for an unknown type name. */
bool rk_synth_tensor_type(const char *type, const char *tensor, int layer, int n_layer, int64_t ne0, uint32_t *out);

/* The whole file in memory (malloc'd, caller frees). RK_E_INVALID_ARG names
 * the bad parameter (unknown shape / type, vocab or layers out of range). */
rk_status rk_synth_build(const rk_synth_params *p, void **bytes, size_t *len, rk_err *err);
/* rk_synth_build, then written atomically (temp file + rename: an existing
 * file is replaced whole or not at all; a full disk is RK_E_IO naming path). */
rk_status rk_synth_write(const rk_synth_params *p, const char *path, rk_err *err);
