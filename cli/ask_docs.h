/* ridgekv ask: the --doc files (taken out of argv, read and checked) and the message
 * for documents that do not fit the context. */
#pragma once
#include "cli.h"
#include "rk_gen.h"

#define CLI_MAX_DOCS 64

typedef struct cli_doc {
    const char *path; /* borrowed from argv */
    const char *name; /* base name, inside path */
    char *text;       /* owned, NUL-terminated */
    size_t len;
} cli_doc;

/* Takes the --doc values out of argv; the rest goes to rest (argc entries) for cli_parse. */
int cli_docs_split(int argc, char **argv, char **rest, int *n_rest, cli_doc *d, int *n_docs);
/* Reads every document: a missing, empty or non-text file is refused with its name (exit 5). */
int cli_docs_read(cli_doc *d, int n_docs);
void cli_docs_free(cli_doc *d, int n_docs);
/* Prints why the prompt does not fit, with per-document token counts and what to cut. */
void cli_docs_too_long(const rk_model *m, const cli_doc *d, int n_docs, int64_t n_prompt, int64_t room, int64_t n_ctx);
