/* rk_conv: messages in the model's chat template over a session whose cache holds the
 * conversation between turns (rules in rk_gen.h). The prompt of a turn is built from
 * per-message token runs: the template is formatted with a marker in place of each
 * content, the markup between markers is tokenized with special tokens, each content
 * without (once, then kept), and an answer the model generated keeps its own tokens. So
 * the tokens of earlier messages do not change when messages are added, and the cache
 * prefix of the last turn is a prefix of the next turn's prompt. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_impl.h"

bool rk_ids_reserve(rk_ids *v, size_t n) {
    if (n <= v->cap) return true;
    size_t cap = v->cap ? v->cap : 256;
    while (cap < n) cap *= 2;
    int32_t *p = realloc(v->p, cap * sizeof *p);
    if (!p) return false;
    v->p = p;
    v->cap = cap;
    return true;
}

bool rk_ids_append(rk_ids *v, const int32_t *x, size_t n) {
    if (!rk_ids_reserve(v, v->n + n)) return false;
    if (n) memcpy(v->p + v->n, x, n * sizeof *x);
    v->n += n;
    return true;
}

const char *rk_conv_role(const char *r) {
    if (!r) return NULL;
    if (!strcmp(r, "system")) return "system";
    if (!strcmp(r, "user")) return "user";
    if (!strcmp(r, "assistant")) return "assistant";
    return NULL;
}

rk_status rk_conv_create(const rk_model *m, rk_session *s, const rk_conv_params *p, rk_conv **out, rk_err *err) {
    if (!m || !s || !out) return rk_err_set(err, RK_E_INVALID_ARG, "conv: needs a model and a session");
    rk_conv *c = calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "conv: out of memory");
    c->m = m;
    c->s = s;
    if (p) c->p = *p;
    c->fam = rk_model_chat_family(m);
    *out = c;
    return RK_OK;
}

void rk_conv_msgs_free(rk_conv_msg *v, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(v[i].content);
        free(v[i].ids);
    }
}

void rk_conv_destroy(rk_conv *c) {
    if (!c) return;
    rk_conv_msgs_free(c->msgs, c->n_msgs);
    free(c->msgs);
    free(c->kv.p);
    free(c);
}

rk_status rk_conv_check(size_t i, const char *role, const char *content, size_t len, rk_err *err) {
    if (!rk_conv_role(role))
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "conv: message %zu has role '%.32s' (expected system, user or "
                          "assistant)",
                          i, role ? role : "(null)");
    if (!strcmp(role, "system") && i != 0)
        return rk_err_set(err, RK_E_INVALID_ARG,
                          "conv: message %zu is a system message; only the first message may "
                          "be one",
                          i);
    if (!content || memchr(content, 0, len))
        return rk_err_set(err, RK_E_INVALID_ARG, "conv: message %zu contains a NUL character", i);
    return RK_OK;
}

/* Appends a message that passed rk_conv_check; takes ids (may be NULL) when given. */
static rk_status push(rk_conv *c, const char *role, const char *content, size_t len, int32_t *ids, size_t n_ids,
                      rk_err *err) {
    if (c->n_msgs == c->cap_msgs) {
        size_t cap = c->cap_msgs ? c->cap_msgs * 2 : 16;
        rk_conv_msg *p = realloc(c->msgs, cap * sizeof *p);
        if (!p) return rk_err_set(err, RK_E_NOMEM, "conv: out of memory");
        c->msgs = p;
        c->cap_msgs = cap;
    }
    char *dup = malloc(len + 1);
    if (!dup) return rk_err_set(err, RK_E_NOMEM, "conv: out of memory for a message of %zu bytes", len);
    memcpy(dup, content, len);
    dup[len] = 0;
    c->msgs[c->n_msgs++] = (rk_conv_msg){rk_conv_role(role), dup, len, ids, n_ids, ids != NULL};
    return RK_OK;
}

rk_status rk_conv_add(rk_conv *c, const char *role, const char *content, size_t len, rk_err *err) {
    rk_status st = rk_conv_check(c->n_msgs, role, content, len, err);
    return st ? st : push(c, role, content, len, NULL, 0, err);
}

void rk_conv_pop(rk_conv *c) {
    if (!c->n_msgs) return;
    c->n_msgs--;
    free(c->msgs[c->n_msgs].content);
    free(c->msgs[c->n_msgs].ids);
}

