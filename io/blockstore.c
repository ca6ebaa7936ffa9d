/* The block store (rk_blockstore.h): frames of zstd-compressed blocks in one file,
 * written and read through io_uring with registered buffers and file, or a pread/pwrite
 * thread pool with the same completions. Compression, checks and decompression run on
 * the caller's thread (put and wait); only the I/O is asynchronous. */
#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include "rk_blockstore.h"

enum { ALIGN = 4096, HDR = 64, VERSION = 1, MAX_QD = 256 };

typedef struct entry {
    uint64_t id, off, frame, raw;
    uint8_t state; /* 0 empty, 1 used, 2 deleted */
} entry;

typedef struct slot {
    uint8_t *buf;
    bool busy, is_put, corrupt;
    uint64_t id, off, frame, raw;
    size_t io_len; /* bytes the I/O moves (frame, or less for the short-write fault) */
    void *ud;
    uint8_t *dst;
    size_t cap;
    const rk_bs_iov *iov; /* rk_bs_getv: the caller's pieces (dst unused) */
    int n_iov;
} slot;

typedef struct done_q {
    int slot;
    int64_t res;
} done_q;

struct rk_bs {
    int fd;
    bool direct;
    rk_bs_backend backend;
    rk_bs_params p;
    size_t slot_cap;
    slot *slots;
    int qd, in_flight;
    uint64_t end;
    entry *tab;
    size_t tab_cap, tab_used;
    ZSTD_CCtx *cctx;
    ZSTD_DCtx *dctx;
    int64_t n_puts, n_gets; /* for the fault hook */
    /* completions not yet returned (ENOSPC/EIO faults, completions reaped while waiting for a buffer) */
    rk_bs_done *pending;
    int n_pending, cap_pending;
    /* io_uring */
    struct io_uring ring;
    bool ring_ok, fixed_bufs, fixed_file;
    bool batch;      /* rk_bs_batch: prepared SQEs wait for one io_uring_submit */
    int unsubmitted; /* SQEs prepared, not yet submitted */
    /* thread pool */
    pthread_t *th;
    int n_th;
    pthread_mutex_t mu;
    pthread_cond_t cv_job, cv_done;
    int *jobs, n_jobs, job_head;
    done_q *dq;
    int n_dq, dq_head;
    bool stop;
    rk_bs_stats st;
};

static uint64_t round_up(uint64_t x) { return (x + ALIGN - 1) / ALIGN * ALIGN; }


const char *rk_bs_backend_name(rk_bs_backend b) {
    return b == RK_BS_URING ? "io_uring" : b == RK_BS_THREADS ? "threads" : "auto";
}

rk_bs_params rk_bs_params_default(void) {
    rk_bs_params p = {.backend = RK_BS_AUTO, .queue_depth = 8, .zstd_level = 1, .max_block = 4u << 20};
    return p;
}

rk_status rk_bs_fault_parse(const char *spec, rk_bs_fault *out, rk_err *err) {
    static const char *names[] = {"none", "short_write", "enospc", "eio", "corrupt", "kill"};
    size_t n = strcspn(spec, "@");
    for (int k = 0; k < 6; k++)
        if (strlen(names[k]) == n && !strncmp(spec, names[k], n)) {
            rk_bs_fault f = {(rk_bs_fault_kind)k, 0};
            if (spec[n] == '@') {
                char *e;
                if (!strcmp(spec + n + 1, "all")) f.nth = -1;
                else {
                    f.nth = strtoll(spec + n + 1, &e, 10);
                    if (e == spec + n + 1 || *e || f.nth < 0)
                        return rk_err_set(err, RK_E_INVALID_ARG, "io: fault '%s': after @ a count or 'all'", spec);
                }
            }
            *out = f;
            return RK_OK;
        }
    return rk_err_set(err, RK_E_INVALID_ARG,
                      "io: fault '%s' unknown (short_write, enospc, eio, corrupt, kill [@N|@all])", spec);
}

/* ---- index: open addressing on the block id ---------------------------------------- */

static size_t hash_id(uint64_t id, size_t cap) { return (size_t)((id * 0x9e3779b97f4a7c15ull) >> 17) & (cap - 1); }

static entry *find(const rk_bs *bs, uint64_t id) {
    if (!bs->tab_cap) return NULL;
    for (size_t i = hash_id(id, bs->tab_cap), k = 0; k < bs->tab_cap; k++, i = (i + 1) & (bs->tab_cap - 1)) {
        entry *e = &bs->tab[i];
        if (e->state == 0) return NULL;
        if (e->state == 1 && e->id == id) return e;
    }
    return NULL;
}

