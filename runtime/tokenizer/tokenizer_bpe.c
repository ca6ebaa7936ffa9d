/* GPT-2 byte-level BPE ("gpt2" vocab), as llama.cpp's llm_tokenizer_bpe:
 * 1. pre-tokenize: the regex set named by tokenizer.ggml.pre, written here as
 *    hand-made matchers over code points with the regexes' alternation order;
 * 2. map each word's bytes to GPT-2's printable code points (bytes_to_unicode);
 * 3. merge adjacent symbols by merge rank (lowest first, ties leftmost) with a heap;
 * 4. emit each symbol's token. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- GPT-2 byte <-> code point ----------------------------------------
 * Printable bytes 33..126, 161..172, 174..255 map to themselves; the other 68 map, in
 * byte order, to 256..323: 0..32 -> 256..288, 127..160 -> 289..322, 173 -> 323. */
static uint32_t byte_to_cp(unsigned char b) {
    if (b <= 32) return 256u + b;
    if (b >= 127 && b <= 160) return 289u + (b - 127u);
    if (b == 173) return 323;
    return b;
}

static int cp_to_byte(uint32_t cp) {
    if ((cp >= 33 && cp <= 126) || (cp >= 161 && cp <= 172) || (cp >= 174 && cp <= 255)) return (int)cp;
    if (cp >= 256 && cp <= 288) return (int)(cp - 256);
    if (cp >= 289 && cp <= 322) return (int)(cp - 289 + 127);
    if (cp == 323) return 173;
    return -1;
}

/* Set in rk_tok_work.cp_fl for a byte that is not valid UTF-8; it counts as U+FFFD. */
#define CP_INVALID 0x80u

/* ---- pre-tokenizer rule sets ---------------------------------------- */

static const struct {
    const char *name;
    rk_tok_pre pre;
} k_pre_names[] = {
    {"default", RK_TOK_PRE_DEFAULT},  {"gpt-2", RK_TOK_PRE_GPT2},
    {"phi-2", RK_TOK_PRE_GPT2},       {"jina-es", RK_TOK_PRE_GPT2},
    {"jina-de", RK_TOK_PRE_GPT2},     {"gigachat", RK_TOK_PRE_GPT2},
    {"jina-v1-en", RK_TOK_PRE_GPT2},  {"jina-v2-es", RK_TOK_PRE_GPT2},
    {"jina-v2-de", RK_TOK_PRE_GPT2},  {"jina-v2-code", RK_TOK_PRE_GPT2},
    {"roberta-bpe", RK_TOK_PRE_GPT2}, {"mpt", RK_TOK_PRE_GPT2},
    {"olmo", RK_TOK_PRE_GPT2},        {"jais", RK_TOK_PRE_GPT2},
    {"trillion", RK_TOK_PRE_GPT2},    {"starcoder", RK_TOK_PRE_STARCODER},
    {"refact", RK_TOK_PRE_STARCODER}, {"command-r", RK_TOK_PRE_STARCODER},
    {"smollm", RK_TOK_PRE_STARCODER}, {"codeshell", RK_TOK_PRE_STARCODER},
    {"exaone", RK_TOK_PRE_STARCODER}, {"minerva-7b", RK_TOK_PRE_STARCODER},
    {"qwen2", RK_TOK_PRE_QWEN2},      {"deepseek-r1-qwen", RK_TOK_PRE_QWEN2},
    {"stablelm2", RK_TOK_PRE_QWEN2},  {"megrez", RK_TOK_PRE_QWEN2},
    {"llama3", RK_TOK_PRE_LLAMA3},    {"llama-v3", RK_TOK_PRE_LLAMA3},
    {"llama-bpe", RK_TOK_PRE_LLAMA3}, {"falcon3", RK_TOK_PRE_LLAMA3},
};

const char *rk_tok_pre_rules_name(rk_tok_pre pre) {
    switch (pre) {
    case RK_TOK_PRE_DEFAULT: return "default";
    case RK_TOK_PRE_GPT2: return "gpt-2";
    case RK_TOK_PRE_STARCODER: return "starcoder";
    case RK_TOK_PRE_QWEN2: return "qwen2";
    case RK_TOK_PRE_LLAMA3: return "llama3";
    default: return "";
    }
}

