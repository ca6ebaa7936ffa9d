/* The document KV cache (rk_cache.h) over the block store and rk_session_kv_export /
 * import. Entry header frame (id 0), little-endian:
 *     0 "RKDC"  4 u32 version (1)  8 u64 n_tokens  16 u64 raw bytes of the KV block
 *    24 u32 pieces  28 u32 piece bytes  32 char key[64]  96 char label[256]
 *   352 char model[64]  416 char kv[64]   (480 bytes)
 * frames 1..pieces: the KV block, piece i holding bytes [(i-1) piece, i piece). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "doc_cache_impl.h"
#include "rk_io.h"
#include "session_impl.h"

static void drop_stream(const rk_doc_cache *c, const char *key);

enum { META_BYTES = 480, META_VERSION = 1, PIECE = 4 << 20 };

struct rk_doc_cache {
    char dir[3072];
    rk_doc_cache_params p;
    rk_doc_cache_stats last;
};

static void put_str(uint8_t *d, const char *s, size_t cap) {
    memset(d, 0, cap);
    if (s) memcpy(d, s, strnlen(s, cap - 1));
}
static void get_str(char *dst, const uint8_t *s, size_t cap) {
    memcpy(dst, s, cap);
    dst[cap - 1] = '\0';
}

rk_doc_cache_params rk_doc_cache_params_default(void) {
    rk_doc_cache_params p = {.dir = NULL, .cap_bytes = 4ull << 30, .io = rk_bs_params_default()};
    p.io.max_block = PIECE;
    return p;
}

rk_status rk_doc_cache_open(const rk_doc_cache_params *p, rk_doc_cache **out, rk_err *err) {
    if (!p || !p->dir || !*p->dir) return rk_err_set(err, RK_E_INVALID_ARG, "document cache: no directory given");
    rk_doc_cache *c = calloc(1, sizeof *c);
    if (!c) return rk_err_set(err, RK_E_NOMEM, "document cache: out of memory");
    c->p = *p;
    if (!c->p.cap_bytes) c->p.cap_bytes = 4ull << 30;
    c->p.io.max_block = PIECE;
    int w = snprintf(c->dir, sizeof c->dir, "%s", p->dir);
    if (w < 0 || (size_t)w >= sizeof c->dir) {
        free(c);
        return rk_err_set(err, RK_E_INVALID_ARG, "document cache: directory path too long");
    }
    c->p.dir = c->dir;
    struct stat sb;
    rk_status st = RK_OK;
    if (stat(c->dir, &sb) == 0 && !S_ISDIR(sb.st_mode)) /* what is in the way, not what mkdir says of it */
        st = rk_err_set(err, RK_E_IO, "document cache: %s is a %s, not a directory", c->dir,
                        S_ISREG(sb.st_mode) ? "regular file" : "special file");
    else if (p->read_only) {
        if (stat(c->dir, &sb) == 0 && access(c->dir, R_OK | X_OK) != 0)
            st = rk_err_set(err, RK_E_IO, "document cache: %s cannot be read (%s)", c->dir, strerror(errno));
    } else {
        st = rk_io_mkdir_p(c->dir, err);
        if (!st && access(c->dir, R_OK | W_OK | X_OK) != 0)
            st = rk_err_set(err, RK_E_IO, "document cache: %s is not writable (%s)", c->dir, strerror(errno));
    }
    if (st) {
        free(c);
        return st;
    }
    *out = c;
    return RK_OK;
}

void rk_doc_cache_close(rk_doc_cache *c) { free(c); }
const char *rk_doc_cache_dir(const rk_doc_cache *c) { return c->dir; }
void rk_doc_cache_last(const rk_doc_cache *c, rk_doc_cache_stats *out) { *out = c->last; }