static bool insert(rk_bs *bs, uint64_t id, uint64_t off, uint64_t frame, uint64_t raw) {
    entry *e = find(bs, id);
    if (e) {
        e->off = off, e->frame = frame, e->raw = raw;
        return true;
    }
    if ((bs->tab_used + 1) * 2 > bs->tab_cap) {
        size_t cap = bs->tab_cap ? bs->tab_cap * 2 : 64;
        entry *t = calloc(cap, sizeof *t);
        if (!t) return false;
        entry *old = bs->tab;
        size_t old_cap = bs->tab_cap;
        bs->tab = t, bs->tab_cap = cap, bs->tab_used = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].state == 1) {
                size_t j = hash_id(old[i].id, cap);
                while (t[j].state) j = (j + 1) & (cap - 1);
                t[j] = old[i];
                bs->tab_used++;
            }
        free(old);
    }
    size_t j = hash_id(id, bs->tab_cap);
    while (bs->tab[j].state == 1) j = (j + 1) & (bs->tab_cap - 1);
    if (bs->tab[j].state == 0) bs->tab_used++;
    bs->tab[j] = (entry){id, off, frame, raw, 1};
    return true;
}

bool rk_bs_block_len(const rk_bs *bs, uint64_t id, size_t *len) {
    const entry *e = find(bs, id);
    if (e && len) *len = (size_t)e->raw;
    return e != NULL;
}

void rk_bs_drop(rk_bs *bs, uint64_t id) {
    entry *e = find(bs, id);
    if (e) e->state = 2;
}

/* ---- frames ------------------------------------------------------------------------- */

/* Checks the 64-byte header at h; fills id, raw, stored. */
static rk_status parse_header(const uint8_t *h, uint64_t *id, uint64_t *raw, uint64_t *stored, uint32_t *codec,
                              char *msg, size_t cap) {
    if (memcmp(h, "RKBS", 4)) {
        snprintf(msg, cap, "not a block frame (magic is not 'RKBS')");
        return RK_E_FORMAT;
    }
    const uint32_t v = (uint32_t)rk_le_get(h + 4, 4);
    if (v != VERSION) {
        snprintf(msg, cap, "block frame format version %u (this build reads %d)", v, VERSION);
        return RK_E_FORMAT;
    }
    if (XXH64(h, 48, 0) != rk_le_get(h + 48, 8)) {
        snprintf(msg, cap, "block frame header checksum mismatch: the header is corrupt");
        return RK_E_FORMAT;
    }
    *id = rk_le_get(h + 8, 8), *raw = rk_le_get(h + 16, 8), *stored = rk_le_get(h + 24, 8);
    *codec = (uint32_t)rk_le_get(h + 32, 4);
    if (*codec > 1 || *stored > (1ull << 40) || *raw > (1ull << 40) || (*codec == 0 && *stored != *raw)) {
        snprintf(msg, cap, "block frame header has impossible sizes (raw %llu, stored %llu, codec %u)",
                 (unsigned long long)*raw, (unsigned long long)*stored, *codec);
        return RK_E_FORMAT;
    }
    return RK_OK;
}

/* ---- the thread pool ---------------------------------------------------------------- */

static void *worker(void *arg) {
    rk_bs *bs = arg;
    pthread_mutex_lock(&bs->mu);
    for (;;) {
        while (!bs->n_jobs && !bs->stop) pthread_cond_wait(&bs->cv_job, &bs->mu);
        if (!bs->n_jobs && bs->stop) break;
        const int si = bs->jobs[bs->job_head];
        bs->job_head = (bs->job_head + 1) % bs->qd;
        bs->n_jobs--;
        pthread_mutex_unlock(&bs->mu);
        slot *s = &bs->slots[si];
        const size_t len = s->io_len;
        size_t done = 0;
        int64_t res = 0;
        while (done < len) {
            ssize_t r = s->is_put ? pwrite(bs->fd, s->buf + done, len - done, (off_t)(s->off + done))
                                  : pread(bs->fd, s->buf + done, len - done, (off_t)(s->off + done));
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                res = -errno;
                break;
            }
            if (r == 0) break;
            done += (size_t)r;
        }
        if (!res) res = (int64_t)done;
        pthread_mutex_lock(&bs->mu);
        bs->dq[(bs->dq_head + bs->n_dq) % bs->qd] = (done_q){si, res};
        bs->n_dq++;
        pthread_cond_signal(&bs->cv_done);
    }
    pthread_mutex_unlock(&bs->mu);
    return NULL;
}

/* ---- submission and completion ------------------------------------------------------ */