/* Piece lengths (in code points) produced by one pass. */
typedef struct pieces {
    uint32_t **v;
    size_t *n, *cap;
    size_t prev; /* end of the last emitted piece */
} pieces;

static bool emit(pieces *o, size_t end) {
    if (end > o->prev) {
        if (!rk_tok_grow(o->v, o->cap, *o->n + 1, sizeof **o->v)) return false;
        (*o->v)[(*o->n)++] = (uint32_t)(end - o->prev);
    }
    o->prev = end;
    return true;
}

#define L RK_UF_LETTER
#define N RK_UF_NUMBER
#define S RK_UF_SPACE
#define EMIT(e)                          \
    do {                                 \
        if (!emit(o, (e))) return false; \
    } while (0)

/* 's|'t|'re|'ve|'m|'ll|'d (fold: ASCII case-insensitive); returns the match length. */
static size_t contraction(const uint32_t *cp, size_t pos, size_t end, bool fold) {
    if (cp[pos] != '\'' || pos + 1 >= end) return 0;
    uint32_t a = cp[pos + 1], b = pos + 2 < end ? cp[pos + 2] : 0;
    if (fold) {
        if (a >= 'A' && a <= 'Z') a += 32;
        if (b >= 'A' && b <= 'Z') b += 32;
    }
    if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
    return 0;
}

/* Whitespace tail of both families: \s+(?!\S) then \s+ (one space is left for the
 * next word when more follows). */
static size_t ws_end(const uint8_t *fl, size_t pos, size_t end) {
    size_t n = 0;
    while (pos + n < end && (fl[pos + n] & S)) n++;
    if (n > 1 && pos + n < end) return pos + n - 1;
    return pos + (n ? n : 1);
}

/* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static bool split_gpt2(const uint32_t *cp, const uint8_t *fl, size_t beg, size_t end, pieces *o) {
    size_t pos = beg;
    while (pos < end) {
        size_t k = contraction(cp, pos, end, false);
        if (k) {
            pos += k;
            EMIT(pos);
            continue;
        }
        /* ' ?' then \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+, whichever class follows */
        size_t q = pos + (cp[pos] == ' ');
        if (q < end && !(fl[q] & S)) {
            unsigned cls = fl[q] & (L | N);
            pos = q;
            if (cls)
                while (pos < end && (fl[pos] & cls)) pos++;
            else
                while (pos < end && !(fl[pos] & (S | L | N))) pos++;
            EMIT(pos);
            continue;
        }
        pos = ws_end(fl, pos, end);
        EMIT(pos);
    }
    return true;
}

/* (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|
 * \p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * (qwen2: max_digits 1; llama3: 3) */
static bool split_llama3(const uint32_t *cp, const uint8_t *fl, size_t beg, size_t end, size_t max_digits, pieces *o) {
    size_t pos = beg;
    while (pos < end) {
        uint32_t c = cp[pos];
        unsigned f = fl[pos];
        size_t k = contraction(cp, pos, end, true);
        if (k) {
            pos += k;
            EMIT(pos);
            continue;
        }
        if (c != '\r' && c != '\n' && !(f & N) && ((f & L) || (pos + 1 < end && (fl[pos + 1] & L)))) {
            pos++;
            while (pos < end && (fl[pos] & L)) pos++;
            EMIT(pos);
            continue;
        }
        if (f & N) {
            size_t ini = pos;
            while (pos < end && (fl[pos] & N)) {
                if (++pos - ini >= max_digits) {
                    EMIT(pos);
                    ini = pos;
                }
            }
            EMIT(pos);
            continue;
        }
        size_t q = pos + (c == ' ');
        if (q < end && !(fl[q] & (S | L | N))) {
            pos = q;
            while (pos < end && !(fl[pos] & (S | L | N))) pos++;
            while (pos < end && (cp[pos] == '\r' || cp[pos] == '\n')) pos++;
            EMIT(pos);
            continue;
        }
        size_t n = 0, last_nl = 0;
        while (pos + n < end && (fl[pos + n] & S)) {
            if (cp[pos + n] == '\r' || cp[pos + n] == '\n') last_nl = pos + n + 1;
            n++;
        }
        pos = last_nl ? last_nl : ws_end(fl, pos, end);
        EMIT(pos);
    }
    return true;
}