void rk_doc_cache_key(const rk_model *m, const rk_kv_params *kv, const char *extra, const int32_t *tokens, size_t n,
                      char key[65]) {
    rk_sha256 h;
    rk_sha256_init(&h);
    rk_sha256_update(&h, "ridgekv-doc-cache-1", 19);
    rk_fingerprint fp;
    rk_model_fingerprint(m, &fp);
    uint8_t b[8 * 10 + 16] = {0};
    memcpy(b, fp.arch, 16);
    const int64_t d[10] = {fp.n_layer,
                           fp.n_embd,
                           fp.n_head,
                           fp.n_head_kv,
                           fp.head_dim,
                           fp.n_ff,
                           fp.n_vocab,
                           (int64_t)fp.tokenizer_hash,
                           (int64_t)fp.weights_hash,
                           (int64_t)fp.quant_hash};
    for (int i = 0; i < 10; i++) rk_le_put(b + 16 + 8 * i, (uint64_t)d[i], 8);
    rk_sha256_update(&h, b, sizeof b);
    char spec[2048];
    rk_kv_params_format(kv, spec, sizeof spec);
    rk_sha256_update(&h, spec, strlen(spec) + 1);
    rk_sha256_update(&h, extra ? extra : "", (extra ? strlen(extra) : 0) + 1);
    uint8_t t[4];
    rk_le_put(b, n, 8);
    rk_sha256_update(&h, b, 8);
    for (size_t i = 0; i < n; i++) {
        rk_le_put(t, (uint32_t)tokens[i], 4);
        rk_sha256_update(&h, t, 4);
    }
    uint8_t dig[32];
    rk_sha256_final(&h, dig);
    rk_sha256_hex(dig, key);
}

static bool valid_key(const char *key) {
    if (!key || strlen(key) != 64) return false;
    for (int i = 0; i < 64; i++)
        if (!((key[i] >= '0' && key[i] <= '9') || (key[i] >= 'a' && key[i] <= 'f'))) return false;
    return true;
}

static rk_status entry_path(const rk_doc_cache *c, const char *key, char *buf, size_t cap, rk_err *err) {
    if (!valid_key(key)) return rk_err_set(err, RK_E_INVALID_ARG, "document cache: '%s' is not a key", key ? key : "");
    int w = snprintf(buf, cap, "%s/%s.rkkv", c->dir, key);
    if (w < 0 || (size_t)w >= cap) return rk_err_set(err, RK_E_INVALID_ARG, "document cache: path too long");
    return RK_OK;
}

typedef struct meta {
    uint64_t n_tokens, raw;
    uint32_t pieces, piece;
    char key[65], label[256], model[64], kv[64];
} meta;

static rk_status read_meta(rk_bs *bs, meta *mt, char *msg, size_t cap) {
    uint8_t b[META_BYTES];
    size_t len = 0;
    rk_err e = {0};
    rk_status st = rk_bs_get_sync(bs, 0, b, sizeof b, &len, &e);
    if (st) {
        snprintf(msg, cap, "%s", e.msg);
        return st;
    }
    if (len != META_BYTES || memcmp(b, "RKDC", 4)) {
        snprintf(msg, cap, "not a document cache entry (header frame of %zu bytes)", len);
        return RK_E_FORMAT;
    }
    const uint32_t v = (uint32_t)rk_le_get(b + 4, 4);
    if (v != META_VERSION) {
        snprintf(msg, cap, "entry format version %u (this build reads %d)", v, META_VERSION);
        return RK_E_FORMAT;
    }
    mt->n_tokens = rk_le_get(b + 8, 8), mt->raw = rk_le_get(b + 16, 8);
    mt->pieces = (uint32_t)rk_le_get(b + 24, 4), mt->piece = (uint32_t)rk_le_get(b + 28, 4);
    char k[65];
    memcpy(k, b + 32, 64);
    k[64] = '\0';
    memcpy(mt->key, k, 65);
    get_str(mt->label, b + 96, 256), get_str(mt->model, b + 352, 64), get_str(mt->kv, b + 416, 64);
    if (!mt->piece || mt->piece > PIECE || mt->raw > (uint64_t)mt->pieces * mt->piece ||
        (mt->pieces && mt->raw <= (uint64_t)(mt->pieces - 1) * mt->piece)) {
        snprintf(msg, cap, "entry header has impossible sizes (%llu bytes in %u pieces of %u)",
                 (unsigned long long)mt->raw, mt->pieces, mt->piece);
        return RK_E_FORMAT;
    }
    for (uint32_t i = 1; i <= mt->pieces; i++) {
        size_t n = 0;
        const uint64_t want = i < mt->pieces ? mt->piece : mt->raw - (uint64_t)(mt->pieces - 1) * mt->piece;
        if (!rk_bs_block_len(bs, i, &n) || n != want) {
            snprintf(msg, cap, "entry piece %u of %u is missing or of the wrong size", i, mt->pieces);
            return RK_E_FORMAT;
        }
    }
    return RK_OK;
}


