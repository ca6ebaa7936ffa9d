/* UTF-8 checks and the streamer that turns generated token bytes into caller text. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "gen_impl.h"

int rk_utf8_char(const unsigned char *p, size_t n) {
    unsigned c = p[0];
    if (c < 0x80) return 1;
    int len;
    unsigned lo = 0x80, hi = 0xbf; /* allowed range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
        len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
        len = 3;
        if (c == 0xe0) lo = 0xa0;      /* overlong */
        else if (c == 0xed) hi = 0x9f; /* surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        len = 4;
        if (c == 0xf0) lo = 0x90;      /* overlong */
        else if (c == 0xf4) hi = 0x8f; /* above U+10FFFF */
    } else {
        return -1; /* continuation byte, overlong lead C0/C1, or F5..FF */
    }
    for (int i = 1; i < len; i++) {
        if ((size_t)i >= n) return 0;
        unsigned b = p[i];
        unsigned blo = i == 1 ? lo : 0x80, bhi = i == 1 ? hi : 0xbf;
        if (b < blo || b > bhi) return -1;
    }
    return len;
}

bool rk_utf8_valid(const char *p, size_t n, size_t *bad) {
    const unsigned char *u = (const unsigned char *)p;
    size_t i = 0;
    while (i < n) {
        if (u[i] < 0x80) { /* ASCII runs are the common case */
            i++;
            continue;
        }
        int l = rk_utf8_char(u + i, n - i);
        if (l <= 0) {
            if (bad) *bad = i;
            return false;
        }
        i += (size_t)l;
    }
    return true;
}

bool rk_gen_buf_reserve(rk_gen_buf *b, size_t cap) {
    if (cap <= b->cap) return true;
    char *q = realloc(b->p, cap);
    if (!q) return false;
    b->p = q;
    b->cap = cap;
    return true;
}

bool rk_gen_buf_put(rk_gen_buf *b, const void *p, size_t n) {
    if (n == 0) return true;
    if (n > SIZE_MAX / 2 - b->n) return false;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        if (!rk_gen_buf_reserve(b, cap)) return false;
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
    return true;
}

void rk_gen_buf_free(rk_gen_buf *b) {
    free(b->p);
    *b = (rk_gen_buf){0};
}

size_t rk_gen_utf8_sanitize(rk_gen_buf *out, const char *p, size_t n, bool final) {
    static const char repl[3] = {'\xef', '\xbf', '\xbd'};
    size_t i = 0, run = 0; /* p[run..i) is well-formed and not yet copied */
    while (i < n) {
        int l = rk_utf8_char((const unsigned char *)p + i, n - i);
        if (l > 0) {
            i += (size_t)l;
            continue;
        }
        if (l == 0 && !final) break;
        if (!rk_gen_buf_put(out, p + run, i - run) || !rk_gen_buf_put(out, repl, sizeof repl)) return (size_t)-1;
        run = ++i;
    }
    if (!rk_gen_buf_put(out, p + run, i - run)) return (size_t)-1;
    return i;
}

/* p[0..n) without a trailing incomplete character: the bytes of a character that a cut
 * (a length limit, a stop string, the end of generation) left unfinished are dropped, not
 * shown as U+FFFD (the model never wrote that character). Bytes that cannot start or
 * continue a character stay, for the sanitizer to replace. */
static size_t complete_len(const char *p, size_t n) {
    size_t i = n;
    while (i > 0 && n - i < 4 && ((unsigned char)p[i - 1] & 0xC0) == 0x80) i--;
    if (i == 0) return n;
    const size_t lead = ((unsigned char)p[i - 1] & 0x80) ? i - 1 : i;
    if (lead == n) return n;
    return rk_utf8_char((const unsigned char *)p + lead, n - lead) == 0 ? lead : n;
}

static size_t stop_len(const rk_gen_text *t, int k) { return t->stop_len ? t->stop_len[k] : strlen(t->stop[k]); }

bool rk_gen_text_push(rk_gen_text *t, const char *p, size_t n) {
    if (t->stopped) return true;
    if (!rk_gen_buf_put(&t->raw, p, n)) return false;
    if (t->raw.n == t->raw_done) return true; /* nothing undecided (raw.p may still be NULL) */
    /* Undecided bytes. No stop string can start before raw_done: such a start would have
     * been held back as a possible prefix, or would have matched already. */
    const char *s = t->raw.p + t->raw_done;
    size_t m = t->raw.n - t->raw_done;
    size_t first = SIZE_MAX;
    for (int k = 0; k < t->n_stop; k++) {
        size_t sl = stop_len(t, k);
        if (!sl) continue;
        const char *h = memmem(s, m, t->stop[k], sl);
        if (h && (size_t)(h - s) < first) first = (size_t)(h - s);
    }
    if (first != SIZE_MAX) {
        if (rk_gen_utf8_sanitize(&t->out, s, complete_len(s, first), true) == (size_t)-1) return false;
        t->raw_done += first;
        t->stopped = true;
        return true;
    }
    /* hold the longest tail that is a proper prefix of some stop string */
    size_t hold = 0;
    for (int k = 0; k < t->n_stop; k++) {
        size_t sl = stop_len(t, k);
        if (!sl) continue;
        size_t l = sl - 1 < m ? sl - 1 : m;
        for (; l > hold; l--)
            if (!memcmp(s + m - l, t->stop[k], l)) {
                hold = l;
                break;
            }
    }
    size_t used = rk_gen_utf8_sanitize(&t->out, s, m - hold, false);
    if (used == (size_t)-1) return false;
    t->raw_done += used;
    return true;
}

bool rk_gen_text_finish(rk_gen_text *t) {
    if (t->stopped) return true;
    size_t m = t->raw.n - t->raw_done;
    if (m == 0) return true;
    const char *s = t->raw.p + t->raw_done;
    if (rk_gen_utf8_sanitize(&t->out, s, complete_len(s, m), true) == (size_t)-1) return false;
    t->raw_done = t->raw.n;
    return true;
}

void rk_gen_text_take(rk_gen_text *t, size_t *off, size_t *len) {
    *off = t->sent;
    *len = t->out.n - t->sent;
    t->sent = t->out.n;
}

void rk_gen_text_deinit(rk_gen_text *t) {
    if (!t) return;
    rk_gen_buf_free(&t->raw);
    rk_gen_buf_free(&t->out);
}

char *rk_utf8_repair(const char *p, size_t n, size_t *out_len) {
    rk_gen_buf b = {0};
    if (rk_gen_utf8_sanitize(&b, p, n, true) == (size_t)-1 || !rk_gen_buf_put(&b, "", 1)) {
        rk_gen_buf_free(&b);
        return NULL;
    }
    *out_len = b.n - 1;
    return b.p;
}
