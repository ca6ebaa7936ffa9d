/* KV blocks: rows of a session's cache as one self-describing byte string, for the
 * document cache, chat's /save and the spill tier.
 *
 * Layout (little-endian):
 *     0  "RKKV"                       4  u32 version (1)
 *     8  u32 header_bytes (128 + 24 n_params)   12  u32 KV policy (rk_kv_kind)
 *    16  u64 checksum: FNV-1a 64 over the block's 64-bit words (then its tail bytes), this
 *        field read as zero
 *    24  model fingerprint: char arch[16]; i32 n_layer, n_embd, n_head, n_head_kv, head_dim,
 *        n_ff, n_vocab; u64 tokenizer_hash, weights_hash, quant_hash
 *    92  u32 n_layer, kv_dim         100  u64 row0, n_rows        116  u64 payload_bytes
 *   124  u32 n_params; then n_params x {char name[16]; f64 value}: the policy's parameters
 *   then i32 token ids (n_rows), then the policy's payload (payload_bytes).
 * Import checks sizes (overflow-safe), the checksum, the model, the policy and its
 * parameters, the row range and the token ids before the policy reads its payload; the
 * policy checks the payload's own structure before it changes anything. */
#include <stdlib.h>
#include <string.h>

#include "kv_impl.h"

enum { BLOCK_VERSION = 1, FIXED_BYTES = 128, PARAM_BYTES = 24, OFF_CHECKSUM = 16, OFF_PAYLOAD = 116 };

static const uint64_t FNV_OFFSET = 0xcbf29ce484222325ull, FNV_PRIME = 0x100000001b3ull;

/* FNV-1a over 64-bit words (a changed word always changes the hash: each step is a
 * bijection of the state), then the tail bytes. */
static uint64_t fnv_words(uint64_t h, const uint8_t *p, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = (h ^ w) * FNV_PRIME;
    }
    for (; i < n; i++) h = (h ^ p[i]) * FNV_PRIME;
    return h;
}

static uint64_t block_checksum(const uint8_t *b, size_t n) {
    uint64_t h = fnv_words(FNV_OFFSET, b, OFF_CHECKSUM);
    h = (h ^ 0) * FNV_PRIME; /* the checksum field itself, as zero */
    return fnv_words(h, b + OFF_CHECKSUM + 8, n - OFF_CHECKSUM - 8);
}


static void put_fingerprint(rk_kv_buf *b, const rk_fingerprint *fp) {
    rk_kv_put(b, fp->arch, sizeof fp->arch);
    const int32_t d[7] = {fp->n_layer, fp->n_embd, fp->n_head, fp->n_head_kv, fp->head_dim, fp->n_ff, fp->n_vocab};
    for (int i = 0; i < 7; i++) rk_kv_put_u32(b, (uint32_t)d[i]);
    rk_kv_put_u64(b, fp->tokenizer_hash), rk_kv_put_u64(b, fp->weights_hash), rk_kv_put_u64(b, fp->quant_hash);
}

/* The header (checksum zero) and the token ids of rows [row0, row1). */
static void put_head(rk_kv_buf *b, const rk_kv *kv, const rk_model *m, const int32_t *tokens, int64_t row0,
                     int64_t row1, uint64_t payload_bytes) {
    rk_kv_param prm[RK_KV_MAX_PARAMS];
    const int n_params = kv->ops->params(kv, prm);
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    rk_kv_put(b, "RKKV", 4);
    rk_kv_put_u32(b, BLOCK_VERSION);
    rk_kv_put_u32(b, FIXED_BYTES + PARAM_BYTES * (uint32_t)n_params);
    rk_kv_put_u32(b, (uint32_t)kv->kind);
    rk_kv_put_u64(b, 0); /* checksum, filled last */
    put_fingerprint(b, &fp);
    rk_kv_put_u32(b, (uint32_t)kv->n_layer), rk_kv_put_u32(b, (uint32_t)kv->kv_dim);
    rk_kv_put_u64(b, (uint64_t)row0), rk_kv_put_u64(b, (uint64_t)(row1 - row0));
    rk_kv_put_u64(b, payload_bytes);
    rk_kv_put_u32(b, (uint32_t)n_params);
    for (int i = 0; i < n_params; i++) {
        char name[16] = {0};
        memcpy(name, prm[i].name, strnlen(prm[i].name, 15));
        rk_kv_put(b, name, 16);
        rk_kv_put_f64(b, prm[i].value);
    }
    for (int64_t r = row0; r < row1; r++) rk_kv_put_u32(b, (uint32_t)tokens[r]);
}