/* Matches of a one-code-point class, each match its own piece; runs: [class]+ else
 * [class]. Text between matches stays as pieces. */
static bool split_class(const uint32_t *cp, const uint8_t *fl, size_t beg, size_t end, bool (*in)(uint32_t, unsigned),
                        bool runs, pieces *o) {
    size_t pos = beg;
    while (pos < end) {
        if (!in(cp[pos], fl[pos])) {
            pos++;
            continue;
        }
        EMIT(pos);
        pos++;
        while (runs && pos < end && in(cp[pos], fl[pos])) pos++;
        EMIT(pos);
    }
    EMIT(end);
    return true;
}

static bool is_number(uint32_t c, unsigned f) { return (void)c, (f & N) != 0; }
/* [\p{P}\$\+<=>\^~\|] */
static bool is_punct_sym(uint32_t c, unsigned f) {
    return (f & RK_UF_PUNCT) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' ||
           c == '|';
}

/* [0-9][0-9][0-9], leftmost and non-overlapping */
static bool split_ascii3(const uint32_t *cp, size_t beg, size_t end, pieces *o) {
    size_t pos = beg;
    while (pos + 3 <= end) {
        if (cp[pos] >= '0' && cp[pos] <= '9' && cp[pos + 1] >= '0' && cp[pos + 1] <= '9' && cp[pos + 2] >= '0' &&
            cp[pos + 2] <= '9') {
            EMIT(pos);
            pos += 3;
            EMIT(pos);
        } else {
            pos++;
        }
    }
    EMIT(end);
    return true;
}

#undef EMIT

/* One regex of the set applied to [beg, end). */
static bool run_pass(rk_tok_pre pre, int pass, const uint32_t *cp, const uint8_t *fl, size_t beg, size_t end,
                     pieces *o) {
    o->prev = beg;
    switch (pre) {
    case RK_TOK_PRE_DEFAULT:
        if (pass == 0) return split_class(cp, fl, beg, end, is_punct_sym, true, o);
        if (pass == 1) return split_gpt2(cp, fl, beg, end, o);
        if (pass == 2) return split_class(cp, fl, beg, end, is_number, true, o);
        return split_ascii3(cp, beg, end, o);
    case RK_TOK_PRE_STARCODER:
        if (pass == 0) return split_class(cp, fl, beg, end, is_number, false, o);
        return split_gpt2(cp, fl, beg, end, o);
    case RK_TOK_PRE_QWEN2: return split_llama3(cp, fl, beg, end, 1, o);
    case RK_TOK_PRE_LLAMA3: return split_llama3(cp, fl, beg, end, 3, o);
    default: return split_gpt2(cp, fl, beg, end, o);
    }
}

static int n_passes(rk_tok_pre pre) { return pre == RK_TOK_PRE_DEFAULT ? 4 : pre == RK_TOK_PRE_STARCODER ? 2 : 1; }

#undef L
#undef N
#undef S

/* ---- merges ----------------------------------------------------------- */

static int32_t merge_rank(const rk_tokenizer *t, const char *l, size_t nl, const char *r, size_t nr) {
    if (nl > t->max_merge_part || nr > t->max_merge_part) return -1;
    uint64_t h = rk_fnv1a(RK_FNV_OFFSET, l, nl);
    h = rk_fnv1a(h, " ", 1);
    h = rk_fnv1a(h, r, nr);
    for (uint32_t i = (uint32_t)h & t->merges.mask;; i = (i + 1) & t->merges.mask) {
        int32_t m = t->merges.slot[i];
        if (m < 0) return -1;
        if (t->merge_l[m].len == nl && t->merge_r[m].len == nr && memcmp(t->merge_l[m].ptr, l, nl) == 0 &&
            memcmp(t->merge_r[m].ptr, r, nr) == 0)
            return m;
    }
}

