/* The document KV cache (librk): the KV rows of a prompt prefix (the documents of ask),
 * kept on disk between runs, keyed by what the rows depend on, so that the next question
 * on the same documents loads them and reads only the question.
 *
 * An entry is one block-store file <dir>/<key>.rkkv (io/include/rk_blockstore.h: zstd frames,
 * XXH64 checked): frame 0 the entry's header (format, version, tokens, label, model,
 * KV policy), frames 1.. the rk_session_kv_export block of rows [0, n) in pieces. Written
 * to <key>.rkkv.tmp.<pid>, fsynced, renamed, then the directory fsynced: a reader never
 * sees half an entry (a killed writer leaves a temporary file that gc removes). Loading
 * touches the entry's mtime: gc and every save remove the least recently used entries
 * past the size cap. A bad entry (torn, truncated, corrupt, another version, another
 * model or KV policy) is reported, removed and never used: the caller reads the prefix
 * again. Same rules as rk.h: nothing prints, reads the environment or exits. */
#pragma once
#include "rk.h"
#include "rk_blockstore.h"
#include "rk_gen.h"

typedef struct rk_doc_cache rk_doc_cache;

typedef struct rk_doc_cache_params {
    const char *dir;    /* the cache directory (created with its parents when missing) */
    uint64_t cap_bytes; /* size cap of all entries; 0: 4 GiB */
    rk_bs_params io;    /* backend, queue depth, zstd level, fault hook */
    bool read_only;     /* only list and read: the directory is neither made nor required writable
                         * (a missing one lists no entries) */
} rk_doc_cache_params;
rk_doc_cache_params rk_doc_cache_params_default(void);

/* RK_E_IO naming the directory when it cannot be created or written (read-only; a file in
 * the way is named as what it is): the caller goes on without the cache. */
rk_status rk_doc_cache_open(const rk_doc_cache_params *p, rk_doc_cache **out, rk_err *err);
void rk_doc_cache_close(rk_doc_cache *c); /* accepts NULL */
const char *rk_doc_cache_dir(const rk_doc_cache *c);

/* The key (64 hex chars + NUL): SHA-256 of the model fingerprint, the KV policy (its
 * canonical spec), extra (what else the rows depend on: the caller's fill mode, map and
 * predictor file hashes, chunk size, backend) and the exact token ids. */
void rk_doc_cache_key(const rk_model *m, const rk_kv_params *kv, const char *extra, const int32_t *tokens, size_t n,
                      char key[65]);
/* The key of rows [0, n) of s holding tokens: rk_doc_cache_key with everything else the
 * rows depend on read from the session itself: its model (fingerprint, RoPE in effect),
 * its KV policy with the parameters its KV blocks record (and a LowRAM predictor file's
 * contents), its backend and prefill chunk, and its fill (rk_session_set_fill: mode and
 * every setting, the map file's contents by SHA-256). Call it with the settings the rows
 * are (or will be) computed under. RK_E_IO when the predictor file cannot be read. */
rk_status rk_doc_cache_session_key(const rk_session *s, const int32_t *tokens, size_t n, char key[65], rk_err *err);

/* Where the documents end in an ask prompt: ids is rk_conv_prompt after rk_conv_add_ask
 * (system, docs, question) on an empty conversation of m. The prompt up to where the
 * question starts (its text through "Question:") is built and tokenized once; *n_prefix
 * is how many leading ids it shares with ids (a token the question's first characters
 * merge with differs and is left out), so rows [0, *n_prefix) depend on the documents
 * alone and can be cached. 0 when there are none. s (a session of m) is only borrowed. */
rk_status rk_doc_ask_prefix(const rk_model *m, rk_session *s, const char *system, const rk_doc *docs, size_t n_docs,
                            const int32_t *ids, size_t n_ids, size_t *n_prefix, rk_err *err);

/* Loads entry key into s (reset first) and sets *n_tokens: rows [0, n) now hold it.
 * RK_E_NOT_FOUND: no such entry. Any other error: the entry was bad (message says why)
 * and is removed; s is left reset. */
rk_status rk_doc_cache_load(rk_doc_cache *c, const char *key, rk_session *s, int64_t *n_tokens, rk_err *err);
/* rk_doc_cache_load that also checks the rows' own tokens against tokens (n of them, the
 * documents the key was made of): an entry that holds another document (a file copied or
 * renamed over it) is bad: reported, removed, s left reset. */
rk_status rk_doc_cache_load_tokens(rk_doc_cache *c, const char *key, const int32_t *tokens, size_t n, rk_session *s,
                                   int64_t *n_tokens, rk_err *err);
/* Saves rows [0, n) of s (a session of m with KV policy kv; NULL: the session's own; n <=
 * n_past; LowRAM: n = n_past) as entry key, atomically; label names the documents (shown by ls). Then removes
 * LRU entries past the cap. On failure (disk full, short write, ...) nothing is left
 * behind and the error says why. */
rk_status rk_doc_cache_save(rk_doc_cache *c, const char *key, const rk_model *m, const rk_kv_params *kv,
                            const rk_session *s, int64_t n, const char *label, rk_err *err);

/* Entry key's KV block as rk_session_kv_export made it (*blk malloc'd, *n bytes): for
 * `ridgekv cache cat` and measurements. Nothing is removed on failure. */
rk_status rk_doc_cache_read(rk_doc_cache *c, const char *key, void **blk, size_t *n, rk_err *err);

