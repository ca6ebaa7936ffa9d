/* Tokenizer dispatch: vocab loading from GGUF, special tokens (BOS/EOS/EOG),
 * special-token partitioning of the input, then SentencePiece (tokenizer_spm.c) or
 * byte-level BPE (tokenizer_bpe.c); pieces and decode. The tables and the merge loop
 * both share are in tables.c. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- loading -------------------------------------------------------- */

static rk_status get_array(const rk_gguf *g, const char *key, bool required, uint32_t n_want, const rk_gguf_kv **out,
                           rk_err *err) {
    const rk_gguf_kv *kv = rk_gguf_find_kv(g, key);
    *out = NULL;
    if (!kv) {
        if (required) return rk_err_set(err, RK_E_NOT_FOUND, "tokenizer: missing key %s", key);
        return RK_OK;
    }
    if (kv->type != RK_GGUF_ARRAY)
        return rk_err_set(err, RK_E_GGUF_TYPE, "tokenizer: key %s is not an array (type %u)", key, kv->type);
    if (n_want && kv->n != n_want)
        return rk_err_set(err, RK_E_GGUF_COUNT, "tokenizer: key %s has a wrong length (expected %u vs got %llu)", key,
                          n_want, (unsigned long long)kv->n);
    *out = kv;
    return RK_OK;
}

/* Reads an optional token id key; out-of-range values keep the default, as llama.cpp. */
static rk_status get_id(const rk_gguf *g, const char *key, uint32_t n_vocab, int32_t *id, rk_err *err) {
    if (!rk_gguf_find_kv(g, key)) return RK_OK;
    int64_t v;
    rk_status st = rk_gguf_get_i64(g, key, &v, err);
    if (st) return st;
    if (v >= 0 && v < (int64_t)n_vocab) *id = (int32_t)v;
    return RK_OK;
}

static rk_status get_flag(const rk_gguf *g, const char *key, bool *flag, rk_err *err) {
    if (!rk_gguf_find_kv(g, key)) return RK_OK;
    return rk_gguf_get_bool(g, key, flag, err);
}

static const char *const eog_texts[] = {
    "<|eot_id|>", "<|im_end|>", "<|end|>",         "<end_of_turn>",      "<|endoftext|>", "<|eom_id|>",
    "<EOT>",      "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>", "<|return|>",    "<|call|>",
};

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static rk_status build_eog(rk_tokenizer *t, rk_err *err) {
    int32_t cand[4 + sizeof eog_texts / sizeof eog_texts[0]];
    size_t n = 0;
    cand[n++] = t->eos;
    cand[n++] = t->eot;
    cand[n++] = t->eom;
    for (size_t i = 0; i < sizeof eog_texts / sizeof eog_texts[0]; i++) {
        int32_t id = rk_tokenizer_find(t, eog_texts[i]);
        if (id >= 0) t->type[id] = RK_TOKTYPE_CONTROL;
        cand[n++] = id;
    }
    int32_t s = rk_tokenizer_find(t, "</s>");
    cand[n++] = (s >= 0 && t->type[s] == RK_TOKTYPE_CONTROL) ? s : -1;
    qsort(cand, n, sizeof cand[0], cmp_i32);
    t->eog = malloc(n * sizeof *t->eog);
    if (!t->eog) return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (eog)");
    for (size_t i = 0; i < n; i++)
        if (cand[i] >= 0 && (t->n_eog == 0 || t->eog[t->n_eog - 1] != cand[i])) t->eog[t->n_eog++] = cand[i];
    return RK_OK;
}

/* qsort has no context argument: sort (length, id) keys instead of ids. */
typedef struct special_key {
    uint64_t len;
    int32_t id;
} special_key;

static int cmp_special(const void *a, const void *b) {
    const special_key *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static rk_status build_special(rk_tokenizer *t, rk_err *err) {
    special_key *keys = NULL;
    uint32_t n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        if (t->text[i].len && (ty == RK_TOKTYPE_CONTROL || ty == RK_TOKTYPE_USER_DEFINED || ty == RK_TOKTYPE_UNKNOWN))
            n++;
    }
    t->special = malloc((n ? n : 1) * sizeof *t->special);
    keys = malloc((n ? n : 1) * sizeof *keys);
    if (!t->special || !keys) {
        free(keys);
        return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (special tokens)");
    }
    n = 0;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint8_t ty = t->type[i];
        if (t->text[i].len && (ty == RK_TOKTYPE_CONTROL || ty == RK_TOKTYPE_USER_DEFINED || ty == RK_TOKTYPE_UNKNOWN))
            keys[n++] = (special_key){t->text[i].len, (int32_t)i};
    }
    qsort(keys, n, sizeof *keys, cmp_special);
    for (uint32_t i = 0; i < n; i++) t->special[i] = keys[i].id;
    t->n_special = n;
    free(keys);
    return RK_OK;
}