static rk_status check_range(const rk_kv *kv, int64_t row0, int64_t row1, rk_err *err) {
    if (row0 < 0 || row1 < row0 || row1 > kv->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: export of rows [%lld, %lld) of a session holding %lld",
                          (long long)row0, (long long)row1, (long long)kv->n_past);
    return RK_OK;
}

rk_status rk_kv_block_export(const rk_kv *kv, const rk_model *m, const int32_t *tokens, int64_t row0, int64_t row1,
                             void **blk, size_t *n, rk_err *err) {
    rk_status st = check_range(kv, row0, row1, err);
    if (st) return st;
    rk_kv_buf b = {0};
    put_head(&b, kv, m, tokens, row0, row1, 0);
    const size_t pay0 = b.n;
    st = kv->ops->export_rows(kv, row0, row1, &b, err);
    if (!st && b.fail)
        st = rk_err_set(err, RK_E_NOMEM, "kv: out of memory exporting %lld rows", (long long)(row1 - row0));
    if (st) {
        free(b.p);
        return st;
    }
    rk_le_put(b.p + OFF_PAYLOAD, (uint64_t)(b.n - pay0), 8);
    rk_le_put(b.p + OFF_CHECKSUM, block_checksum(b.p, b.n), 8);
    *blk = b.p;
    *n = b.n;
    return RK_OK;
}

/* FNV-1a over 64-bit words of a byte stream that arrives in pieces of any length. */
typedef struct fnv_stream {
    uint64_t h;
    uint8_t carry[8];
    size_t nc;
} fnv_stream;

static void fnv_feed(fnv_stream *f, const uint8_t *p, size_t n) {
    if (f->nc) {
        const size_t k = 8 - f->nc < n ? 8 - f->nc : n;
        memcpy(f->carry + f->nc, p, k);
        f->nc += k, p += k, n -= k;
        if (f->nc < 8) return;
        f->h = fnv_words(f->h, f->carry, 8);
        f->nc = 0;
    }
    const size_t whole = n & ~(size_t)7;
    f->h = fnv_words(f->h, p, whole);
    memcpy(f->carry, p + whole, n - whole);
    f->nc = n - whole;
}

static uint64_t fnv_end(const fnv_stream *f) { return fnv_words(f->h, f->carry, f->nc); }

typedef struct export_sink {
    rk_kv_sink put;
    void *ctx;
    fnv_stream f;
} export_sink;

static void sink_put(void *ctx, const uint8_t *p, size_t n) {
    export_sink *x = ctx;
    fnv_feed(&x->f, p, n);
    x->put(x->ctx, p, n);
}

enum { STREAM_WINDOW = 1 << 20 };

rk_status rk_kv_block_export_stream(const rk_kv *kv, const rk_model *m, const int32_t *tokens, int64_t row0,
                                    int64_t row1, rk_kv_sink put, void *ctx, uint8_t checksum[8], rk_err *err) {
    rk_status st = check_range(kv, row0, row1, err);
    if (st) return st;
    uint64_t pay;
    if (kv->ops->export_bytes) pay = kv->ops->export_bytes(kv, row0, row1);
    else {
        rk_kv_buf dry = {.dry = true};
        if ((st = kv->ops->export_rows(kv, row0, row1, &dry, err))) return st;
        pay = dry.total;
    }
    export_sink x = {put, ctx, {FNV_OFFSET, {0}, 0}};
    rk_kv_buf b = {.p = malloc(STREAM_WINDOW), .cap = STREAM_WINDOW, .sink = sink_put, .ctx = &x};
    if (!b.p) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory exporting %lld rows", (long long)(row1 - row0));
    put_head(&b, kv, m, tokens, row0, row1, pay);
    const uint64_t head = b.total;
    st = kv->ops->export_rows(kv, row0, row1, &b, err);
    rk_kv_flush(&b);
    free(b.p);
    if (st) return st;
    if (b.total - head != pay) /* the two passes of one policy over the same rows disagree */
        return rk_err_set(err, RK_E_INTERNAL, "kv: %s export of %lld rows made %llu bytes, %llu announced",
                          kv->ops->name, (long long)(row1 - row0), (unsigned long long)(b.total - head),
                          (unsigned long long)pay);
    rk_le_put(checksum, fnv_end(&x.f), 8);
    return RK_OK;
}

#define BAD(...) rk_err_set(err, RK_E_FORMAT, __VA_ARGS__)

