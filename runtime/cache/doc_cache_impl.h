/* Internal: the document cache's file I/O for its other files (doc_ckpt.c). */
#pragma once
#include "rk_cache.h"

/* Writes blk (len bytes) as an entry-format file at path (header key, n tokens, label, the
 * model's name and the KV spec; zstd frames through the block store), atomically: temporary
 * file, fsync, rename, directory fsync. On failure nothing is left and err says why. */
rk_status rk_doc_cache_write_file(rk_doc_cache *c, const char *path, const char *key, const rk_model *m,
                                  const rk_kv_params *kv, int64_t n, const char *label, const void *blk, size_t len,
                                  rk_err *err);
/* The same, written as it is produced: open, put the bytes (in any number of calls: a
 * failure is kept and makes later puts no-ops), close with the header (keep false: abandons
 * the file, RK_OK). Only one piece (4 MiB) is buffered. */
typedef struct rk_doc_cache_writer rk_doc_cache_writer;
rk_status rk_doc_cache_writer_open(rk_doc_cache *c, const char *path, rk_doc_cache_writer **out, rk_err *err);
void rk_doc_cache_writer_put(rk_doc_cache_writer *w, const void *p, size_t n);
bool rk_doc_cache_writer_failed(const rk_doc_cache_writer *w);
/* Overwrites bytes [off, off + n) of what was put, inside the first piece (held until close
 * for this); past it the writer fails (RK_E_INTERNAL). */
void rk_doc_cache_writer_patch(rk_doc_cache_writer *w, size_t off, const void *p, size_t n);
rk_status rk_doc_cache_writer_close(rk_doc_cache_writer *w, bool keep, const char *key, const rk_model *m,
                                    const rk_kv_params *kv, int64_t n, const char *label, rk_err *err);
/* Such a file's payload read in order as one byte stream (RD_DEPTH pieces in flight, each
 * frame's checksum checked as it arrives; the header's key checked at open: msg says why
 * not). pull (an rk_kv_pull) fills dst with the next len bytes, or skips them (dst NULL);
 * past the end it fails (RK_E_FORMAT). */
typedef struct rk_doc_cache_reader rk_doc_cache_reader;
rk_status rk_doc_cache_reader_open(rk_doc_cache *c, const char *path, const char *key, rk_doc_cache_reader **out,
                                   uint64_t *raw, int64_t *n_tokens, char *msg, size_t cap);
rk_status rk_doc_cache_reader_pull(void *r, uint8_t *dst, size_t len, rk_err *err);
uint64_t rk_doc_cache_reader_left(const rk_doc_cache_reader *r); /* bytes not pulled yet */
void rk_doc_cache_reader_close(rk_doc_cache_reader *r);
