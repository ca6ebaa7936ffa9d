/* rk_generate: prefill, then sample / stream / evaluate one token at a time until a stop
 * reason. Every command that generates (run, chat, ask, serve, eval needle, bench) runs
 * this loop. */
#include <math.h>
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

/* Every token's bytes (pieces without special-token text): (n_vocab + 1) offsets into one
 * buffer. Made once per call when a grammar or DRY needs them. */
typedef struct tok_bytes {
    char *p;
    uint32_t *off;
} tok_bytes;

static rk_status tok_bytes_make(const rk_model *m, int32_t nv, tok_bytes *tb, rk_err *err) {
    size_t cap = (size_t)nv * 8, n = 0;
    tb->p = malloc(cap);
    tb->off = malloc(((size_t)nv + 1) * sizeof *tb->off);
    if (!tb->p || !tb->off) return rk_err_set(err, RK_E_NOMEM, "generate: out of memory for the token table");
    for (int32_t t = 0; t < nv; t++) {
        tb->off[t] = (uint32_t)n;
        size_t need = rk_model_token_piece(m, t, false, tb->p + n, cap - n);
        if (need > cap - n) {
            while (need > cap - n) cap *= 2;
            char *q = realloc(tb->p, cap);
            if (!q || cap > UINT32_MAX)
                return rk_err_set(err, RK_E_NOMEM, "generate: out of memory for the token table");
            tb->p = q;
            need = rk_model_token_piece(m, t, false, tb->p + n, cap - n);
        }
        n += need;
    }
    tb->off[nv] = (uint32_t)n;
    return RK_OK;
}

static const char *const default_breakers[] = {"\n", ":", "\"", "*"};

/* Tokens whose text holds a breaker string become DRY sequence breakers. */
static rk_status set_breakers(rk_sampler *smp, const rk_gen_params *p, const tok_bytes *tb, int32_t nv, rk_err *err) {
    const char *const *b = p->dry_breakers ? p->dry_breakers : default_breakers;
    const int32_t nb = p->dry_breakers ? p->n_dry_breakers : 4;
    int32_t *ids = malloc((size_t)nv * sizeof *ids);
    if (!ids) return rk_err_set(err, RK_E_NOMEM, "generate: out of memory for the DRY breakers");
    size_t n = 0;
    for (int32_t t = 0; t < nv; t++) {
        const char *s = tb->p + tb->off[t];
        const size_t len = tb->off[t + 1] - tb->off[t];
        for (int32_t k = 0; k < nb; k++)
            if (b[k] && b[k][0] && memmem(s, len, b[k], strlen(b[k]))) {
                ids[n++] = t;
                break;
            }
    }
    rk_status st = rk_sampler_set_dry_breakers(smp, ids, n, err);
    free(ids);
    return st;
}

/* The next token under a grammar: the sampler's pick among the tokens whose bytes keep the
 * text a prefix of the language (end-of-generation only where the value can end). Greedy
 * tries the best tokens one by one first; otherwise every token is checked and the rest
 * masked (NaN). -1: no token fits. */
static int32_t grammar_pick(const rk_model *m, rk_sampler *smp, float *logits, int32_t nv, bool greedy,
                            const tok_bytes *tb, rk_json_state *gs) {
    const bool can_end = rk_json_state_can_end(gs);
#define ALLOWED(t)                                                  \
    (rk_model_token_is_eog(m, t) ? can_end                          \
                                 : tb->off[(t) + 1] > tb->off[t] && \
                                       rk_json_state_accepts(gs, tb->p + tb->off[t], tb->off[(t) + 1] - tb->off[t]))
    if (greedy)
        for (int tries = 0; tries < 16; tries++) {
            int32_t best = -1;
            for (int32_t i = 0; i < nv; i++)
                if (!isnan(logits[i]) && (best < 0 || logits[i] > logits[best])) best = i;
            if (best < 0) return -1;
            if (ALLOWED(best)) return best;
            logits[best] = NAN;
        }
    int32_t n_ok = 0;
    for (int32_t t = 0; t < nv; t++) {
        if (isnan(logits[t])) continue;
        if (ALLOWED(t)) n_ok++;
        else logits[t] = NAN;
    }
#undef ALLOWED
    return n_ok ? rk_sampler_pick(smp, logits) : -1;
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
    tok_bytes tb = {0};
    rk_json_state *gs = NULL;
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
    if (p->grammar || p->sampler.dry_multiplier > 0.0f) {
        if ((st = tok_bytes_make(m, hp->n_vocab, &tb, err))) goto fail;
        if (p->sampler.dry_multiplier > 0.0f && (st = set_breakers(smp, p, &tb, hp->n_vocab, err))) goto fail;
        if (p->grammar && (st = rk_json_state_create(p->grammar, &gs, err))) goto fail;
    }
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
        /* the penalties see the generated tokens (and the prompt when asked) */
        const size_t h0 = p->sampler.penalize_prompt ? 0 : n_prompt;
        rk_sampler_penalize(smp, logits, hist + h0, n_hist - h0);
        int32_t tok;
        if (gs) {
            tok = grammar_pick(m, smp, logits, hp->n_vocab, p->sampler.temp <= 0.0f, &tb, gs);
            if (tok < 0) { /* nothing can follow: the value is as complete as it gets */
                why = RK_STOP_EOG;
                break;
            }
        } else {
            tok = rk_sampler_pick(smp, logits);
        }
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
        if (gs) rk_json_state_feed(gs, pbuf, pn); /* accepted: grammar_pick checked these bytes */
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
        if (gs && rk_json_state_complete(gs)) {
            why = RK_STOP_EOG;
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
    rk_json_state_destroy(gs);
    free(tb.p);
    free(tb.off);
    free(hist);
    free(logits);
    free(pbuf);
    return st;
}
