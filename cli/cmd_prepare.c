/* `ridgekv prepare`: RidgeFill maps without a manual step. The maps of a model are fitted
 * once (rk_calibrate) over a calibration text that a Debian package ships, and kept in the
 * cache under the model's fingerprint; ask, chat and serve find them there
 * (cli_auto_fill). `pull` may call cli_prepare_maps after fetching a model. */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "progress.h"
#include "rk_fitters.h"
#include "rk_experimental.h"
#include "rk_io.h"

extern char **environ;

/* The Jargon File 4.4.7 (public domain; Debian package jargon-text, in scripts/deps.sh):
 * English prose, gzip'd by the package. */
#define CLI_PREPARE_TEXT "/usr/share/doc/jargon-text/jargon.txt.gz"
enum { PREPARE_TOKENS = CLI_PREPARE_TOKENS, PREPARE_TEXT_BYTES = 1 << 20 };

static const char *help =
    "usage: ridgekv prepare [-m MODEL] [--text FILE ...] [--max-tokens N] [--force] [--sparse] [-t N]\n"
    "\n"
    "Fits the RidgeFill maps of a model once (the work of `ridgekv calibrate`: one exact forward\n"
    "pass over the text, then the ridge solves) and stores them in the cache,\n"
    "${XDG_CACHE_HOME:-~/.cache}/ridgekv/maps/, under the model's fingerprint. ask, chat and serve\n"
    "then find them without --ridgefill, say on stderr that they use them, and `--no-ridgefill`\n"
    "turns them off. Does nothing when maps for this model are already there (--force refits).\n"
    "\n"
    "  --text FILE      calibration text (repeatable; .gz is read through gzip). Default: the Jargon\n"
    "                   File 4.4.7 (public domain) from the Debian package jargon-text,\n"
    "                   " CLI_PREPARE_TEXT "\n"
    "  --max-tokens N   tokens of text to fit on (default 32768: about 90 s on 2 quiet cores for\n"
    "                   the default model)\n"
    "  --force          refit even when the cache holds maps for this model\n"
    "  --sparse         also calibrate sparse attention (each layer and head's kept attention mass,\n"
    "                   measured on 8192-token segments of the text; --sparse on then uses it):\n"
    "                   <same name>.sparse.gguf beside the maps\n"
    "  -t N             threads\n";

