/* The document KV cache in the CLI: where it lives, its flags and environment, and the
 * one "documents first" prefill that ask and serve's ask op share (doc_cache_cli.c). */
#pragma once
#include "cli.h"
#include "rk_cache.h"
#include "rk_gen.h"

/* ${XDG_CACHE_HOME:-$HOME/.cache}/ridgekv/kv. -1 when neither is set. */
int cli_kv_cache_dir(char *buf, size_t cap);

/* Opens the cache with the flags (--cache-level) and the environment: RIDGEKV_NO_URING=1
 * (the thread-pool backend), RIDGEKV_IO_FAULT=kind[@n] (the block store's fault hook, for
 * tests). NULL, after one stderr line saying why, when it cannot be used (read-only or
 * missing directory that cannot be made): the command goes on without it. */
rk_doc_cache *cli_doc_cache_open(const cli_opts *o, const char *cmd);
/* The same; read_only: only to list and read (`cache ls`, and `gc` / `rm`, which then say why
 * nothing could be removed): a read-only directory opens. */
rk_doc_cache *cli_doc_cache_open_mode(const cli_opts *o, const char *cmd, bool read_only);

typedef struct cli_prefix {
    int64_t n_prefix; /* tokens of the documents' prefix of the prompt (0: none found) */
    int64_t n_read;   /* of them read by a prefill (0 when the cache held them; a resumed read: less
                       * the tokens its checkpoint held) */
    double read_s;    /* seconds to read or load them */
    bool reused;      /* loaded from the cache */
    uint64_t filled;  /* (row, layer) pairs the prefix's prefill filled (RidgeFill) */
} cli_prefix;

/* The documents form a prefix of the prompt ids (rk_doc_ask_prefix), keyed by the
 * session's own settings (rk_doc_cache_session_key): that prefix is loaded from the cache (stderr: "reused cached KV for <doc> (N tokens)") or
 * read by its own prefill (progress through progress/ud with (done, n_ids) and saved;
 * the question is then read by the caller's generate, which keeps these rows. A bad
 * entry is reported, removed and read again; a failed save is reported; neither stops
 * the command. c may be NULL (--no-cache): the prefix is still read on its own, so a
 * cached and an uncached run compute the same. Returns RK_OK or the prefill's error
 * (RK_E_CANCELLED on Ctrl-C). An entry whose rows hold other tokens than the documents' is bad (reported,
 * removed, read again). A read from row 0 writes checkpoints (rk_doc_ckpt_open;
 * RIDGEKV_CHECKPOINT: 0 off, SECONDS, or CHUNKSc; default every 60 s) and resumes from
 * one, saying "resuming from token N of M"; a completed read removes them. */
rk_status cli_doc_prefix(const cli_opts *o, const char *cmd, rk_doc_cache *c, const rk_model *m, rk_session *s,
                         const char *system, const rk_doc *docs, size_t n_docs, const int32_t *ids, size_t n_ids,
                         rk_progress_fn progress, void *ud, cli_prefix *out, rk_err *err);

/* Progress of the rest of the prompt after the prefix: ud is a cli_prefix_progress. */
typedef struct cli_prefix_progress {
    rk_progress_fn fn;
    void *ud;
    int64_t off;
    int64_t total; /* reported total; 0: off + the eval's */
} cli_prefix_progress;
bool cli_prefix_progress_fn(void *ud, int64_t done, int64_t total);

int cmd_cache(int argc, char **argv);

/* --kv-budget SIZE and --kv-host-budget SIZE into kv (a share "25%" is bench's: of the plain KV of n_tokens when
 * n_tokens > 0, else left 0), the spill directory ($TMPDIR, else /tmp), RIDGEKV_NO_URING. */
void cli_kv_tier_params(const cli_opts *o, rk_kv_params *kv);
uint64_t cli_kv_budget_share(const cli_opts *o, const rk_model *m, const rk_kv_params *kv, int64_t n_tokens);
/* The same for --kv-host-budget (rk_kv_params.host_budget: the GPU KV tiers' pinned host bytes). */
uint64_t cli_kv_host_budget_share(const cli_opts *o, const rk_model *m, const rk_kv_params *kv, int64_t n_tokens);
/* One stderr line of the memory tiers' counters since *before (bench, -v). */
void cli_kv_tier_line(const char *cmd, const rk_kv_tier_stats *before, const rk_kv_tier_stats *now);

/* "512M", "2G", "100K", "12345" (bytes; K/M/G/T are powers of 1024) into *out. */
bool cli_parse_size(const char *s, uint64_t *out);
