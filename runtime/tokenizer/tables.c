/* Tokenizer tables shared by SentencePiece and BPE: growable arrays, the text -> id hash
 * table, and the bigram merge loop (a heap of candidate pairs). Calls nothing above it. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_impl.h"

/* ---- small containers ---------------------------------------------- */

bool rk_tok_grow(void *pptr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2) return false;
        n *= 2;
    }
    if (n > SIZE_MAX / elem) return false;
    void *p, *q;
    memcpy(&p, pptr, sizeof p); /* pptr is a T **: copy the pointer, do not alias it */
    q = realloc(p, n * elem);
    if (!q) return false;
    memcpy(pptr, &q, sizeof q);
    *cap = n;
    return true;
}

void rk_tok_work_free(rk_tok_work *w) {
    free(w->sym);
    free(w->heap);
    free(w->buf);
    free(w->cp);
    free(w->cp_off);
    free(w->cp_fl);
    free(w->piece[0]);
    free(w->piece[1]);
}

bool rk_tok_ids_push(rk_tok_ids *a, int32_t id) {
    if (!rk_tok_grow(&a->v, &a->cap, a->n + 1, sizeof *a->v)) return false;
    a->v[a->n++] = id;
    return true;
}

uint64_t rk_tok_str_hash(const char *s, size_t n) { return rk_fnv1a(RK_FNV_OFFSET, s, n); }

bool rk_tok_table_init(rk_tok_table *tb, uint32_t n) {
    uint32_t cap = 16;
    while (cap < 2u * n) cap *= 2; /* n <= INT32_MAX / 4, checked by the caller */
    tb->slot = malloc((size_t)cap * sizeof *tb->slot);
    if (!tb->slot) return false;
    memset(tb->slot, 0xff, (size_t)cap * sizeof *tb->slot);
    tb->mask = cap - 1;
    return true;
}

int32_t rk_tok_lookup(const rk_tokenizer *t, const char *s, size_t n) {
    if (n == 0 || n > t->max_text_bytes) return -1;
    uint32_t i = (uint32_t)rk_tok_str_hash(s, n) & t->by_text.mask;
    for (;; i = (i + 1) & t->by_text.mask) {
        int32_t id = t->by_text.slot[i];
        if (id < 0) return -1;
        if (t->text[id].len == n && memcmp(t->text[id].ptr, s, n) == 0) return id;
    }
}

/* ---- heap and merge loop -------------------------------------------- */

static bool bigram_before(const rk_tok_bigram *a, const rk_tok_bigram *b) {
    return a->prio > b->prio || (a->prio == b->prio && a->left < b->left);
}

static bool heap_push(rk_tok_work *w, rk_tok_bigram b) {
    if (!rk_tok_grow(&w->heap, &w->heap_cap, w->heap_n + 1, sizeof *w->heap)) return false;
    size_t i = w->heap_n++;
    while (i > 0) {
        size_t up = (i - 1) / 2;
        if (!bigram_before(&b, &w->heap[up])) break;
        w->heap[i] = w->heap[up];
        i = up;
    }
    w->heap[i] = b;
    return true;
}

static rk_tok_bigram heap_pop(rk_tok_work *w) {
    rk_tok_bigram top = w->heap[0], last = w->heap[--w->heap_n];
    size_t i = 0, n = w->heap_n;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && bigram_before(&w->heap[c + 1], &w->heap[c])) c++;
        if (!bigram_before(&w->heap[c], &last)) break;
        w->heap[i] = w->heap[c];
        i = c;
    }
    if (n) w->heap[i] = last;
    return top;
}

static bool try_pair(const rk_tokenizer *t, rk_tok_work *w, int32_t l, int32_t r, rk_tok_pair_fn pair) {
    if (l < 0 || r < 0) return true;
    rk_tok_bigram b;
    if (!pair(t, w->buf, &w->sym[l], &w->sym[r], &b.prio)) return true;
    b.left = (uint32_t)l;
    b.right = (uint32_t)r;
    b.n_left = w->sym[l].n;
    b.n_right = w->sym[r].n;
    return heap_push(w, b);
}

rk_status rk_tok_merge(const rk_tokenizer *t, rk_tok_work *w, size_t n, rk_tok_pair_fn pair, rk_err *err) {
    w->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        if (!try_pair(t, w, (int32_t)(i - 1), (int32_t)i, pair)) goto fail;
    while (w->heap_n) {
        rk_tok_bigram b = heap_pop(w);
        rk_tok_sym *l = &w->sym[b.left], *r = &w->sym[b.right];
        /* Sizes only grow by merging, so unchanged sizes mean the same two strings. */
        if (l->n == 0 || r->n == 0 || l->n != b.n_left || r->n != b.n_right) continue;
        l->n += r->n;
        r->n = 0;
        l->next = r->next;
        if (r->next >= 0) w->sym[r->next].prev = (int32_t)b.left;
        if (!try_pair(t, w, l->prev, (int32_t)b.left, pair)) goto fail;
        if (!try_pair(t, w, (int32_t)b.left, l->next, pair)) goto fail;
    }
    return RK_OK;
fail:
    return rk_err_set(err, RK_E_NOMEM, "tokenizer: out of memory in merge queue");
}