/* An entry-format file's payload read in order, piece by piece, RD_DEPTH pieces in flight. */
enum { RD_DEPTH = 4 };
struct rk_doc_cache_reader {
    rk_doc_cache *c;
    rk_bs *bs;
    meta mt;
    uint8_t *buf[RD_DEPTH];
    bool ready[RD_DEPTH];
    uint32_t next; /* the next piece to queue (1-based) */
    uint32_t cur;  /* the piece being consumed (1-based; 0: none yet) */
    size_t off;    /* bytes of it consumed */
    uint64_t pulled;
    double t0;
};

static size_t piece_len(const meta *mt, uint32_t i) {
    return i < mt->pieces ? mt->piece : (size_t)(mt->raw - (uint64_t)(mt->pieces - 1) * mt->piece);
}

static rk_status rd_queue(rk_doc_cache_reader *r, rk_err *err) {
    while (r->next <= r->mt.pieces && r->next < r->cur + RD_DEPTH + (r->cur == 0)) {
        const int slot = (int)((r->next - 1) % RD_DEPTH);
        r->ready[slot] = false;
        rk_status st = rk_bs_get(r->bs, r->next, r->buf[slot], r->mt.piece, (void *)(intptr_t)(slot + 1), err);
        if (st) return st;
        r->next++;
    }
    return RK_OK;
}

rk_status rk_doc_cache_reader_pull(void *ctx, uint8_t *dst, size_t len, rk_err *err) {
    rk_doc_cache_reader *r = ctx;
    if (len > r->mt.raw - r->pulled)
        return rk_err_set(err, RK_E_FORMAT, "a read past the end of its %llu bytes", (unsigned long long)r->mt.raw);
    while (len) {
        if (r->cur == 0 || r->off == piece_len(&r->mt, r->cur)) {
            r->cur++, r->off = 0;
            rk_status st = rd_queue(r, err);
            if (st) return st;
            const int slot = (int)((r->cur - 1) % RD_DEPTH);
            while (!r->ready[slot]) {
                rk_bs_done d[RD_DEPTH];
                const int k = rk_bs_wait(r->bs, 1, d, RD_DEPTH);
                if (!k) return rk_err_set(err, RK_E_IO, "piece %u was never read", r->cur);
                for (int j = 0; j < k; j++) {
                    if (d[j].status) return rk_err_set(err, d[j].status, "%s", d[j].msg);
                    r->ready[(intptr_t)d[j].ud - 1] = true;
                }
            }
        }
        const int slot = (int)((r->cur - 1) % RD_DEPTH);
        const size_t have = piece_len(&r->mt, r->cur) - r->off, k = have < len ? have : len;
        if (dst) memcpy(dst, r->buf[slot] + r->off, k), dst += k;
        r->off += k, len -= k, r->pulled += k;
    }
    return RK_OK;
}

uint64_t rk_doc_cache_reader_left(const rk_doc_cache_reader *r) { return r->mt.raw - r->pulled; }

rk_status rk_doc_cache_reader_open(rk_doc_cache *c, const char *path, const char *key, rk_doc_cache_reader **out,
                                   uint64_t *raw, int64_t *n_tokens, char *msg, size_t cap) {
    *out = NULL;
    rk_doc_cache_reader *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(msg, cap, "out of memory");
        return RK_E_NOMEM;
    }
    r->c = c, r->t0 = rk_time_now(), r->next = 1;
    rk_err e = {0};
    rk_status st = rk_bs_open(path, RK_BS_READ, &c->p.io, &r->bs, &e);
    if (st) snprintf(msg, cap, "%s", e.msg);
    if (!st && (st = read_meta(r->bs, &r->mt, msg, cap)) == RK_OK && strcmp(r->mt.key, key)) {
        st = RK_E_FORMAT;
        snprintf(msg, cap, "the file is named for entry %.12s but holds entry %.12s", key, r->mt.key);
    }
    for (int i = 0; !st && i < RD_DEPTH; i++)
        if (!(r->buf[i] = malloc(r->mt.piece))) {
            st = RK_E_NOMEM;
            snprintf(msg, cap, "out of memory for a piece of %u bytes", r->mt.piece);
        }
    if (st) {
        rk_doc_cache_reader_close(r);
        return st;
    }
    if (raw) *raw = r->mt.raw;
    if (n_tokens) *n_tokens = (int64_t)r->mt.n_tokens;
    *out = r;
    return RK_OK;
}

