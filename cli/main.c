#include <stdio.h>
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
            "  pull     fetch a catalogue model into the cache (default SmolLM2-135M-Instruct)\n"
            "  models   list the catalogue (pull NAME, -m NAME) and what is in the cache\n"
            "\n"
            "`ridgekv COMMAND --help` lists the options of each command.\n"
            "Without -m, commands use the default model in ${XDG_CACHE_HOME:-~/.cache}/ridgekv/;\n"
            "-m takes a GGUF path or a catalogue name (ridgekv models).\n",
            RK_VERSION);
}

int main(int argc, char **argv) {
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
    if (!strcmp(c, "serve")) return cmd_serve(argc, argv);
    if (!strcmp(c, "chat")) return cmd_chat(argc, argv);
    if (!strcmp(c, "ask")) return cmd_ask(argc, argv);
    fprintf(stderr, "ridgekv: unknown command '%s' (try ridgekv --help)\n", c);
    return RK_EXIT_USAGE;
}