int cli_maps_cache_path(const rk_model *m, char *buf, size_t cap) {
    char dir[4096];
    if (cli_cache_dir(dir, sizeof dir) != 0) return -1;
    rk_fingerprint f;
    rk_model_fingerprint(m, &f);
    int w = snprintf(buf, cap, "%s/maps/%s-%016llx-%016llx-%016llx.maps.gguf", dir, f.arch,
                     (unsigned long long)f.tokenizer_hash, (unsigned long long)f.weights_hash,
                     (unsigned long long)f.quant_hash);
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

/* The text of a .gz file through `gzip -dc` (at most cap bytes kept); NULL after printing why. */
static char *read_gz(const char *path, size_t cap, size_t *n_out) {
    int fd[2];
    if (pipe(fd) != 0) {
        fprintf(stderr, "ridgekv prepare: cannot read %s: pipe: %s\n", path, strerror(errno));
        return NULL;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], 1);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    char *argv[] = {"gzip", "-dc", "--", (char *)path, NULL};
    pid_t pid;
    int rc = posix_spawnp(&pid, "gzip", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(fd[1]);
    if (rc != 0) {
        close(fd[0]);
        fprintf(stderr, "ridgekv prepare: cannot run gzip to read %s: %s\n", path, strerror(rc));
        return NULL;
    }
    char *buf = malloc(cap + 1);
    size_t n = 0;
    char sink[65536];
    for (;;) {
        ssize_t k = buf && n < cap ? read(fd[0], buf + n, cap - n) : read(fd[0], sink, sizeof sink);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        if (buf && n < cap) n += (size_t)k;
    }
    close(fd[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    /* killed by SIGPIPE is impossible: we read to the end */
    if (!buf || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || n == 0) {
        fprintf(stderr, "ridgekv prepare: %s: %s\n", path,
                !buf     ? "out of memory"
                : n == 0 ? "no text (missing file or not gzip data)"
                         : "gzip failed (corrupt?)");
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    *n_out = n;
    return buf;
}

/* Calibration tokens from the text files (plain or .gz), up to max_tokens; exit code. */
static int text_tokens(const rk_model *m, const char *const *texts, int n_texts, size_t max_tokens, int32_t **ids,
                       size_t *n) {
    int32_t *all = NULL;
    size_t n_all = 0;
    for (int i = 0; i < n_texts && n_all < max_tokens; i++) {
        const size_t len = strlen(texts[i]);
        int32_t *t = NULL;
        size_t nt = 0;
        if (len > 3 && !strcmp(texts[i] + len - 3, ".gz")) {
            size_t nb = 0;
            char *txt = read_gz(texts[i], PREPARE_TEXT_BYTES, &nb);
            if (!txt) {
                free(all);
                return RK_EXIT_IO;
            }
            rk_err e = {0};
            rk_status st = rk_model_tokenize(m, txt, nb, false, false, &t, &nt, &e);
            free(txt);
            if (st) {
                cli_print_error(&e);
                free(all);
                return cli_exit_code(st);
            }
        } else {
            int rc = cli_read_text_tokens(m, &texts[i], 1, max_tokens - n_all, &t, &nt);
            if (rc) {
                free(all);
                return rc;
            }
        }
        if (nt > max_tokens - n_all) nt = max_tokens - n_all;
        int32_t *grown = realloc(all, (n_all + nt + 1) * sizeof(int32_t));
        if (!grown) {
            free(t);
            free(all);
            fprintf(stderr, "ridgekv prepare: out of memory\n");
            return RK_EXIT_ERROR;
        }
        all = grown;
        memcpy(all + n_all, t, nt * sizeof(int32_t));
        n_all += nt;
        free(t);
    }
    *ids = all;
    *n = n_all;
    return 0;
}

/* The forward pass's progress (cli_progress: a bar on a terminal, plain lines otherwise),
 * then a line for the solve, which reports nothing until the file is written. */
static bool on_progress(void *ud, int64_t done, int64_t total) {
    cli_progress *p = ud;
    const bool go = cli_progress_fn(p, done, total);
    if (done >= total) {
        cli_progress_end(p);
        fprintf(stderr, "ridgekv prepare: forward pass done; solving the maps (held-out choice of lambda)\n");
    }
    return go;
}

/* Writes a fitted file into the cache (its folder made first, the file replaced atomically)
 * and frees bytes; 0, or -1 after printing why. */
static int store(const char *path, void *bytes, size_t n_bytes) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    rk_err e = {0};
    const rk_status st = rk_io_mkdir_p(dir, &e) ? RK_E_IO : rk_io_write_file_atomic(path, bytes, n_bytes, &e);
    free(bytes);
    if (st) cli_print_error(&e);
    return st ? -1 : 0;
}

int cli_prepare_maps(const rk_model *m, const char *const *texts, int n_texts, size_t max_tokens, int n_threads,
                     bool force) {
    static const char *const def[] = {CLI_PREPARE_TEXT};
    char path[4096];
    if (cli_maps_cache_path(m, path, sizeof path) != 0) {
        fprintf(stderr, "ridgekv prepare: no cache directory (set HOME or XDG_CACHE_HOME)\n");
        return RK_EXIT_IO;
    }
    struct stat sb;
    if (!force && stat(path, &sb) == 0) {
        rk_ridge_maps *r = NULL;
        char warn[512];
        rk_err e = {0};
        if (rk_ridge_maps_load(path, m, &r, warn, sizeof warn, &e) == RK_OK) {
            rk_ridge_maps_destroy(r);
            fprintf(stderr, "ridgekv prepare: maps for %s already in the cache: %s\n", rk_model_name(m), path);
            return RK_EXIT_OK;
        }
        fprintf(stderr, "ridgekv prepare: the cached maps are unusable (%s); fitting them again\n", e.msg);
    }
    if (n_texts == 0) texts = def, n_texts = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = text_tokens(m, texts, n_texts, max_tokens, &ids, &n);
    if (rc) return rc;
    const rk_hparams *hp = rk_model_hparams(m);
    rk_calib_params cp = {.split = (int)(0.4 * hp->n_layer + 0.5),
                          .stride = 8,
                          .seg_len = 2048,
                          .lambda = -1.0f,
                          .dtype = RK_DT_F16,
                          .keep_share = 0.1f,
                          .n_threads = n_threads};
    fprintf(stderr, "ridgekv prepare: fitting RidgeFill maps for %s on %zu tokens of %s%s (split %d of %d)\n",
            rk_model_name(m), n, texts[0], n_texts > 1 ? " and more" : "", cp.split, hp->n_layer);
    if (n < 4096) {
        fprintf(stderr, "ridgekv prepare: %zu tokens of text are too few to fit maps (at least 4096)\n", n);
        free(ids);
        return RK_EXIT_USAGE;
    }
    double t0 = rk_time_now();
    cli_progress pg;
    cli_progress_begin(&pg, "prepare", "fit", "tokens", (int64_t)n, false);
    void *bytes = NULL;
    size_t n_bytes = 0;
    rk_calib_report rep;
    rk_err e = {0};
    rk_status st = rk_calibrate(m, ids, n, &cp, on_progress, &pg, &bytes, &n_bytes, &rep, &e);
    free(ids);
    if (st) {
        cli_print_error(&e);
        return cli_exit_code(st);
    }
    if (store(path, bytes, n_bytes)) return RK_EXIT_IO;
    fprintf(stderr, "ridgekv prepare: wrote %s (%.1f MiB, lambda %.3g, %.0f s)\n", path, (double)n_bytes / 1048576.0,
            (double)rep.lambda, rk_time_now() - t0);
    return RK_EXIT_OK;
}

int cli_prepare_sparse(const rk_model *m, const char *const *texts, int n_texts, size_t max_tokens, int n_threads,
                       bool force) {
    static const char *const def[] = {CLI_PREPARE_TEXT};
    char path[4096];
    if (cli_sparse_cache_path(m, path, sizeof path) != 0) {
        fprintf(stderr, "ridgekv prepare: no cache directory (set HOME or XDG_CACHE_HOME)\n");
        return RK_EXIT_IO;
    }
    rk_err e = {0};
    struct stat sb;
    if (!force && stat(path, &sb) == 0) {
        rk_sparse_calib *c = NULL;
        char warn[512];
        if (rk_sparse_calib_load(path, m, &c, warn, sizeof warn, &e) == RK_OK) {
            rk_sparse_calib_destroy(c);
            fprintf(stderr, "ridgekv prepare: sparse-attention calibration for %s already in the cache: %s\n",
                    rk_model_name(m), path);
            return RK_EXIT_OK;
        }
        fprintf(stderr, "ridgekv prepare: the cached sparse calibration is unusable (%s); measuring again\n", e.msg);
    }
    if (n_texts == 0) texts = def, n_texts = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = text_tokens(m, texts, n_texts, max_tokens, &ids, &n);
    if (rc) return rc;
    rk_sparse_fit_params fp = {.segment = 8192, .n_threads = n_threads};
    if (fp.segment > rk_model_hparams(m)->n_ctx_train) fp.segment = rk_model_hparams(m)->n_ctx_train;
    if ((size_t)fp.segment > n) fp.segment = (int32_t)n;
    fp.min_kv = fp.segment / 4; /* chunks past a quarter of the segment are measured (2048 of 8192) */
    if (n > 2 * (size_t)fp.segment) n = 2 * (size_t)fp.segment; /* two segments */
    fprintf(stderr, "ridgekv prepare: measuring sparse attention of %s on %zu tokens (segments of %d)\n",
            rk_model_name(m), n, fp.segment);
    double t0 = rk_time_now();
    void *bytes = NULL;
    size_t n_bytes = 0;
    rk_sparse_fit_report rep;
    rk_status st = rk_sparse_fit(m, ids, n, &fp, &bytes, &n_bytes, &rep, &e);
    free(ids);
    if (st) {
        cli_print_error(&e);
        return cli_exit_code(st);
    }
    if (store(path, bytes, n_bytes)) return RK_EXIT_IO;
    fprintf(stderr, "ridgekv prepare: wrote %s (mean kept mass %.3f, exact mass covered %.3f, %.0f s)\n", path,
            rep.mean_mass, rep.mean_cover, rk_time_now() - t0);
    return RK_EXIT_OK;
}

int cli_auto_fill(cli_opts *o, const rk_model *m, const char *cmd) {
    static char buf[4096]; /* o->ridgefill points here: once per process */
    const size_t cap = sizeof buf;
    if (o->no_ridgefill) {
        o->ridgefill = NULL;
        o->fill = "off";
        if (o->verbose) fprintf(stderr, "ridgekv %s: RidgeFill off (--no-ridgefill): exact prefill\n", cmd);
        return 0;
    }
    if (o->ridgefill) return 0; /* the user's maps: cli_fill_params says what it uses with -v */
    struct stat sb;
    if (cli_maps_cache_path(m, buf, cap) != 0 || stat(buf, &sb) != 0) return 0;
    const char *mode = o->fill ? o->fill : cli_default_fill_name();
    if (!strcmp(mode, "off")) {
        if (o->fill) {
            if (o->verbose) fprintf(stderr, "ridgekv %s: RidgeFill off (--fill off): exact prefill\n", cmd);
        } else
            fprintf(stderr,
                    "ridgekv %s: RidgeFill maps found for this model, not used by default (exact prefill; "
                    "--fill quality uses them, docs/RIDGEFILL.md)\n",
                    cmd);
        return 0;
    }
    o->ridgefill = buf;
    o->fill = mode;
    rk_fill_mode fm = RK_FILL_OFF;
    (void)rk_fill_mode_parse(mode, &fm);
    char grp[48] = "";
    if (cli_fill_group(o, fm) > 0) snprintf(grp, sizeof grp, ", filled rows in groups of %d", cli_fill_group(o, fm));
    /* ask and chat say it when a prompt is long enough for it (cli_fill_applies); a server
     * cannot know, so it says it once; the path only with -v */
    if (o->verbose)
        fprintf(stderr, "ridgekv %s: RidgeFill %s for prompts over %d tokens (maps %s%s; --no-ridgefill: exact)\n", cmd,
                mode, o->tail ? o->tail : rk_fill_default_tail(fm), buf, grp);
    else if (!strcmp(cmd, "serve"))
        fprintf(stderr, "ridgekv %s: RidgeFill %s for prompts over %d tokens (--no-ridgefill: exact)\n", cmd, mode,
                o->tail ? o->tail : rk_fill_default_tail(fm));
    return 0;
}

bool cli_fill_applies(const cli_opts *o, int64_t n_tokens, char *buf, size_t cap) {
    rk_fill_mode fm = RK_FILL_OFF;
    const char *mode = o->fill ? o->fill : o->ridgefill ? cli_default_fill_name() : "off";
    if (!rk_fill_mode_parse(mode, &fm) || fm == RK_FILL_OFF) return false;
    const int64_t tail = o->tail ? o->tail : rk_fill_default_tail(fm);
    if (n_tokens <= tail) return false;
    snprintf(buf, cap, "RidgeFill %s for this %lld-token prompt (exact tail %lld; --no-ridgefill: exact)", mode,
             (long long)n_tokens, (long long)tail);
    return true;
}

int cmd_prepare(int argc, char **argv) {
    const char *texts[64];
    int n_texts = 0, force = 0, sparse = 0, max_tokens = PREPARE_TOKENS;
    char **av = malloc((size_t)argc * sizeof *av);
    if (!av) return RK_EXIT_ERROR;
    int ac = 0, rc = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i >= 2 && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            fputs(help, stdout);
            free(av);
            return RK_EXIT_OK;
        }
        if (i >= 2 && !strcmp(a, "--force")) force = 1;
        else if (i >= 2 && !strcmp(a, "--sparse")) sparse = 1;
        else if (i >= 2 && (!strcmp(a, "--text") || !strcmp(a, "--max-tokens"))) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ridgekv prepare: %s needs a value\n", a);
                rc = RK_EXIT_USAGE;
                break;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--text")) {
                if (n_texts >= 64) {
                    fprintf(stderr, "ridgekv prepare: at most 64 --text files\n");
                    rc = RK_EXIT_USAGE;
                    break;
                }
                texts[n_texts++] = v;
            } else {
                char *end;
                long x = strtol(v, &end, 10);
                if (*end || x < 1 || x > (1L << 30)) {
                    fprintf(stderr, "ridgekv prepare: --max-tokens expects a positive integer (got '%s')\n", v);
                    rc = RK_EXIT_USAGE;
                    break;
                }
                max_tokens = (int)x;
            }
        } else av[ac++] = argv[i];
    }
    cli_opts o = {.sp = rk_sampler_params_default()};
    const char *pos[1];
    int n_pos;
    if (!rc) rc = cli_parse(ac, av, 2, &o, pos, 0, &n_pos, "prepare");
    free(av);
    if (rc) return rc;
    rk_model *m = NULL;
    if ((rc = cli_load_model(&o, &m))) return rc;
    rc = cli_prepare_maps(m, texts, n_texts, (size_t)max_tokens, o.n_threads, force != 0);
    if (!rc && sparse) rc = cli_prepare_sparse(m, texts, n_texts, (size_t)max_tokens, o.n_threads, force != 0);
    rk_model_destroy(m);
    return rc;
}
