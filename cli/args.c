#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "catalog.h"
#include "cli.h"
#include "doc_cache_cli.h"
#include "rk_experimental.h"
#include "rk_io.h"
#include "suggest.h"

static int parse_int(const char *cmd, const char *flag, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ridgekv %s: %s expects an integer in [%d, %d] (got '%s')\n", cmd, flag, lo, hi, s);
        return RK_EXIT_USAGE;
    }
    *out = (int)v;
    return 0;
}

static int parse_float(const char *cmd, const char *flag, const char *s, float lo, float hi, float *out) {
    char *end;
    errno = 0;
    float v = strtof(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ridgekv %s: %s expects a number in [%g, %g] (got '%s')\n", cmd, flag, (double)lo, (double)hi,
                s);
        return RK_EXIT_USAGE;
    }
    *out = v;
    return 0;
}

/* The flags each command uses; any other common flag is refused with its name (a flag
 * silently ignored is a flag the user thinks is working). Commands not listed (eval,
 * calibrate, info: their own files check what applies) take every common flag. */
static const struct {
    const char *cmd;
    const char *flags;
} k_accepts[] = {
#define GEN_FLAGS                                                                                          \
    " --model --n-predict --threads --ctx-size --batch-size --kv --backend --temp --top-k --top-p --min-p" \
    " --repeat-penalty --repeat-last-n --seed --ridgefill --fill --tail --split --keep-share --verbose"    \
    " --frequency-penalty --presence-penalty --dry-multiplier --dry-base --dry-allowed-length"             \
    " --dry-penalty-last-n"                                                                                \
    " --kv-budget --kv-host-budget" FILL_FLAGS ROPE_FLAGS " "
#define FILL_FLAGS " --obs --score-layers --score-skip --baseline --pool --fill-group --sparse"
#define ROPE_FLAGS                                                                                      \
    " --ctx-overflow-ok --rope-scaling --rope-scale --rope-freq-base --yarn-orig-ctx --yarn-ext-factor" \
    " --yarn-attn-factor --yarn-beta-fast --yarn-beta-slow"
    {"run", GEN_FLAGS "--prompt --file --chat --system --stop --verbose-prompt --json-schema --json-object "},
    {"chat", GEN_FLAGS "--system --stop --verbose-prompt --no-ridgefill "},
    {"ask", GEN_FLAGS "--prompt --system --stop --verbose-prompt --no-ridgefill --no-cache --cache-level "
                      "--json-schema --json-object "},
    {"serve", GEN_FLAGS "--no-ridgefill --no-cache --cache-level "},
    {"bench",
     " --model --prompt --file --n-predict --threads --ctx-size --batch-size --kv --backend --ridgefill --fill --tail"
     " --split --keep-share --band --json --verbose --kv-budget --kv-host-budget" FILL_FLAGS ROPE_FLAGS " "},
    {"tokenize", " --model --prompt --file --verbose "},
#undef GEN_FLAGS
#undef FILL_FLAGS
#undef ROPE_FLAGS
};

/* Whether cmd uses the flag whose long name is lng. */
static bool accepts(const char *cmd, const char *lng) {
    char key[64];
    snprintf(key, sizeof key, " %s ", lng);
    for (size_t i = 0; i < sizeof k_accepts / sizeof *k_accepts; i++)
        if (!strcmp(k_accepts[i].cmd, cmd)) return strstr(k_accepts[i].flags, key) != NULL;
    return true;
}

/* Values that are text: "--x=y" after one of these is the value, not a flag. */
static bool takes_text(const char *a) {
    static const char *const t[] = {"-p",    "--prompt", "-f",       "--file", "--system", "--stop", "-r",
                                    "--doc", "-o",       "--output", "-m",     "--model",  "--text", "--json-schema"};
    for (size_t i = 0; i < sizeof t / sizeof *t; i++)
        if (!strcmp(a, t[i])) return true;
    return false;
}

char **cli_expand_eq(int *argc, char **argv) {
    int n = *argc, extra = 0;
    size_t names = 0;
    for (int i = 1; i < n; i++)
        if (!strncmp(argv[i], "--", 2) && strchr(argv[i], '=')) extra++, names += strlen(argv[i]) + 1;
    if (!extra) return argv;
    /* one block: the new argv, then the flag names it points to (main frees it) */
    char **out = calloc(1, (size_t)(n + extra + 1) * sizeof *out + names);
    if (!out) return argv;
    char *store = (char *)(out + n + extra + 1);
    int k = 0;
    for (int i = 0; i < n; i++) {
        const char *a = argv[i], *eq = strchr(a, '=');
        bool is_value = i > 0 && takes_text(argv[i - 1]);
        /* "--name=value": a flag name of letters, digits and dashes before the '=' */
        bool split = i > 0 && !is_value && !strncmp(a, "--", 2) && eq && eq > a + 2 &&
                     strspn(a + 2, "abcdefghijklmnopqrstuvwxyz0123456789-") == (size_t)(eq - a - 2);
        if (!split) {
            out[k++] = argv[i];
            continue;
        }
        memcpy(store, a, (size_t)(eq - a));
        store[eq - a] = 0;
        out[k++] = store;
        store += eq - a + 1;
        out[k++] = (char *)eq + 1;
    }
    out[k] = NULL;
    *argc = k;
    return out;
}