/* Removes messages [from, to). */
static void remove_msgs(rk_conv *c, size_t from, size_t to) {
    rk_conv_msgs_free(c->msgs + from, to - from);
    memmove(c->msgs + from, c->msgs + to, (c->n_msgs - to) * sizeof *c->msgs);
    c->n_msgs -= to - from;
}

void rk_conv_reset(rk_conv *c, bool keep_system) {
    size_t keep = keep_system && c->n_msgs && !strcmp(c->msgs[0].role, "system") ? 1 : 0;
    remove_msgs(c, keep, c->n_msgs);
    rk_session_reset(c->s);
    c->kv.n = 0;
}

size_t rk_conv_n_messages(const rk_conv *c) { return c->n_msgs; }

rk_chat_msg rk_conv_message(const rk_conv *c, size_t i) {
    return i < c->n_msgs ? (rk_chat_msg){c->msgs[i].role, c->msgs[i].content} : (rk_chat_msg){NULL, NULL};
}

size_t rk_conv_n_exchanges(const rk_conv *c) {
    size_t n = 0;
    for (size_t i = 0; i < c->n_msgs; i++) n += !strcmp(c->msgs[i].role, "user");
    return n;
}

rk_chat_family rk_conv_family(const rk_conv *c) { return c->fam; }

int64_t rk_conv_answer_room(const rk_conv *c) {
    const int64_t n_ctx = rk_session_n_ctx(c->s);
    if (c->p.room_div <= 0) return 1;
    const int64_t cap = n_ctx / c->p.room_div;
    return c->p.n_answer > 0 && c->p.n_answer < cap ? c->p.n_answer : cap;
}

rk_conv_fit rk_conv_last_fit(const rk_conv *c) { return c->fit; }

/* ---- the documents + question prompt ---------------------------------------------- */
static bool cat(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        char *q = realloc(*b, c);
        if (!q) return false;
        *b = q;
        *cap = c;
    }
    memcpy(*b + *len, s, n);
    *len += n;
    (*b)[*len] = 0;
    return true;
}

/* cat with CRLF and lone CR turned into LF. */
static bool cat_lf(char **b, size_t *len, size_t *cap, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        const char *cr = memchr(s + i, '\r', n - i);
        size_t run = cr ? (size_t)(cr - (s + i)) : n - i;
        if (!cat(b, len, cap, s + i, run)) return false;
        i += run;
        if (!cr) break;
        if (!cat(b, len, cap, "\n", 1)) return false;
        i += (i + 1 < n && s[i + 1] == '\n') ? 2 : 1;
    }
    return true;
}

rk_status rk_conv_add_ask(rk_conv *c, const char *system, const rk_doc *docs, size_t n_docs, const char *question,
                          rk_err *err) {
    if (!question) return rk_err_set(err, RK_E_INVALID_ARG, "conv: ask needs a question");
    if (system && c->n_msgs)
        return rk_err_set(err, RK_E_INVALID_ARG, "conv: a system prompt for ask in a conversation that has messages");
    char *b = NULL, head[600];
    size_t len = 0, cap = 0;
    bool ok = cat(&b, &len, &cap, "", 0);
    for (size_t i = 0; ok && i < n_docs; i++) {
        const char *nm = docs[i].name;
        if (n_docs == 1) snprintf(head, sizeof head, "Document%s%.500s\n\"\"\"\n", nm ? ": " : "", nm ? nm : "");
        else
            snprintf(head, sizeof head, "Document %zu of %zu%s%.500s\n\"\"\"\n", i + 1, n_docs, nm ? ": " : "",
                     nm ? nm : "");
        size_t tl = docs[i].len;
        while (tl && (docs[i].text[tl - 1] == '\n' || docs[i].text[tl - 1] == '\r')) tl--;
        ok = cat(&b, &len, &cap, head, strlen(head)) && cat_lf(&b, &len, &cap, docs[i].text, tl) &&
             cat(&b, &len, &cap, "\n\"\"\"\n\n", 6);
    }
    ok = ok && cat(&b, &len, &cap, "Question: ", 10) && cat_lf(&b, &len, &cap, question, strlen(question));
    rk_status st = ok ? RK_OK : rk_err_set(err, RK_E_NOMEM, "conv: out of memory for the documents");
    const bool add_sys = !c->n_msgs;
    if (!st && add_sys)
        st = rk_conv_add(c, "system", system ? system : RK_ASK_SYSTEM, strlen(system ? system : RK_ASK_SYSTEM), err);
    if (!st && (st = rk_conv_add(c, "user", b, len, err)) && add_sys) rk_conv_pop(c);
    free(b);
    return st;
}

