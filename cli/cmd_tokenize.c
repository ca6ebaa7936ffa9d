/* ridgekv tokenize: the tokens of a text as the model's tokenizer makes them (what
 * llama.cpp's llama-tokenize shows): one line per token, id and piece; or the ids only. */
#include <stdlib.h>
#include <string.h>

#include "cli_gen.h"
#include "rk_io.h"

static const char *help =
    "usage: ridgekv tokenize [-m MODEL] (-p TEXT | -f FILE | TEXT...) [options]\n"
    "\n"
    "Prints the tokens of the text: one line per token, its id, a tab and its piece in\n"
    "single quotes (\\n, \\t, \\r, \\\\, \\' and \\xNN escaped), then \"N tokens\" on stderr.\n"
    "Words given without -p are joined by single spaces.\n"
    "\n"
    "  -m, --model FILE        GGUF model (default: the cached SmolLM2-135M-Instruct)\n"
    "  -p, --prompt TEXT       the text\n"
    "  -f, --file FILE         read the text from FILE (CRLF becomes LF; non-UTF-8 is converted, with a warning)\n"
    "      --ids               print only the ids, space-separated, on one line\n"
    "      --no-bos            do not add the BOS token the vocabulary asks for\n"
    "      --no-special        treat special-token markup (<|im_start|>) as plain text\n"
    "  -v, --verbose           the model's name and vocabulary size on stderr\n"
    "\n"
    "exit codes: 0 done, 2 bad usage, 3 model unusable, 5 reading FILE or writing failed,\n"
    "6 no default model\n";

static void put_piece(const char *p, size_t n) {
    for (size_t j = 0; j < n; j++) {
        unsigned char ch = (unsigned char)p[j];
        if (ch == '\n') fputs("\\n", stdout);
        else if (ch == '\t') fputs("\\t", stdout);
        else if (ch == '\r') fputs("\\r", stdout);
        else if (ch == '\'' || ch == '\\') printf("\\%c", ch);
        else if (ch < 0x20 || ch == 0x7f) printf("\\x%02x", ch);
        else putchar(ch);
    }
}

int cmd_tokenize(int argc, char **argv) {
    bool ids_only = false, bos = true, special = true;
    char **rest = calloc((size_t)argc + 1, sizeof *rest);
    const char **pos = calloc((size_t)argc + 1, sizeof *pos);
    if (!rest || !pos) {
        free(rest);
        free(pos);
        return RK_EXIT_ERROR;
    }
    int n_rest = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (i >= 2 && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            fputs(help, stdout);
            free(rest);
            free(pos);
            return RK_EXIT_OK;
        }
        if (i >= 2 && !strcmp(a, "--ids")) ids_only = true;
        else if (i >= 2 && !strcmp(a, "--no-bos")) bos = false;
        else if (i >= 2 && !strcmp(a, "--no-special")) special = false;
        else rest[n_rest++] = argv[i];
    }
    cli_opts o = {.sp = rk_sampler_params_default()};
    int n_pos = 0, rc = cli_parse(n_rest, rest, 2, &o, pos, argc, &n_pos, "tokenize");
    free(rest);
    char *text = NULL;
    size_t len = 0;
    rk_model *m = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (rc) goto done;
    if ((o.prompt != NULL) + (o.prompt_file != NULL) + (n_pos > 0) != 1) {
        fprintf(stderr, "ridgekv tokenize: give the text once: -p TEXT, -f FILE or as arguments (see ridgekv "
                        "tokenize --help)\n");
        rc = RK_EXIT_USAGE;
        goto done;
    }
    rk_err e = {0};
    if (o.prompt_file) {
        if (rk_io_read_file(o.prompt_file, &text, &len, &e)) {
            cli_print_error(&e);
            rc = RK_EXIT_IO;
            goto done;
        }
        if ((rc = cli_text_clean("tokenize", o.prompt_file, &text, &len))) goto done;
    } else if (o.prompt) {
        len = strlen(o.prompt);
        text = strdup(o.prompt);
    } else {
        for (int i = 0; i < n_pos; i++) len += strlen(pos[i]) + 1;
        if ((text = malloc(len + 1))) {
            text[0] = 0;
            for (int i = 0; i < n_pos; i++) {
                if (i) strcat(text, " ");
                strcat(text, pos[i]);
            }
            len = strlen(text);
        }
    }
    if (!text) {
        fprintf(stderr, "ridgekv tokenize: out of memory\n");
        rc = RK_EXIT_ERROR;
        goto done;
    }
    if ((rc = cli_load_model(&o, &m))) goto done;
    if (o.verbose)
        fprintf(stderr, "ridgekv tokenize: %s, %d tokens in the vocabulary\n", rk_model_name(m),
                rk_model_hparams(m)->n_vocab);
    rk_status st = rk_model_tokenize(m, text, len, bos, special, &ids, &n, &e);
    if (st) {
        cli_print_error(&e);
        rc = cli_exit_code(st);
        goto done;
    }
    char stack[256];
    for (size_t i = 0; i < n; i++) {
        if (ids_only) {
            printf(i ? " %d" : "%d", ids[i]);
            continue;
        }
        size_t k = rk_model_token_piece(m, ids[i], true, stack, sizeof stack);
        printf("%d\t'", ids[i]);
        put_piece(stack, k < sizeof stack ? k : sizeof stack);
        fputs("'\n", stdout);
    }
    if (ids_only) putchar('\n');
    fprintf(stderr, "ridgekv tokenize: %zu tokens\n", n);
    rc = RK_EXIT_OK; /* main reports a failed write to stdout (exit 5) */
done:
    free(ids);
    free(text);
    free(pos);
    rk_model_destroy(m);
    return rc;
}