/* A random 63-bit seed (getrandom; the clock and pid when that fails). */
static uint64_t random_seed(void) {
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 20) ^ ((uint64_t)getpid() << 40);
        v = rk_splitmix64(&x);
    }
    return v & 0x7fffffffffffffffull;
}

void cli_seed_note(const char *cmd, const cli_opts *o) {
    if (o->verbose)
        fprintf(stderr, "ridgekv %s: seed %llu (%s)\n", cmd, (unsigned long long)o->sp.seed,
                o->seed_random ? "random; --seed N repeats a run" : "--seed");
}

/* --kv-host-budget is the pinned host tier under the device's KV (runtime/kv/kv_dev.c):
 * it means something only with --backend cuda, a --kv-budget, and f16 / f32 rows (one of
 * bench's list); anywhere else it would be ignored, so it is refused with the reason. */
static int host_budget_check(const char *cmd, const cli_opts *o) {
    if (!o->kv_host_budget) return 0;
    const char *why = NULL;
    if (!o->backend || strcmp(o->backend, "cuda"))
        why = "applies to --backend cuda only (the pinned host memory under the device's KV; on the CPU the KV is "
              "in host memory already and --kv-budget alone spills it to $TMPDIR)";
    else if (!o->kv_budget)
        why = "needs --kv-budget (the device memory; the host budget holds the cold layers past it)";
    if (!why && o->kv) {
        char items[8][1200];
        const int n = cli_kv_split(o->kv, items, 8);
        bool plain = false;
        for (int i = 0; i < n; i++) plain |= !strcmp(items[i], "f16") || !strcmp(items[i], "f32");
        if (!plain) why = "applies to --kv f16 or f32 only (q8 and lowram keep their rows in host memory)";
    }
    if (!why) return 0;
    fprintf(stderr, "ridgekv %s: --kv-host-budget %s\n", cmd, why);
    return RK_EXIT_USAGE;
}