void rk_doc_cache_reader_close(rk_doc_cache_reader *r) {
    if (!r) return;
    while (r->bs && rk_bs_in_flight(r->bs)) { /* what an early stop left queued */
        rk_bs_done d[RD_DEPTH];
        if (!rk_bs_wait(r->bs, 1, d, RD_DEPTH)) break;
    }
    for (int i = 0; i < RD_DEPTH; i++) free(r->buf[i]);
    if (r->bs) {
        r->c->last.backend = rk_bs_backend_used(r->bs);
        r->c->last.direct = rk_bs_direct(r->bs);
    }
    rk_bs_close(r->bs);
    r->c->last.io_s = rk_time_now() - r->t0;
    r->c->last.raw_bytes = r->mt.raw;
    free(r);
}

/* Entry key's KV block whole (*buf malloc'd, mt its header), through the reader; msg says
 * why not. */
static rk_status read_entry(rk_doc_cache *c, const char *path, const char *key, uint8_t **buf, meta *mt, char *msg,
                            size_t cap) {
    rk_doc_cache_reader *r = NULL;
    *buf = NULL;
    rk_status st = rk_doc_cache_reader_open(c, path, key, &r, NULL, NULL, msg, cap);
    if (st) return st;
    *mt = r->mt;
    if (!(*buf = malloc(mt->raw ? (size_t)mt->raw : 1))) {
        st = RK_E_NOMEM;
        snprintf(msg, cap, "out of memory for %llu bytes", (unsigned long long)mt->raw);
    }
    rk_err e = {0};
    if (!st && (st = rk_doc_cache_reader_pull(r, *buf, (size_t)mt->raw, &e))) snprintf(msg, cap, "%s", e.msg);
    rk_doc_cache_reader_close(r);
    if (st) {
        free(*buf);
        *buf = NULL;
    }
    return st;
}

/* Entry key's KV block into s (reset first), streamed; msg says why not. */
static rk_status load_entry(rk_doc_cache *c, const char *path, const char *key, rk_session *s, meta *mt, char *msg,
                            size_t cap) {
    rk_doc_cache_reader *r = NULL;
    rk_status st = rk_doc_cache_reader_open(c, path, key, &r, NULL, NULL, msg, cap);
    if (st) return st;
    *mt = r->mt;
    rk_session_reset(s);
    rk_err e = {0};
    if ((st = rk_session_kv_import_stream(s, mt->raw, rk_doc_cache_reader_pull, r, &e)))
        snprintf(msg, cap, "%s", e.msg);
    rk_doc_cache_reader_close(r);
    return st;
}

rk_status rk_doc_cache_load(rk_doc_cache *c, const char *key, rk_session *s, int64_t *n_tokens, rk_err *err) {
    return rk_doc_cache_load_tokens(c, key, NULL, 0, s, n_tokens, err);
}

rk_status rk_doc_cache_load_tokens(rk_doc_cache *c, const char *key, const int32_t *tokens, size_t n, rk_session *s,
                                   int64_t *n_tokens, rk_err *err) {
    char path[4096];
    rk_status st = entry_path(c, key, path, sizeof path, err);
    if (st) return st;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        if (errno == ENOENT) return rk_err_set(err, RK_E_NOT_FOUND, "document cache: no entry %.12s", key);
        return rk_err_set(err, RK_E_IO, "document cache: cannot stat %s (%s)", path, strerror(errno));
    }
    char msg[640] = "";
    meta mt = {0};
    st = load_entry(c, path, key, s, &mt, msg, sizeof msg);
    c->last.file_bytes = (uint64_t)sb.st_size;
    if (!st) {
        if ((uint64_t)rk_session_n_past(s) != mt.n_tokens) {
            st = RK_E_FORMAT;
            snprintf(msg, sizeof msg, "entry says %llu tokens, its block holds %lld", (unsigned long long)mt.n_tokens,
                     (long long)rk_session_n_past(s));
        } else if (tokens) { /* the rows' own tokens against the documents the key was made of */
            size_t i = 0;
            const int32_t *held = rk_session_tokens(s);
            while (i < n && i < mt.n_tokens && held[i] == tokens[i]) i++;
            if (i < n || mt.n_tokens != n) {
                st = RK_E_FORMAT;
                snprintf(msg, sizeof msg,
                         "it holds another document: its %llu tokens differ from the %zu of the documents at token "
                         "%zu",
                         (unsigned long long)mt.n_tokens, n, i);
            }
        }
    }
    if (st) {
        rk_session_reset(s);
        unlink(path);
        drop_stream(c, key);
        return rk_err_set(err, st, "document cache: entry %.12s is unusable (%s); removed", key, msg);
    }
    utimensat(AT_FDCWD, path, NULL, 0); /* last use, for LRU */
    *n_tokens = (int64_t)mt.n_tokens;
    return RK_OK;
}

