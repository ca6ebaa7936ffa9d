/* Internals of the extractors: the text builder they share and one entry per format. */
#pragma once
#include <stdbool.h>
#include <stddef.h>

#include "rk_extract.h"

/* Output text under construction. Words are separated by at most one space; breaks
 * between blocks are held back until the next text, so the result never starts or ends
 * with blank lines and never holds more than one blank line in a row. */
typedef struct rk_tbuf {
    char *p;
    size_t n, cap;
    int want_nl;     /* newlines owed before the next text (0, 1 or 2) */
    bool want_space; /* a space owed before the next text on the same line */
    bool oom;
} rk_tbuf;

void rk_tbuf_free(rk_tbuf *b);
/* Appends bytes as they are (no whitespace folding), after any owed break. */
void rk_tbuf_raw(rk_tbuf *b, const char *s, size_t n);
/* Appends inline text: runs of whitespace become one space. */
void rk_tbuf_text(rk_tbuf *b, const char *s, size_t n);
/* Owes a line break (n = 1) or a blank line (n = 2) before the next text. */
void rk_tbuf_break(rk_tbuf *b, int n);
/* Owes a space before the next text (unless at the start of a line). */
void rk_tbuf_space(rk_tbuf *b);
/* Writes the " | " between two table cells (dropping a space the first cell owed). */
void rk_tbuf_cell(rk_tbuf *b);
/* Hands over the text (NUL-terminated); RK_E_NOMEM when an append failed. */
rk_status rk_tbuf_take(rk_tbuf *b, rk_extract_result *out, rk_doc_format f, const char *name, rk_err *err);

/* One extractor per format; name is for messages ("stdin" when read from a stream). */
rk_status rk_extract_pdf(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err);
rk_status rk_extract_html(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err);
rk_status rk_extract_zip(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err);

/* Walks an HTML or XHTML document's body into b (shared by HTML and EPUB). heading and
 * title, when not NULL, receive the first heading's and the <title>'s text (malloc'd; NULL
 * when none). Returns false when the bytes could not be parsed at all. */
bool rk_html_to_text(const void *data, size_t len, rk_tbuf *b, char **heading, char **title);
