/* The needle driver: passkey retrieval with the needle inside the bulk region, every fill
 * mode or KV policy on the same prompt (paired); answers through rk_generate (greedy). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_eval.h"
#include "rk_gen.h"

/* Wordings of the needle sentence and its question (trial t uses wording t % n_wordings;
 * the first is the original one). */
static const char *const needles[EV_NEEDLE_WORDINGS] = {
    " The secret passkey is %d. Remember it.",
    " Note that the access code for the blue vault is %d.",
    " Important: the magic number you must remember is %d.",
    " The password of the server room is %d, and nobody else knows it.",
};
static const char *const questions[EV_NEEDLE_WORDINGS] = {
    "What is the secret passkey? Answer with the number only.",
    "What is the access code for the blue vault? Answer with the number only.",
    "What is the magic number I must remember? Reply with just the number.",
    "What is the password of the server room? Give only the number.",
};
static const char *marker = "@@RIDGEKV_HAYSTACK@@";

static bool word_start(const rk_model *m, int32_t id) {
    char buf[64];
    size_t n = rk_model_token_piece(m, id, false, buf, sizeof buf);
    return n > 0 && n <= sizeof buf && (buf[0] == ' ' || buf[0] == '\n');
}

/* Chat-template text around the haystack, tokenized: prefix (with BOS when the vocab
 * wants it) and suffix (question, end of turn, open assistant turn). */
static rk_status chat_parts(const rk_model *m, int w, int32_t **pre, size_t *n_pre, int32_t **suf, size_t *n_suf,
                            rk_err *e) {
    char content[256];
    snprintf(content, sizeof content, "%s\n\n%s", marker, questions[w]);
    rk_chat_msg msg = {"user", content};
    char *txt = NULL;
    rk_status st = rk_chat_format(rk_model_chat_family(m), &msg, 1, true, &txt, e);
    if (st) return st;
    char *at = strstr(txt, marker);
    if (!at) {
        free(txt);
        return rk_err_set(e, RK_E_INTERNAL, "eval needle: chat template dropped the haystack marker");
    }
    const char *rest = at + strlen(marker);
    st = rk_model_tokenize(m, txt, (size_t)(at - txt), true, true, pre, n_pre, e);
    if (!st) st = rk_model_tokenize(m, rest, strlen(rest), false, true, suf, n_suf, e);
    free(txt);
    return st;
}

static rk_status needle_ids(const rk_model *m, int w, int key, int32_t **ids, size_t *n, rk_err *e) {
    char txt[160];
    snprintf(txt, sizeof txt, needles[w], key);
    return rk_model_tokenize(m, txt, strlen(txt), false, false, ids, n, e);
}

static int n_wordings(const ev_needle_params *p) {
    return p->n_wordings <= 0 ? 1 : p->n_wordings > EV_NEEDLE_WORDINGS ? EV_NEEDLE_WORDINGS : p->n_wordings;
}

static int n_distractors(const ev_needle_params *p) {
    return p->n_distractors <= 0                       ? 0
           : p->n_distractors > EV_NEEDLE_WORDINGS - 1 ? EV_NEEDLE_WORDINGS - 1
                                                       : p->n_distractors;
}

/* Tokens of the distractor sentences that go with wording w (the other wordings, from the
 * one after w); keys do not change the length. */
static rk_status distractor_tokens(const rk_model *m, const ev_needle_params *p, int w, size_t *n, rk_err *e) {
    *n = 0;
    rk_status st = RK_OK;
    for (int j = 0; !st && j < n_distractors(p); j++) {
        int32_t *ids = NULL;
        size_t k = 0;
        st = needle_ids(m, (w + 1 + j) % EV_NEEDLE_WORDINGS, 12345, &ids, &k, e);
        free(ids);
        *n += k;
    }
    return st;
}