rk_status rk_doc_cache_read(rk_doc_cache *c, const char *key, void **blk, size_t *n, rk_err *err) {
    char path[4096];
    rk_status st = entry_path(c, key, path, sizeof path, err);
    if (st) return st;
    if (access(path, F_OK) != 0) return rk_err_set(err, RK_E_NOT_FOUND, "document cache: no entry %.12s", key);
    uint8_t *buf = NULL;
    char msg[640] = "";
    meta mt = {0};
    if ((st = read_entry(c, path, key, &buf, &mt, msg, sizeof msg)))
        return rk_err_set(err, st, "document cache: entry %.12s is unusable (%s)", key, msg);
    *blk = buf;
    *n = (size_t)mt.raw;
    return RK_OK;
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

struct rk_doc_cache_writer {
    rk_doc_cache *c;
    rk_bs *bs;
    char path[4096], tmp[4200], msg[640];
    uint8_t *buf;   /* (PIECE) the piece being filled */
    uint8_t *first; /* (PIECE) piece 1, written at close so that rk_doc_cache_writer_patch can
                       still change it */
    size_t fill, first_len;
    uint64_t len;
    uint32_t pieces;
    rk_status st; /* the first failure; later puts are no-ops */
    double t0;
};

static void w_fail(rk_doc_cache_writer *w, rk_status st, const char *msg) {
    if (w->st) return;
    w->st = st;
    snprintf(w->msg, sizeof w->msg, "%s", msg);
}

/* Reaps the completions there are (wait: all in flight), keeping the first failure. */
static void w_reap(rk_doc_cache_writer *w, bool wait) {
    while (rk_bs_in_flight(w->bs)) {
        rk_bs_done d[16];
        const int k = rk_bs_wait(w->bs, wait ? 1 : 0, d, 16);
        for (int j = 0; j < k; j++)
            if (d[j].status) w_fail(w, d[j].status, d[j].msg);
        if (!k) break;
    }
}

static void w_piece(rk_doc_cache_writer *w) {
    rk_err e = {0};
    if (++w->pieces == 1 && !w->st) { /* held until close */
        uint8_t *t = w->first;
        w->first = w->buf, w->first_len = w->fill;
        w->buf = t;
        if (!w->buf && !(w->buf = malloc(PIECE))) w_fail(w, RK_E_NOMEM, "out of memory");
        w->fill = 0;
        return;
    }
    if (!w->st && rk_bs_put(w->bs, w->pieces, w->buf, w->fill, NULL, &e)) w_fail(w, e.code, e.msg);
    w->fill = 0;
    w_reap(w, false);
}

void rk_doc_cache_writer_patch(rk_doc_cache_writer *w, size_t off, const void *p, size_t n) {
    uint8_t *at = w->pieces ? w->first : w->buf;
    const size_t have = w->pieces ? w->first_len : w->fill;
    if (w->st) return;
    if (!at || off > have || n > have - off) w_fail(w, RK_E_INTERNAL, "a patch past the first piece");
    else memcpy(at + off, p, n);
}

rk_status rk_doc_cache_writer_open(rk_doc_cache *c, const char *path, rk_doc_cache_writer **out, rk_err *err) {
    rk_doc_cache_writer *w = calloc(1, sizeof *w);
    if (w) w->buf = malloc(PIECE);
    if (!w || !w->buf) {
        if (w) free(w);
        return rk_err_set(err, RK_E_NOMEM, "document cache: out of memory");
    }
    w->c = c, w->t0 = rk_time_now();
    snprintf(w->path, sizeof w->path, "%s", path);
    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%ld", path, (long)getpid());
    rk_err e = {0};
    if (rk_bs_open(w->tmp, RK_BS_CREATE, &c->p.io, &w->bs, &e)) w_fail(w, e.code, e.msg);
    *out = w;
    return RK_OK;
}

void rk_doc_cache_writer_put(rk_doc_cache_writer *w, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n && !w->st && w->buf) {
        const size_t k = PIECE - w->fill < n ? PIECE - w->fill : n;
        memcpy(w->buf + w->fill, b, k);
        w->fill += k, w->len += k, b += k, n -= k;
        if (w->fill == PIECE) w_piece(w);
    }
}

bool rk_doc_cache_writer_failed(const rk_doc_cache_writer *w) { return w->st != RK_OK; }