/* ---- prompt building ------------------------------------------------------------------ */
static rk_status tok_append(const rk_model *m, const char *s, size_t n, bool add_special, bool parse_special,
                            rk_ids *out, rk_err *err) {
    int32_t *t = NULL;
    size_t nt = 0;
    rk_status st = rk_model_tokenize(m, s, n, add_special, parse_special, &t, &nt, err);
    if (st) return st;
    bool ok = rk_ids_append(out, t, nt);
    free(t);
    return ok ? RK_OK : rk_err_set(err, RK_E_NOMEM, "conv: out of memory");
}

/* Marker standing for message i's content in the formatted template: control bytes no
 * template writes. */
#define MARK_OPEN '\x01'
#define MARK_CLOSE '\x02'

rk_status rk_conv_build(rk_conv *c, rk_ids *out, rk_err *err) {
    out->n = 0;
    rk_chat_msg *cm = malloc((c->n_msgs + 1) * sizeof *cm);
    char *marks = malloc((c->n_msgs + 1) * 24);
    char *text = NULL;
    rk_status st = RK_OK;
    if (!cm || !marks) {
        st = rk_err_set(err, RK_E_NOMEM, "conv: out of memory");
        goto done;
    }
    for (size_t i = 0; i < c->n_msgs; i++) {
        snprintf(marks + 24 * i, 24, "%c%zu%c", MARK_OPEN, i, MARK_CLOSE);
        cm[i] = (rk_chat_msg){c->msgs[i].role, marks + 24 * i};
    }
    if ((st = rk_model_chat_format(c->m, cm, c->n_msgs, true, &text, err)))
        goto done; /* the template's default system too */
    const char *at = text;
    bool first = true;
    for (;;) {
        const char *mk = strchr(at, MARK_OPEN);
        const size_t n_markup = mk ? (size_t)(mk - at) : strlen(at);
        /* markup, with BOS before the first piece when the vocab asks for it */
        if (n_markup || first) {
            if ((st = tok_append(c->m, at, n_markup, first, true, out, err))) goto done;
            first = false;
        }
        if (!mk) break;
        char *end;
        const unsigned long i = strtoul(mk + 1, &end, 10);
        if (*end != MARK_CLOSE || i >= c->n_msgs) {
            st = rk_err_set(err, RK_E_INTERNAL, "conv: the chat template changed a content marker");
            goto done;
        }
        rk_conv_msg *msg = &c->msgs[i];
        if (!msg->have_ids) {
            /* contents are text: never special-token markup */
            rk_ids t = {0};
            if ((st = tok_append(c->m, msg->content, msg->len, false, false, &t, err))) {
                free(t.p);
                goto done;
            }
            msg->ids = t.p;
            msg->n_ids = t.n;
            msg->have_ids = true;
        }
        if (!rk_ids_append(out, msg->ids, msg->n_ids)) {
            st = rk_err_set(err, RK_E_NOMEM, "conv: out of memory");
            goto done;
        }
        at = end + 1;
    }
done:
    free(text);
    free(marks);
    free(cm);
    return st;
}

rk_status rk_conv_prompt(rk_conv *c, int32_t **ids, size_t *n, rk_err *err) {
    rk_ids v = {0};
    rk_status st = rk_conv_build(c, &v, err);
    if (st) {
        free(v.p);
        return st;
    }
    *ids = v.p;
    *n = v.n;
    return RK_OK;
}

/* ---- a turn ---------------------------------------------------------------------------- */