static bool bpe_pair(const rk_tokenizer *t, const char *s, const rk_tok_sym *l, const rk_tok_sym *r, double *prio) {
    int32_t rank = merge_rank(t, s + l->off, l->n, s + r->off, r->n);
    if (rank < 0) return false;
    *prio = -(double)rank;
    return true;
}

rk_status rk_tok_bpe_init(rk_tokenizer *t, const rk_gguf *g, rk_err *err) {
    rk_status st;
    const rk_gguf_kv *pre = rk_gguf_find_kv(g, "tokenizer.ggml.pre");
    t->pre = RK_TOK_PRE_DEFAULT; /* llama.cpp's choice when the key is missing */
    if (pre) {
        if ((st = rk_gguf_get_str(g, "tokenizer.ggml.pre", &t->pre_stored, err))) return st;
        t->pre = RK_TOK_PRE_GPT2;
        t->pre_fallback = true;
        for (size_t i = 0; i < sizeof k_pre_names / sizeof k_pre_names[0]; i++) {
            if (rk_str_eq(t->pre_stored, k_pre_names[i].name)) {
                t->pre = k_pre_names[i].pre;
                t->pre_fallback = false;
                break;
            }
        }
    }
    if (t->pre == RK_TOK_PRE_LLAMA3) {
        t->ignore_merges = true;
        t->add_bos = true;
    }

    const rk_gguf_kv *kv = rk_gguf_find_kv(g, "tokenizer.ggml.merges");
    if (!kv) return rk_err_set(err, RK_E_NOT_FOUND, "tokenizer: missing key tokenizer.ggml.merges");
    if (kv->type != RK_GGUF_ARRAY || kv->arr_type != RK_GGUF_STRING)
        return rk_err_set(err, RK_E_GGUF_TYPE, "tokenizer: tokenizer.ggml.merges is not an array of strings");
    if (kv->n > (uint64_t)INT32_MAX / 4)
        return rk_err_set(err, RK_E_GGUF_COUNT, "tokenizer: %llu merges (max %d)", (unsigned long long)kv->n,
                          INT32_MAX / 4);
    t->n_merges = (uint32_t)kv->n;
    size_t n_alloc = t->n_merges ? t->n_merges : 1;
    t->merge_l = calloc(n_alloc, sizeof *t->merge_l);
    t->merge_r = calloc(n_alloc, sizeof *t->merge_r);
    uint32_t cap = 16;
    while (cap < 2u * t->n_merges) cap *= 2;
    t->merges.slot = malloc((size_t)cap * sizeof *t->merges.slot);
    if (!t->merge_l || !t->merge_r || !t->merges.slot)
        return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (%u merges)", t->n_merges);
    memset(t->merges.slot, 0xff, (size_t)cap * sizeof *t->merges.slot);
    t->merges.mask = cap - 1;

    for (uint32_t i = 0; i < t->n_merges; i++) {
        rk_str s;
        if ((st = rk_gguf_arr_str(g, kv, i, &s, err))) return st;
        /* split at the first space after the first byte; no space: never matches */
        const char *sp = s.len > 1 ? memchr(s.ptr + 1, ' ', s.len - 1) : NULL;
        if (!sp) continue;
        t->merge_l[i] = (rk_str){s.ptr, (uint64_t)(sp - s.ptr)};
        t->merge_r[i] = (rk_str){sp + 1, s.len - t->merge_l[i].len - 1};
        if (t->merge_l[i].len > t->max_merge_part) t->max_merge_part = t->merge_l[i].len;
        if (t->merge_r[i].len > t->max_merge_part) t->max_merge_part = t->merge_r[i].len;
        /* the stored "left right" hashes like the lookup's left + ' ' + right */
        uint32_t h = (uint32_t)rk_fnv1a(RK_FNV_OFFSET, s.ptr, s.len) & t->merges.mask;
        for (;; h = (h + 1) & t->merges.mask) {
            int32_t m = t->merges.slot[h];
            if (m < 0) {
                t->merges.slot[h] = (int32_t)i;
                break;
            }
            if (t->merge_l[m].len == t->merge_l[i].len && t->merge_r[m].len == t->merge_r[i].len &&
                memcmp(t->merge_l[m].ptr, s.ptr, s.len) == 0)
                break; /* duplicate: the first (lower) rank stays, as llama.cpp */
        }
    }
    return RK_OK;
}