static rk_status submit(rk_bs *bs, int si, size_t len, rk_err *err) {
    slot *s = &bs->slots[si];
    s->io_len = len;
    if (bs->backend == RK_BS_URING) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&bs->ring);
        if (!sqe) return rk_err_set(err, RK_E_INTERNAL, "io: io_uring submission queue full");
        const int fd = bs->fixed_file ? 0 : bs->fd;
        if (bs->fixed_bufs) {
            if (s->is_put) io_uring_prep_write_fixed(sqe, fd, s->buf, (unsigned)len, s->off, si);
            else io_uring_prep_read_fixed(sqe, fd, s->buf, (unsigned)len, s->off, si);
        } else {
            if (s->is_put) io_uring_prep_write(sqe, fd, s->buf, (unsigned)len, s->off);
            else io_uring_prep_read(sqe, fd, s->buf, (unsigned)len, s->off);
        }
        if (bs->fixed_file) sqe->flags |= IOSQE_FIXED_FILE;
        io_uring_sqe_set_data64(sqe, (uint64_t)si);
        if (bs->batch) {
            bs->unsubmitted++; /* submitted with the others by flush() */
        } else {
            int r = io_uring_submit(&bs->ring);
            if (r < 0) return rk_err_set(err, RK_E_IO, "io: io_uring_submit failed (%s)", strerror(-r));
        }
    } else {
        pthread_mutex_lock(&bs->mu);
        bs->jobs[(bs->job_head + bs->n_jobs) % bs->qd] = si;
        bs->n_jobs++;
        pthread_cond_signal(&bs->cv_job);
        pthread_mutex_unlock(&bs->mu);
    }
    bs->in_flight++;
    return RK_OK;
}

/* A checked frame of slot s into the caller's pieces, in order (rk_bs_getv). */
static rk_status scatter_out(rk_bs *bs, const slot *s, uint32_t codec, uint64_t raw, uint64_t stored, char *msg,
                             size_t cap) {
    const uint8_t *src = s->buf + HDR;
    if (codec == 0) {
        uint64_t o = 0;
        for (int i = 0; i < s->n_iov && o < raw; i++) {
            const size_t n = s->iov[i].len < raw - o ? s->iov[i].len : (size_t)(raw - o);
            memcpy(s->iov[i].base, src + o, n);
            o += n;
        }
        return RK_OK;
    }
    ZSTD_DCtx_reset(bs->dctx, ZSTD_reset_session_only);
    ZSTD_inBuffer in = {src, (size_t)stored, 0};
    uint64_t out_total = 0;
    for (int i = 0; i < s->n_iov; i++) {
        ZSTD_outBuffer out = {s->iov[i].base, s->iov[i].len, 0};
        size_t r = 1;
        while (out.pos < out.size && r != 0) {
            const size_t before = out.pos, used = in.pos;
            r = ZSTD_decompressStream(bs->dctx, &out, &in);
            if (ZSTD_isError(r)) {
                snprintf(msg, cap, "io: block %llu does not decompress (%s)", (unsigned long long)s->id,
                         ZSTD_getErrorName(r));
                return RK_E_FORMAT;
            }
            if (out.pos == before && in.pos == used) break; /* no progress: the frame is short */
        }
        out_total += out.pos;
        if (out.pos < out.size) break; /* the frame ended (or is short): the size check says which */
    }
    if (out_total != raw) {
        snprintf(msg, cap, "io: block %llu decompresses to %llu bytes, %llu expected", (unsigned long long)s->id,
                 (unsigned long long)out_total, (unsigned long long)raw);
        return RK_E_FORMAT;
    }
    return RK_OK;
}

