#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "suggest.h"

static void usage(FILE *f) {
    fprintf(f,
            "ridgekv %s - run LLMs locally, with cheap long prompts\n"
            "\n"
            "usage: ridgekv COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  chat     talk with the model in the terminal (streaming, history, /help inside)\n"
            "  ask      answer a question about documents (--doc FILE \"QUESTION\")\n"
            "  cache    the document KV cache: ls, rm, gc, path\n"
            "  run      generate text from a prompt (-p TEXT or -f FILE)\n"
            "  info     describe a GGUF file: architecture, shapes, tensor types, tokenizer, memory\n"
            "  bench    prefill and decode throughput, peak RSS, KV bytes per token\n"
            "  eval     quality measurements (eval ppl: perplexity over a text file)\n"
            "  serve    --jsonl: JSON requests on stdin, JSON events on stdout (docs/JSONL.md)\n"
            "  calibrate  fit RidgeFill maps on text (--text FILE -o MAPS.gguf)\n"
            "  prepare  fit the model's RidgeFill maps once into the cache (ask/chat/serve find them)\n"
            "  pull     fetch a catalogue model into the cache (default SmolLM2-135M-Instruct)\n"
            "  models   list the catalogue (pull NAME, -m NAME) and what is in the cache\n"
            "  tokenize show the tokens of a text (ids and pieces)\n"
            "  synth    write a random-weight model of a real shape (benchmarks without downloads)\n"
            "\n"
            "  --version  print the version; --help  this text\n"
            "`ridgekv COMMAND --help` lists the options of each command; --flag=value works too.\n"
            "Without -m, commands use the default model in ${XDG_CACHE_HOME:-~/.cache}/ridgekv/;\n"
            "-m takes a GGUF path or a catalogue name (ridgekv models).\n",
            RK_VERSION);
}

static int dispatch(int argc, char **argv);

int main(int argc, char **argv) {
    /* a closed stdout (| head) must be a write error the command reports (exit 5), not a
     * silent death by SIGPIPE (exit 141) */
    signal(SIGPIPE, SIG_IGN);
#ifdef __GLIBC__
    /* glibc raises its mmap threshold (up to 32 MiB) each time a large block is freed, so a
     * second long prompt's buffers (LowRAM's stores, per-eval work areas) come from the heap
     * and stay resident after free: a fixed 128 KiB threshold gives them back (second 8K
     * prompt of one LowRAM session on SmolLM2: peak 224 instead of 308-371 MiB, exact f16
     * 295).  MALLOC_MMAP_THRESHOLD_ in the environment wins. */
    if (!getenv("MALLOC_MMAP_THRESHOLD_")) (void)mallopt(M_MMAP_THRESHOLD, 128 * 1024);
#endif
    /* the library reads no environment: the CLI hands it the CUDA module's path */
    const char *cuda_module = getenv("RIDGEKV_CUDA_MODULE");
    if (cuda_module && *cuda_module) {
        rk_err e = {0};
        if (rk_backend_cuda_module(cuda_module, &e)) {
            cli_print_error(&e);
            return RK_EXIT_USAGE;
        }
    }
    char **orig = argv;
    argv = cli_expand_eq(&argc, argv);
    int rc = dispatch(argc, argv);
    if (argv != orig) free(argv);
    /* whatever a command printed last: a failed flush is a failed write */
    errno = 0;
    if ((fflush(stdout) == EOF || ferror(stdout)) && rc == RK_EXIT_OK) {
        fprintf(stderr, "ridgekv: writing to stdout failed: %s\n", strerror(errno ? errno : EIO));
        rc = RK_EXIT_IO;
    }
    return rc;
}

static int dispatch(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return RK_EXIT_USAGE;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h") || !strcmp(c, "help")) {
        usage(stdout);
        return RK_EXIT_OK;
    }
    if (!strcmp(c, "--version")) {
        printf("ridgekv %s\n", RK_VERSION);
        return RK_EXIT_OK;
    }
    if (!strcmp(c, "run")) return cmd_run(argc, argv);
    if (!strcmp(c, "info")) return cmd_info(argc, argv);
    if (!strcmp(c, "bench")) return cmd_bench(argc, argv);
    if (!strcmp(c, "pull")) return cmd_pull(argc, argv);
    if (!strcmp(c, "models")) return cmd_models(argc, argv);
    if (!strcmp(c, "eval")) return cmd_eval(argc, argv);
    if (!strcmp(c, "calibrate")) return cmd_calibrate(argc, argv);
    if (!strcmp(c, "prepare")) return cmd_prepare(argc, argv);
    if (!strcmp(c, "serve")) return cmd_serve(argc, argv);
    if (!strcmp(c, "chat")) return cmd_chat(argc, argv);
    if (!strcmp(c, "ask")) return cmd_ask(argc, argv);
    if (!strcmp(c, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(c, "synth")) return cmd_synth(argc, argv);
    if (!strcmp(c, "cache")) return cmd_cache(argc, argv);
    return cli_unknown_command(c);
}