/* ---- encode ---------------------------------------------------------- */

/* Grows the three parallel code-point arrays together. */
static bool grow_cps(rk_tok_work *w, size_t need) {
    if (need <= w->cp_cap) return true;
    size_t cap = w->cp_cap ? w->cp_cap : 64;
    while (cap < need) cap *= 2; /* need <= RK_TOK_MAX_TEXT + 1 */
    uint32_t *cp = realloc(w->cp, cap * sizeof *cp);
    if (cp) w->cp = cp;
    uint32_t *off = realloc(w->cp_off, cap * sizeof *off);
    if (off) w->cp_off = off;
    uint8_t *fl = realloc(w->cp_fl, cap);
    if (fl) w->cp_fl = fl;
    if (!cp || !off || !fl) return false; /* arrays stay valid at the old capacity */
    w->cp_cap = cap;
    return true;
}

/* One pre-tokenized word, code points [a, b) of text -> tokens. As in llama.cpp, each
 * invalid byte is replaced by U+FFFD's bytes before the byte-level mapping. */
static rk_status encode_word(const rk_tokenizer *t, rk_tok_work *wk, const char *text, size_t a, size_t b,
                             rk_tok_ids *out, rk_err *err) {
    size_t n_max = 3 * (size_t)(wk->cp_off[b] - wk->cp_off[a]); /* bytes after U+FFFD */
    if (!rk_tok_grow(&wk->buf, &wk->buf_cap, 2 * n_max, 1) ||
        !rk_tok_grow(&wk->sym, &wk->sym_cap, n_max, sizeof *wk->sym))
        goto fail;
    size_t m = 0, n = 0;
    for (size_t c = a; c < b; c++) {
        const char *src = text + wk->cp_off[c];
        size_t k_src = wk->cp_off[c + 1] - wk->cp_off[c];
        if (wk->cp_fl[c] & CP_INVALID) {
            src = "\xef\xbf\xbd";
            k_src = 3;
        }
        for (size_t j = 0; j < k_src; j++) {
            size_t k = rk_utf8_encode(byte_to_cp((unsigned char)src[j]), wk->buf + m);
            wk->sym[n] = (rk_tok_sym){(uint32_t)m, (uint32_t)k, (int32_t)n - 1, (int32_t)n + 1};
            m += k;
            n++;
        }
    }
    wk->sym[n - 1].next = -1;
    if (t->ignore_merges) {
        int32_t id = rk_tok_lookup(t, wk->buf, m);
        if (id >= 0) {
            if (!rk_tok_ids_push(out, id)) goto fail;
            return RK_OK;
        }
    }
    rk_status st = rk_tok_merge(t, wk, n, bpe_pair, err);
    if (st) return st;
    for (int32_t i = 0; i != -1; i = wk->sym[i].next) {
        const rk_tok_sym *s = &wk->sym[i];
        int32_t id = rk_tok_lookup(t, wk->buf + s->off, s->n);
        if (id >= 0) {
            if (!rk_tok_ids_push(out, id)) goto fail;
            continue;
        }
        /* llama.cpp: tokens of the symbol's single bytes, skipping those it lacks */
        for (uint32_t j = 0; j < s->n; j++) {
            id = rk_tok_lookup(t, wk->buf + s->off + j, 1);
            if (id >= 0 && !rk_tok_ids_push(out, id)) goto fail;
        }
    }
    return RK_OK;
fail:
    return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (bpe word of %zu bytes)", n_max / 3);
}

/* Pre-tokenizes text with the rules pre: fills w->cp* and leaves the word lengths (in
 * code points) in w->piece[*which]. */