/* Turns the result of slot si into a completion record; frees the slot. */
static void complete(rk_bs *bs, int si, int64_t res, rk_bs_done *d) {
    slot *s = &bs->slots[si];
    memset(d, 0, sizeof *d);
    d->id = s->id, d->is_put = s->is_put, d->ud = s->ud, d->status = RK_OK;
    if (res < 0) {
        d->status = RK_E_IO;
        snprintf(d->msg, sizeof d->msg, "io: %s of block %llu failed (%s)", s->is_put ? "write" : "read",
                 (unsigned long long)s->id, strerror((int)-res));
    } else if ((uint64_t)res != s->frame) {
        d->status = s->is_put ? RK_E_IO : RK_E_FORMAT;
        snprintf(d->msg, sizeof d->msg, "io: %s of block %llu: %lld of %llu bytes (%s)",
                 s->is_put ? "short write" : "short read", (unsigned long long)s->id, (long long)res,
                 (unsigned long long)s->frame, s->is_put ? "disk full?" : "the file is truncated");
    } else if (s->is_put) {
        if (!insert(bs, s->id, s->off, s->frame, s->raw)) {
            d->status = RK_E_NOMEM;
            snprintf(d->msg, sizeof d->msg, "io: out of memory indexing block %llu", (unsigned long long)s->id);
        } else {
            d->len = (size_t)s->raw;
            bs->st.puts++;
        }
    } else {
        uint64_t id, raw, stored;
        uint32_t codec;
        rk_status st = parse_header(s->buf, &id, &raw, &stored, &codec, d->msg, sizeof d->msg);
        if (s->corrupt) s->buf[!st && stored ? HDR + stored / 2 : 20] ^= 0x5a; /* the payload (else the header) */
        if (s->corrupt && st == RK_OK && !stored)
            st = parse_header(s->buf, &id, &raw, &stored, &codec, d->msg, sizeof d->msg);
        if (!st && (id != s->id || raw != s->raw || round_up(HDR + stored) != s->frame)) {
            st = RK_E_FORMAT;
            snprintf(d->msg, sizeof d->msg, "io: frame read for block %llu holds block %llu (%llu bytes)",
                     (unsigned long long)s->id, (unsigned long long)id, (unsigned long long)raw);
        }
        if (!st && XXH64(s->buf + HDR, (size_t)stored, 0) != rk_le_get(s->buf + 40, 8)) {
            st = RK_E_FORMAT;
            snprintf(d->msg, sizeof d->msg, "io: block %llu checksum mismatch: the frame is corrupt",
                     (unsigned long long)s->id);
        }
        if (!st && raw > s->cap) {
            st = RK_E_INVALID_ARG;
            snprintf(d->msg, sizeof d->msg, "io: block %llu has %llu bytes, the buffer %zu", (unsigned long long)s->id,
                     (unsigned long long)raw, s->cap);
        }
        if (!st) {
            const double t0 = rk_time_now();
            if (s->iov) st = scatter_out(bs, s, codec, raw, stored, d->msg, sizeof d->msg);
            else if (codec == 0) memcpy(s->dst, s->buf + HDR, (size_t)raw);
            else {
                /* capacity raw, not cap: zstd may use spare room past the content as scratch (it
                 * decodes literals there), and the caller's bytes past raw are not ours */
                size_t r = ZSTD_decompressDCtx(bs->dctx, s->dst, (size_t)raw, s->buf + HDR, (size_t)stored);
                if (ZSTD_isError(r) || r != raw) {
                    st = RK_E_FORMAT;
                    snprintf(d->msg, sizeof d->msg, "io: block %llu does not decompress (%s)",
                             (unsigned long long)s->id, ZSTD_isError(r) ? ZSTD_getErrorName(r) : "wrong size");
                }
            }
            bs->st.decompress_s += rk_time_now() - t0;
        }
        if (!st) {
            d->len = (size_t)raw;
            bs->st.gets++, bs->st.raw_read += raw, bs->st.stored_read += s->frame;
        } else if (!d->msg[0]) snprintf(d->msg, sizeof d->msg, "io: block %llu is corrupt", (unsigned long long)s->id);
        if (st && strncmp(d->msg, "io: ", 4)) {
            char t[sizeof d->msg];
            memcpy(t, d->msg, sizeof t);
            int w = snprintf(d->msg, sizeof d->msg, "io: block %llu: ", (unsigned long long)s->id);
            if (w > 0 && (size_t)w < sizeof d->msg)
                snprintf(d->msg + w, sizeof d->msg - (size_t)w, "%.*s", (int)(sizeof d->msg - (size_t)w - 1), t);
        }
        d->status = st;
    }
    s->busy = false;
}

static bool push_pending(rk_bs *bs, const rk_bs_done *d) {
    if (bs->n_pending == bs->cap_pending) {
        int cap = bs->cap_pending ? 2 * bs->cap_pending : 16;
        rk_bs_done *p = realloc(bs->pending, (size_t)cap * sizeof *p);
        if (!p) return false;
        bs->pending = p, bs->cap_pending = cap;
    }
    bs->pending[bs->n_pending++] = *d;
    return true;
}

/* Reaps completed I/O (waiting for one when block) into out; returns the count. */
/* Submits the SQEs a batch prepared (one system call for all of them). */
static void flush(rk_bs *bs) {
    if (bs->backend != RK_BS_URING || !bs->unsubmitted) return;
    const int r = io_uring_submit(&bs->ring);
    if (r >= 0) bs->unsubmitted = r >= bs->unsubmitted ? 0 : bs->unsubmitted - r;
}

void rk_bs_batch(rk_bs *bs, bool on) {
    if (!bs) return;
    bs->batch = on;
    if (!on) flush(bs);
}

static int reap(rk_bs *bs, bool block, rk_bs_done *out, int max) {
    int n = 0;
    flush(bs);
    if (bs->backend == RK_BS_URING) {
        while (n < max && bs->in_flight > 0) {
            struct io_uring_cqe *cqe = NULL;
            int r = (block && n == 0) ? io_uring_wait_cqe(&bs->ring, &cqe) : io_uring_peek_cqe(&bs->ring, &cqe);
            if (r == -EINTR) continue;
            if (r < 0 || !cqe) break;
            const int si = (int)io_uring_cqe_get_data64(cqe);
            const int64_t res = cqe->res;
            io_uring_cqe_seen(&bs->ring, cqe);
            bs->in_flight--;
            complete(bs, si, res, &out[n++]);
        }
    } else {
        pthread_mutex_lock(&bs->mu);
        while (block && n == 0 && !bs->n_dq && bs->in_flight > 0) pthread_cond_wait(&bs->cv_done, &bs->mu);
        while (n < max && bs->n_dq) {
            done_q q = bs->dq[bs->dq_head];
            bs->dq_head = (bs->dq_head + 1) % bs->qd;
            bs->n_dq--;
            bs->in_flight--;
            pthread_mutex_unlock(&bs->mu);
            complete(bs, q.slot, q.res, &out[n++]);
            pthread_mutex_lock(&bs->mu);
        }
        pthread_mutex_unlock(&bs->mu);
    }
    return n;
}