int cli_parse(int argc, char **argv, int first, cli_opts *o, const char **pos, int max_pos, int *n_pos,
              const char *cmd) {
    *n_pos = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int rc = 0;
        /* the long name of a known flag, for the per-command check */
        static const char *const shorts[][2] = {{"-m", "--model"},    {"-p", "--prompt"},     {"-f", "--file"},
                                                {"-o", "--output"},   {"-n", "--n-predict"},  {"-t", "--threads"},
                                                {"-c", "--ctx-size"}, {"-b", "--batch-size"}, {"-v", "--verbose"},
                                                {"-r", "--stop"}};
        const char *lng = a;
        for (size_t k = 0; k < sizeof shorts / sizeof *shorts; k++)
            if (!strcmp(a, shorts[k][0])) lng = shorts[k][1];
        static const char *const known =
            " --model --prompt --file --output --n-predict --threads --ctx-size "
            "--batch-size --temp --top-k --top-p --min-p --repeat-penalty "
            "--repeat-last-n --frequency-penalty --presence-penalty --dry-multiplier --dry-base "
            "--dry-allowed-length --dry-penalty-last-n --json-schema --json-object --seed --kv --backend --system --ridgefill --fill --tail "
            "--split --keep-share --chat --json --verbose --stop --verbose-prompt "
            "--kv-budget --kv-host-budget --no-cache --cache-level --no-ridgefill --obs --score-layers "
            "--score-skip --baseline --pool --band --fill-group --sparse --ctx-overflow-ok --rope-scaling --rope-scale "
            "--rope-freq-base --yarn-orig-ctx --yarn-ext-factor --yarn-attn-factor "
            "--yarn-beta-fast --yarn-beta-slow ";
        char key[64];
        snprintf(key, sizeof key, " %.60s ", lng);
        if (a[0] == '-' && a[1] == '-' && strstr(known, key) && !accepts(cmd, lng)) {
            fprintf(stderr, "ridgekv %s: %s does not apply to %s (see ridgekv %s --help)\n", cmd, a, cmd, cmd);
            return RK_EXIT_USAGE;
        }
        if (a[0] == '-' && a[1] != '-' && lng != a && !accepts(cmd, lng)) {
            fprintf(stderr, "ridgekv %s: %s does not apply to %s (see ridgekv %s --help)\n", cmd, a, cmd, cmd);
            return RK_EXIT_USAGE;
        }
#define NEED()                                                         \
    do {                                                               \
        if (!v) {                                                      \
            fprintf(stderr, "ridgekv %s: %s needs a value\n", cmd, a); \
            return RK_EXIT_USAGE;                                      \
        }                                                              \
        i++;                                                           \
    } while (0)
        if (!strcmp(a, "-m") || !strcmp(a, "--model")) {
            NEED();
            o->model = v;
        } else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            NEED();
            o->prompt = v;
            o->prompt_list = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            NEED();
            o->prompt_file = v;
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            NEED();
            o->out = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            NEED();
            rc = parse_int(cmd, a, v, -1, 1 << 24, &o->n_predict);
        } else if (!strcmp(a, "-t") || !strcmp(a, "--threads")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 1024, &o->n_threads);
        } else if (!strcmp(a, "-c") || !strcmp(a, "--ctx-size")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 1 << 24, &o->n_ctx);
        } else if (!strcmp(a, "-b") || !strcmp(a, "--batch-size")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 1 << 16, &o->n_batch);
        } else if (!strcmp(a, "--temp")) {
            NEED();
            rc = parse_float(cmd, a, v, 0.0f, 100.0f, &o->sp.temp);
        } else if (!strcmp(a, "--top-k")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 1 << 24, &o->sp.top_k);
        } else if (!strcmp(a, "--top-p")) {
            NEED();
            rc = parse_float(cmd, a, v, 0.0f, 1.0f, &o->sp.top_p);
        } else if (!strcmp(a, "--min-p")) {
            NEED();
            rc = parse_float(cmd, a, v, 0.0f, 1.0f, &o->sp.min_p);
        } else if (!strcmp(a, "--repeat-penalty")) {
            NEED();
            rc = parse_float(cmd, a, v, 0.01f, 100.0f, &o->sp.repeat_penalty);
        } else if (!strcmp(a, "--repeat-last-n")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 1 << 24, &o->sp.repeat_last_n);
        } else if (!strcmp(a, "--frequency-penalty")) {
            NEED();
            rc = parse_float(cmd, a, v, -2.0f, 2.0f, &o->sp.frequency_penalty);
        } else if (!strcmp(a, "--presence-penalty")) {
            NEED();
            rc = parse_float(cmd, a, v, -2.0f, 2.0f, &o->sp.presence_penalty);
        } else if (!strcmp(a, "--dry-multiplier")) {
            NEED();
            rc = parse_float(cmd, a, v, 0.0f, 100.0f, &o->sp.dry_multiplier);
        } else if (!strcmp(a, "--dry-base")) {
            NEED();
            rc = parse_float(cmd, a, v, 1.0001f, 100.0f, &o->sp.dry_base);
        } else if (!strcmp(a, "--dry-allowed-length")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 1 << 16, &o->sp.dry_allowed_length);
        } else if (!strcmp(a, "--dry-penalty-last-n")) {
            NEED();
            rc = parse_int(cmd, a, v, -1, 1 << 24, &o->sp.dry_penalty_last_n);
        } else if (!strcmp(a, "--json-schema")) {
            NEED();
            o->json_schema = v;
        } else if (!strcmp(a, "--json-object")) {
            o->json_object = 1;
        } else if (!strcmp(a, "--seed")) {
            NEED();
            char *end;
            errno = 0;
            if (!strcmp(v, "-1")) {
                o->seed_given = false; /* llama.cpp's "random" */
                continue;
            }
            unsigned long long s = strtoull(v, &end, 10);
            if (errno || end == v || *end || v[0] == '-') {
                fprintf(stderr,
                        "ridgekv %s: --seed expects a non-negative integer, or -1 for a random one (got '%s')\n", cmd,
                        v);
                return RK_EXIT_USAGE;
            }
            o->sp.seed = s;
            o->seed_given = true;
        } else if (!strcmp(a, "--stop") || !strcmp(a, "-r")) {
            NEED();
            if (!*v) {
                fprintf(stderr, "ridgekv %s: %s expects a non-empty string\n", cmd, a);
                return RK_EXIT_USAGE;
            }
            if (o->n_stop == CLI_MAX_STOP) {
                fprintf(stderr, "ridgekv %s: at most %d stop strings\n", cmd, CLI_MAX_STOP);
                return RK_EXIT_USAGE;
            }
            o->stop[o->n_stop++] = v;
        } else if (!strcmp(a, "--kv")) {
            NEED();
            if ((rc = cli_kv_check(cmd, v))) return rc;
            o->kv = v;
        } else if (!strcmp(a, "--backend")) {
            NEED();
            rk_backend_kind bk;
            if (!rk_backend_kind_parse(v, &bk)) {
                fprintf(stderr, "ridgekv %s: --backend expects cpu, cpu_ref or cuda (got '%s')\n", cmd, v);
                return RK_EXIT_USAGE;
            }
            o->backend = v;
        } else if (!strcmp(a, "--system")) {
            NEED();
            o->system = v;
        } else if (!strcmp(a, "--ridgefill")) {
            NEED();
            o->ridgefill = v;
        } else if (!strcmp(a, "--fill")) {
            NEED();
            o->fill = v;
        } else if (!strcmp(a, "--tail")) {
            NEED();
            rc = parse_int(cmd, a, v, 512, 1 << 24, &o->tail);
        } else if (!strcmp(a, "--split")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 4096, &o->split);
        } else if (!strcmp(a, "--keep-share")) {
            NEED();
            rc = parse_float(cmd, a, v, 0.0f, 1.0f, &o->keep_share);
        } else if (!strcmp(a, "--obs")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 4096, &o->obs);
        } else if (!strcmp(a, "--score-layers")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 256, &o->score_layers);
        } else if (!strcmp(a, "--score-skip") || !strcmp(a, "--baseline")) {
            NEED();
            int *dst = !strcmp(a, "--baseline") ? &o->baseline : &o->score_skip;
            rc = parse_int(cmd, a, v, 0, 4096, dst);
            if (!rc && *dst == 0) *dst = -1; /* the library's "none" */
        } else if (!strcmp(a, "--pool")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 256, &o->pool);
            if (!rc && o->pool == 0) o->pool = -1; /* the library's "no pooling" */
        } else if (!strcmp(a, "--band")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 1 << 24, &o->band);
        } else if (!strcmp(a, "--rescore-rows")) {
            NEED();
            rc = parse_int(cmd, a, v, 1, 1 << 24, &o->rescore_rows);
        } else if (!strcmp(a, "--pool-after")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 4096, &o->pool_after);
            if (!rc && o->pool_after == 0) o->pool_after = -1; /* the library's "as pool" */
        } else if (!strcmp(a, "--fill-group")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 4096, &o->fill_group);
            if (!rc && o->fill_group == 0) o->fill_group = -1; /* off, not the default */
        } else if (!strcmp(a, "--no-ridgefill")) o->no_ridgefill = 1;
        else if (!strcmp(a, "--sparse")) {
            NEED();
            o->sparse = v;
        } else if (!strcmp(a, "--no-cache")) o->no_cache = 1;
        else if (!strcmp(a, "--cache-level")) {
            NEED();
            rc = parse_int(cmd, a, v, 0, 19, &o->cache_level);
            if (!rc && !o->cache_level) o->cache_level = -1;
        } else if (!strcmp(a, "--kv-budget") || !strcmp(a, "--kv-host-budget")) {
            NEED();
            uint64_t b;
            const size_t lv = strlen(v);
            const bool pct = lv > 1 && v[lv - 1] == '%' && !strcmp(cmd, "bench");
            if (!pct && !cli_parse_size(v, &b)) {
                fprintf(stderr, "ridgekv %s: %s expects a size such as 512M%s (got '%s')\n", cmd, a,
                        !strcmp(cmd, "bench") ? " or a share such as 25%" : "", v);
                return RK_EXIT_USAGE;
            }
            if (!strcmp(a, "--kv-budget")) o->kv_budget = v;
            else o->kv_host_budget = v;
        } else if (!strncmp(a, "--rope-", 7) || !strncmp(a, "--yarn-", 7)) {
            NEED();
            if (!o->rope_set) o->rope = rk_rope_override_default(), o->rope_set = 1;
            rk_rope_override *r = &o->rope;
            if (!strcmp(a, "--rope-scaling")) {
                if (!rk_rope_scaling_parse(v, &r->type)) {
                    fprintf(stderr, "ridgekv %s: --rope-scaling expects none, linear or yarn (got '%s')\n", cmd, v);
                    return RK_EXIT_USAGE;
                }
            } else if (!strcmp(a, "--rope-scale")) rc = parse_float(cmd, a, v, 1.0f, 1024.0f, &r->factor);
            else if (!strcmp(a, "--rope-freq-base")) rc = parse_float(cmd, a, v, 1.0f, 1e12f, &r->freq_base);
            else if (!strcmp(a, "--yarn-orig-ctx")) rc = parse_int(cmd, a, v, 1, 1 << 24, &r->orig_ctx);
            else if (!strcmp(a, "--yarn-ext-factor")) rc = parse_float(cmd, a, v, 0.0f, 1.0f, &r->ext_factor);
            else if (!strcmp(a, "--yarn-attn-factor")) rc = parse_float(cmd, a, v, 0.01f, 100.0f, &r->attn_factor);
            else if (!strcmp(a, "--yarn-beta-fast")) rc = parse_float(cmd, a, v, 0.01f, 1e4f, &r->beta_fast);
            else if (!strcmp(a, "--yarn-beta-slow")) rc = parse_float(cmd, a, v, 0.01f, 1e4f, &r->beta_slow);
            else return cli_unknown_flag(cmd, a, v, known);
        } else if (!strcmp(a, "--ctx-overflow-ok")) o->ctx_overflow_ok = 1;
        else if (!strcmp(a, "--chat")) o->chat = 1;
        else if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--verbose-prompt")) o->verbose_prompt = 1;
        else if (!strcmp(a, "-v") || !strcmp(a, "--verbose")) o->verbose = 1;
        else if (a[0] == '-' && a[1] != '\0') return cli_unknown_flag(cmd, a, v, known);
        else {
            if (*n_pos >= max_pos) {
                fprintf(stderr, "ridgekv %s: unexpected argument '%s'\n", cmd, a);
                return RK_EXIT_USAGE;
            }
            pos[(*n_pos)++] = a;
        }
