/* SentencePiece-style tokenizer ("llama" vocab), as llama.cpp's llm_tokenizer_spm:
 * escape spaces to U+2581, split into UTF-8 characters, merge the adjacent pair whose
 * concatenation is a vocab entry with the highest score (ties: leftmost) until none is
 * left, then emit each symbol's token or, when it has none, its bytes as <0xXX>. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

static const char k_space[3] = {'\xe2', '\x96', '\x81'}; /* U+2581 "▁" */

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

int rk_tok_byte_of(rk_str s) {
    if (s.len != 6 || memcmp(s.ptr, "<0x", 3) != 0 || s.ptr[5] != '>') return -1;
    int hi = hexval(s.ptr[3]), lo = hexval(s.ptr[4]);
    return (hi < 0 || lo < 0) ? -1 : hi * 16 + lo;
}

/* ---- character pairs that occur inside tokens ------------------------- */

static uint64_t pair_key(uint32_t a, uint32_t b) { return ((uint64_t)a << 21 | b) + 1; }

static uint64_t pair_slot(uint64_t key, uint64_t mask) { return (key * 0x9E3779B97F4A7C15ull >> 20) & mask; }

static bool pair_has(const rk_tokenizer *t, uint64_t key) {
    for (uint64_t i = pair_slot(key, t->pair_mask);; i = (i + 1) & t->pair_mask) {
        if (t->pair[i] == key) return true;
        if (t->pair[i] == 0) return false;
    }
}

/* One initial symbol at s[0..n): its length by the lead-byte rule (clipped), and its
 * code point when it is one valid character (*ok). */
static size_t symbol_at(const char *s, size_t n, uint32_t *cp, bool *ok) {
    size_t k = rk_utf8_len_lead((unsigned char)s[0]);
    if (k > n) k = n;
    *ok = rk_utf8_decode(s, k, cp, ok) == k && *ok;
    return k;
}

static rk_status build_pairs(rk_tokenizer *t, rk_err *err) {
    uint64_t n_pairs = 0; /* with repeats: an upper bound on the distinct pairs */
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->text[i].ptr;
        for (size_t off = 0, n = t->text[i].len; off < n; n_pairs++) {
            size_t k = rk_utf8_len_lead((unsigned char)s[off]);
            off += k < n - off ? k : n - off;
        }
        if (t->text[i].len) n_pairs--;
    }
    uint64_t cap = 1024;
    while (cap < n_pairs + n_pairs / 2) cap *= 2;
    t->pair = calloc(cap, sizeof *t->pair);
    if (!t->pair) return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (pair set)");
    t->pair_mask = cap - 1;
    for (uint32_t i = 0; i < t->n_vocab; i++) {
        const char *s = t->text[i].ptr;
        size_t n = t->text[i].len, off = 0;
        uint32_t prev = 0;
        bool prev_ok = false;
        while (off < n) {
            uint32_t cp;
            bool ok;
            off += symbol_at(s + off, n - off, &cp, &ok);
            if (prev_ok && ok) {
                uint64_t key = pair_key(prev, cp), j = pair_slot(key, t->pair_mask);
                while (t->pair[j] && t->pair[j] != key) j = (j + 1) & t->pair_mask;
                t->pair[j] = key;
            }
            prev = cp;
            prev_ok = ok;
        }
    }
    return RK_OK;
}

rk_status rk_tok_spm_init(rk_tokenizer *t, rk_err *err) {
    t->pre = RK_TOK_PRE_NONE;
    for (int b = 0; b < 256; b++) {
        static const char hex[] = "0123456789ABCDEF";
        char s[7] = {'<', '0', 'x', hex[b >> 4], hex[b & 15], '>', 0};
        t->byte_tok[b] = rk_tok_lookup(t, s, 6);
        /* llama.cpp falls back to a token whose text is the byte itself */
        if (t->byte_tok[b] < 0) {
            char c = (char)b;
            t->byte_tok[b] = rk_tok_lookup(t, &c, 1);
        }
    }
    return build_pairs(t, err);
}

/* ---- encode ------------------------------------------------------------ */

static bool spm_pair(const rk_tokenizer *t, const char *s, const rk_tok_sym *l, const rk_tok_sym *r, double *prio) {
    int32_t id = rk_tok_lookup(t, s + l->off, (size_t)l->n + r->n);
    if (id < 0) return false;
    *prio = t->score[id];
    return true;
}