/* The fixed part of a header, read. */
typedef struct blk_head {
    uint32_t header_bytes, kind, n_layer, kv_dim, n_params;
    uint64_t checksum, row0, n_rows, payload_bytes;
    rk_fingerprint fb;
} blk_head;

/* Magic, version and sizes of a block of n bytes whose first min(n, FIXED_BYTES) bytes are b. */
static rk_status head_sizes(const uint8_t *b, uint64_t n, blk_head *h, rk_err *err) {
    if (!b || n < 8)
        return BAD("kv: block of %llu bytes is truncated (the header alone is %d)", (unsigned long long)(b ? n : 0),
                   FIXED_BYTES);
    if (memcmp(b, "RKKV", 4)) return BAD("kv: not a KV block (magic is not 'RKKV')");
    rk_kv_rd r = {b, n < FIXED_BYTES ? (size_t)n : FIXED_BYTES, 4, false};
    const uint32_t version = rk_kv_get_u32(&r);
    if (version != BLOCK_VERSION)
        return BAD("kv: block format version %u (this build reads %d)", version, BLOCK_VERSION);
    if (n < FIXED_BYTES)
        return BAD("kv: block of %llu bytes is truncated (the header alone is %d)", (unsigned long long)n, FIXED_BYTES);
    h->header_bytes = rk_kv_get_u32(&r), h->kind = rk_kv_get_u32(&r);
    h->checksum = rk_kv_get_u64(&r);
    memcpy(h->fb.arch, rk_kv_get(&r, 16), 16);
    h->fb.arch[15] = '\0';
    int32_t *dims[7] = {&h->fb.n_layer,  &h->fb.n_embd, &h->fb.n_head, &h->fb.n_head_kv,
                        &h->fb.head_dim, &h->fb.n_ff,   &h->fb.n_vocab};
    for (int i = 0; i < 7; i++) *dims[i] = (int32_t)rk_kv_get_u32(&r);
    h->fb.tokenizer_hash = rk_kv_get_u64(&r), h->fb.weights_hash = rk_kv_get_u64(&r);
    h->fb.quant_hash = rk_kv_get_u64(&r);
    h->n_layer = rk_kv_get_u32(&r), h->kv_dim = rk_kv_get_u32(&r);
    h->row0 = rk_kv_get_u64(&r), h->n_rows = rk_kv_get_u64(&r), h->payload_bytes = rk_kv_get_u64(&r);
    h->n_params = rk_kv_get_u32(&r);
    /* sizes first: everything below reads inside the block */
    if (h->n_params > RK_KV_MAX_PARAMS || h->header_bytes != FIXED_BYTES + PARAM_BYTES * h->n_params)
        return BAD("kv: block header claims %u parameters in %u bytes (at most %d; 128 + 24 each)", h->n_params,
                   h->header_bytes, RK_KV_MAX_PARAMS);
    uint64_t total;
    if (!rk_mul_u64(h->n_rows, 4, &total) || !rk_add_u64(total, h->header_bytes, &total) ||
        !rk_add_u64(total, h->payload_bytes, &total))
        return BAD("kv: block sizes overflow (%llu rows, payload %llu bytes)", (unsigned long long)h->n_rows,
                   (unsigned long long)h->payload_bytes);
    if (n < total)
        return BAD("kv: block is truncated (%llu bytes of %llu)", (unsigned long long)n, (unsigned long long)total);
    if (n > total) return BAD("kv: block has %llu bytes after its end", (unsigned long long)(n - total));
    return RK_OK;
}

/* Whose the block is and where its rows go: the model, the policy and its parameters
 * (prm: n_params x 24 bytes), the row range. */
