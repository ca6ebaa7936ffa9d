/* ridgekv ask's documents: see ask_docs.h. */
#include "ask_docs.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_gen.h"
#include "rk_extract.h"

/* The path of "--doc -": compared by address, so a file named "stdin" stays a file. */
static const char stdin_path[] = "stdin";

int cli_docs_split(int argc, char **argv, char **rest, int *n_rest, cli_doc *d, int *n_docs) {
    *n_rest = 0;
    *n_docs = 0;
    for (int i = 0; i < argc; i++) {
        if (i >= 2 && !strcmp(argv[i], "--doc")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ridgekv ask: --doc needs a value\n");
                return RK_EXIT_USAGE;
            }
            if (*n_docs >= CLI_MAX_DOCS) {
                fprintf(stderr, "ridgekv ask: at most %d documents\n", CLI_MAX_DOCS);
                return RK_EXIT_USAGE;
            }
            const char *p = argv[++i], *slash = strrchr(p, '/');
            if (!strcmp(p, "-")) { /* stdin: read once, named "stdin" in the prompt and messages */
                for (int k = 0; k < *n_docs; k++)
                    if (d[k].path == stdin_path) {
                        fprintf(stderr, "ridgekv ask: --doc - (stdin) can be given once\n");
                        return RK_EXIT_USAGE;
                    }
                d[(*n_docs)++] = (cli_doc){.path = stdin_path, .name = stdin_path};
                continue;
            }
            d[(*n_docs)++] = (cli_doc){.path = p, .name = slash && slash[1] ? slash + 1 : p};
        } else {
            rest[(*n_rest)++] = argv[i];
        }
    }
    return 0;
}

/* One document's bytes (a file, or stdin for "--doc -") as UTF-8 text with page or
 * section markers (cli/extract/rk_extract.h); the refusal names the format and the fix. */
static int read_one(cli_doc *d, bool from_stdin) {
    rk_err e = {0};
    rk_extract_result x = {0};
    rk_status st;
    if (from_stdin) {
        if (isatty(0)) fprintf(stderr, "ridgekv ask: reading the document from stdin (end it with Ctrl-D)\n");
        char *data = NULL;
        size_t len = 0;
        st = rk_extract_read_fd(0, "stdin", &data, &len, &e);
        if (!st) st = rk_extract_bytes(data, len, "stdin", &x, &e);
        free(data);
    } else {
        st = rk_extract_file(d->path, &x, &e);
    }
    if (st) {
        const char *msg = strncmp(e.msg, "extract: ", 9) ? e.msg : e.msg + 9;
        if (!strncmp(msg, d->path, strlen(d->path))) fprintf(stderr, "ridgekv ask: document %s\n", msg);
        else fprintf(stderr, "ridgekv ask: cannot read document %s: %s\n", d->path, msg);
        return st == RK_E_NOMEM ? RK_EXIT_ERROR : RK_EXIT_IO;
    }
    d->text = x.text;
    d->len = x.len;
    return 0;
}

int cli_docs_read(cli_doc *d, int n_docs) {
    for (int i = 0; i < n_docs; i++) {
        int rc = read_one(&d[i], d[i].path == stdin_path);
        if (rc) return rc;
        if (memchr(d[i].text, 0, d[i].len)) {
            fprintf(stderr,
                    "ridgekv ask: document %s is not a text file (it contains NUL bytes); "
                    "ask reads text, PDF, HTML, EPUB and DOCX\n",
                    d[i].path);
            return RK_EXIT_IO;
        }
        if (cli_text_clean("ask", d[i].path, &d[i].text, &d[i].len)) {
            fprintf(stderr, "ridgekv ask: out of memory reading %s\n", d[i].path);
            return RK_EXIT_ERROR;
        }
        const char *s = d[i].text;
        while (*s == ' ' || *s == '\n' || *s == '\r' || *s == '\t') s++;
        if (!*s) {
            fprintf(stderr, "ridgekv ask: document %s is empty\n", d[i].path);
            return RK_EXIT_IO;
        }
    }
    return 0;
}

void cli_docs_free(cli_doc *d, int n_docs) {
    for (int i = 0; i < n_docs; i++) free(d[i].text);
}

void cli_docs_too_long(const rk_model *m, const cli_doc *d, int n_docs, int64_t n_prompt, int64_t room, int64_t n_ctx) {
    const int n_ctx_train = (int)rk_model_n_ctx_max(m); /* with RoPE scaling: orig x factor */
    int64_t n_doc_total = 0, n_doc_bytes = 0;
    fprintf(stderr, "ridgekv ask: the documents do not fit the context:\n");
    for (int i = 0; i < n_docs; i++) {
        int32_t *t = NULL;
        size_t nt = 0;
        if (rk_model_tokenize(m, d[i].text, d[i].len, false, false, &t, &nt, NULL) == RK_OK) {
            fprintf(stderr, "  %s: %zu tokens (%zu bytes)\n", d[i].path, nt, d[i].len);
            n_doc_total += (int64_t)nt;
            n_doc_bytes += (int64_t)d[i].len;
        }
        free(t);
    }
    int64_t need = n_prompt + room, cut = need - n_ctx;
    fprintf(stderr,
            "  prompt %lld tokens (documents %lld, question + system prompt + template %lld) + %lld tokens of answer "
            "room\n  = %lld tokens, but the context holds %lld.\n",
            (long long)n_prompt, (long long)n_doc_total,
            (long long)(n_prompt > n_doc_total ? n_prompt - n_doc_total : 0), (long long)room, (long long)need,
            (long long)n_ctx);
    if (cut >= n_doc_total) {
        if (n_ctx < n_ctx_train)
            fprintf(stderr,
                    "Even without documents the rest leaves no room for them: raise -c (up to the model's %d) "
                    "or lower -n.\n",
                    n_ctx_train);
        else
            fprintf(stderr, "Even without documents the rest leaves no room for them: lower -n or shorten the "
                            "question and system prompt.\n");
        return;
    }
    fprintf(stderr, "Cut at least %lld tokens from the documents", (long long)cut);
    if (n_doc_total)
        fprintf(stderr, " (about %.0f bytes, %.0f%% of them)", (double)cut * (double)n_doc_bytes / (double)n_doc_total,
                100.0 * (double)cut / (double)n_doc_total + 0.5);
    if (n_ctx < n_ctx_train) fprintf(stderr, ", or raise -c (this model was trained on %d tokens)", n_ctx_train);
    else if (cut < room) fprintf(stderr, ", or lower -n to leave less answer room");
    fprintf(stderr, ". Nothing is cut automatically.\n");
}