/* Merges and emits w->buf[beg..end), a run that starts on a symbol boundary. */
static rk_status encode_piece(const rk_tokenizer *t, rk_tok_work *w, size_t beg, size_t end, rk_tok_ids *out,
                              rk_err *err) {
    size_t n_sym = 0;
    for (size_t off = beg; off < end;) {
        size_t k = rk_utf8_len_lead((unsigned char)w->buf[off]);
        if (k > end - off) k = end - off;
        if (!rk_tok_grow(&w->sym, &w->sym_cap, n_sym + 1, sizeof *w->sym)) goto fail;
        w->sym[n_sym] =
            (rk_tok_sym){(uint32_t)off, (uint32_t)k, (int32_t)n_sym - 1, off + k == end ? -1 : (int32_t)n_sym + 1};
        n_sym++;
        off += k;
    }
    rk_status st = rk_tok_merge(t, w, n_sym, spm_pair, err);
    if (st) return st;

    for (int32_t i = 0; i != -1; i = w->sym[i].next) {
        const rk_tok_sym *s = &w->sym[i];
        int32_t id = rk_tok_lookup(t, w->buf + s->off, s->n);
        if (id >= 0) {
            if (!rk_tok_ids_push(out, id)) goto fail;
            continue;
        }
        /* Merged symbols are vocab entries by construction; only unmerged characters
         * get here. */
        for (uint32_t j = 0; j < s->n; j++) {
            int32_t b = t->byte_tok[(unsigned char)w->buf[s->off + j]];
            if (b < 0) b = t->unk;
            if (b < 0)
                return rk_err_set(err, RK_E_UNSUPPORTED, "tokenizer: byte 0x%02x has no <0x..> token and no unk",
                                  (unsigned char)w->buf[s->off + j]);
            if (!rk_tok_ids_push(out, b)) goto fail;
        }
    }
    return RK_OK;
fail:
    return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (spm, %zu bytes)", end - beg);
}

rk_status rk_tok_spm_encode(const rk_tokenizer *t, rk_tok_work *w, const char *text, size_t len, bool prefix,
                            rk_tok_ids *out, rk_err *err) {
    /* escaped text: every ' ' becomes 3 bytes; len <= RK_TOK_MAX_TEXT keeps it in uint32 */
    size_t n = 0;
    if (!rk_tok_grow(&w->buf, &w->buf_cap, 3 * len + 3, 1))
        return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory (spm, %zu bytes)", len);
    if (prefix) {
        memcpy(w->buf, k_space, 3);
        n = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(w->buf + n, k_space, 3);
            n += 3;
        } else {
            w->buf[n++] = text[i];
        }
    }
    /* The merge order is global in llama.cpp, but no merge crosses a pair of characters
     * that no token contains, so pieces cut there give the same tokens with small
     * queues. */
    size_t beg = 0, off = 0;
    uint32_t prev = 0;
    bool prev_ok = false;
    while (off < n) {
        uint32_t cp;
        bool ok;
        size_t k = symbol_at(w->buf + off, n - off, &cp, &ok);
        if (off > beg && prev_ok && ok && !pair_has(t, pair_key(prev, cp))) {
            rk_status st = encode_piece(t, w, beg, off, out, err);
            if (st) return st;
            beg = off;
        }
        prev = cp;
        prev_ok = ok;
        off += k;
    }
    return n > beg ? encode_piece(t, w, beg, n, out, err) : RK_OK;
}

size_t rk_tok_spm_piece(const rk_tokenizer *t, int32_t id, char *buf, size_t cap) {
    rk_str s = t->text[id];
    if (t->type[id] == RK_TOKTYPE_BYTE) {
        int b = rk_tok_byte_of(s);
        if (b < 0) return 0;
        if (cap >= 1) buf[0] = (char)b;
        return 1;
    }
    /* NORMAL: "▁" -> ' ' */
    size_t n = 0;
    for (size_t i = 0; i < s.len; n++) {
        if (s.len - i >= 3 && memcmp(s.ptr + i, k_space, 3) == 0) {
            i += 3;
        } else {
            i++;
        }
    }
    if (n > cap) return n;
    n = 0;
    for (size_t i = 0; i < s.len;) {
        if (s.len - i >= 3 && memcmp(s.ptr + i, k_space, 3) == 0) {
            buf[n++] = ' ';
            i += 3;
        } else {
            buf[n++] = s.ptr[i++];
        }
    }
    return n;
}