static uint64_t hash_u32(uint64_t h, uint32_t v) {
    unsigned char b[4] = {(unsigned char)v, (unsigned char)(v >> 8), (unsigned char)(v >> 16),
                          (unsigned char)(v >> 24)};
    return rk_fnv1a(h, b, 4);
}

static uint64_t fingerprint(const rk_tokenizer *t) {
    const char *kind = t->kind == RK_TOK_SPM ? "llama" : "gpt2";
    const char *pre = rk_tok_pre_rules_name(t->pre);
    uint64_t h = rk_fnv1a(RK_FNV_OFFSET, kind, strlen(kind) + 1);
    h = rk_fnv1a(h, pre, strlen(pre) + 1);
    h = hash_u32(h, t->n_vocab);
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        uint32_t bits;
        memcpy(&bits, &t->score[i], 4);
        h = hash_u32(h, (uint32_t)t->text[i].len);
        h = rk_fnv1a(h, t->text[i].ptr, t->text[i].len);
        h = hash_u32(h, bits);
        h = hash_u32(h, t->type[i]);
    }
    h = hash_u32(h, t->n_merges);
    for (uint32_t i = 0; i < t->n_merges; i++) {
        h = hash_u32(h, (uint32_t)t->merge_l[i].len);
        h = rk_fnv1a(h, t->merge_l[i].ptr, t->merge_l[i].len);
        h = hash_u32(h, (uint32_t)t->merge_r[i].len);
        h = rk_fnv1a(h, t->merge_r[i].ptr, t->merge_r[i].len);
    }
    h = hash_u32(h, (uint32_t)t->bos);
    h = hash_u32(h, (uint32_t)t->eos);
    h = hash_u32(h, (uint32_t)t->unk);
    h = hash_u32(h, (uint32_t)t->add_bos | (uint32_t)t->add_eos << 1 | (uint32_t)t->add_space_prefix << 2);
    return h;
}

static rk_status load_vocab(rk_tokenizer *t, const rk_gguf *g, rk_err *err) {
    const rk_gguf_kv *tok, *sc, *ty;
    rk_status st = get_array(g, "tokenizer.ggml.tokens", true, 0, &tok, err);
    if (st) return st;
    if (tok->arr_type != RK_GGUF_STRING)
        return rk_err_set(err, RK_E_GGUF_TYPE, "tokenizer: tokenizer.ggml.tokens is not strings");
    if (tok->n == 0 || tok->n > (uint64_t)INT32_MAX / 4)
        return rk_err_set(err, RK_E_GGUF_COUNT, "tokenizer: tokenizer.ggml.tokens count (1..%d vs %llu)", INT32_MAX / 4,
                          (unsigned long long)tok->n);
    t->n_vocab = (uint32_t)tok->n;
    if ((st = get_array(g, "tokenizer.ggml.scores", false, t->n_vocab, &sc, err))) return st;
    if ((st = get_array(g, "tokenizer.ggml.token_type", false, t->n_vocab, &ty, err))) return st;

    t->text = calloc(t->n_vocab, sizeof *t->text);
    t->score = calloc(t->n_vocab, sizeof *t->score);
    t->type = calloc(t->n_vocab, sizeof *t->type);
    if (!t->text || !t->score || !t->type || !rk_tok_table_init(&t->by_text, t->n_vocab))
        return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (%u tokens)", t->n_vocab);
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if ((st = rk_gguf_arr_str(g, tok, i, &t->text[i], err))) return st;
        if (t->text[i].len > t->max_text_bytes) t->max_text_bytes = t->text[i].len;
        if (sc) {
            if ((st = rk_gguf_arr_f32(sc, i, &t->score[i], err))) return st;
            if (t->score[i] != t->score[i]) t->score[i] = -1e30f; /* NaN would break ordering */
        }
        t->type[i] = RK_TOKTYPE_NORMAL;
        if (ty) {
            int64_t v;
            if ((st = rk_gguf_arr_i64(ty, i, &v, err))) return st;
            t->type[i] = (v >= RK_TOKTYPE_NORMAL && v <= RK_TOKTYPE_BYTE) ? (uint8_t)v : RK_TOKTYPE_UNDEFINED;
        }
    }
    if (t->max_text_bytes > RK_TOK_MAX_TEXT)
        return rk_err_set(err, RK_E_GGUF_COUNT, "tokenizer: token text of %zu bytes", t->max_text_bytes);
    /* Later duplicates win, like llama.cpp's token_to_id map. Empty texts are never
     * looked up. */
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        if (!t->text[i].len) continue;
        uint32_t s = (uint32_t)rk_tok_str_hash(t->text[i].ptr, t->text[i].len) & t->by_text.mask;
        for (;; s = (s + 1) & t->by_text.mask) {
            int32_t id = t->by_text.slot[s];
            if (id < 0 ||
                (t->text[id].len == t->text[i].len && memcmp(t->text[id].ptr, t->text[i].ptr, t->text[i].len) == 0)) {
                t->by_text.slot[s] = (int32_t)i;
                break;
            }
        }
    }
    return RK_OK;
}