/* Builds the prompt into *want, dropping the oldest exchanges under the overflow rule. */
static rk_status fit_turn(rk_conv *c, rk_ids *want, rk_err *err) {
    const int64_t n_ctx = rk_session_n_ctx(c->s), room = rk_conv_answer_room(c);
    c->fit = (rk_conv_fit){.n_before = -1, .n_room = room, .n_ctx = n_ctx};
    for (;;) {
        rk_status st = rk_conv_build(c, want, err);
        if (st) return st;
        c->fit.n_prompt = (int64_t)want->n;
        if (c->fit.n_before < 0) c->fit.n_before = (int64_t)want->n;
        if ((int64_t)want->n + room <= n_ctx) return RK_OK;
        const size_t from = c->n_msgs && !strcmp(c->msgs[0].role, "system") ? 1 : 0;
        if (c->p.drop_oldest && from + 1 < c->n_msgs) {
            /* the oldest exchange: the first message after the system prompt and everything
             * up to the next user message, never the newest message */
            size_t to = from + 1;
            while (to < c->n_msgs - 1 && strcmp(c->msgs[to].role, "user")) to++;
            remove_msgs(c, from, to);
            c->fit.n_dropped++;
            continue;
        }
        if (c->p.drop_oldest && (int64_t)want->n < n_ctx) return RK_OK; /* alone it fits: the answer gets the rest */
        c->fit.too_long = true;
        return rk_err_set(err, RK_E_CONTEXT,
                          "conv: the prompt has %zu tokens and the answer needs room for %lld, but the context "
                          "holds %lld",
                          want->n, (long long)room, (long long)n_ctx);
    }
}

/* Rows of the cache that match want: the longest common prefix with what the cache holds. */
static int64_t common_prefix(const rk_conv *c, const rk_ids *want) {
    const int64_t n_past = rk_session_n_past(c->s);
    const int32_t *cached = rk_session_tokens(c->s);
    if (!cached) {
        if ((int64_t)c->kv.n != n_past) return 0; /* someone else used the session: no record */
        cached = c->kv.p;
    }
    int64_t p = 0;
    while (p < n_past && p < (int64_t)want->n && cached[p] == want->p[p]) p++;
    return p;
}

rk_status rk_conv_generate(rk_conv *c, const rk_gen_params *p, rk_gen_result *out, rk_err *err) {
    rk_ids want = {0};
    rk_gen_result r = {0};
    rk_status st = fit_turn(c, &want, err);
    if (st) goto done;
    rk_gen_params gp = *p;
    gp.n_reuse = common_prefix(c, &want);
    c->fit.n_answer_cap = p->max_tokens;
    if (c->p.room_div > 0) {
        /* the answer room caps the answer: the next turn must still find its history */
        int64_t cap = rk_conv_answer_room(c);
        const int64_t left = rk_session_n_ctx(c->s) - (int64_t)want.n;
        if (cap > left) cap = left;
        if (cap < 1) cap = 1;
        if (gp.max_tokens < 0 || gp.max_tokens > cap) gp.max_tokens = (int32_t)cap;
        c->fit.n_answer_cap = gp.max_tokens;
    }
    c->fit.n_reused = gp.n_reuse < (int64_t)want.n ? gp.n_reuse : (int64_t)want.n - 1;
    st = rk_generate(c->m, c->s, want.p, want.n, &gp, &r, err);
    /* the record of the cache: what the session holds now */
    const int64_t n_past = rk_session_n_past(c->s);
    if (st == RK_OK || st == RK_E_CANCELLED) {
        c->kv.n = 0;
        bool ok = rk_ids_append(&c->kv, want.p, (size_t)(n_past < (int64_t)want.n ? n_past : (int64_t)want.n));
        if (st == RK_OK) ok = ok && rk_ids_append(&c->kv, r.tokens, (size_t)(n_past - (int64_t)want.n));
        if (!ok) {
            rk_session_reset(c->s);
            c->kv.n = 0;
        }
    } else {
        rk_session_reset(c->s); /* an eval failed part way: keep no rows we cannot vouch for */
        c->kv.n = 0;
    }
    if (st) goto done;
    /* the answer joins the conversation; its own tokens stand for it unless a stop string
     * cut the text short of them */
    int32_t *ids = NULL;
    if (r.stop != RK_STOP_STRING) {
        ids = malloc(((size_t)r.n_gen + 1) * sizeof *ids);
        if (!ids) {
            st = rk_err_set(err, RK_E_NOMEM, "conv: out of memory");
            goto done;
        }
        memcpy(ids, r.tokens, (size_t)r.n_gen * sizeof *ids);
    }
    if ((st = push(c, "assistant", r.text, r.n_text, ids, ids ? (size_t)r.n_gen : 0, err))) {
        free(ids);
        goto done;
    }
    *out = r;
    r = (rk_gen_result){0};
done:
    rk_gen_result_deinit(&r);
    free(want.p);
    return st;
}