#undef NEED
        if (rc) return rc;
    }
    const int hb = host_budget_check(cmd, o);
    if (hb) return hb;
    /* the generating commands: a random seed unless one was given (eval, bench and the
     * fitters keep their fixed default: their runs must repeat) */
    if (!o->seed_given &&
        (!strcmp(cmd, "run") || !strcmp(cmd, "chat") || !strcmp(cmd, "ask") || !strcmp(cmd, "serve"))) {
        o->sp.seed = random_seed();
        o->seed_random = true;
    }
    return 0;
}

int cli_cache_dir(char *buf, size_t cap) {
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int w;
    if (xdg && *xdg) w = snprintf(buf, cap, "%s/ridgekv", xdg);
    else if (home && *home) w = snprintf(buf, cap, "%s/.cache/ridgekv", home);
    else return -1;
    return w < 0 || (size_t)w >= cap ? -1 : 0;
}

/* A catalogue name (no such file here) becomes its file in the cache. */
static const char *resolve_name(const char *m, char *buf, size_t cap) {
    struct stat st;
    const cli_model_entry *me = cli_catalog_find(m);
    if (!me && stat(m, &st) != 0 && !strchr(m, '/') && !strstr(m, ".gguf")) {
        cli_unknown_model(m); /* a name, not a path: the nearest catalogue names */
        return NULL;
    }
    if (!me || stat(m, &st) == 0) return m;
    char dir[3072];
    if (cli_cache_dir(dir, sizeof dir) != 0) {
        fprintf(stderr, "ridgekv: -m %s: neither XDG_CACHE_HOME nor HOME is set\n", m);
        return NULL;
    }
    snprintf(buf, cap, "%s/%s", dir, me->file);
    if (stat(buf, &st) != 0) {
        fprintf(stderr, "ridgekv: model '%s' is not in the cache (%s).\nFetch it with `ridgekv pull %s`.\n", m, buf, m);
        return NULL;
    }
    return buf;
}