static rk_status head_owner(const rk_kv *kv, const rk_model *m, const blk_head *h, const uint8_t *prm, rk_err *err) {
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    const rk_fingerprint *fb = &h->fb;
    const bool shape = strncmp(fb->arch, fp.arch, sizeof fp.arch) || fb->n_layer != fp.n_layer ||
                       fb->n_embd != fp.n_embd || fb->n_head != fp.n_head || fb->n_head_kv != fp.n_head_kv ||
                       fb->head_dim != fp.head_dim || fb->n_ff != fp.n_ff || fb->n_vocab != fp.n_vocab;
    if (shape || fb->tokenizer_hash != fp.tokenizer_hash || fb->weights_hash != fp.weights_hash)
        return rk_err_set(err, RK_E_MISMATCH,
                          "kv: block is from another model (%s, %d layers, d=%d, vocab %d, weights %016llx) than %s "
                          "(%s, %d layers, d=%d, vocab %d, weights %016llx)",
                          fb->arch, fb->n_layer, fb->n_embd, fb->n_vocab, (unsigned long long)fb->weights_hash,
                          rk_model_name(m), fp.arch, fp.n_layer, fp.n_embd, fp.n_vocab,
                          (unsigned long long)fp.weights_hash);
    if (fb->quant_hash != fp.quant_hash)
        return rk_err_set(err, RK_E_MISMATCH, "kv: block is from another quantisation of %s's weights",
                          rk_model_name(m));
    if (h->kind != (uint32_t)kv->kind)
        return rk_err_set(err, RK_E_MISMATCH, "kv: block holds KV policy %s, the session uses %s",
                          rk_kv_kind_name((rk_kv_kind)h->kind), rk_kv_kind_name(kv->kind));
    if (h->n_layer != (uint32_t)kv->n_layer || h->kv_dim != (uint32_t)kv->kv_dim)
        return rk_err_set(err, RK_E_MISMATCH, "kv: block rows are %u layers x %u, the session's %d x %d", h->n_layer,
                          h->kv_dim, kv->n_layer, kv->kv_dim);
    rk_kv_param mine[RK_KV_MAX_PARAMS];
    const int n_mine = kv->ops->params(kv, mine);
    rk_kv_rd r = {prm, (size_t)h->n_params * PARAM_BYTES, 0, false};
    for (uint32_t i = 0; i < h->n_params || (int)i < n_mine; i++) {
        char name[17] = {0};
        double v = 0;
        if (i < h->n_params) {
            memcpy(name, rk_kv_get(&r, 16), 16);
            v = rk_kv_get_f64(&r);
        }
        if ((int)i >= n_mine || i >= h->n_params || strncmp(name, mine[i].name, 16) || !(v == mine[i].value))
            return rk_err_set(err, RK_E_MISMATCH, "kv: block's %s parameter %s = %g, the session's %s = %g",
                              rk_kv_kind_name(kv->kind), i < h->n_params ? name : "(none)", v,
                              (int)i < n_mine ? mine[i].name : "(none)", (int)i < n_mine ? mine[i].value : 0.0);
    }
    if (h->row0 != (uint64_t)kv->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: block starts at row %llu but the session holds %lld rows",
                          (unsigned long long)h->row0, (long long)kv->n_past);
    if (h->n_rows > (uint64_t)(kv->n_ctx - kv->n_past))
        return rk_err_set(err, RK_E_CONTEXT, "kv: block rows [%llu, %llu) do not fit the context of %lld",
                          (unsigned long long)h->row0, (unsigned long long)(h->row0 + h->n_rows), (long long)kv->n_ctx);
    return RK_OK;
}

/* Every token id inside the vocabulary. */
static rk_status check_ids(const uint8_t *ids, uint64_t n_rows, int32_t n_vocab, rk_err *err) {
    for (uint64_t i = 0; i < n_rows; i++) {
        const uint32_t id = (uint32_t)rk_le_get(ids + 4 * i, 4);
        if (id >= (uint32_t)n_vocab)
            return BAD("kv: block token %llu is id %u, outside the vocab of %d", (unsigned long long)i, id, n_vocab);
    }
    return RK_OK;
}

static void put_ids(int32_t *tokens, const uint8_t *ids, uint64_t row0, uint64_t n_rows) {
    for (uint64_t i = 0; i < n_rows; i++) tokens[row0 + i] = (int32_t)(uint32_t)rk_le_get(ids + 4 * i, 4);
}

rk_status rk_kv_block_import(rk_kv *kv, const rk_model *m, const void *blk, size_t n, int32_t *tokens, rk_err *err) {
    const uint8_t *b = blk;
    blk_head h = {0};
    rk_status st = head_sizes(b, n, &h, err);
    if (st) return st;
    if (block_checksum(b, n) != h.checksum) return BAD("kv: block checksum mismatch: the block is corrupt");
    if ((st = head_owner(kv, m, &h, b + FIXED_BYTES, err))) return st;
    const uint8_t *ids = b + h.header_bytes;
    if ((st = check_ids(ids, h.n_rows, h.fb.n_vocab, err))) return st;
    const uint8_t *payload = ids + 4 * h.n_rows;
    st = kv->ops->import_rows(kv, (int64_t)h.row0, (int64_t)h.n_rows, payload, (size_t)h.payload_bytes, err);
    if (st) return st;
    put_ids(tokens, ids, h.row0, h.n_rows);
    return RK_OK;
}