int rk_bs_wait(rk_bs *bs, int min_n, rk_bs_done *out, int max) {
    const double t0 = rk_time_now();
    int n = 0;
    while (n < max && bs->n_pending) {
        out[n++] = bs->pending[0];
        memmove(bs->pending, bs->pending + 1, (size_t)(--bs->n_pending) * sizeof *bs->pending);
    }
    while (n < max) {
        int got = reap(bs, n < min_n && bs->in_flight > 0, out + n, max - n);
        n += got;
        if (!got && (n >= min_n || bs->in_flight == 0)) break;
    }
    bs->st.wait_s += rk_time_now() - t0;
    return n;
}

int rk_bs_in_flight(const rk_bs *bs) { return bs->in_flight + bs->n_pending; }

/* A free slot: reaps completions into pending until one is free. */
static int free_slot(rk_bs *bs, rk_err *err) {
    for (;;) {
        for (int i = 0; i < bs->qd; i++)
            if (!bs->slots[i].busy) return i;
        rk_bs_done d;
        const double t0 = rk_time_now();
        int n = reap(bs, true, &d, 1);
        bs->st.wait_s += rk_time_now() - t0;
        if (n == 0) {
            rk_err_set(err, RK_E_INTERNAL, "io: every buffer is busy and nothing is in flight");
            return -1;
        }
        if (!push_pending(bs, &d)) {
            rk_err_set(err, RK_E_NOMEM, "io: out of memory queueing a completion");
            return -1;
        }
    }
}

static bool fault_now(const rk_bs *bs, rk_bs_fault_kind k, int64_t count) {
    return bs->p.fault.kind == k && (bs->p.fault.nth < 0 || bs->p.fault.nth == count);
}

rk_status rk_bs_put(rk_bs *bs, uint64_t id, const void *data, size_t len, void *ud, rk_err *err) {
    if (len > bs->p.max_block)
        return rk_err_set(err, RK_E_INVALID_ARG, "io: block %llu of %zu bytes is over the store's %zu",
                          (unsigned long long)id, len, bs->p.max_block);
    const int si = free_slot(bs, err);
    if (si < 0) return err ? err->code : RK_E_INTERNAL;
    slot *s = &bs->slots[si];
    const double t0 = rk_time_now();
    /* level < 0: raw frames (no compression attempt: KV rows barely shrink, docs/TIERS.md) */
    size_t stored = bs->p.zstd_level < 0
                        ? len
                        : ZSTD_compressCCtx(bs->cctx, s->buf + HDR, bs->slot_cap - HDR, data, len, bs->p.zstd_level);
    uint32_t codec = 1;
    if (ZSTD_isError(stored) || stored >= len) {
        memcpy(s->buf + HDR, data, len);
        stored = len, codec = 0;
    }
    bs->st.compress_s += rk_time_now() - t0;
    uint8_t *h = s->buf;
    memset(h, 0, HDR);
    memcpy(h, "RKBS", 4);
    rk_le_put(h + 4, VERSION, 4);
    rk_le_put(h + 8, id, 8), rk_le_put(h + 16, len, 8), rk_le_put(h + 24, stored, 8);
    rk_le_put(h + 32, codec, 4), rk_le_put(h + 36, codec ? (uint64_t)bs->p.zstd_level : 0, 4);
    rk_le_put(h + 40, XXH64(s->buf + HDR, stored, 0), 8);
    rk_le_put(h + 48, XXH64(h, 48, 0), 8);
    const uint64_t frame = round_up(HDR + stored);
    memset(s->buf + HDR + stored, 0, (size_t)(frame - HDR - stored));
    *s = (slot){
        .buf = s->buf, .busy = true, .is_put = true, .id = id, .off = bs->end, .frame = frame, .raw = len, .ud = ud};
    bs->end += frame;
    bs->st.raw_written += len, bs->st.stored_written += frame;
    const int64_t nth = bs->n_puts++;
    size_t wlen = (size_t)frame;
    if (fault_now(bs, RK_BS_FAULT_ENOSPC, nth)) {
        rk_bs_done d;
        complete(bs, si, -ENOSPC, &d);
        if (!push_pending(bs, &d)) return rk_err_set(err, RK_E_NOMEM, "io: out of memory queueing a completion");
        return RK_OK;
    }
    if (fault_now(bs, RK_BS_FAULT_SHORT_WRITE, nth) || fault_now(bs, RK_BS_FAULT_KILL, nth))
        wlen = frame / 2 / 512 > 0 ? frame / 2 / 512 * 512 : 512;
    if (fault_now(bs, RK_BS_FAULT_KILL, nth)) {
        ssize_t w = pwrite(bs->fd, s->buf, wlen, (off_t)s->off);
        (void)w;
        raise(SIGKILL);
    }
    rk_status st = submit(bs, si, wlen, err);
    if (st) s->busy = false;
    return st;
}

