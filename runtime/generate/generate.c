/* rk_generate: prefill, then sample / stream / evaluate one token at a time until a stop
 * reason. Every command that generates (run, chat, ask, serve, eval needle, bench) runs
 * this loop. */
#include <stdlib.h>
#include <string.h>

#include "gen_impl.h"

static const char *const stop_names[] = {
    [RK_STOP_LENGTH] = "length",       [RK_STOP_EOG] = "eog", [RK_STOP_STRING] = "stop", [RK_STOP_CONTEXT] = "context",
    [RK_STOP_CANCELLED] = "cancelled",
};

const char *rk_stop_reason_name(rk_stop_reason r) {
    return (unsigned)r <= RK_STOP_CANCELLED ? stop_names[r] : "unknown";
}

rk_gen_params rk_gen_params_default(void) {
    rk_gen_params p = {0};
    p.sampler = rk_sampler_params_default();
    p.max_tokens = 256;
    return p;
}

void rk_gen_result_deinit(rk_gen_result *r) {
    if (!r) return;
    free(r->text);
    free(r->tokens);
    memset(r, 0, sizeof *r);
}

static uint64_t filled_rows(const rk_session *s, int n_layer) {
    uint64_t n = 0, f;
    for (int l = 0; l < n_layer; l++) rk_session_layer_rows(s, l, NULL, &f), n += f;
    return n;
}

/* Bytes of token tok into *buf (grown when a piece is longer than it: rare, and only
 * for a token never seen before, so not per step). */
static rk_status piece(const rk_model *m, int32_t tok, char **buf, size_t *cap, size_t *n, rk_err *err) {
    size_t need = rk_model_token_piece(m, tok, false, *buf, *cap);
    if (need > *cap) {
        char *p = realloc(*buf, need);
        if (!p) return rk_err_set(err, RK_E_NOMEM, "generate: out of memory for a token piece of %zu bytes", need);
        *buf = p;
        *cap = need;
        need = rk_model_token_piece(m, tok, false, *buf, *cap);
    }
    *n = need;
    return RK_OK;
}

