/* ridgekv cache: the document KV cache (rk_cache.h) on disk: list, remove, collect, path. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "doc_cache_cli.h"

static const char *help =
    "usage: ridgekv cache ls | rm KEY-PREFIX|--all | gc [--max SIZE] | path | cat KEY-PREFIX > FILE\n"
    "\n"
    "The document KV cache: after `ask` (and serve's ask op, chat's /save) read the\n"
    "documents, their KV rows are kept here, keyed by the model, the KV policy, the fill\n"
    "settings and the exact tokens; the next question on the same documents loads them\n"
    "and reads only the question. Entries are zstd-compressed, checksummed block files.\n"
    "\n"
    "  ls              entries, most recently used first: key, tokens, size, model, KV, documents\n"
    "  rm PREFIX       removes the entries whose key starts with PREFIX (--all: every one)\n"
    "  gc [--max SIZE] removes temporary files of killed writers, unreadable entries, then the\n"
    "                  least recently used entries until the cache is at most SIZE (default 4G)\n"
    "  path            prints the directory: ${XDG_CACHE_HOME:-~/.cache}/ridgekv/kv\n"
    "  cat PREFIX      writes the entry's KV block (rk_session_kv_export's, uncompressed) to stdout\n"
    "\n"
    "ask --no-cache reads the documents without the cache; --cache-level N sets the zstd level\n"
    "(1..19, default 1). RIDGEKV_NO_URING=1 uses a pread/pwrite thread pool instead of io_uring.\n"
    "A long read saves checkpoints (<key>.rkck) every 60 s (RIDGEKV_CHECKPOINT=SECONDS, 0 off):\n"
    "an interrupted ask resumes from the last one; the completed read removes them.\n"
    "ls and cat only read: they work on a read-only cache; rm and gc then say why they cannot.\n";

static void human(uint64_t b, char *buf, size_t cap) {
    const char *u[] = {"B", "K", "M", "G", "T"};
    double v = (double)b;
    int i = 0;
    while (v >= 1024 && i < 4) v /= 1024, i++;
    snprintf(buf, cap, i ? "%.1f%s" : "%.0f%s", v, u[i]);
}

int cmd_cache(int argc, char **argv) {
    if (argc < 3 || !strcmp(argv[2], "--help") || !strcmp(argv[2], "-h")) {
        fputs(help, argc < 3 ? stderr : stdout);
        return argc < 3 ? RK_EXIT_USAGE : RK_EXIT_OK;
    }
    const char *sub = argv[2];
    char dir[3200];
    if (cli_kv_cache_dir(dir, sizeof dir)) {
        fprintf(stderr, "ridgekv cache: neither XDG_CACHE_HOME nor HOME is set\n");
        return RK_EXIT_ERROR;
    }
    if (!strcmp(sub, "path")) {
        if (argc != 3) goto usage;
        printf("%s\n", dir);
        return RK_EXIT_OK;
    }
    uint64_t cap = 0;
    const char *prefix = NULL;
    if (!strcmp(sub, "ls")) {
        if (argc != 3) goto usage;
    } else if (!strcmp(sub, "rm")) {
        if (argc != 4) goto usage;
        prefix = !strcmp(argv[3], "--all") ? "" : argv[3];
        if (!*prefix && strcmp(argv[3], "--all")) goto usage;
    } else if (!strcmp(sub, "cat")) {
        if (argc != 4 || !*argv[3]) goto usage;
        prefix = argv[3];
    } else if (!strcmp(sub, "gc")) {
        if (argc == 5 && !strcmp(argv[3], "--max")) {
            if (!cli_parse_size(argv[4], &cap) || !cap) {
                fprintf(stderr, "ridgekv cache gc: --max expects a size such as 512M (got '%s')\n", argv[4]);
                return RK_EXIT_USAGE;
            }
        } else if (argc != 3) goto usage;
    } else goto usage;
    cli_opts o = {0};
    /* read-only: ls reads a directory it cannot write; rm and gc then say why they remove nothing */
    rk_doc_cache *c = cli_doc_cache_open_mode(&o, "cache", true);
    if (!c) return RK_EXIT_ERROR;
    rk_err e = {0};
    int rc = RK_EXIT_OK;
    if (!strcmp(sub, "ls")) {
        rk_doc_cache_entry *v = NULL;
        size_t n = 0;
        if (rk_doc_cache_list(c, &v, &n, &e)) {
            cli_print_error(&e);
            rc = RK_EXIT_ERROR;
        } else {
            uint64_t total = 0;
            for (size_t i = 0; i < n; i++) {
                char sz[32], when[32];
                human(v[i].bytes, sz, sizeof sz);
                time_t t = (time_t)v[i].mtime;
                struct tm tm;
                strftime(when, sizeof when, "%Y-%m-%d %H:%M", localtime_r(&t, &tm));
                if (v[i].bad) printf("%.16s  unreadable (%s)  %s\n", v[i].key, v[i].label, sz);
                else
                    printf("%.16s  %8lld tokens  %8s  %s  %s  %s  %s\n", v[i].key, (long long)v[i].n_tokens, sz, when,
                           v[i].model, v[i].kv, v[i].label);
                total += v[i].bytes;
            }
            char tt[32];
            human(total, tt, sizeof tt);
            fprintf(stderr, "ridgekv cache: %zu entr%s, %s in %s\n", n, n == 1 ? "y" : "ies", tt, dir);
            free(v);
        }
    } else if (!strcmp(sub, "cat")) {
        rk_doc_cache_entry *v = NULL;
        size_t n = 0, hit = 0;
        if (rk_doc_cache_list(c, &v, &n, &e)) {
            cli_print_error(&e);
            rc = RK_EXIT_ERROR;
        }
        for (size_t i = 0; !rc && i < n; i++)
            if (!strncmp(v[i].key, prefix, strlen(prefix))) hit = hit ? (size_t)-1 : i + 1;
        if (!rc && (hit == 0 || hit == (size_t)-1)) {
            fprintf(stderr, "ridgekv cache cat: %s entry matches '%s'\n", hit ? "more than one" : "no", prefix);
            rc = RK_EXIT_ERROR;
        }
        void *blk = NULL;
        size_t len = 0;
        if (!rc && rk_doc_cache_read(c, v[hit - 1].key, &blk, &len, &e)) {
            cli_print_error(&e);
            rc = RK_EXIT_ERROR;
        }
        if (!rc && (fwrite(blk, 1, len, stdout) != len || fflush(stdout))) {
            fprintf(stderr, "ridgekv cache cat: writing stdout failed\n");
            rc = RK_EXIT_IO;
        }
        free(blk);
        free(v);
    } else if (!strcmp(sub, "rm")) {
        size_t n = 0;
        if (rk_doc_cache_remove(c, prefix, &n, &e)) {
            cli_print_error(&e);
            rc = RK_EXIT_ERROR;
        }
        fprintf(stderr, "ridgekv cache: removed %zu entr%s\n", n, n == 1 ? "y" : "ies");
        if (!n && *prefix && !rc) rc = RK_EXIT_ERROR;
    } else {
        size_t n = 0;
        uint64_t left = 0;
        if (rk_doc_cache_gc(c, cap, &n, &left, &e)) {
            cli_print_error(&e);
            rc = RK_EXIT_ERROR;
        } else {
            char l[32];
            human(left, l, sizeof l);
            fprintf(stderr, "ridgekv cache: removed %zu file%s, %s left\n", n, n == 1 ? "" : "s", l);
        }
    }
    rk_doc_cache_close(c);
    return rc;
usage:
    fprintf(stderr, "ridgekv cache: bad usage (see ridgekv cache --help)\n");
    return RK_EXIT_USAGE;
}