rk_status ev_needle_plan(const rk_model *m, const ev_needle_params *p, int *n_ctx, rk_err *err) {
    rk_status st = RK_OK;
    int max_len = 0;
    for (int w = 0; !st && w < n_wordings(p); w++) {
        int32_t *pre = NULL, *suf = NULL, *needle = NULL;
        size_t n_pre = 0, n_suf = 0, n_needle = 0;
        st = chat_parts(m, w, &pre, &n_pre, &suf, &n_suf, err);
        /* the needle's length is the same for every 5-digit key (digits tokenize alike) */
        if (!st) st = needle_ids(m, w, 12345, &needle, &n_needle, err);
        size_t n_distr = 0;
        if (!st) st = distractor_tokens(m, p, w, &n_distr, err);
        n_needle += n_distr; /* the room the inserted sentences take together */
        const int tail = p->modes.fill.tail;
        for (int i = 0; !st && i < p->n_lens; i++) {
            const int L = p->lens[i];
            if ((long)L - tail - (long)n_pre - (long)n_needle - 8 < 0 || L < (int)(n_pre + n_suf + n_needle) + 8)
                st = rk_err_set(
                    err, RK_E_INVALID_ARG,
                    "length %d leaves no room for the needle and distractors (%zu tokens) before the exact tail of %d (chat "
                    "prefix %zu, question %zu tokens)",
                    L, n_needle, tail, n_pre, n_suf);
            max_len = L > max_len ? L : max_len;
        }
        free(pre);
        free(suf);
        free(needle);
    }
    if (!st) *n_ctx = max_len + p->gen;
    return st;
}

void ev_needle_result_free(ev_needle_result *r) {
    free(r->trials);
    free(r->correct);
    free(r->lured);
    free(r->answers);
    free(r->kept);
    free(r->trial_prefill_s);
    free(r->done);
    memset(r, 0, sizeof *r);
}

rk_status ev_needle_result_init(ev_needle_result *r, int n_trials, int n_modes, rk_err *err) {
    memset(r, 0, sizeof *r);
    r->n_trials = n_trials, r->n_modes = n_modes;
    const size_t nt = (size_t)(n_trials > 0 ? n_trials : 1), nm = (size_t)n_modes;
    r->trials = calloc(nt, sizeof *r->trials);
    r->correct = calloc(nt * nm, 1);
    r->lured = calloc(nt * nm, 1);
    r->answers = calloc(nt * nm, EV_ANSWER_BYTES);
    r->kept = malloc(nt * nm * sizeof *r->kept);
    r->trial_prefill_s = calloc(nt * nm, sizeof *r->trial_prefill_s);
    r->done = calloc(nt, 1);
    if (!r->trials || !r->correct || !r->lured || !r->answers || !r->kept || !r->trial_prefill_s || !r->done) {
        ev_needle_result_free(r);
        return rk_err_set(err, RK_E_NOMEM, "eval needle: out of memory for %d trials", n_trials);
    }
    for (size_t i = 0; i < nt * nm; i++) r->kept[i] = -1;
    return RK_OK;
}

void ev_needle_result_compact(ev_needle_result *r) {
    const int nm = r->n_modes;
    int k = 0;
    for (int mi = 0; mi < nm; mi++) r->prefill_s[mi] = 0;
    for (int t = 0; t < r->n_trials; t++) {
        if (!r->done[t]) continue;
        if (k != t) {
            r->trials[k] = r->trials[t];
            memcpy(r->correct + (size_t)k * nm, r->correct + (size_t)t * nm, (size_t)nm);
            memcpy(r->lured + (size_t)k * nm, r->lured + (size_t)t * nm, (size_t)nm);
            memcpy(r->answers + (size_t)k * nm * EV_ANSWER_BYTES, r->answers + (size_t)t * nm * EV_ANSWER_BYTES,
                   (size_t)nm * EV_ANSWER_BYTES);
            memcpy(r->kept + (size_t)k * nm, r->kept + (size_t)t * nm, (size_t)nm * sizeof *r->kept);
            memcpy(r->trial_prefill_s + (size_t)k * nm, r->trial_prefill_s + (size_t)t * nm,
                   (size_t)nm * sizeof *r->trial_prefill_s);
            r->done[k] = 1;
        }
        for (int mi = 0; mi < nm; mi++) r->prefill_s[mi] += r->trial_prefill_s[(size_t)k * nm + mi];
        k++;
    }
    r->n_trials = k;
}

