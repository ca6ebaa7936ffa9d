/* UTF-8 decode/encode, Unicode category lookups and the streaming UTF-8 joiner. */
#include <string.h>

#include "tokenizer_impl.h"

rk_ucat rk_unicode_category(uint32_t cp) {
    if (cp > 0x10FFFF) return RK_UCAT_CN;
    /* last range whose first code point is <= cp; entry 0 starts at 0 */
    size_t lo = 0, hi = rk_unicode_n_ranges;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if ((rk_unicode_ranges[mid] >> 8) <= cp) lo = mid;
        else hi = mid;
    }
    return (rk_ucat)(rk_unicode_ranges[lo] & 0xff);
}

/* Unicode White_Space property (PropList.txt); stable since Unicode 6.3. */
bool rk_unicode_is_space(uint32_t cp) {
    if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
    if (cp < 0x85) return false;
    return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
           cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

unsigned rk_unicode_flags(uint32_t cp) {
    unsigned f = rk_unicode_is_space(cp) ? RK_UF_SPACE : 0u;
    if (cp < 0x80) { /* fast path, same answers as the table */
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return f | RK_UF_LETTER;
        if (cp >= '0' && cp <= '9') return f | RK_UF_NUMBER;
    }
    switch (rk_unicode_category(cp)) {
    case RK_UCAT_L: return f | RK_UF_LETTER;
    case RK_UCAT_N: return f | RK_UF_NUMBER;
    case RK_UCAT_P: return f | RK_UF_PUNCT;
    default: return f;
    }
}

size_t rk_utf8_len_lead(unsigned char c) {
    static const unsigned char len[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return len[c >> 4];
}

size_t rk_utf8_decode(const char *s, size_t n, uint32_t *cp, bool *valid) {
    const unsigned char *b = (const unsigned char *)s;
    size_t need;
    uint32_t v;
    if (b[0] < 0x80) {
        *cp = b[0];
        *valid = true;
        return 1;
    }
    if ((b[0] & 0xE0) == 0xC0) {
        need = 2;
        v = b[0] & 0x1Fu;
    } else if ((b[0] & 0xF0) == 0xE0) {
        need = 3;
        v = b[0] & 0x0Fu;
    } else if ((b[0] & 0xF8) == 0xF0) {
        need = 4;
        v = b[0] & 0x07u;
    } else {
        goto bad; /* continuation byte or F8..FF */
    }
    if (need > n) goto bad;
    for (size_t i = 1; i < need; i++) {
        if ((b[i] & 0xC0) != 0x80) goto bad;
        v = (v << 6) | (b[i] & 0x3Fu);
    }
    if (v > 0x10FFFF) goto bad;
    *cp = v;
    *valid = true;
    return need;
bad:
    *cp = 0xFFFD;
    *valid = false;
    return 1;
}

size_t rk_utf8_encode(uint32_t cp, char out[4]) {
    if (cp > 0x10FFFF) cp = 0xFFFD;
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12));
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18));
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- streaming joiner ------------------------------------------------ */

void rk_utf8_stream_init(rk_utf8_stream *s) { memset(s, 0, sizeof *s); }

/* Length of a sequence starting with lead byte c, 0 if c cannot start one. */
static size_t seq_len(unsigned char c) {
    if (c < 0x80) return 1;
    if ((c & 0xE0) == 0xC0) return 2;
    if ((c & 0xF0) == 0xE0) return 3;
    if ((c & 0xF8) == 0xF0) return 4;
    return 0;
}

/* Bytes at the end of b[0..n) that form an unfinished but so far valid sequence. */
static size_t incomplete_tail(const unsigned char *b, size_t n) {
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = b[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation: look further back */
        size_t need = seq_len(c);
        return (need > back) ? back : 0;
    }
    return 0;
}

size_t rk_utf8_stream_push(rk_utf8_stream *s, const char *in, size_t n, char *out, size_t cap) {
    if (cap < n + 3) return SIZE_MAX;
    size_t total = s->n_pend + n;
    memcpy(out, s->pend, s->n_pend);
    if (n) memcpy(out + s->n_pend, in, n);
    size_t keep = incomplete_tail((const unsigned char *)out, total);
    s->n_pend = (unsigned)keep;
    memcpy(s->pend, out + total - keep, keep);
    return total - keep;
}

size_t rk_utf8_stream_flush(rk_utf8_stream *s, char *out, size_t cap) {
    if (cap < s->n_pend) return SIZE_MAX;
    size_t n = s->n_pend;
    memcpy(out, s->pend, n);
    s->n_pend = 0;
    return n;
}