const char *cli_model_path(const cli_opts *o, char *buf, size_t cap) {
    if (o->model) return resolve_name(o->model, buf, cap);
    const char *env = getenv("RIDGEKV_MODEL");
    if (env && *env) return resolve_name(env, buf, cap);
    char dir[3072];
    if (cli_cache_dir(dir, sizeof dir) != 0) {
        fprintf(stderr, "ridgekv: no -m given and neither XDG_CACHE_HOME nor HOME is set\n");
        return NULL;
    }
    snprintf(buf, cap, "%s/%s", dir, RK_DEFAULT_MODEL_FILE);
    struct stat st;
    if (stat(buf, &st) != 0) {
        fprintf(stderr,
                "ridgekv: no -m given and the default model is not in the cache (%s).\n"
                "Fetch it with `ridgekv pull`, or pass -m FILE.gguf.\n",
                buf);
        return NULL;
    }
    return buf;
}

int cli_exit_code(rk_status st) {
    switch (st) {
    case RK_OK: return RK_EXIT_OK;
    case RK_E_CONTEXT: return RK_EXIT_CONTEXT;
    case RK_E_IO: return RK_EXIT_IO;
    case RK_E_INVALID_ARG: return RK_EXIT_USAGE;
    case RK_E_NOT_FOUND:
    case RK_E_UNSUPPORTED:
    case RK_E_MISMATCH:
    case RK_E_CHECKSUM: return RK_EXIT_MODEL;
    default: return st >= RK_E_GGUF_MAGIC && st <= RK_E_GGUF_BLOCK ? RK_EXIT_MODEL : RK_EXIT_ERROR;
    }
}

void cli_print_error(const rk_err *e) {
    fprintf(stderr, "ridgekv: error: %s [%s]\n", e->msg[0] ? e->msg : "unknown error", rk_status_name(e->code));
}

