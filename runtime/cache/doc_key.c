/* What a document cache entry is keyed by, read from the session that computes its rows
 * (rk_cache.h: rk_doc_cache_session_key), and where the documents end in an ask prompt
 * (rk_doc_ask_prefix). The session's settings are read from its own state
 * (session/session_impl.h), so a key never depends on how a caller spelled them. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_cache.h"
#include "rk_gen.h"
#include "rk_io.h"
#include "session_impl.h"
#include "sparse_impl.h"

typedef struct text {
    char *p;
    size_t n, cap;
    bool full;
} text;

static void add(text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void add(text *t, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    const int w = t->full ? -1 : vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
    va_end(ap);
    if (w < 0 || (size_t)w >= t->cap - t->n) t->full = true;
    else t->n += (size_t)w;
}

static void hex_digest(const void *data, size_t len, char hex[65]) {
    rk_sha256 h;
    rk_sha256_init(&h);
    rk_sha256_update(&h, data, len);
    uint8_t d[32];
    rk_sha256_final(&h, d);
    rk_sha256_hex(d, hex);
}

/* Floats as C99 hex ("%a"): exact, so two settings never print alike. */
static void add_rope(text *t, const rk_hparams *hp) {
    const rk_rope_scaling *r = &hp->rope_scaling;
    add(t, ";rope=%d,%a,%d,%a,%a,%a,%a,base=%a,n_rot=%d,mode=%d", (int)r->type, (double)r->factor, (int)r->orig_ctx,
        (double)r->ext_factor, (double)r->attn_factor, (double)r->beta_fast, (double)r->beta_slow,
        (double)hp->rope_base, (int)hp->n_rot, (int)hp->rope_mode);
}

/* The KV policy: its kind and the parameters its blocks record (what their rows depend
 * on), and a LowRAM predictor file's contents. */
static rk_status add_kv(text *t, const rk_session *s, rk_err *err) {
    rk_kv_param prm[RK_KV_MAX_PARAMS];
    const int n = s->kv->ops->params ? s->kv->ops->params(s->kv, prm) : 0;
    add(t, ";kv=%s", rk_kv_kind_name(s->kv->kind));
    for (int i = 0; i < n && i < RK_KV_MAX_PARAMS; i++) add(t, ",%.16s=%a", prm[i].name, prm[i].value);
    const rk_lowram_params *lp = &s->p.kv.lowram;
    /* LowRAM settings of the fit that its blocks do not record: the state saved after the
     * documents' prefill depends on them too */
    if (s->kv->kind == RK_KV_LOWRAM)
        add(t, ";lowram=fitmin=%d,vkeep=%a,vpool=%d,vpin=%d,full=%d,fullmin=%a,nostage=%d", (int)lp->fit_min,
            (double)lp->mass_keep, (int)lp->mass_pool, (int)lp->mass_pin, (int)lp->full_layers, (double)lp->full_min,
            (int)lp->no_stage);
    if (s->kv->kind == RK_KV_LOWRAM && lp->predictor[0]) {
        char pred[65];
        rk_err e = {0};
        if (rk_sha256_file(lp->predictor, pred, &e))
            return rk_err_set(err, RK_E_IO, "document cache: no key: the predictor file cannot be hashed (%s)", e.msg);
        add(t, ";pred=%s", pred);
    }
    return RK_OK;
}