/* pull, hashed */
static rk_status take(rk_kv_pull pull, void *ctx, fnv_stream *f, uint8_t *dst, size_t n, rk_err *err) {
    rk_status st = pull(ctx, dst, n, err);
    if (!st) fnv_feed(f, dst, n);
    return st;
}

enum { IMPORT_PIECE = 4 << 20 };

/* The rows payload into place, a layer part at a time in pieces of at most IMPORT_PIECE. */
static rk_status import_parts(rk_kv *kv, const blk_head *h, rk_kv_pull pull, void *ctx, fnv_stream *f, rk_err *err) {
    uint64_t want;
    if (!rk_mul_u64(h->n_rows, kv->row_bytes, &want) || !rk_mul_u64(want, 2ull * (uint64_t)kv->n_layer, &want) ||
        want != h->payload_bytes)
        return BAD("kv: %s payload of %llu bytes for %llu rows (expected %llu)", kv->ops->name,
                   (unsigned long long)h->payload_bytes, (unsigned long long)h->n_rows, (unsigned long long)want);
    const int64_t per = kv->row_bytes ? (int64_t)(IMPORT_PIECE / kv->row_bytes) : 1;
    const int64_t step = per > 0 ? per : 1;
    const int64_t n_rows = (int64_t)h->n_rows;
    uint8_t *buf = malloc((size_t)(step < n_rows ? step : (n_rows ? n_rows : 1)) * kv->row_bytes + 1);
    if (!buf) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory importing %lld rows", (long long)n_rows);
    rk_status st = RK_OK;
    for (int l = 0; l < kv->n_layer && !st; l++)
        for (int v = 0; v < 2 && !st; v++)
            for (int64_t r = 0; r < n_rows && !st; r += step) {
                const int64_t k = n_rows - r < step ? n_rows - r : step;
                if (!(st = take(pull, ctx, f, buf, (size_t)k * kv->row_bytes, err)))
                    st = kv->ops->import_part(kv, l, v == 1, (int64_t)h->row0 + r, k, buf, err);
            }
    free(buf);
    return st;
}

rk_status rk_kv_block_import_stream(rk_kv *kv, const rk_model *m, uint64_t n, rk_kv_pull pull, void *ctx,
                                    int32_t *tokens, rk_err *err) {
    uint8_t head[FIXED_BYTES + PARAM_BYTES * RK_KV_MAX_PARAMS];
    const size_t first = n < FIXED_BYTES ? (size_t)n : FIXED_BYTES;
    rk_status st = pull(ctx, head, first, err);
    if (st) return st;
    blk_head h = {0};
    if ((st = head_sizes(head, n, &h, err))) return st;
    if ((st = pull(ctx, head + FIXED_BYTES, h.header_bytes - FIXED_BYTES, err))) return st;
    if ((st = head_owner(kv, m, &h, head + FIXED_BYTES, err))) return st;
    fnv_stream f = {FNV_OFFSET, {0}, 0};
    memset(head + OFF_CHECKSUM, 0, 8); /* hashed as zero */
    fnv_feed(&f, head, h.header_bytes);
    uint8_t *ids = malloc(h.n_rows ? (size_t)h.n_rows * 4 : 1);
    if (!ids) return rk_err_set(err, RK_E_NOMEM, "kv: out of memory importing %llu rows", (unsigned long long)h.n_rows);
    st = take(pull, ctx, &f, ids, (size_t)h.n_rows * 4, err);
    if (!st) st = check_ids(ids, h.n_rows, h.fb.n_vocab, err);
    uint8_t *pay = NULL;
    if (!st && kv->ops->import_part) st = import_parts(kv, &h, pull, ctx, &f, err);
    else if (!st) {
        if (!(pay = malloc(h.payload_bytes ? (size_t)h.payload_bytes : 1)))
            st = rk_err_set(err, RK_E_NOMEM, "kv: out of memory for a payload of %llu bytes",
                            (unsigned long long)h.payload_bytes);
        if (!st) st = take(pull, ctx, &f, pay, (size_t)h.payload_bytes, err);
    }
    if (!st && fnv_end(&f) != h.checksum) st = BAD("kv: block checksum mismatch: the block is corrupt");
    if (!st && kv->ops->import_part) kv->n_past = (int64_t)(h.row0 + h.n_rows);
    else if (!st) st = kv->ops->import_rows(kv, (int64_t)h.row0, (int64_t)h.n_rows, pay, (size_t)h.payload_bytes, err);
    if (!st) put_ids(tokens, ids, h.row0, h.n_rows);
    free(pay), free(ids);
    return st;
}