int cli_load_model(const cli_opts *o, rk_model **m) {
    char buf[4096];
    const char *path = cli_model_path(o, buf, sizeof buf);
    if (!path) return o->model ? RK_EXIT_MODEL : RK_EXIT_NO_MODEL;
    rk_err e = {0};
    rk_model_params mp = rk_model_params_default();
    const char *hp = getenv("RIDGEKV_HUGEPAGES"); /* 0: the plain file mapping (docs/USAGE.md) */
    if (hp && !strcmp(hp, "0")) mp.huge_pages = false;
    rk_status st = rk_model_load_with(path, &mp, m, &e);
    if (st) {
        cli_print_error(&e);
        return st == RK_E_NOMEM ? RK_EXIT_ERROR : RK_EXIT_MODEL;
    }
    if (o->rope_set && (st = rk_model_set_rope(*m, &o->rope, &e))) {
        cli_print_error(&e);
        rk_model_destroy(*m);
        *m = NULL;
        return RK_EXIT_USAGE;
    }
    if (o->verbose) {
        const rk_rope_scaling *r = &rk_model_hparams(*m)->rope_scaling;
        fprintf(stderr, "ridgekv: rope scaling %s", rk_rope_scaling_name(r->type));
        if (r->type != RK_ROPE_SCALING_NONE)
            fprintf(stderr, " (factor %g, original context %d%s)", (double)r->factor, (int)r->orig_ctx,
                    r->type == RK_ROPE_SCALING_YARN ? ", yarn" : "");
        fprintf(stderr, ", effective context %lld\n", (long long)rk_model_n_ctx_max(*m));
    }
    return 0;
}

int cli_session_params(const cli_opts *o, rk_session_params *p) {
    *p = rk_session_params_default();
    p->n_ctx = o->n_ctx;
    p->n_threads = o->n_threads;
    if (o->n_batch) p->n_batch = o->n_batch;
    char items[8][1200];
    if (o->kv && cli_kv_split(o->kv, items, 8) >= 1 && cli_kv_params(o, items[0], &p->kv)) return RK_EXIT_USAGE;
    if (!o->kv) cli_kv_apply(o, &p->kv); /* the default policy takes --kv-budget and the tier settings too */
    if (o->backend) rk_backend_kind_parse(o->backend, &p->backend);
    p->ctx_overflow_ok = o->ctx_overflow_ok != 0;
    const char *g = getenv("RIDGEKV_CUDA_GRAPHS"); /* docs/GPU.md: recorded decode steps */
    p->cuda_graphs = g && *g && strcmp(g, "0") != 0;
    return 0;
}

/* ---- --kv f16|f32|q8|q4|lowram[:opts] (a list for bench) ---------------------------- */

int cli_kv_split(const char *kv, char items[][1200], int max_items) {
    int n = 0;
    for (const char *s = kv; s && *s;) {
        const char *e = strchr(s, ',');
        size_t len = e ? (size_t)(e - s) : strlen(s);
        /* a new item starts at f16, f32, q8, q4 or lowram; other tokens continue the item before */
        const bool head = (len == 3 && (!strncmp(s, "f16", 3) || !strncmp(s, "f32", 3))) ||
                          (len == 2 && (!strncmp(s, "q8", 2) || !strncmp(s, "q4", 2))) || !strncmp(s, "lowram", 6);
        const char *pred = strstr(s, "pred=");
        if (pred && (pred == s || (!strncmp(s, "lowram:", 7) && pred == s + 7)))
            len = strlen(s); /* the path takes the rest */
        if (head || n == 0) {
            if (n == max_items) return -1;
            items[n++][0] = '\0';
        } else {
            strcat(items[n - 1], ",");
        }
        if (strlen(items[n - 1]) + len >= 1199) return -1;
        strncat(items[n - 1], s, len);
        s += len;
        if (*s == ',') s++;
    }
    return n;
}

/* The LowRAM settings table (rk_lowram_params_keys), as --kv lowram:help shows it. */
static void cli_lowram_keys(FILE *f) {
    size_t n = 0;
    const rk_param_key *k = rk_lowram_params_keys(&n);
    fprintf(f, "--kv lowram:KEY=VALUE,FLAG,...  (pred=FILE last). Stable: ratio, threads, pred; the other keys\n"
               "are research settings that may change in any release.\n");
    for (size_t i = 0; i < n; i++) {
        char form[96];
        switch (k[i].kind) {
        case RK_PARAM_NUMBER: snprintf(form, sizeof form, "%s=X  [%g, %g]", k[i].key, k[i].lo, k[i].hi); break;
        case RK_PARAM_INTEGER: snprintf(form, sizeof form, "%s=N  [%.0f, %.0f]", k[i].key, k[i].lo, k[i].hi); break;
        case RK_PARAM_FLAG: snprintf(form, sizeof form, "%s", k[i].key); break;
        case RK_PARAM_CHOICE: snprintf(form, sizeof form, "%s=%s", k[i].key, k[i].choices); break;
        case RK_PARAM_PATH: snprintf(form, sizeof form, "%s=FILE", k[i].key); break;
        }
        fprintf(f, "  %-28s %s\n", form, k[i].help);
    }
}