rk_status rk_doc_cache_writer_close(rk_doc_cache_writer *w, bool keep, const char *key, const rk_model *m,
                                    const rk_kv_params *kv, int64_t n, const char *label, rk_err *err) {
    rk_doc_cache *c = w->c;
    if (!keep) w_fail(w, RK_E_CANCELLED, "abandoned");
    if (w->fill) w_piece(w);
    rk_err e = {0};
    if (w->first && !w->st && rk_bs_put(w->bs, 1, w->first, w->first_len, NULL, &e)) w_fail(w, e.code, e.msg);
    uint8_t mb[META_BYTES] = {0};
    memcpy(mb, "RKDC", 4);
    rk_le_put(mb + 4, META_VERSION, 4);
    rk_le_put(mb + 8, (uint64_t)n, 8), rk_le_put(mb + 16, w->len, 8);
    rk_le_put(mb + 24, w->pieces, 4), rk_le_put(mb + 28, PIECE, 4);
    memcpy(mb + 32, key, 64);
    put_str(mb + 96, label, 256);
    put_str(mb + 352, rk_model_name(m), 64);
    char spec[2048];
    rk_kv_params_format(kv, spec, sizeof spec);
    put_str(mb + 416, spec, 64);
    if (!w->st && rk_bs_put(w->bs, 0, mb, sizeof mb, NULL, &e)) w_fail(w, e.code, e.msg);
    if (w->bs) w_reap(w, true);
    if (!w->st && rk_bs_sync(w->bs, &e)) w_fail(w, e.code, e.msg);
    if (w->bs) {
        c->last.backend = rk_bs_backend_used(w->bs);
        c->last.direct = rk_bs_direct(w->bs);
    }
    rk_bs_close(w->bs);
    if (!w->st && rename(w->tmp, w->path) != 0) {
        char msg[640];
        snprintf(msg, sizeof msg, "cannot rename %.300s (%s)", w->tmp, strerror(errno));
        w_fail(w, RK_E_IO, msg);
    }
    rk_status st = w->st;
    if (st) {
        unlink(w->tmp);
        if (keep)
            rk_err_set(err, st, "document cache: cannot save %s %.12s in %s (%s)",
                       strstr(w->path, ".rkck") ? "a checkpoint of entry" : "entry", key, c->dir, w->msg);
    } else {
        fsync_dir(c->dir);
        struct stat sb;
        c->last.io_s = rk_time_now() - w->t0;
        c->last.raw_bytes = w->len;
        c->last.file_bytes = stat(w->path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
    }
    free(w->buf), free(w->first), free(w);
    return keep ? st : RK_OK;
}

rk_status rk_doc_cache_write_file(rk_doc_cache *c, const char *path, const char *key, const rk_model *m,
                                  const rk_kv_params *kv, int64_t n, const char *label, const void *blk, size_t len,
                                  rk_err *err) {
    rk_doc_cache_writer *w = NULL;
    rk_status st = rk_doc_cache_writer_open(c, path, &w, err);
    if (st) return st;
    rk_doc_cache_writer_put(w, blk, len);
    return rk_doc_cache_writer_close(w, true, key, m, kv, n, label, err);
}

static void w_sink(void *ctx, const uint8_t *p, size_t n) { rk_doc_cache_writer_put(ctx, p, n); }

rk_status rk_doc_cache_save(rk_doc_cache *c, const char *key, const rk_model *m, const rk_kv_params *kv,
                            const rk_session *s, int64_t n, const char *label, rk_err *err) {
    char path[4096];
    rk_status st = entry_path(c, key, path, sizeof path, err);
    if (st) return st;
    if (!m) m = s->m;
    if (!kv) kv = &s->p.kv;
    /* streamed: the block is never whole in memory (at 100K tokens it is as large as the KV) */
    rk_doc_cache_writer *w = NULL;
    if ((st = rk_doc_cache_writer_open(c, path, &w, err))) return st;
    uint8_t sum[8];
    rk_err e = {0};
    st = rk_kv_block_export_stream(s->kv, s->m, s->tokens, 0, n, w_sink, w, sum, &e);
    if (!st) rk_doc_cache_writer_patch(w, 16, sum, 8); /* the block's checksum field */
    rk_status cst = rk_doc_cache_writer_close(w, !st, key, m, kv, n, label, err);
    if (st) return rk_err_set(err, st, "document cache: cannot save entry %.12s (%s)", key, e.msg);
    if ((st = cst)) return st;
    size_t nr;
    uint64_t left;
    rk_err ge = {0};
    rk_doc_cache_gc(c, 0, &nr, &left, &ge); /* the entry is saved; a failing gc is not the caller's error */
    return RK_OK;
}

/* ---- listing and removal ------------------------------------------------------------ */

static int by_mtime_desc(const void *a, const void *b) {
    const rk_doc_cache_entry *x = a, *y = b;
    return x->mtime < y->mtime ? 1 : x->mtime > y->mtime ? -1 : strcmp(x->key, y->key);
}

static bool is_entry_name(const char *name, char key[65]) {
    size_t n = strlen(name);
    if (n != 64 + 5 || strcmp(name + 64, ".rkkv")) return false;
    memcpy(key, name, 64);
    key[64] = '\0';
    return valid_key(key);
}

rk_status rk_doc_cache_list(rk_doc_cache *c, rk_doc_cache_entry **out, size_t *n_out, rk_err *err) {
    *out = NULL;
    *n_out = 0;
    DIR *d = opendir(c->dir);
    if (!d && errno == ENOENT) return RK_OK; /* a read-only open of a cache never made */
    if (!d) return rk_err_set(err, RK_E_IO, "document cache: cannot list %s (%s)", c->dir, strerror(errno));
    rk_doc_cache_entry *v = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char key[65], path[4096];
        if (!is_entry_name(de->d_name, key)) continue;
        snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
        struct stat sb;
        if (stat(path, &sb) != 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            rk_doc_cache_entry *t = realloc(v, cap * sizeof *t);
            if (!t) {
                free(v);
                closedir(d);
                return rk_err_set(err, RK_E_NOMEM, "document cache: out of memory");
            }
            v = t;
        }
        rk_doc_cache_entry *en = &v[n++];
        memset(en, 0, sizeof *en);
        memcpy(en->key, key, 65);
        en->bytes = (uint64_t)sb.st_size;
        en->mtime = (int64_t)sb.st_mtime;
        rk_bs *bs = NULL;
        rk_err e = {0};
        rk_bs_params io = c->p.io;
        io.fault = (rk_bs_fault){0};
        io.queue_depth = 1;
        meta mt = {0};
        char msg[640] = "";
        rk_status st = rk_bs_open(path, RK_BS_READ, &io, &bs, &e);
        if (st) snprintf(msg, sizeof msg, "%s", e.msg);
        else st = read_meta(bs, &mt, msg, sizeof msg);
        rk_bs_close(bs);
        if (!st && strcmp(mt.key, key)) {
            st = RK_E_FORMAT;
            snprintf(msg, sizeof msg, "the file is named for entry %.12s but holds entry %.12s", key, mt.key);
        }
        if (st) {
            en->bad = true;
            snprintf(en->label, sizeof en->label, "%.255s", msg);
        } else {
            memcpy(en->label, mt.label, sizeof en->label);
            memcpy(en->model, mt.model, sizeof en->model);
            memcpy(en->kv, mt.kv, sizeof en->kv);
            en->n_tokens = (int64_t)mt.n_tokens;
            en->raw_bytes = mt.raw;
        }
    }
    closedir(d);
    if (n) qsort(v, n, sizeof *v, by_mtime_desc);
    *out = v;
    *n_out = n;
    return RK_OK;
}

