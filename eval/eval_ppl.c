/* The perplexity driver (eval ppl): llama-perplexity's procedure, so numbers compare. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "rk_eval.h"

rk_status ev_ppl_tokenize(const rk_model *m, const char *text, size_t len, int32_t **ids, size_t *n, rk_err *err) {
    if (len > 0 && text[len - 1] == '\n') len--;
    return rk_model_tokenize(m, text, len, true, false, ids, n, err);
}

int64_t ev_ppl_n_chunks(size_t n_ids, const ev_ppl_params *p) {
    if (p->n_ctx < 1) return 0;
    int64_t n = (int64_t)n_ids / p->n_ctx;
    return p->max_chunks > 0 && n > p->max_chunks ? p->max_chunks : n;
}

rk_status ev_ppl_run(const rk_model *m, rk_session *s, const int32_t *ids, size_t n_ids, const ev_ppl_params *p,
                     ev_ppl_progress_fn progress, void *ud, ev_ppl_result *out, rk_err *err) {
    const int c = p->n_ctx;
    if (c < 4) return rk_err_set(err, RK_E_INVALID_ARG, "eval ppl: chunk of %d tokens (at least 4)", c);
    const int64_t n_chunk = ev_ppl_n_chunks(n_ids, p);
    if (n_chunk < 1)
        return rk_err_set(err, RK_E_INVALID_ARG, "eval ppl: %zu tokens, fewer than one chunk of %d", n_ids, c);
    if (rk_session_n_ctx(s) < c)
        return rk_err_set(err, RK_E_CONTEXT, "eval ppl: chunk of %d tokens in a context of %lld", c,
                          (long long)rk_session_n_ctx(s));
    const int32_t n_vocab = rk_model_hparams(m)->n_vocab;
    /* Only the second half of a chunk is scored: the first half is evaluated without logits
     * and the second in pieces of PIECE rows, so memory stays PIECE x n_vocab floats (a 16K
     * chunk of a 152K-vocab model would otherwise keep 10 GB of logits). */
    enum { PIECE = 512 };
    float *logits = malloc((size_t)PIECE * (size_t)n_vocab * sizeof(float));
    int32_t *chunk = malloc((size_t)c * sizeof *chunk);
    if (!logits || !chunk) {
        free(logits);
        free(chunk);
        return rk_err_set(err, RK_E_NOMEM, "eval: out of memory for %d x %d logits", PIECE, n_vocab);
    }
    const bool bos = rk_model_add_bos(m) && rk_model_token_bos(m) >= 0;
    double nll = 0, nll2 = 0;
    int64_t count = 0;
    rk_status st = RK_OK;
    for (int64_t ch = 0; !st && ch < n_chunk; ch++) {
        memcpy(chunk, ids + ch * c, (size_t)c * sizeof *chunk);
        if (bos) chunk[0] = rk_model_token_bos(m); /* each chunk starts with BOS, as llama-perplexity's */
        rk_session_reset(s);
        const int half = c / 2;
        st = rk_session_eval(s, chunk, (size_t)half, NULL, false, err);
        for (int p0 = half; !st && p0 < c - 1; p0 += PIECE) {
            const int p1 = p0 + PIECE < c - 1 ? p0 + PIECE : c - 1; /* row c-1 has no next token */
            st = rk_session_eval(s, chunk + p0, (size_t)(p1 - p0), logits, true, err);
            for (int j = p0; !st && j < p1; j++) {
                const double l = ev_nll_row(logits + (size_t)(j - p0) * (size_t)n_vocab, n_vocab, chunk[j + 1]);
                nll += l;
                nll2 += l * l;
                count++;
            }
        }
        if (!st && progress) progress(ud, ch + 1, n_chunk, exp(nll / (double)count));
    }
    free(logits);
    free(chunk);
    if (st) return st;
    const double mean = nll / (double)count, var = nll2 / (double)count - mean * mean;
    out->n_chunk = n_chunk;
    out->n_scored = count;
    out->nll = mean;
    out->ppl = exp(mean);
    out->ppl_err = out->ppl * sqrt(var > 0 ? var / (double)(count - 1 > 0 ? count - 1 : 1) : 0);
    return RK_OK;
}
