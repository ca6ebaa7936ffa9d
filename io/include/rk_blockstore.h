/* io: the block store. Put / get of byte blocks by id in one file, asynchronous with
 * completions, over io_uring (liburing: registered buffers and file, O_DIRECT where the
 * file system takes it, queue depth a parameter) or, with the same API, a pread/pwrite
 * thread pool (when io_uring_queue_init fails, e.g. a seccomp profile forbids it, or the
 * caller asks for it: the CLI does on RIDGEKV_NO_URING=1).
 *
 * Each block is one frame at a 4096-aligned offset, padded to a multiple of 4096:
 *     0  "RKBS"   4  u32 version (1)   8  u64 block id   16  u64 raw bytes
 *    24  u64 stored bytes   32  u32 codec (0 raw, 1 zstd)   36  u32 zstd level
 *    40  u64 XXH64 of the stored bytes   48  u64 XXH64 of bytes 0..47   56  zero
 *    64  the stored bytes (a zstd frame, or the raw block when zstd does not pay)
 * A torn, truncated, corrupt or foreign frame is detected on read (RK_E_FORMAT naming
 * what), never used. The store never prints, reads the environment or exits. */
#pragma once
#include "rk_base.h"

typedef struct rk_bs rk_bs;

typedef enum rk_bs_backend { RK_BS_AUTO = 0, RK_BS_URING, RK_BS_THREADS } rk_bs_backend;
const char *rk_bs_backend_name(rk_bs_backend b); /* "auto", "io_uring", "threads" */

/* Test hook: the nth (0-based) operation of the kind makes the fault; n < 0: every one. */
typedef enum rk_bs_fault_kind {
    RK_BS_FAULT_NONE = 0,
    RK_BS_FAULT_SHORT_WRITE, /* a put writes half its frame (really: a short pwrite) */
    RK_BS_FAULT_ENOSPC,      /* a put completes with ENOSPC (nothing written) */
    RK_BS_FAULT_EIO,         /* a get completes with EIO */
    RK_BS_FAULT_CORRUPT,     /* a get flips one byte of the frame it read */
    RK_BS_FAULT_KILL,        /* a put writes half its frame, then the process gets SIGKILL */
} rk_bs_fault_kind;
typedef struct rk_bs_fault {
    rk_bs_fault_kind kind;
    int64_t nth;
} rk_bs_fault;
/* Parses "short_write|enospc|eio|corrupt|kill[@N]" (N default 0; "@all": every one). */
rk_status rk_bs_fault_parse(const char *spec, rk_bs_fault *out, rk_err *err);

typedef struct rk_bs_params {
    rk_bs_backend backend; /* AUTO: io_uring when it initialises, else threads */
    int queue_depth;       /* operations in flight (and buffers); 0: 8 */
    int zstd_level;        /* 1..19; 0: 1; < 0: every block raw (no compression). A block that
                              does not shrink is stored raw */
    bool no_direct;        /* do not try O_DIRECT */
    size_t max_block;      /* largest raw block (buffer size); 0: 4 MiB */
    rk_bs_fault fault;
} rk_bs_params;
rk_bs_params rk_bs_params_default(void);

typedef enum rk_bs_mode { RK_BS_CREATE = 0, RK_BS_READ } rk_bs_mode;

/* CREATE: a new file (truncated), for puts and gets. READ: an existing file, its frames
 * indexed by a scan of their headers (a bad header ends the scan with RK_E_FORMAT). */
rk_status rk_bs_open(const char *path, rk_bs_mode mode, const rk_bs_params *p, rk_bs **out, rk_err *err);
/* A new spill file in dir (made with mkstemp, unlinked at once: it goes with the store),
 * open for puts and gets. */
rk_status rk_bs_open_spill(const char *dir, const rk_bs_params *p, rk_bs **out, rk_err *err);
/* Waits for what is in flight, then closes (accepts NULL). */
void rk_bs_close(rk_bs *bs);

rk_bs_backend rk_bs_backend_used(const rk_bs *bs);
bool rk_bs_direct(const rk_bs *bs); /* the file is open with O_DIRECT */

/* Compresses data (len <= max_block) and queues the write of its frame at the end of the
 * file (waits for a free buffer when queue_depth are in flight). A later put of the same
 * id replaces it. ud comes back with the completion. */
rk_status rk_bs_put(rk_bs *bs, uint64_t id, const void *data, size_t len, void *ud, rk_err *err);
/* Queues the read of block id into dst (cap bytes); the completion checks and
 * decompresses it there. RK_E_NOT_FOUND when no frame holds id. */
rk_status rk_bs_get(rk_bs *bs, uint64_t id, void *dst, size_t cap, void *ud, rk_err *err);

/* Like rk_bs_get, but the block's bytes go to the pieces iov[0..n_iov) in order (their
 * lengths summed: the capacity); iov must stay valid until the completion is reaped. */
typedef struct rk_bs_iov {
    void *base;
    size_t len;
} rk_bs_iov;
rk_status rk_bs_getv(rk_bs *bs, uint64_t id, const rk_bs_iov *iov, int n_iov, void *ud, rk_err *err);
typedef struct rk_bs_done {
    uint64_t id;
    bool is_put;
    void *ud;
    size_t len;       /* raw bytes (put: stored; get: written to dst) */
    rk_status status; /* RK_OK, RK_E_IO (errno text in msg), RK_E_FORMAT (corrupt frame) */
    char msg[200];
} rk_bs_done;
/* Reaps completions into out (at most max); waits until at least min_n are reaped or
 * nothing is in flight. Returns how many. */
int rk_bs_wait(rk_bs *bs, int min_n, rk_bs_done *out, int max);
int rk_bs_in_flight(const rk_bs *bs);
/* on: the operations queued from now on are submitted together (io_uring: one
 * io_uring_submit) when the batch ends (rk_bs_batch(bs, false)) or a wait begins; the
 * thread pool starts each at once either way. Accepts NULL. */
void rk_bs_batch(rk_bs *bs, bool on);

/* Synchronous forms: put / get, then wait for that completion (others reaped meanwhile
 * are dropped: use these only when nothing else is in flight). */
rk_status rk_bs_put_sync(rk_bs *bs, uint64_t id, const void *data, size_t len, rk_err *err);
rk_status rk_bs_get_sync(rk_bs *bs, uint64_t id, void *dst, size_t cap, size_t *len, rk_err *err);

/* Raw size of block id (false when absent). */
bool rk_bs_block_len(const rk_bs *bs, uint64_t id, size_t *len);
/* Forgets block id (its frame stays in the file, dead). */
void rk_bs_drop(rk_bs *bs, uint64_t id);
/* fsync of the file (after the puts completed). */
rk_status rk_bs_sync(rk_bs *bs, rk_err *err);

typedef struct rk_bs_stats {
    uint64_t puts, gets, raw_written, stored_written, raw_read, stored_read;
    double wait_s; /* time spent blocked in rk_bs_wait */
    double compress_s, decompress_s;
} rk_bs_stats;
void rk_bs_get_stats(const rk_bs *bs, rk_bs_stats *out);
/* Adds bs's counters to acc (bs may be NULL): totals over the stores a tier replaced. */
void rk_bs_stats_accumulate(rk_bs_stats *acc, const rk_bs *bs);
/* Replaces *bs (may be NULL) by a new spill file in dir, adding the old store's counters to
 * acc; on failure *bs stays as it was. */
rk_status rk_bs_renew_spill(rk_bs **bs, const char *dir, const rk_bs_params *p, rk_bs_stats *acc, rk_err *err);
