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

rk_status rk_kv_block_export(const rk_kv *kv, const rk_model *m, const int32_t *tokens, int64_t row0, int64_t row1,
                             void **blk, size_t *n, rk_err *err) {
    if (row0 < 0 || row1 < row0 || row1 > kv->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: export of rows [%lld, %lld) of a session holding %lld",
                          (long long)row0, (long long)row1, (long long)kv->n_past);
    rk_kv_param prm[RK_KV_MAX_PARAMS];
    const int n_params = kv->ops->params(kv, prm);
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    rk_kv_buf b = {0};
    rk_kv_put(&b, "RKKV", 4);
    rk_kv_put_u32(&b, BLOCK_VERSION);
    rk_kv_put_u32(&b, FIXED_BYTES + PARAM_BYTES * (uint32_t)n_params);
    rk_kv_put_u32(&b, (uint32_t)kv->kind);
    rk_kv_put_u64(&b, 0); /* checksum, filled last */
    put_fingerprint(&b, &fp);
    rk_kv_put_u32(&b, (uint32_t)kv->n_layer), rk_kv_put_u32(&b, (uint32_t)kv->kv_dim);
    rk_kv_put_u64(&b, (uint64_t)row0), rk_kv_put_u64(&b, (uint64_t)(row1 - row0));
    rk_kv_put_u64(&b, 0); /* payload bytes, filled below */
    rk_kv_put_u32(&b, (uint32_t)n_params);
    for (int i = 0; i < n_params; i++) {
        char name[16] = {0};
        memcpy(name, prm[i].name, strnlen(prm[i].name, 15));
        rk_kv_put(&b, name, 16);
        rk_kv_put_f64(&b, prm[i].value);
    }
    for (int64_t r = row0; r < row1; r++) rk_kv_put_u32(&b, (uint32_t)tokens[r]);
    const size_t pay0 = b.n;
    rk_status st = kv->ops->export_rows(kv, row0, row1, &b, err);
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

#define BAD(...) rk_err_set(err, RK_E_FORMAT, __VA_ARGS__)

rk_status rk_kv_block_import(rk_kv *kv, const rk_model *m, const void *blk, size_t n, int32_t *tokens, rk_err *err) {
    const uint8_t *b = blk;
    if (!b || n < 8) return BAD("kv: block of %zu bytes is truncated (the header alone is %d)", b ? n : 0, FIXED_BYTES);
    if (memcmp(b, "RKKV", 4)) return BAD("kv: not a KV block (magic is not 'RKKV')");
    rk_kv_rd r = {b, n, 4, false};
    const uint32_t version = rk_kv_get_u32(&r);
    if (version != BLOCK_VERSION)
        return BAD("kv: block format version %u (this build reads %d)", version, BLOCK_VERSION);
    if (n < FIXED_BYTES) return BAD("kv: block of %zu bytes is truncated (the header alone is %d)", n, FIXED_BYTES);
    const uint32_t header_bytes = rk_kv_get_u32(&r), kind = rk_kv_get_u32(&r);
    const uint64_t checksum = rk_kv_get_u64(&r);
    rk_fingerprint fb = {0};
    memcpy(fb.arch, rk_kv_get(&r, 16), 16);
    fb.arch[15] = '\0';
    int32_t *dims[7] = {&fb.n_layer, &fb.n_embd, &fb.n_head, &fb.n_head_kv, &fb.head_dim, &fb.n_ff, &fb.n_vocab};
    for (int i = 0; i < 7; i++) *dims[i] = (int32_t)rk_kv_get_u32(&r);
    fb.tokenizer_hash = rk_kv_get_u64(&r), fb.weights_hash = rk_kv_get_u64(&r), fb.quant_hash = rk_kv_get_u64(&r);
    const uint32_t n_layer = rk_kv_get_u32(&r), kv_dim = rk_kv_get_u32(&r);
    const uint64_t row0 = rk_kv_get_u64(&r), n_rows = rk_kv_get_u64(&r), payload_bytes = rk_kv_get_u64(&r);
    const uint32_t n_params = rk_kv_get_u32(&r);
    /* sizes first: everything below reads inside the block */
    if (n_params > RK_KV_MAX_PARAMS || header_bytes != FIXED_BYTES + PARAM_BYTES * n_params)
        return BAD("kv: block header claims %u parameters in %u bytes (at most %d; 128 + 24 each)", n_params,
                   header_bytes, RK_KV_MAX_PARAMS);
    uint64_t total;
    if (!rk_mul_u64(n_rows, 4, &total) || !rk_add_u64(total, header_bytes, &total) ||
        !rk_add_u64(total, payload_bytes, &total))
        return BAD("kv: block sizes overflow (%llu rows, payload %llu bytes)", (unsigned long long)n_rows,
                   (unsigned long long)payload_bytes);
    if (n < total) return BAD("kv: block is truncated (%zu bytes of %llu)", n, (unsigned long long)total);
    if (n > total) return BAD("kv: block has %llu bytes after its end", (unsigned long long)(n - total));
    if (block_checksum(b, n) != checksum) return BAD("kv: block checksum mismatch: the block is corrupt");
    /* then whose it is */
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    const bool shape = strncmp(fb.arch, fp.arch, sizeof fp.arch) || fb.n_layer != fp.n_layer ||
                       fb.n_embd != fp.n_embd || fb.n_head != fp.n_head || fb.n_head_kv != fp.n_head_kv ||
                       fb.head_dim != fp.head_dim || fb.n_ff != fp.n_ff || fb.n_vocab != fp.n_vocab;
    if (shape || fb.tokenizer_hash != fp.tokenizer_hash || fb.weights_hash != fp.weights_hash)
        return rk_err_set(err, RK_E_MISMATCH,
                          "kv: block is from another model (%s, %d layers, d=%d, vocab %d, weights %016llx) than %s "
                          "(%s, %d layers, d=%d, vocab %d, weights %016llx)",
                          fb.arch, fb.n_layer, fb.n_embd, fb.n_vocab, (unsigned long long)fb.weights_hash,
                          rk_model_name(m), fp.arch, fp.n_layer, fp.n_embd, fp.n_vocab,
                          (unsigned long long)fp.weights_hash);
    if (fb.quant_hash != fp.quant_hash)
        return rk_err_set(err, RK_E_MISMATCH, "kv: block is from another quantisation of %s's weights",
                          rk_model_name(m));
    if (kind != (uint32_t)kv->kind)
        return rk_err_set(err, RK_E_MISMATCH, "kv: block holds KV policy %s, the session uses %s",
                          rk_kv_kind_name((rk_kv_kind)kind), rk_kv_kind_name(kv->kind));
    if (n_layer != (uint32_t)kv->n_layer || kv_dim != (uint32_t)kv->kv_dim)
        return rk_err_set(err, RK_E_MISMATCH, "kv: block rows are %u layers x %u, the session's %d x %d", n_layer,
                          kv_dim, kv->n_layer, kv->kv_dim);
    rk_kv_param mine[RK_KV_MAX_PARAMS];
    const int n_mine = kv->ops->params(kv, mine);
    for (uint32_t i = 0; i < n_params || (int)i < n_mine; i++) {
        char name[17] = {0};
        double v = 0;
        if (i < n_params) {
            memcpy(name, rk_kv_get(&r, 16), 16);
            v = rk_kv_get_f64(&r);
        }
        if ((int)i >= n_mine || i >= n_params || strncmp(name, mine[i].name, 16) || !(v == mine[i].value))
            return rk_err_set(err, RK_E_MISMATCH, "kv: block's %s parameter %s = %g, the session's %s = %g",
                              rk_kv_kind_name(kv->kind), i < n_params ? name : "(none)", v,
                              (int)i < n_mine ? mine[i].name : "(none)", (int)i < n_mine ? mine[i].value : 0.0);
    }
    /* then where the rows go */
    if (row0 != (uint64_t)kv->n_past)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: block starts at row %llu but the session holds %lld rows",
                          (unsigned long long)row0, (long long)kv->n_past);
    if (n_rows > (uint64_t)(kv->n_ctx - kv->n_past))
        return rk_err_set(err, RK_E_CONTEXT, "kv: block rows [%llu, %llu) do not fit the context of %lld",
                          (unsigned long long)row0, (unsigned long long)(row0 + n_rows), (long long)kv->n_ctx);
    const uint8_t *ids = rk_kv_get_n(&r, n_rows, 4);
    for (uint64_t i = 0; i < n_rows; i++) {
        uint32_t id = 0;
        for (int k = 0; k < 4; k++) id |= (uint32_t)ids[4 * i + k] << (8 * k);
        if (id >= (uint32_t)fp.n_vocab)
            return BAD("kv: block token %llu is id %u, outside the vocab of %d", (unsigned long long)i, id, fp.n_vocab);
    }
    const uint8_t *payload = rk_kv_get(&r, (size_t)payload_bytes);
    if (r.fail) return BAD("kv: block is truncated"); /* unreachable after the size check; kept as the reader's guard */
    rk_status st = kv->ops->import_rows(kv, (int64_t)row0, (int64_t)n_rows, payload, (size_t)payload_bytes, err);
    if (st) return st;
    for (uint64_t i = 0; i < n_rows; i++) {
        uint32_t id = 0;
        for (int k = 0; k < 4; k++) id |= (uint32_t)ids[4 * i + k] << (8 * k);
        tokens[row0 + i] = (int32_t)id;
    }
    return RK_OK;
}