static rk_status get_impl(rk_bs *bs, uint64_t id, void *dst, size_t cap, const rk_bs_iov *iov, int n_iov, void *ud,
                          rk_err *err);

rk_status rk_bs_get(rk_bs *bs, uint64_t id, void *dst, size_t cap, void *ud, rk_err *err) {
    return get_impl(bs, id, dst, cap, NULL, 0, ud, err);
}

rk_status rk_bs_getv(rk_bs *bs, uint64_t id, const rk_bs_iov *iov, int n_iov, void *ud, rk_err *err) {
    size_t cap = 0;
    for (int i = 0; i < n_iov; i++) cap += iov[i].len;
    return get_impl(bs, id, NULL, cap, iov, n_iov, ud, err);
}

static rk_status get_impl(rk_bs *bs, uint64_t id, void *dst, size_t cap, const rk_bs_iov *iov, int n_iov, void *ud,
                          rk_err *err) {
    const entry *e = find(bs, id);
    if (!e) return rk_err_set(err, RK_E_NOT_FOUND, "io: no block %llu in the store", (unsigned long long)id);
    if (e->frame > bs->slot_cap)
        return rk_err_set(err, RK_E_FORMAT, "io: block %llu frame of %llu bytes is over the store's buffers",
                          (unsigned long long)id, (unsigned long long)e->frame);
    const entry ent = *e;
    const int si = free_slot(bs, err);
    if (si < 0) return err ? err->code : RK_E_INTERNAL;
    slot *s = &bs->slots[si];
    const int64_t nth = bs->n_gets++;
    *s = (slot){.buf = s->buf,
                .busy = true,
                .is_put = false,
                .id = id,
                .off = ent.off,
                .frame = ent.frame,
                .raw = ent.raw,
                .ud = ud,
                .dst = dst,
                .cap = cap,
                .iov = iov,
                .n_iov = n_iov,
                .corrupt = fault_now(bs, RK_BS_FAULT_CORRUPT, nth)};
    if (fault_now(bs, RK_BS_FAULT_EIO, nth)) {
        rk_bs_done d;
        complete(bs, si, -EIO, &d);
        if (!push_pending(bs, &d)) return rk_err_set(err, RK_E_NOMEM, "io: out of memory queueing a completion");
        return RK_OK;
    }
    rk_status st = submit(bs, si, (size_t)ent.frame, err);
    if (st) s->busy = false;
    return st;
}

static rk_status wait_one(rk_bs *bs, uint64_t id, bool is_put, size_t *len, rk_err *err) {
    for (;;) {
        rk_bs_done d;
        if (rk_bs_wait(bs, 1, &d, 1) != 1)
            return rk_err_set(err, RK_E_INTERNAL, "io: block %llu: no completion", (unsigned long long)id);
        if (d.id != id || d.is_put != is_put) continue;
        if (d.status) return rk_err_set(err, d.status, "%s", d.msg);
        if (len) *len = d.len;
        return RK_OK;
    }
}

rk_status rk_bs_put_sync(rk_bs *bs, uint64_t id, const void *data, size_t len, rk_err *err) {
    rk_status st = rk_bs_put(bs, id, data, len, NULL, err);
    return st ? st : wait_one(bs, id, true, NULL, err);
}

rk_status rk_bs_get_sync(rk_bs *bs, uint64_t id, void *dst, size_t cap, size_t *len, rk_err *err) {
    rk_status st = rk_bs_get(bs, id, dst, cap, NULL, err);
    return st ? st : wait_one(bs, id, false, len, err);
}

rk_status rk_bs_sync(rk_bs *bs, rk_err *err) {
    if (fsync(bs->fd) != 0)
        return rk_err_set(err, RK_E_IO, "io: fsync of the block store failed (%s)", strerror(errno));
    return RK_OK;
}

rk_bs_backend rk_bs_backend_used(const rk_bs *bs) { return bs->backend; }
bool rk_bs_direct(const rk_bs *bs) { return bs->direct; }
void rk_bs_get_stats(const rk_bs *bs, rk_bs_stats *out) { *out = bs->st; }

/* ---- open / close ------------------------------------------------------------------- */