void ev_needle_count(const ev_needle_result *r, int mi, int *k, int *b, int *c) {
    *k = *b = *c = 0;
    for (int t = 0; t < r->n_trials; t++) {
        bool x = r->correct[t * r->n_modes + mi], x0 = r->correct[t * r->n_modes];
        *k += x;
        *b += x0 && !x;
        *c += !x0 && x;
    }
}

int ev_needle_lured(const ev_needle_result *r, int mi) {
    int n = 0;
    for (int t = 0; t < r->n_trials; t++) n += r->lured[t * r->n_modes + mi];
    return n;
}

void ev_needle_cell(const ev_needle_result *r, int mi, bool by_length, int cell, int *n, int *k) {
    *n = *k = 0;
    for (int t = 0; t < r->n_trials; t++) {
        if ((by_length ? r->trials[t].len_i : r->trials[t].depth_i) != cell) continue;
        (*n)++;
        *k += r->correct[t * r->n_modes + mi];
    }
}

/* Streaming callback: stops as soon as the answer holds the key or a distractor's key. */
typedef struct answer {
    char text[EV_ANSWER_BYTES];
    size_t n;
    int n_keys;
    char keys[EV_NEEDLE_WORDINGS][16]; /* the needle's, then the distractors' */
} answer;

static bool holds_key(const answer *a, int from) {
    for (int i = from; i < a->n_keys; i++)
        if (strstr(a->text, a->keys[i])) return true;
    return false;
}

static bool on_token(void *ud, int32_t tok, const char *text, size_t n) {
    (void)tok;
    answer *a = ud;
    size_t room = sizeof a->text - 1 - a->n;
    memcpy(a->text + a->n, text, n < room ? n : room);
    a->n += n < room ? n : room;
    a->text[a->n] = 0;
    return !holds_key(a, 0);
}

/* A sentence inserted into the haystack: before hay[at]. */
typedef struct insert {
    int64_t at;
    const int32_t *ids;
    size_t n;
    int who; /* -1: the needle, j: distractor j */
} insert;

/* Distractor hay positions: uniform over 0.05..0.95 of the room, snapped to a word start, at
 * least gap tokens from the needle's and the earlier ones' (a few redraws, then taken as is). */
static int64_t distractor_at(const rk_model *m, const int32_t *hay, int64_t room, const insert *ins, int n_ins,
                             int64_t gap, uint64_t *rng) {
    int64_t at = 0;
    for (int tries = 0; tries < 16; tries++) {
        at = (int64_t)llround((0.05 + 0.9 * (double)ev_rand_below(rng, 10001) / 10000.0) * (double)room);
        for (int k = 0; k < 32 && at > 0 && !word_start(m, hay[at]); k++) at--;
        bool far = true;
        for (int i = 0; i < n_ins; i++) far = far && llabs(at - ins[i].at) >= gap;
        if (far) break;
    }
    return at;
}