rk_status rk_tokenizer_create(const rk_gguf *g, rk_tokenizer **out, rk_err *err) {
    rk_status st;
    rk_str model;
    rk_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory");
    t->bos = t->eos = t->unk = t->eot = t->eom = -1;
    if ((st = rk_gguf_get_str(g, "tokenizer.ggml.model", &model, err))) goto fail;
    if (rk_str_eq(model, "llama")) {
        t->kind = RK_TOK_SPM;
        t->bos = 1;
        t->eos = 2;
        t->unk = 0;
        t->add_bos = true;
        t->add_space_prefix = true;
    } else if (rk_str_eq(model, "gpt2")) {
        t->kind = RK_TOK_BPE;
        t->bos = 11; /* llama.cpp's defaults when the file names none */
        t->eos = 11;
    } else {
        st = rk_err_set(err, RK_E_UNSUPPORTED, "tokenizer: tokenizer.ggml.model '%.*s' (expected llama or gpt2)",
                        (int)(model.len > 64 ? 64 : model.len), model.ptr);
        goto fail;
    }
    if ((st = load_vocab(t, g, err))) goto fail;
    if (t->bos >= (int32_t)t->n_vocab) t->bos = -1;
    if (t->eos >= (int32_t)t->n_vocab) t->eos = -1;
    if (t->unk >= (int32_t)t->n_vocab) t->unk = -1;
    if ((st = get_id(g, "tokenizer.ggml.bos_token_id", t->n_vocab, &t->bos, err))) goto fail;
    if ((st = get_id(g, "tokenizer.ggml.eos_token_id", t->n_vocab, &t->eos, err))) goto fail;
    if ((st = get_id(g, "tokenizer.ggml.unknown_token_id", t->n_vocab, &t->unk, err))) goto fail;
    if ((st = get_id(g, "tokenizer.ggml.eot_token_id", t->n_vocab, &t->eot, err))) goto fail;
    if ((st = get_id(g, "tokenizer.ggml.eom_token_id", t->n_vocab, &t->eom, err))) goto fail;

    if (t->kind == RK_TOK_SPM) st = rk_tok_spm_init(t, err);
    else st = rk_tok_bpe_init(t, g, err); /* sets pre, and add_bos for llama3 rules */
    if (st) goto fail;
    if ((st = get_flag(g, "tokenizer.ggml.add_space_prefix", &t->add_space_prefix, err))) goto fail;
    if ((st = get_flag(g, "tokenizer.ggml.add_bos_token", &t->add_bos, err))) goto fail;
    if ((st = get_flag(g, "tokenizer.ggml.add_eos_token", &t->add_eos, err))) goto fail;

    if ((st = build_eog(t, err))) goto fail;
    if ((st = build_special(t, err))) goto fail;
    t->hash = fingerprint(t);
    *out = t;
    return RK_OK;
fail:
    rk_tokenizer_destroy(t);
    return st;
}

void rk_tokenizer_destroy(rk_tokenizer *t) {
    if (!t) return;
    free(t->text);
    free(t->score);
    free(t->type);
    free(t->by_text.slot);
    free(t->merge_l);
    free(t->merge_r);
    free(t->merges.slot);
    free(t->special);
    free(t->eog);
    free(t->pair);
    free(t);
}

/* ---- encode --------------------------------------------------------- */

/* A stretch of input text (tok < 0) or an already-recognised special token. */
typedef struct frag {
    size_t off, len;
    int32_t tok;
} frag;

