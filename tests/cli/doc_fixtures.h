/* Documents made at run time for the extraction tests: a hand-written PDF (its xref
 * offsets computed as it is written) and zip archives (EPUB, DOCX) built with libzip. */
#pragma once
#include <stddef.h>

typedef enum fx_pdf_kind {
    FX_PDF_TEXT,      /* one text line per page (Helvetica, no embedded font) */
    FX_PDF_NO_TEXT,   /* pages that only draw a line: no text layer */
    FX_PDF_ENCRYPTED, /* a Standard security handler whose empty user password fails */
} fx_pdf_kind;

/* A PDF of n_pages pages, page i showing lines[i] (ASCII, no parentheses or backslashes).
 * malloc'd; *len its size. */
char *fx_pdf(fx_pdf_kind kind, const char *const *lines, int n_pages, size_t *len);

/* A zip of n members (names[i] holding texts[i]); the first is stored uncompressed (the
 * EPUB mimetype rule), the rest deflated. malloc'd; *len its size; NULL on failure. */
char *fx_zip(const char *const *names, const char *const *texts, int n, size_t *len);

/* A minimal EPUB whose spine lists two chapters in the order opposite to the manifest's,
 * and a DOCX with a heading, runs, a tab, a line break and a 2x2 table. */
char *fx_epub(size_t *len);
char *fx_docx(size_t *len);

/* Writes len bytes to path (aborts the test on failure). */
void fx_write(const char *path, const void *data, size_t len);