static rk_status start_threads(rk_bs *bs, rk_err *err) {
    bs->jobs = calloc((size_t)bs->qd, sizeof *bs->jobs);
    bs->dq = calloc((size_t)bs->qd, sizeof *bs->dq);
    const int n = bs->qd < 4 ? bs->qd : 4;
    bs->th = calloc((size_t)n, sizeof *bs->th);
    if (!bs->jobs || !bs->dq || !bs->th) return rk_err_set(err, RK_E_NOMEM, "io: out of memory for the I/O threads");
    pthread_mutex_init(&bs->mu, NULL);
    pthread_cond_init(&bs->cv_job, NULL);
    pthread_cond_init(&bs->cv_done, NULL);
    for (int i = 0; i < n; i++) {
        if (pthread_create(&bs->th[i], NULL, worker, bs)) {
            return rk_err_set(err, RK_E_IO, "io: cannot start I/O thread %d", i);
        }
        bs->n_th++;
    }
    bs->backend = RK_BS_THREADS;
    return RK_OK;
}

static bool start_uring(rk_bs *bs) {
    if (io_uring_queue_init((unsigned)bs->qd, &bs->ring, 0) < 0) return false;
    bs->ring_ok = true;
    struct iovec *iov = calloc((size_t)bs->qd, sizeof *iov);
    if (iov) {
        for (int i = 0; i < bs->qd; i++) iov[i] = (struct iovec){bs->slots[i].buf, bs->slot_cap};
        bs->fixed_bufs = io_uring_register_buffers(&bs->ring, iov, (unsigned)bs->qd) == 0;
        free(iov);
    }
    bs->fixed_file = io_uring_register_files(&bs->ring, &bs->fd, 1) == 0;
    bs->backend = RK_BS_URING;
    return true;
}

/* Indexes the frames of an existing file. */
static rk_status scan(rk_bs *bs, const char *path, rk_err *err) {
    struct stat sb;
    if (fstat(bs->fd, &sb) != 0) return rk_err_set(err, RK_E_IO, "io: cannot stat %s (%s)", path, strerror(errno));
    const uint64_t size = (uint64_t)sb.st_size;
    uint8_t *h = bs->slots[0].buf;
    uint64_t off = 0;
    while (off < size) {
        ssize_t r;
        do r = pread(bs->fd, h, ALIGN, (off_t)off);
        while (r < 0 && errno == EINTR);
        if (r < 0)
            return rk_err_set(err, RK_E_IO, "io: read of %s at %llu failed (%s)", path, (unsigned long long)off,
                              strerror(errno));
        if (r < HDR)
            return rk_err_set(err, RK_E_FORMAT, "io: %s is truncated (a frame header at %llu)", path,
                              (unsigned long long)off);
        uint64_t id, raw, stored;
        uint32_t codec;
        char msg[160];
        if (parse_header(h, &id, &raw, &stored, &codec, msg, sizeof msg))
            return rk_err_set(err, RK_E_FORMAT, "io: %s at %llu: %s", path, (unsigned long long)off, msg);
        const uint64_t frame = round_up(HDR + stored);
        if (frame > size - off)
            return rk_err_set(
                err, RK_E_FORMAT, "io: %s is truncated (block %llu needs %llu bytes at %llu, the file has %llu)", path,
                (unsigned long long)id, (unsigned long long)frame, (unsigned long long)off, (unsigned long long)size);
        if (!insert(bs, id, off, frame, raw)) return rk_err_set(err, RK_E_NOMEM, "io: out of memory indexing %s", path);
        if (raw > bs->p.max_block) bs->p.max_block = (size_t)raw; /* buffers grown below */
        off += frame;
    }
    bs->end = off;
    return RK_OK;
}

static rk_status alloc_slots(rk_bs *bs, rk_err *err) {
    bs->slot_cap = (size_t)round_up(HDR + ZSTD_compressBound(bs->p.max_block));
    bs->slots = calloc((size_t)bs->qd, sizeof *bs->slots);
    if (!bs->slots) return rk_err_set(err, RK_E_NOMEM, "io: out of memory");
    for (int i = 0; i < bs->qd; i++)
        if (posix_memalign((void **)&bs->slots[i].buf, ALIGN, bs->slot_cap))
            return rk_err_set(err, RK_E_NOMEM, "io: cannot allocate %d buffers of %zu bytes", bs->qd, bs->slot_cap);
    return RK_OK;
}

static void free_slots(rk_bs *bs) {
    for (int i = 0; bs->slots && i < bs->qd; i++) free(bs->slots[i].buf);
    free(bs->slots);
    bs->slots = NULL;
}