typedef struct frag_list {
    frag *v;
    size_t n, cap;
} frag_list;

static bool frag_push(frag_list *l, size_t off, size_t len, int32_t tok) {
    if (!rk_tok_grow(&l->v, &l->cap, l->n + 1, sizeof *l->v)) return false;
    l->v[l->n++] = (frag){off, len, tok};
    return true;
}

/* llama.cpp's tokenizer_st_partition: for each special token, longest first, split every
 * text fragment at each of its (leftmost, non-overlapping) occurrences. */
static bool partition(const rk_tokenizer *t, const char *text, size_t len, bool parse_special, frag_list *cur,
                      frag_list *nxt) {
    cur->n = 0;
    if (len && !frag_push(cur, 0, len, -1)) return false;
    for (uint32_t k = 0; k < t->n_special; k++) {
        int32_t id = t->special[k];
        uint8_t ty = t->type[id];
        if (!parse_special && (ty == RK_TOKTYPE_CONTROL || ty == RK_TOKTYPE_UNKNOWN)) continue;
        rk_str s = t->text[id];
        bool any = false;
        for (size_t i = 0; i < cur->n && !any; i++)
            any = cur->v[i].tok < 0 && cur->v[i].len >= s.len &&
                  memmem(text + cur->v[i].off, cur->v[i].len, s.ptr, s.len) != NULL;
        if (!any) continue;
        nxt->n = 0;
        for (size_t i = 0; i < cur->n; i++) {
            frag f = cur->v[i];
            if (f.tok >= 0) {
                if (!frag_push(nxt, f.off, f.len, f.tok)) return false;
                continue;
            }
            size_t pos = f.off, end = f.off + f.len;
            while (pos < end) {
                const char *m = end - pos >= s.len ? memmem(text + pos, end - pos, s.ptr, s.len) : NULL;
                if (!m) break;
                size_t at = (size_t)(m - text);
                if (at > pos && !frag_push(nxt, pos, at - pos, -1)) return false;
                if (!frag_push(nxt, at, s.len, id)) return false;
                pos = at + s.len;
            }
            if (pos < end && !frag_push(nxt, pos, end - pos, -1)) return false;
        }
        frag_list tmp = *cur;
        *cur = *nxt;
        *nxt = tmp;
    }
    return true;
}

static rk_status nomem(rk_err *err, size_t len) {
    return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory encoding %zu bytes", len);
}

static rk_status encode_frags(const rk_tokenizer *t, const char *text, size_t len, const frag_list *fr,
                              bool add_special, rk_tok_work *w, rk_tok_ids *out, rk_err *err) {
    if (add_special && t->add_bos) {
        if (t->bos < 0) return rk_err_set(err, RK_E_UNSUPPORTED, "tokenizer: vocab adds BOS but has no BOS id");
        if (!rk_tok_ids_push(out, t->bos)) return nomem(err, len);
    }
    bool prev_special = true; /* SPM: the first text fragment gets the dummy prefix */
    for (size_t i = 0; i < fr->n; i++) {
        frag f = fr->v[i];
        rk_status st;
        if (f.tok >= 0) {
            if (!rk_tok_ids_push(out, f.tok)) return nomem(err, len);
            prev_special = true;
            continue;
        }
        if (t->kind == RK_TOK_SPM)
            st = rk_tok_spm_encode(t, w, text + f.off, f.len, t->add_space_prefix && prev_special, out, err);
        else st = rk_tok_bpe_encode(t, w, text + f.off, f.len, out, err);
        if (st) return st;
        prev_special = false;
    }
    if (add_special && t->add_eos && t->eos >= 0 && !rk_tok_ids_push(out, t->eos)) return nomem(err, len);
    return RK_OK;
}

rk_status rk_tokenizer_encode(const rk_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t **ids, size_t *n_ids, rk_err *err) {
    rk_status st;
    rk_tok_ids out = {0};
    rk_tok_work w = {0};
    frag_list a = {0}, b = {0};
    if (!t || !ids || !n_ids || (!text && len)) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "tokenizer: encode needs a tokenizer and text");
        goto fail;
    }
    if (len > RK_TOK_MAX_TEXT) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "tokenizer: text of %zu bytes (max %zu)", len, RK_TOK_MAX_TEXT);
        goto fail;
    }
    if (!partition(t, text, len, parse_special, &a, &b)) {
        st = nomem(err, len);
        goto fail;
    }
    if ((st = encode_frags(t, text, len, &a, add_special, &w, &out, err))) goto fail;
    *ids = out.v;
    *n_ids = out.n;
    out.v = NULL;
