/* Internal: the bound model. */
#pragma once
#include "rk.h"
#include "rk_gguf.h"
#include "rk_kernels.h"
#include "tokenizer_impl.h"

typedef struct rk_layer {
    rk_view attn_norm;            /* (n_embd) f32 */
    rk_view wq, wk, wv, wo;       /* (n_head*hd, n_embd), (kv_dim, n_embd) x2, (n_embd, n_head*hd) */
    rk_view bq, bk, bv;           /* qwen2 biases; data NULL when absent */
    rk_view q_norm, k_norm;       /* qwen3 (head_dim) */
    rk_view ffn_norm;             /* (n_embd) */
    rk_view w_gate, w_up, w_down; /* (n_ff, n_embd) x2, (n_embd, n_ff) */
} rk_layer;

struct rk_model {
    rk_mapping map;
    rk_gguf *gguf;
    rk_hparams hp;
    rk_view tok_embd;    /* (n_vocab, n_embd) */
    rk_view output_norm; /* (n_embd) */
    rk_view output;      /* (n_vocab, n_embd): token_embd when tied */
    rk_layer *layers;    /* n_layer */
    rk_tokenizer *tok;
    uint64_t weight_bytes;
    char name[128];
    char *chat_default_system; /* chat_template.c: the system prompt the template inserts ("" none) */
};

/* rope.c: the GGUF's RoPE scaling into m->hp.rope_scaling (at load), and the kernels'
 * parameters of the RoPE in effect (forward pass, KV caches' unrope). */
rk_status rk_model_read_rope_scaling(rk_model *m, rk_err *err);
/* chat_template.c: the template's rules beyond its family (m->chat_default_system). */
rk_status rk_model_read_chat_rules(rk_model *m, rk_err *err);
/* finite.c: RK_OK when every value of t (a type rk_quant_ref reads) is finite; otherwise
 * RK_E_FORMAT naming file, the tensor and the first NaN / Inf (row, column). */
rk_status rk_tensor_check_finite(const rk_gguf_tensor *t, const char *file, rk_err *err);
void rk_model_rope_params(const rk_model *m, int64_t pos0, rk_rope_params *out);