/* The kept split stream beside an entry (doc_stream.c: <key>.rkxs) and the checkpoints of its
 * read (doc_ckpt.c: <key>.rkck, <key>.rkck.old) go with it. */
static void drop_stream(const rk_doc_cache *c, const char *key) {
    static const char *const ext[] = {"rkxs", "rkck", "rkck.old"};
    for (int i = 0; i < 3; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.%s", c->dir, key, ext[i]);
        unlink(path);
    }
}

/* Why a file of the cache could not be removed, in the user's terms. */
static const char *why_not_removed(int e) {
    return e == EROFS                  ? "the file system is read-only"
           : e == EACCES || e == EPERM ? "the cache directory is not writable"
                                       : strerror(e);
}

/* Streams whose entry is gone (a crash between the two removals, an older binary's rm), and
 * checkpoints whose entry is there (a crash between saving the entry and removing them). */
static size_t remove_orphan_streams(const rk_doc_cache *c) {
    DIR *d = opendir(c->dir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const size_t len = strlen(de->d_name);
        const bool stream = len == 64 + 5 && !strcmp(de->d_name + 64, ".rkxs");
        const bool ckpt = (len == 64 + 5 && !strcmp(de->d_name + 64, ".rkck")) ||
                          (len == 64 + 9 && !strcmp(de->d_name + 64, ".rkck.old"));
        if (!stream && !ckpt) continue;
        char entry[4096], path[4096];
        snprintf(entry, sizeof entry, "%s/%.64s.rkkv", c->dir, de->d_name);
        const bool has_entry = access(entry, F_OK) == 0;
        /* a stream without its entry, a checkpoint of a read that completed */
        if (stream ? has_entry || errno != ENOENT : !has_entry) continue;
        snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
        if (unlink(path) == 0) n++;
    }
    closedir(d);
    return n;
}