rk_status rk_generate(const rk_model *m, rk_session *s, const int32_t *prompt, size_t n_prompt, const rk_gen_params *p,
                      rk_gen_result *out, rk_err *err) {
    const double t0 = rk_time_now();
    const rk_hparams *hp = rk_model_hparams(m);
    const int64_t n_ctx = rk_session_n_ctx(s), n_past = rk_session_n_past(s);
    if (n_prompt == 0) return rk_err_set(err, RK_E_INVALID_ARG, "generate: the prompt is empty (0 tokens)");
    if ((int64_t)n_prompt >= n_ctx)
        return rk_err_set(err, RK_E_CONTEXT,
                          "generate: the prompt has %zu tokens but the context holds %lld, and at least one more "
                          "is needed to generate",
                          n_prompt, (long long)n_ctx);
    if (p->n_reuse < 0 || p->n_reuse > n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "generate: n_reuse %lld outside [0, n_past %lld]",
                          (long long)p->n_reuse, (long long)n_past);
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return rk_err_set(err, RK_E_INVALID_ARG, "generate: %d stop strings without an array", (int)p->n_stop);
    for (int32_t k = 0; k < p->n_stop; k++)
        if (!p->stop[k] || (p->stop_len ? p->stop_len[k] : strlen(p->stop[k])) == 0)
            return rk_err_set(err, RK_E_INVALID_ARG, "generate: stop string %d is empty", (int)k);
    const int64_t keep = p->n_reuse < (int64_t)n_prompt ? p->n_reuse : (int64_t)n_prompt - 1;
    /* the last token is sampled, not evaluated: a full context still takes one more */
    const int64_t room = n_ctx - (int64_t)n_prompt + 1;
    const int64_t max_gen = p->max_tokens < 0 || p->max_tokens > room ? room : p->max_tokens;

    rk_status st = RK_OK;
    rk_sampler *smp = NULL;
    rk_gen_text txt = {.stop = p->stop, .stop_len = p->stop_len, .n_stop = p->n_stop};
    size_t pcap = 256, pn = 0;
    char *pbuf = malloc(pcap);
    float *logits = malloc((size_t)hp->n_vocab * sizeof *logits);
    int32_t *hist = malloc((n_prompt + (size_t)max_gen + 1) * sizeof *hist); /* prompt, then generated */
    /* text: room for typical pieces of up to 4096 tokens; longer answers grow it (amortised) */
    const size_t text_cap = (size_t)(max_gen < 4096 ? max_gen : 4096) * 8 + 64;
    if (!pbuf || !logits || !hist || !rk_gen_buf_reserve(&txt.raw, text_cap) ||
        !rk_gen_buf_reserve(&txt.out, text_cap)) {
        st = rk_err_set(err, RK_E_NOMEM, "generate: out of memory for %lld tokens", (long long)(n_prompt + max_gen));
        goto fail;
    }
    if ((st = rk_sampler_create(&p->sampler, hp->n_vocab, &smp, err))) goto fail;
    if (p->fill && (st = rk_session_set_fill(s, p->fill, err))) goto fail;
    memcpy(hist, prompt, n_prompt * sizeof *hist);

    /* ---- prefill: prompt[keep..) after the kept rows ---- */
    if (keep == 0) rk_session_reset(s);
    else if ((st = rk_session_truncate(s, keep, err))) goto fail;
    const uint64_t filled0 = filled_rows(s, hp->n_layer);
    rk_session_set_progress(s, p->progress, p->progress_ud);
    const double tp = rk_time_now();
    st = rk_session_eval(s, prompt + keep, n_prompt - (size_t)keep, logits, false, err);
    rk_session_set_progress(s, NULL, NULL);
    const double t1 = rk_time_now();
    if (st) goto fail;
    const uint64_t filled = filled_rows(s, hp->n_layer) - filled0;

    /* ---- decode ---- */
    rk_stop_reason why = RK_STOP_LENGTH;
    size_t n_hist = n_prompt;
    int64_t n_gen = 0;
    double t_first = -1;
    while (n_gen < max_gen) {
        const int32_t tok = rk_sampler_sample(smp, logits, hist, n_hist);
        if (n_gen == 0) t_first = rk_time_now();
        if (!p->ignore_eog && rk_model_token_is_eog(m, tok)) {
            why = RK_STOP_EOG;
            break;
        }
        if ((st = piece(m, tok, &pbuf, &pcap, &pn, err))) goto fail;
        if (!rk_gen_text_push(&txt, pbuf, pn)) {
            st = rk_err_set(err, RK_E_NOMEM, "generate: out of memory for the generated text");
            goto fail;
        }
        hist[n_hist++] = tok;
        n_gen++;
        bool go_on = true;
        if (p->on_token) {
            size_t off, len;
            rk_gen_text_take(&txt, &off, &len);
            go_on = p->on_token(p->token_ud, tok, len ? txt.out.p + off : "", len);
        }
        if (txt.stopped) {
            why = RK_STOP_STRING;
            break;
        }
        if (!go_on) {
            why = RK_STOP_CANCELLED;
            break;
        }
        if (n_gen >= max_gen) {
            /* room ran out before max_tokens did: the context is the reason */
            why = p->max_tokens >= 0 && n_gen >= p->max_tokens ? RK_STOP_LENGTH : RK_STOP_CONTEXT;
            break;
        }
        if ((st = rk_session_eval(s, &tok, 1, logits, false, err))) goto fail;
    }
    const double t2 = rk_time_now();
    if (!rk_gen_text_finish(&txt) || !rk_gen_buf_put(&txt.out, "", 1)) {
        st = rk_err_set(err, RK_E_NOMEM, "generate: out of memory for the generated text");
        goto fail;
    }
    int32_t *toks = malloc(((size_t)n_gen + 1) * sizeof *toks);
    if (!toks) {
        st = rk_err_set(err, RK_E_NOMEM, "generate: out of memory");
        goto fail;
    }
    memcpy(toks, hist + n_prompt, (size_t)n_gen * sizeof *toks);
    *out = (rk_gen_result){
        .stop = why,
        .text = txt.out.p,
        .n_text = txt.out.n - 1,
        .n_streamed = p->on_token ? txt.sent : 0,
        .tokens = toks,
        .n_gen = n_gen,
        .n_prompt = (int64_t)n_prompt,
        .n_prefill = (int64_t)n_prompt - keep,
        .filled_rows = filled,
        .prefill_s = t1 - tp,
        .ttft_s = t_first >= 0 ? t_first - t0 : -1,
        .decode_s = t2 - t1,
        .prefill_tok_s = t1 > tp ? (double)((int64_t)n_prompt - keep) / (t1 - tp) : 0,
        .decode_tok_s = n_gen > 0 && t2 > t1 ? (double)n_gen / (t2 - t1) : 0,
    };
    txt.out = (rk_gen_buf){0}; /* now the result's */
fail:
    rk_gen_text_deinit(&txt);
    rk_sampler_destroy(smp);
    free(hist);
    free(logits);
    free(pbuf);
    return st;
}