int cli_kv_check(const char *cmd, const char *kv) {
    char items[8][1200];
    int n = cli_kv_split(kv, items, 8);
    if (n < 1 || (n > 1 && strcmp(cmd, "bench"))) {
        fprintf(stderr, "ridgekv %s: --kv expects f16, f32, q8, q4 or lowram[:opts]%s (got '%s')\n", cmd,
                strcmp(cmd, "bench") ? "" : " or a list of up to 8", kv);
        return RK_EXIT_USAGE;
    }
    for (int i = 0; i < n; i++) {
        const char *it = items[i];
        /* q8 is a policy of the API: the session says whether this build has it */
        if (!strcmp(it, "f16") || !strcmp(it, "f32") || !strcmp(it, "q8") || !strcmp(it, "q4")) continue;
        if (strncmp(it, "lowram", 6) || (it[6] && it[6] != ':')) {
            fprintf(stderr, "ridgekv %s: --kv expects f16, f32, q8, q4 or lowram[:opts] (got '%s')\n", cmd, it);
            return RK_EXIT_USAGE;
        }
        if (!strcmp(it, "lowram:help")) {
            cli_lowram_keys(stdout);
            fflush(stdout);
            exit(ferror(stdout) ? RK_EXIT_IO : RK_EXIT_OK);
        }
        rk_lowram_params lp = rk_lowram_params_default();
        rk_err e = {0};
        if (rk_lowram_parse(it[6] ? it + 7 : "", &lp, &e)) {
            fprintf(stderr, "ridgekv %s: --kv %s: %s (--kv lowram:help lists the keys)\n", cmd, it, e.msg);
            return RK_EXIT_USAGE;
        }
    }
    return 0;
}

int cli_kv_params(const cli_opts *o, const char *item, rk_kv_params *out) {
    rk_err e = {0};
    rk_kv_params kp;
    if (rk_kv_params_parse(item, &kp, &e)) {
        cli_print_error(&e);
        return RK_EXIT_USAGE;
    }
    cli_kv_apply(o, &kp);
    if (o->kv_budget && kp.kind == RK_KV_Q4) {
        fprintf(stderr, "ridgekv: error: --kv q4 has no memory tiers: --kv-budget needs f16, f32, q8 or lowram\n");
        return RK_EXIT_USAGE;
    }
    if (o->kv_budget && kp.kind == RK_KV_LOWRAM && kp.lowram.evict > 0) {
        fprintf(stderr, "ridgekv: error: --kv lowram with evict= and --kv-budget together: eviction rewrites the "
                        "stored rows a budget spills; drop one of them\n");
        return RK_EXIT_USAGE;
    }
    *out = kp;
    return 0;
}

void cli_kv_apply(const cli_opts *o, rk_kv_params *kp) {
    if (o->n_threads > 0 && kp->lowram.n_threads == 0) kp->lowram.n_threads = o->n_threads;
    cli_kv_tier_params(o, kp);
}

int cli_setup_kv(const cli_opts *o, rk_session *s, const char *item) {
    (void)item;
    const char *w = rk_session_warning(s);
    if (w[0]) fprintf(stderr, "ridgekv: warning: %s\n", w);
    if (o->verbose && o->kv) fprintf(stderr, "ridgekv: KV policy %s\n", o->kv);
    return 0;
}

void cli_kv_budget_check(const char *cmd, const rk_session *s) {
    static bool warned; /* one line per process: a budget broken once stays broken */
    if (warned || !s) return;
    rk_kv_tier_stats t;
    rk_session_kv_tier_stats(s, &t);
    if (!t.on || !t.spill_errors) return;
    warned = true;
    fprintf(stderr,
            "ridgekv %s: warning: the KV budget of %.1f MiB cannot be kept: %llu spill%s failed (%s); those rows "
            "stay in memory, so the process holds more than the budget (--kv-budget, TMPDIR: docs/TIERS.md)\n",
            cmd, t.budget / 1048576.0, (unsigned long long)t.spill_errors, t.spill_errors == 1 ? "" : "s",
            t.spill_error[0] ? t.spill_error : "no reason recorded");
}

int cli_fill_group(const cli_opts *o, rk_fill_mode mode) {
    if (o->fill_group) return o->fill_group > 0 ? o->fill_group : 0;
    return rk_fill_default_group(mode);
}

const char *cli_default_fill_name(void) { return rk_fill_mode_name(rk_fill_params_default().mode); }