typedef struct rk_doc_cache_entry {
    char key[65];
    char label[256];
    char model[64];
    char kv[64];
    int64_t n_tokens;
    uint64_t bytes;     /* of the file */
    uint64_t raw_bytes; /* of the KV block before zstd */
    int64_t mtime;      /* last use, seconds since the epoch */
    bool bad;           /* the header frame does not read, or names another entry than the
                         * file's name (label says why) */
} rk_doc_cache_entry;
/* Every entry, most recently used first (*out malloc'd). */
rk_status rk_doc_cache_list(rk_doc_cache *c, rk_doc_cache_entry **out, size_t *n, rk_err *err);
/* Removes the entries whose key starts with prefix ("" or NULL: every entry), with their
 * stream and checkpoints, and the checkpoints of reads that never completed (counted as
 * entries); *n_removed. */
rk_status rk_doc_cache_remove(rk_doc_cache *c, const char *prefix, size_t *n_removed, rk_err *err);
/* Removes temporary files of dead writers, checkpoints of completed reads, bad entries,
 * then LRU entries until the total is at most cap (0: the cache's cap). RK_E_IO saying why
 * when the directory is not writable (nothing removed). */
rk_status rk_doc_cache_gc(rk_doc_cache *c, uint64_t cap, size_t *n_removed, uint64_t *bytes_left, rk_err *err);

typedef struct rk_doc_cache_stats {
    double io_s; /* last load / save: seconds in the block store */
    uint64_t raw_bytes, file_bytes;
    rk_bs_backend backend;
    bool direct;
} rk_doc_cache_stats;
void rk_doc_cache_last(const rk_doc_cache *c, rk_doc_cache_stats *out);

/* ---- the kept split stream of a cached document (runtime/cache/doc_stream.c) ---------- */
/* Saves the session's kept stream (rk_session_fill_stream) as <dir>/<key>.rkxs beside the
 * entry (checksummed, atomic); RK_OK and nothing written when the session keeps none. */
rk_status rk_doc_stream_save(rk_doc_cache *c, const char *key, const rk_session *s, rk_err *err);
/* After rk_doc_cache_load of the same key: gives the session the stream, so the next
 * question re-scores the document's rows. RK_E_NOT_FOUND when there is none; a corrupt or
 * foreign file is removed and named (RK_E_FORMAT); the session's KV is left as it is. */
rk_status rk_doc_stream_load(rk_doc_cache *c, const char *key, rk_session *s, rk_err *err);
rk_status rk_doc_stream_remove(rk_doc_cache *c, const char *key, rk_err *err);

/* ---- checkpoints of a long read (runtime/cache/doc_ckpt.c) ---------------------------- */
/* While a session reads the documents of entry key (one rk_session_eval of all their tokens
 * from row 0), the state the prefill carries between chunks is saved every so often as
 * <dir>/<key>.rkck (the previous one kept as <key>.rkck.old): the KV rows of every layer,
 * the fill's selection, kept stream and grouped lists, the stream between the layer-major
 * passes, the question's queries. After an interruption (Ctrl-C, kill -9, a full disk) the
 * next read of the same key (same model, KV policy, fill settings, tokens: the key says so)
 * resumes from the newest checkpoint that reads and computes what an uninterrupted read
 * computes, bit for bit. Checkpoints go through the block store (zstd frames, XXH64
 * checked; temporary file, fsync, rename, directory fsync): a torn or corrupt one is named
 * through note, removed and the older one (or a fresh read) used. Sessions whose rows live
 * elsewhere than plain host rows (LowRAM, the memory tiers, a device backend) or that splice
 * are not checkpointed (rk_doc_ckpt_open says why). */
typedef struct rk_doc_ckpt rk_doc_ckpt;
typedef struct rk_doc_ckpt_params {
    double every_s;   /* seconds of reading between checkpoints; 0: 60. A checkpoint is also
                       * at least 10 times its own write time after the last, so that they
                       * cost at most about a tenth of the read */
    int every_chunks; /* > 0: a checkpoint every that many chunks instead (tests) */
    int block_rows;   /* rows of KV per block of a checkpoint; 0: about 4 MiB of them (tests set a few) */
    /* One line for the user (the library never prints): a checkpoint that did not read and was
     * ignored, the first one that could not be written (no more are tried). May be NULL. */
    void (*note)(void *ud, const char *msg);
    void *ud;
} rk_doc_ckpt_params;
rk_doc_ckpt_params rk_doc_ckpt_params_default(void);

/* Checkpoints for s reading tokens (n of them; s reset: n_past 0) into entry key: finds
 * the newest checkpoint of key that reads (to resume from) and attaches itself to s until
 * rk_doc_ckpt_close; s, c and tokens are borrowed until then. *out NULL (RK_OK; the reason in
 * why, cap bytes) when s cannot be checkpointed. */
rk_status rk_doc_ckpt_open(rk_doc_cache *c, const char *key, rk_session *s, const int32_t *tokens, size_t n,
                           const rk_doc_ckpt_params *p, rk_doc_ckpt **out, char *why, size_t why_cap, rk_err *err);
/* Tokens' worth of the read a checkpoint holds (the prefill's progress when it was made; 0:
 * none found, the read starts afresh); after the read, whether it did resume. */
int64_t rk_doc_ckpt_resume_at(const rk_doc_ckpt *ck);
bool rk_doc_ckpt_resumed(const rk_doc_ckpt *ck);
/* Checkpoints written so far by this read. */
int rk_doc_ckpt_written(const rk_doc_ckpt *ck);
/* Detaches from the session; done: the read completed (its entry is saved or the cache is
 * given up) and its checkpoints are removed. Accepts NULL. */
void rk_doc_ckpt_close(rk_doc_ckpt *ck, bool done);
