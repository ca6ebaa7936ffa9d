#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f) {
    fprintf(f,
            "ridgekv %s - run LLMs locally, with cheap long prompts\n"
            "\n"
            "usage: ridgekv COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  chat     talk with the model in the terminal (streaming, history, /help inside)\n"
            "  ask      answer a question about documents (--doc FILE \"QUESTION\")\n"
            "  run      generate text from a prompt (-p TEXT or -f FILE)\n"
            "  info     describe a GGUF file: architecture, shapes, tensor types, tokenizer, memory\n"
            "  bench    prefill and decode throughput, peak RSS, KV bytes per token\n"
            "  eval     quality measurements (eval ppl: perplexity over a text file)\n"
            "  serve    --jsonl: JSON requests on stdin, JSON events on stdout (docs/JSONL.md)\n"
            "  calibrate  fit RidgeFill maps on text (--text FILE -o MAPS.gguf)\n"
            "  pull     fetch the default model (SmolLM2-135M-Instruct) into the cache\n"
            "  tokenize show the tokens of a text (ids and pieces)\n"
            "  synth    write a random-weight model of a real shape (benchmarks without downloads)\n"
            "\n"
            "  --version  print the version; --help  this text\n"
            "`ridgekv COMMAND --help` lists the options of each command; --flag=value works too.\n"
            "Without -m, commands use the default model in ${XDG_CACHE_HOME:-~/.cache}/ridgekv/.\n",
            RK_VERSION);
}

static int dispatch(int argc, char **argv);

int main(int argc, char **argv) {
    /* a closed stdout (| head) must be a write error the command reports (exit 5), not a
     * silent death by SIGPIPE (exit 141) */
    signal(SIGPIPE, SIG_IGN);
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
    if (!strcmp(c, "eval")) return cmd_eval(argc, argv);
    if (!strcmp(c, "calibrate")) return cmd_calibrate(argc, argv);
    if (!strcmp(c, "serve")) return cmd_serve(argc, argv);
    if (!strcmp(c, "chat")) return cmd_chat(argc, argv);
    if (!strcmp(c, "ask")) return cmd_ask(argc, argv);
    if (!strcmp(c, "tokenize")) return cmd_tokenize(argc, argv);
    if (!strcmp(c, "synth")) return cmd_synth(argc, argv);
    fprintf(stderr, "ridgekv: unknown command '%s' (try ridgekv --help)\n", c);
    return RK_EXIT_USAGE;
}