rk_status rk_bs_open(const char *path, rk_bs_mode mode, const rk_bs_params *pp, rk_bs **out, rk_err *err) {
    rk_bs_params p = pp ? *pp : rk_bs_params_default();
    if (p.queue_depth <= 0) p.queue_depth = 8;
    if (p.queue_depth > MAX_QD) p.queue_depth = MAX_QD;
    if (p.zstd_level == 0) p.zstd_level = 1;
    if (p.zstd_level < 0) p.zstd_level = -1;
    if (p.zstd_level > ZSTD_maxCLevel()) p.zstd_level = ZSTD_maxCLevel();
    if (!p.max_block) p.max_block = 4u << 20;
    rk_bs *bs = calloc(1, sizeof *bs);
    if (!bs) return rk_err_set(err, RK_E_NOMEM, "io: out of memory");
    bs->fd = -1;
    bs->p = p;
    bs->qd = p.queue_depth;
    rk_status st = RK_OK;
    const int flags = mode == RK_BS_CREATE ? O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC : O_RDONLY | O_CLOEXEC;
    if (!p.no_direct) {
        bs->fd = open(path, flags | O_DIRECT, 0644);
        bs->direct = bs->fd >= 0;
    }
    if (bs->fd < 0) bs->fd = open(path, flags, 0644);
    if (bs->fd < 0) {
        st = rk_err_set(err, errno == ENOENT ? RK_E_NOT_FOUND : RK_E_IO, "io: cannot %s %s (%s)",
                        mode == RK_BS_CREATE ? "create" : "open", path, strerror(errno));
        goto fail;
    }
    bs->cctx = ZSTD_createCCtx();
    bs->dctx = ZSTD_createDCtx();
    if (!bs->cctx || !bs->dctx) {
        st = rk_err_set(err, RK_E_NOMEM, "io: out of memory for zstd");
        goto fail;
    }
    if ((st = alloc_slots(bs, err))) goto fail;
    if (mode == RK_BS_READ) {
        const size_t before = bs->p.max_block;
        if ((st = scan(bs, path, err))) goto fail;
        if (bs->p.max_block != before) {
            free_slots(bs);
            if ((st = alloc_slots(bs, err))) goto fail;
        }
    }
    if (p.backend == RK_BS_THREADS || !start_uring(bs)) {
        if (p.backend == RK_BS_URING) {
            st = rk_err_set(err, RK_E_UNSUPPORTED, "io: io_uring is not usable here (io_uring_queue_init failed)");
            goto fail;
        }
        if ((st = start_threads(bs, err))) goto fail;
    }
    *out = bs;
    return RK_OK;
fail:
    rk_bs_close(bs);
    return st;
}

void rk_bs_close(rk_bs *bs) {
    if (!bs) return;
    rk_bs_done d[8];
    while (bs->in_flight > 0 && reap(bs, true, d, 8) > 0) {
    }
    if (bs->ring_ok) io_uring_queue_exit(&bs->ring);
    if (bs->th) {
        pthread_mutex_lock(&bs->mu);
        bs->stop = true;
        pthread_cond_broadcast(&bs->cv_job);
        pthread_mutex_unlock(&bs->mu);
        for (int i = 0; i < bs->n_th; i++) pthread_join(bs->th[i], NULL);
        pthread_mutex_destroy(&bs->mu);
        pthread_cond_destroy(&bs->cv_job);
        pthread_cond_destroy(&bs->cv_done);
    }
    free(bs->th), free(bs->jobs), free(bs->dq), free(bs->pending);
    free_slots(bs);
    free(bs->tab);
    ZSTD_freeCCtx(bs->cctx);
    ZSTD_freeDCtx(bs->dctx);
    if (bs->fd >= 0) close(bs->fd);
    free(bs);
}

rk_status rk_bs_open_spill(const char *dir, const rk_bs_params *p, rk_bs **out, rk_err *err) {
    char path[4096];
    if (snprintf(path, sizeof path, "%s/ridgekv-spill-XXXXXX", dir) >= (int)sizeof path)
        return rk_err_set(err, RK_E_INVALID_ARG, "kv: spill directory path too long (%.64s...)", dir);
    int fd = mkstemp(path);
    if (fd < 0) return rk_err_set(err, RK_E_IO, "kv: cannot create a spill file in %s (%s)", dir, strerror(errno));
    close(fd);
    rk_status st = rk_bs_open(path, RK_BS_CREATE, p, out, err);
    unlink(path);
    return st;
}

void rk_bs_stats_accumulate(rk_bs_stats *acc, const rk_bs *bs) {
    if (!bs) return;
    rk_bs_stats o;
    rk_bs_get_stats(bs, &o);
    acc->puts += o.puts, acc->gets += o.gets;
    acc->raw_written += o.raw_written, acc->stored_written += o.stored_written;
    acc->raw_read += o.raw_read, acc->stored_read += o.stored_read;
    acc->wait_s += o.wait_s, acc->compress_s += o.compress_s, acc->decompress_s += o.decompress_s;
}

rk_status rk_bs_renew_spill(rk_bs **bs, const char *dir, const rk_bs_params *p, rk_bs_stats *acc, rk_err *err) {
    rk_bs *fresh = NULL;
    rk_status st = rk_bs_open_spill(dir, p, &fresh, err);
    if (st) return st;
    rk_bs_stats_accumulate(acc, *bs);
    rk_bs_close(*bs);
    *bs = fresh;
    return RK_OK;
}