static bool pretokenize(rk_tok_pre pre, rk_tok_work *w, const char *text, size_t len, int *which) {
    /* code points with their byte offsets; invalid bytes count as U+FFFD but keep
     * their own byte */
    if (!grow_cps(w, len + 1)) return false;
    size_t n_cp = 0;
    for (size_t off = 0; off < len;) {
        bool ok;
        size_t k = rk_utf8_decode(text + off, len - off, &w->cp[n_cp], &ok);
        w->cp_off[n_cp] = (uint32_t)off;
        w->cp_fl[n_cp] = (uint8_t)(rk_unicode_flags(w->cp[n_cp]) | (ok ? 0u : CP_INVALID));
        n_cp++;
        off += k;
    }
    w->cp_off[n_cp] = (uint32_t)len;
    int cur = 0;
    w->piece_n[0] = 0;
    if (n_cp) {
        if (!rk_tok_grow(&w->piece[0], &w->piece_cap[0], 1, sizeof(uint32_t))) return false;
        w->piece[0][w->piece_n[0]++] = (uint32_t)n_cp;
    }
    /* each pass re-splits the previous pass's pieces */
    for (int pass = 0; n_cp && pass < n_passes(pre); pass++) {
        int nx = 1 - cur;
        pieces o = {&w->piece[nx], &w->piece_n[nx], &w->piece_cap[nx], 0};
        w->piece_n[nx] = 0;
        size_t beg = 0;
        for (size_t i = 0; i < w->piece_n[cur]; i++) {
            size_t end = beg + w->piece[cur][i];
            if (!run_pass(pre, pass, w->cp, w->cp_fl, beg, end, &o)) return false;
            beg = end;
        }
        cur = nx;
    }
    *which = cur;
    return true;
}

rk_status rk_tok_bpe_encode(const rk_tokenizer *t, rk_tok_work *w, const char *text, size_t len, rk_tok_ids *out,
                            rk_err *err) {
    int cur;
    if (!pretokenize(t->pre, w, text, len, &cur))
        return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (bpe, %zu bytes)", len);
    size_t beg = 0;
    for (size_t i = 0; i < w->piece_n[cur]; i++) {
        size_t end = beg + w->piece[cur][i];
        rk_status st = encode_word(t, w, text, beg, end, out, err);
        if (st) return st;
        beg = end;
    }
    return RK_OK;
}

rk_status rk_tok_pretokenize(rk_tok_pre pre, const char *text, size_t len, size_t **ends, size_t *n, rk_err *err) {
    rk_status st = RK_OK;
    rk_tok_work w = {0};
    int cur;
    size_t *e = NULL;
    if (len > RK_TOK_MAX_TEXT || (!text && len)) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "tokenizer: pretokenize text of %zu bytes", len);
        goto fail;
    }
    if (!pretokenize(pre, &w, text, len, &cur) || !(e = malloc((w.piece_n[cur] ? w.piece_n[cur] : 1) * sizeof *e))) {
        st = rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (pretokenize)");
        goto fail;
    }
    size_t beg = 0;
    for (size_t i = 0; i < w.piece_n[cur]; i++) {
        beg += w.piece[cur][i];
        e[i] = w.cp_off[beg];
    }
    *ends = e;
    *n = w.piece_n[cur];
    e = NULL;
fail:
    free(e);
    rk_tok_work_free(&w);
    return st;
}

/* ---- pieces ----------------------------------------------------------- */

size_t rk_tok_bpe_piece(const rk_tokenizer *t, int32_t id, char *buf, size_t cap) {
    rk_str s = t->text[id];
    if (t->type[id] == RK_TOKTYPE_BYTE) {
        int b = rk_tok_byte_of(s); /* "<0xXX>" byte tokens, as in SPM vocabs */
        if (b >= 0) {
            if (cap >= 1) buf[0] = (char)b;
            return 1;
        }
    }
    /* Byte-level text back to bytes; characters outside the map are copied as they are. */
    size_t n = 0;
    for (int write = 0; write < 2; write++) {
        if (write && n > cap) return n;
        n = 0;
        for (size_t i = 0; i < s.len;) {
            uint32_t cp;
            bool ok;
            size_t k = rk_utf8_decode(s.ptr + i, s.len - i, &cp, &ok);
            int b = ok ? cp_to_byte(cp) : -1;
            if (b >= 0) {
                if (write) buf[n] = (char)b;
                n++;
            } else {
                if (write) memcpy(buf + n, s.ptr + i, k);
                n += k;
            }
            i += k;
        }
    }
    return n;
}