rk_status ev_needle_run(const rk_model *m, rk_session *const *s, const ev_corpus *c, const ev_needle_params *p,
                        ev_needle_result *out, rk_err *err) {
    ev_needle_result r;
    int32_t *pre = NULL, *suf = NULL, *prompt = NULL, *needle = NULL, *dids[EV_NEEDLE_WORDINGS - 1] = {0};
    size_t n_pre = 0, n_suf = 0, n_needle = 0;
    rk_gen_result g = {0};
    int max_len = 0;
    for (int i = 0; i < p->n_lens; i++) max_len = p->lens[i] > max_len ? p->lens[i] : max_len;
    rk_status st = ev_needle_result_init(&r, p->n_trials, p->modes.n, err);
    if (st) return st;
    prompt = malloc((size_t)max_len * sizeof *prompt);
    if (!prompt) {
        st = rk_err_set(err, RK_E_NOMEM, "eval needle: out of memory");
        goto fail;
    }
    const double t_start = rk_time_now();
    /* the budget's guess of a trial's time: seconds ~ length^1.5 (weights ~ L, attention ~ L^2;
     * measured 2.75x from 2048 to 4096 tokens), the slowest rate of this call's trials */
    double rate = 0;
    bool stopped = false;
    const int tail = p->modes.fill.tail;
    uint64_t rng = p->seed * 0x2545f4914f6cdd1dull + 17;
    const int n_cells = p->n_lens * p->n_depths;
    for (int t = 0; t < r.n_trials; t++) {
        /* trials cycle over cells so a shorter run stays balanced */
        const int li = (t % n_cells) / p->n_depths, di = (t % n_cells) % p->n_depths, L = p->lens[li];
        ev_needle_trial *tr = &r.trials[t];
        tr->len_i = li;
        tr->depth_i = di;
        tr->key = 10000 + (int)ev_rand_below(&rng, 90000);
        tr->wording = (t / n_cells) % n_wordings(p); /* every cell sees every wording */
        free(needle), free(pre), free(suf);
        needle = pre = suf = NULL;
        if ((st = chat_parts(m, tr->wording, &pre, &n_pre, &suf, &n_suf, err)) ||
            (st = needle_ids(m, tr->wording, tr->key, &needle, &n_needle, err)))
            goto fail;
        /* distractors: the other wordings, keys of their own (none equal to another) */
        size_t n_dall = 0;
        tr->n_distr = n_distractors(p);
        for (int j = 0; j < tr->n_distr; j++) {
            free(dids[j]);
            dids[j] = NULL;
            tr->dwording[j] = (tr->wording + 1 + j) % EV_NEEDLE_WORDINGS;
            bool fresh;
            do {
                tr->dkey[j] = 10000 + (int)ev_rand_below(&rng, 90000);
                fresh = tr->dkey[j] != tr->key;
                for (int i = 0; i < j; i++) fresh = fresh && tr->dkey[j] != tr->dkey[i];
            } while (!fresh);
            size_t dn = 0;
            if ((st = needle_ids(m, tr->dwording[j], tr->dkey[j], &dids[j], &dn, err))) goto fail;
            tr->dlen[j] = (int64_t)dn;
            n_dall += dn;
        }
        const size_t n_hay = (size_t)L - n_pre - n_suf - n_needle - n_dall;
        ev_window w;
        if (!ev_corpus_pick(c, n_hay, 1, &rng, &w)) {
            st =
                rk_err_set(err, RK_E_INVALID_ARG, "eval needle: no corpus file holds %zu tokens for a haystack", n_hay);
            goto fail;
        }
        tr->doc = w.doc;
        tr->off = w.off;
        const int32_t *hay = c->docs[w.doc].ids + w.off;
        /* needle start inside the haystack: depth of the room before bulk_end, snapped back
         * to a word start so the sentence sits between words */
        const int64_t bulk_end = L - tail, room = bulk_end - (int64_t)n_needle - (int64_t)n_dall - (int64_t)n_pre;
        int64_t ph = room > 0 ? (int64_t)llround(p->depths[di] * (double)room) : 0;
        for (int k = 0; k < 32 && ph > 0 && !word_start(m, hay[ph]); k++) ph--;
        insert ins[EV_NEEDLE_WORDINGS] = {{ph, needle, n_needle, -1}};
        int n_ins = 1;
        for (int j = 0; j < tr->n_distr; j++, n_ins++)
            ins[n_ins] = (insert){distractor_at(m, hay, room, ins, n_ins, (int64_t)n_needle + 16, &rng), dids[j],
                                  (size_t)tr->dlen[j], j};
        for (int i = 1; i < n_ins; i++) /* by hay position; ties keep the order above */
            for (int k = i; k > 0 && ins[k].at < ins[k - 1].at; k--) {
                const insert x = ins[k];
                ins[k] = ins[k - 1], ins[k - 1] = x;
            }
        size_t at = 0;
        int64_t prev = 0;
        memcpy(prompt + at, pre, n_pre * sizeof *prompt), at += n_pre;
        for (int i = 0; i < n_ins; i++) {
            memcpy(prompt + at, hay + prev, (size_t)(ins[i].at - prev) * sizeof *prompt),
                at += (size_t)(ins[i].at - prev);
            if (ins[i].who < 0) tr->needle_pos = (int64_t)at;
            else tr->dpos[ins[i].who] = (int64_t)at;
            memcpy(prompt + at, ins[i].ids, ins[i].n * sizeof *prompt), at += ins[i].n;
            prev = ins[i].at;
        }
        memcpy(prompt + at, hay + prev, (n_hay - (size_t)prev) * sizeof *prompt), at += n_hay - (size_t)prev;
        memcpy(prompt + at, suf, n_suf * sizeof *prompt), at += n_suf;
        tr->needle_len = (int64_t)n_needle;
        tr->bulk_end = bulk_end;
        if (p->on_prompt) p->on_prompt(p->prompt_ud, t, prompt, at);
        if (p->skip && p->skip[t]) continue; /* done before (a results file): built, not run */
        if (!stopped && p->budget_s > 0 && rk_time_now() - t_start + rate * pow((double)L, 1.5) > p->budget_s)
            stopped = true;
        if (stopped) continue; /* the later trials that were done before are still built */
        const double t_trial = rk_time_now();
        char detail[400];
        int dl = snprintf(detail, sizeof detail, "len %d depth %.2f:", L, p->depths[di]);
        for (int mi = 0; mi < r.n_modes; mi++) {
            rk_fill_params fp;
            ev_modes_params(&p->modes, mi, &fp); /* the mode and its own settings (grouping) */
            answer a = {.n_keys = 1 + tr->n_distr};
            snprintf(a.keys[0], sizeof a.keys[0], "%d", tr->key);
            for (int j = 0; j < tr->n_distr; j++) snprintf(a.keys[1 + j], sizeof a.keys[1 + j], "%d", tr->dkey[j]);
            rk_gen_params gp = rk_gen_params_default();
            if (p->sampler) gp.sampler = *p->sampler;
            else gp.sampler.repeat_penalty = 1.0f;
            gp.sampler.temp = 0; /* greedy; decode is always exact */
            gp.max_tokens = p->gen;
            gp.fill = &fp;
            gp.on_token = on_token;
            gp.token_ud = &a;
            if ((st = rk_generate(m, s[mi], prompt, (size_t)L, &gp, &g, err))) goto fail;
            r.prefill_s[mi] += g.prefill_s;
            r.trial_prefill_s[t * r.n_modes + mi] = g.prefill_s;
            r.kept[t * r.n_modes + mi] = fp.mode == RK_FILL_QUALITY || fp.question_aware
                                             ? rk_session_fill_kept(s[mi], tr->needle_pos, tr->needle_len)
                                             : -1;
            rk_gen_result_deinit(&g);
            const bool lured = holds_key(&a, 1), ok = strstr(a.text, a.keys[0]) && !lured;
            r.correct[t * r.n_modes + mi] = ok;
            r.lured[t * r.n_modes + mi] = lured;
            memcpy(r.answers + ((size_t)t * (size_t)r.n_modes + (size_t)mi) * EV_ANSWER_BYTES, a.text, a.n + 1);
            if (dl > 0 && (size_t)dl < sizeof detail) {
                dl += snprintf(detail + dl, sizeof detail - (size_t)dl, " %s %s", ev_modes_label(&p->modes, mi),
                               ok      ? "ok"
                               : lured ? "LURED"
                                       : "MISS");
                rk_lowram_stats ls;
                rk_session_lowram_stats(s[mi], &ls);
                for (int f = 0; f < ls.n_full && dl > 0 && (size_t)dl < sizeof detail; f++) /* LowRAM's full layers */
                    dl += snprintf(detail + dl, sizeof detail - (size_t)dl, "%s%d", f ? "," : " [full ", ls.full_l[f]);
                if (ls.n_full && dl > 0 && (size_t)dl < sizeof detail)
                    dl += snprintf(detail + dl, sizeof detail - (size_t)dl, "]");
            }
        }
        r.done[t] = 1;
        const double took = rk_time_now() - t_trial, r_t = took / pow((double)L, 1.5);
        rate = r_t > rate ? r_t : rate;
        if (p->on_trial && (st = p->on_trial(p->trial_ud, &r, t, err))) goto fail;
        if (p->progress) p->progress(p->progress_ud, t + 1, r.n_trials, detail);
    }
    *out = r;
    r = (ev_needle_result){0};
fail:
    ev_needle_result_free(&r);
    rk_gen_result_deinit(&g);
    free(prompt);
    free(needle);
    for (int j = 0; j < EV_NEEDLE_WORDINGS - 1; j++) free(dids[j]);
    free(pre);
    free(suf);
    return st;
}