fail:
    free(out.v);
    free(a.v);
    free(b.v);
    rk_tok_work_free(&w);
    return st;
}

/* ---- pieces and decode ---------------------------------------------- */

size_t rk_tokenizer_piece(const rk_tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap) {
    if (!t || id < 0 || (uint32_t)id >= t->n_vocab) return 0;
    uint8_t ty = t->type[id];
    rk_str s = t->text[id];
    switch (ty) {
    case RK_TOKTYPE_CONTROL:
    case RK_TOKTYPE_UNKNOWN:
        if (!render_special) return 0;
        /* fall through */
    case RK_TOKTYPE_USER_DEFINED:
        if (s.len <= cap && s.len) memcpy(buf, s.ptr, s.len);
        return s.len;
    case RK_TOKTYPE_NORMAL:
    case RK_TOKTYPE_BYTE:
        return t->kind == RK_TOK_SPM ? rk_tok_spm_piece(t, id, buf, cap) : rk_tok_bpe_piece(t, id, buf, cap);
    default: return 0;
    }
}

size_t rk_tokenizer_max_piece_bytes(const rk_tokenizer *t) { return t->max_text_bytes; }

rk_status rk_tokenizer_decode(const rk_tokenizer *t, const int32_t *ids, size_t n_ids, bool render_special, char **text,
                              size_t *len, rk_err *err) {
    if (!t || !text || !len || (!ids && n_ids))
        return rk_err_set(err, RK_E_INVALID_ARG, "tokenizer: decode needs a tokenizer and ids");
    size_t total = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t k = rk_tokenizer_piece(t, ids[i], render_special, NULL, 0);
        if (k > SIZE_MAX - 1 - total) return rk_err_set(err, RK_E_INVALID_ARG, "tokenizer: decoded text too long");
        total += k;
    }
    char *s = malloc(total + 1);
    if (!s) return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory decoding %zu ids", n_ids);
    size_t n = 0;
    for (size_t i = 0; i < n_ids; i++) {
        size_t k = rk_tokenizer_piece(t, ids[i], render_special, s + n, total - n);
        if (i == 0 && t->add_space_prefix && k && s[n] == ' ') {
            memmove(s + n, s + n + 1, k - 1);
            k--;
        }
        n += k;
    }
    s[n] = '\0';
    *text = s;
    *len = n;
    return RK_OK;
}

/* ---- queries -------------------------------------------------------- */

int32_t rk_tokenizer_n_vocab(const rk_tokenizer *t) { return (int32_t)t->n_vocab; }
int32_t rk_tokenizer_bos(const rk_tokenizer *t) { return t->bos; }
int32_t rk_tokenizer_eos(const rk_tokenizer *t) { return t->eos; }
bool rk_tokenizer_add_bos(const rk_tokenizer *t) { return t->add_bos; }
uint64_t rk_tokenizer_hash(const rk_tokenizer *t) { return t->hash; }
rk_tok_kind rk_tokenizer_kind(const rk_tokenizer *t) { return t->kind; }
rk_tok_pre rk_tokenizer_pre(const rk_tokenizer *t) { return t->pre; }
const char *rk_tokenizer_pre_name(const rk_tokenizer *t) { return rk_tok_pre_rules_name(t->pre); }

bool rk_tokenizer_pre_fallback(const rk_tokenizer *t, rk_str *stored) {
    if (stored) *stored = t->pre_stored;
    return t->pre_fallback;
}

bool rk_tokenizer_is_eog(const rk_tokenizer *t, int32_t id) {
    for (uint32_t i = 0; i < t->n_eog; i++)
        if (t->eog[i] == id) return true;
    return false;
}

size_t rk_tokenizer_eog_ids(const rk_tokenizer *t, const int32_t **ids) {
    *ids = t->eog;
    return t->n_eog;
}

int32_t rk_tokenizer_find(const rk_tokenizer *t, const char *text) {
    return text ? rk_tok_lookup(t, text, strlen(text)) : -1;
}

rk_str rk_tokenizer_text(const rk_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return (rk_str){NULL, 0};
    return t->text[id];
}

rk_toktype rk_tokenizer_type(const rk_tokenizer *t, int32_t id) {
    if (id < 0 || (uint32_t)id >= t->n_vocab) return RK_TOKTYPE_UNDEFINED;
    return (rk_toktype)t->type[id];
}