int cli_fill_params(const cli_opts *o, const rk_model *m, rk_ridge_maps **maps, const char *mode_override,
                    rk_fill_params *out) {
    rk_err e = {0};
    const char *mode_s = mode_override ? mode_override : o->fill;
    /* the library's defaults, the flags over them */
    rk_fill_params fp = rk_fill_params_default();
    fp.mode = RK_FILL_OFF, fp.group = -1;
    if (o->tail) fp.tail = o->tail;
    if (o->split) fp.split = o->split;
    if (o->keep_share > 0) fp.keep_share = o->keep_share;
    if (o->obs) fp.obs = o->obs;
    if (o->score_layers) fp.score_layers = o->score_layers;
    if (o->score_skip) fp.score_skip = o->score_skip;
    if (o->pool) fp.pool = o->pool;
    if (o->baseline) fp.baseline = o->baseline;
    if (o->band) fp.band = o->band;
    if (o->rescore_rows) fp.rescore_rows = o->rescore_rows;
    if (o->pool_after) fp.pool_after = o->pool_after;
    if (!mode_s) mode_s = o->ridgefill ? cli_default_fill_name() : "off";
    /* MODE:group=G (bench lists compare grouping in one run) */
    char mbuf[64];
    const char *colon = strchr(mode_s, ':');
    if (colon) {
        long g = -1;
        char *end = NULL;
        if (!strncmp(colon + 1, "group=", 6)) g = strtol(colon + 7, &end, 10);
        if (g < 0 || g > 4096 || !end || *end || (size_t)(colon - mode_s) >= sizeof mbuf) {
            fprintf(stderr, "ridgekv: --fill item '%s': the only setting here is group=G (0..4096)\n", mode_s);
            return RK_EXIT_USAGE;
        }
        memcpy(mbuf, mode_s, (size_t)(colon - mode_s));
        mbuf[colon - mode_s] = '\0';
        fp.group = (int32_t)g;
        mode_s = mbuf;
    }
    if (!rk_fill_mode_parse(mode_s, &fp.mode)) {
        fprintf(stderr, "ridgekv: --fill expects off, speed, quality, identity or plumb (got '%s')\n", mode_s);
        return RK_EXIT_USAGE;
    }
    if (fp.group < 0) fp.group = cli_fill_group(o, fp.mode);
    if (o->ridgefill && !*maps) {
        char warn[512];
        rk_status st = rk_ridge_maps_load(o->ridgefill, m, maps, warn, sizeof warn, &e);
        if (st) {
            cli_print_error(&e);
            return st == RK_E_NOMEM ? RK_EXIT_ERROR : RK_EXIT_MODEL;
        }
        if (warn[0]) fprintf(stderr, "ridgekv: warning: %s\n", warn);
    }
    fp.maps = *maps;
    int src = cli_sparse_params(o, m, &fp.sparse); /* sparse_cli.c */
    if (src) return src;
    if (fp.mode != RK_FILL_OFF && !fp.maps && fp.mode != RK_FILL_IDENTITY && fp.mode != RK_FILL_PLUMB) {
        fprintf(stderr, "ridgekv: --fill %s needs --ridgefill MAPS.gguf (make one with ridgekv calibrate)\n", mode_s);
        return RK_EXIT_USAGE;
    }
    if (fp.mode != RK_FILL_OFF && o->verbose)
        fprintf(stderr, "ridgekv: ridgefill %s, split %d, tail %d, group %d%s%s\n", rk_fill_mode_name(fp.mode),
                fp.maps ? rk_ridge_maps_split(fp.maps) : fp.split, fp.tail ? fp.tail : rk_fill_default_tail(fp.mode),
                fp.group, fp.maps ? ", maps " : "", fp.maps ? o->ridgefill : "");
    *out = fp;
    return 0;
}

int cli_setup_fill(const cli_opts *o, const rk_model *m, rk_session *s, rk_ridge_maps **maps,
                   const char *mode_override) {
    rk_fill_params fp;
    int rc = cli_fill_params(o, m, maps, mode_override, &fp);
    if (rc) return rc;
    rk_err e = {0};
    if (rk_session_set_fill(s, &fp, &e)) {
        cli_print_error(&e);
        return RK_EXIT_USAGE;
    }
    return 0;
}

int cli_read_text_tokens(const rk_model *m, const char *const *files, int n_files, size_t max_tokens, int32_t **out,
                         size_t *n_out) {
    rk_err e = {0};
    int32_t *all = NULL;
    size_t n_all = 0;
    for (int i = 0; i < n_files && n_all < max_tokens; i++) {
        char *txt;
        size_t len;
        if (rk_io_read_file(files[i], &txt, &len, &e)) {
            cli_print_error(&e);
            free(all);
            return RK_EXIT_IO;
        }
        if (memchr(txt, 0, len)) {
            fprintf(stderr, "ridgekv: %s is not a text file (it contains NUL bytes)\n", files[i]);
            free(txt);
            free(all);
            return RK_EXIT_USAGE;
        }
        /* tokenizing a whole novel is wasteful when only max_tokens are used: ~6 bytes/token */
        size_t want = (max_tokens - n_all) * 8;
        if (len > want) len = want;
        int32_t *ids;
        size_t n;
        rk_status st = rk_model_tokenize(m, txt, len, false, false, &ids, &n, &e);
        free(txt);
        if (st) {
            cli_print_error(&e);
            free(all);
            return cli_exit_code(st);
        }
        if (n > max_tokens - n_all) n = max_tokens - n_all;
        int32_t *grown = realloc(all, (n_all + n + 1) * sizeof *all);
        if (!grown) {
            free(ids);
            free(all);
            fprintf(stderr, "ridgekv: out of memory reading %s\n", files[i]);
            return RK_EXIT_ERROR;
        }
        all = grown;
        memcpy(all + n_all, ids, n * sizeof *ids);
        n_all += n;
        free(ids);
    }
    *out = all;
    *n_out = n_all;
    return 0;
}
