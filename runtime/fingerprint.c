/* Model fingerprint: what a ridge-map or predictor file records about the model it
 * was fitted on, so that loading it on another model is refused by name. */
#include <string.h>

#include "model_impl.h"

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

void rk_model_fingerprint(const rk_model *m, rk_fingerprint *fp) {
    const rk_hparams *hp = &m->hp;
    memset(fp, 0, sizeof *fp);
    memcpy(fp->arch, hp->arch_name, sizeof fp->arch);
    fp->n_layer = hp->n_layer;
    fp->n_embd = hp->n_embd;
    fp->n_head = hp->n_head;
    fp->n_head_kv = hp->n_head_kv;
    fp->head_dim = hp->head_dim;
    fp->n_ff = hp->n_ff;
    fp->n_vocab = hp->n_vocab;
    fp->tokenizer_hash = rk_tokenizer_hash(m->tok);
    /* Norm weights stay f32 under every llama.cpp quantisation: they identify the
     * weights independently of how the matrices were quantised. */
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, m->output_norm.data, (size_t)hp->n_embd * sizeof(float));
    for (int l = 0; l < hp->n_layer; l++) {
        h = fnv1a(h, m->layers[l].attn_norm.data, (size_t)hp->n_embd * sizeof(float));
        h = fnv1a(h, m->layers[l].ffn_norm.data, (size_t)hp->n_embd * sizeof(float));
    }
    fp->weights_hash = h;
    /* The raw bytes of the first and last layers' K projections: changes with quantisation. */
    uint64_t q = 0xcbf29ce484222325ull;
    const rk_view *k0 = &m->layers[0].wk, *kl = &m->layers[hp->n_layer - 1].wk;
    q = fnv1a(q, &k0->type, sizeof k0->type);
    q = fnv1a(q, k0->data, k0->nb1 * (size_t)k0->ne[1]);
    q = fnv1a(q, kl->data, kl->nb1 * (size_t)kl->ne[1]);
    fp->quant_hash = q;
}