/* The fill settings (rk_session_set_fill) and the contents of their map file. */
static void add_fill(text *t, const rk_session *s) {
    const rk_fill_params *f = &s->fill;
    add(t, ";fill=%s", rk_fill_mode_name(f->mode));
    char sp[160];
    if (rk_sparse_key(&f->sparse, sp, sizeof sp)) add(t, ";sparse=%s", sp); /* nothing when off */
    if (f->mode == RK_FILL_OFF) return;
    add(t,
        ",tail=%d,split=%d,sink=%d,keep=%a,obs=%d,slayers=%d,sskip=%d,pool=%d,baseline=%d,band=%d,qa=%d,"
        "keepsel=%d,group=%d,lmajor=%d",
        (int)f->tail, (int)f->split, (int)f->n_sink, (double)f->keep_share, (int)f->obs, (int)f->score_layers,
        (int)f->score_skip, (int)f->pool, (int)f->baseline, (int)f->band, (int)f->question_aware,
        (int)f->keep_selection, (int)f->group, (int)f->layer_major);
    if (f->keep_rows > 0) add(t, ",keeprows=%d", (int)f->keep_rows); /* the floor of kept rows (plan_impl.h) */
    /* the grouped lists' rows (fill_group.c): q8 under a q8 or q4 cache with heads of whole blocks */
    if (f->group > 0 && (s->kv->kind == RK_KV_Q8 || s->kv->kind == RK_KV_Q4) && s->m->hp.head_dim % 32 == 0)
        add(t, ",glist=q8");
    char maps[65] = "-";
    if (f->maps && f->maps->map.data) hex_digest(f->maps->map.data, f->maps->map.len, maps);
    add(t, ";maps=%s", maps);
}

rk_status rk_doc_cache_session_key(const rk_session *s, const int32_t *tokens, size_t n, char key[65], rk_err *err) {
    if (!s || (n && !tokens)) return rk_err_set(err, RK_E_INVALID_ARG, "document cache: no key without a session");
    char buf[4096];
    text t = {buf, 0, sizeof buf, false};
    buf[0] = '\0';
    add(&t, "session-key-2;backend=%s;batch=%d", s->be->ops->name, (int)s->p.n_batch);
    add_rope(&t, rk_model_hparams(s->m));
    rk_status st = add_kv(&t, s, err);
    if (st) return st;
    add_fill(&t, s);
    if (t.full) return rk_err_set(err, RK_E_INTERNAL, "document cache: the session's settings overflow the key text");
    rk_doc_cache_key(s->m, &s->p.kv, buf, tokens, n, key);
    return RK_OK;
}

rk_status rk_doc_ask_prefix(const rk_model *m, rk_session *s, const char *system, const rk_doc *docs, size_t n_docs,
                            const int32_t *ids, size_t n_ids, size_t *n_prefix, rk_err *err) {
    /* The prompt with an empty question, its text cut after "Question:" (the space after
     * it belongs to the question's first word in every tokenizer: " What", "▁What"), then
     * the template's closing markup, which no text token equals. */
    rk_conv_params cp = {.n_answer = 1, .room_div = 4};
    rk_conv *c = NULL;
    int32_t *head = NULL;
    size_t n_head = 0;
    char *user = NULL;
    rk_status st = rk_conv_create(m, s, &cp, &c, err);
    if (!st) st = rk_conv_add_ask(c, system, docs, n_docs, "", err);
    if (!st) {
        const rk_chat_msg um = rk_conv_message(c, rk_conv_n_messages(c) - 1);
        size_t len = strlen(um.content);
        if (len && um.content[len - 1] == ' ') len--;
        if (!(user = malloc(len + 1))) st = rk_err_set(err, RK_E_NOMEM, "document cache: out of memory");
        else {
            memcpy(user, um.content, len);
            user[len] = '\0';
            rk_conv_pop(c);
            st = rk_conv_add(c, "user", user, len, err);
        }
    }
    if (!st) st = rk_conv_prompt(c, &head, &n_head, err);
    rk_conv_destroy(c);
    free(user);
    if (st) return st;
    /* The check at the boundary: the ids both share. Where the question's first characters
     * merge with the tokens before it, those tokens differ and are read with the question,
     * so rows [0, p) are the prompt's own whatever the question. */
    size_t p = 0;
    while (p < n_head && p < n_ids && head[p] == ids[p]) p++;
    free(head);
    *n_prefix = p < n_ids ? p : 0;
    return RK_OK;
}