rk_status rk_doc_cache_remove(rk_doc_cache *c, const char *prefix, size_t *n_removed, rk_err *err) {
    *n_removed = 0;
    DIR *d = opendir(c->dir);
    if (!d && errno == ENOENT) return RK_OK;
    if (!d) return rk_err_set(err, RK_E_IO, "document cache: cannot list %s (%s)", c->dir, strerror(errno));
    const size_t np = prefix ? strlen(prefix) : 0;
    rk_status st = RK_OK;
    struct dirent *de;
    while ((de = readdir(d))) {
        char key[65], path[4096];
        const size_t len = strlen(de->d_name);
        /* the checkpoints of a read that never completed count as its entry */
        const bool ckpt = len >= 69 && (!strcmp(de->d_name + 64, ".rkck") || !strcmp(de->d_name + 64, ".rkck.old"));
        if (ckpt) {
            memcpy(key, de->d_name, 64);
            key[64] = '\0';
            if (!valid_key(key) || strncmp(key, prefix ? prefix : "", np)) continue;
            char entry[4096];
            snprintf(entry, sizeof entry, "%s/%s.rkkv", c->dir, key);
            const bool alone = len == 69 && access(entry, F_OK) != 0;
            snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
            if (unlink(path) == 0) *n_removed += alone;
            else if (errno != ENOENT && !st)
                st = rk_err_set(err, RK_E_IO, "document cache: cannot remove %s (%s)", path, why_not_removed(errno));
            continue;
        }
        if (!is_entry_name(de->d_name, key) || strncmp(key, prefix ? prefix : "", np)) continue;
        snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
        if (unlink(path) == 0) (*n_removed)++, drop_stream(c, key);
        else if (!st)
            st = rk_err_set(err, RK_E_IO, "document cache: cannot remove %s (%s)", path, why_not_removed(errno));
    }
    closedir(d);
    return st;
}

/* Temporary files of writers that are gone: <key>.<ext>.tmp.<pid>. */
static size_t remove_stale_tmp(const rk_doc_cache *c) {
    DIR *d = opendir(c->dir);
    if (!d) return 0;
    size_t n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *t = strstr(de->d_name, ".tmp.");
        char key[65];
        if (!t || t - de->d_name < 64) continue;
        memcpy(key, de->d_name, 64);
        key[64] = '\0';
        if (!valid_key(key) || de->d_name[64] != '.') continue;
        char *end;
        const long pid = strtol(t + 5, &end, 10);
        if (*end || pid <= 0) continue;
        if (pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", c->dir, de->d_name);
            if (unlink(path) == 0) n++;
        }
    }
    closedir(d);
    return n;
}

rk_status rk_doc_cache_gc(rk_doc_cache *c, uint64_t cap, size_t *n_removed, uint64_t *bytes_left, rk_err *err) {
    if (!cap) cap = c->p.cap_bytes;
    if (access(c->dir, W_OK) != 0 && (errno == EROFS || errno == EACCES)) {
        *n_removed = 0, *bytes_left = 0;
        return rk_err_set(err, RK_E_IO, "document cache: nothing collected in %s (%s)", c->dir, why_not_removed(errno));
    }
    *n_removed = remove_stale_tmp(c);
    remove_orphan_streams(c);
    *bytes_left = 0;
    rk_doc_cache_entry *v = NULL;
    size_t n = 0;
    rk_status st = rk_doc_cache_list(c, &v, &n, err);
    if (st) return st;
    uint64_t total = 0;
    for (size_t i = 0; i < n; i++) total += v[i].bytes;
    /* bad entries first, then the least recently used (the list is most recent first) */
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = n; i-- > 0;) {
            if (!v[i].bytes && !v[i].bad) continue;
            if (pass == 0 ? !v[i].bad : total <= cap) continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s.rkkv", c->dir, v[i].key);
            if (unlink(path) == 0) {
                drop_stream(c, v[i].key);
                (*n_removed)++;
                total -= v[i].bytes;
                v[i].bytes = 0, v[i].bad = false;
            }
        }
    free(v);
    *bytes_left = total;
    return RK_OK;
}
