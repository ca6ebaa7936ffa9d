/* Document text extraction for `ridgekv ask`: bytes in, UTF-8 text with citation markers out.
 *
 * Formats, found by magic bytes first and the file name's extension second:
 *   text  UTF-8 (a BOM is dropped), UTF-16LE/BE with a BOM (converted); other 8-bit text is
 *         passed through as it is (the caller repairs it)
 *   PDF   poppler-glib; "[page N]" before each page's text
 *   HTML  libxml2's HTML parser; headings as "# Title" lines, scripts and styles dropped,
 *         entities decoded, table rows as "a | b" lines
 *   EPUB  libzip + libxml2: META-INF/container.xml -> the OPF -> the spine in reading order;
 *         "[chapter N: TITLE]" before each spine item
 *   DOCX  libzip + libxml2: word/document.xml paragraphs; headings as "# Title" lines,
 *         tabs, breaks, table rows as "a | b" lines
 * What cannot be read (encrypted PDF, a PDF with no text layer, a damaged zip, an old binary
 * .doc, an image, other binary data) fails with an rk_err naming the format and what to do.
 * Corrupt input never aborts: every entry point is safe on arbitrary bytes (fuzz/fuzz_extract.c). */
#pragma once
#include <stddef.h>

#include "rk_base.h"

typedef enum rk_doc_format {
    RK_DOC_TEXT,
    RK_DOC_PDF,
    RK_DOC_HTML,
    RK_DOC_EPUB,
    RK_DOC_DOCX,
    RK_DOC_UNKNOWN, /* refused: binary data of no format read here */
} rk_doc_format;

/* Largest document accepted (file or stdin), and largest member unpacked from an EPUB or DOCX. */
#define RK_EXTRACT_MAX_BYTES ((size_t)256 << 20)

typedef struct rk_extract_result {
    char *text; /* owned by the caller (free), NUL-terminated UTF-8 for every format but text */
    size_t len;
    rk_doc_format format;
} rk_extract_result;

/* "text", "PDF", "HTML", "EPUB", "DOCX", "unknown". */
const char *rk_doc_format_name(rk_doc_format f);

/* The format of (data, len); name (may be NULL) is used only for its extension, when the
 * bytes do not settle it (HTML without a doctype, text). */
rk_doc_format rk_extract_detect(const void *data, size_t len, const char *name);

/* Extracts the text of a document held in memory (borrowed for the call). name (may be NULL)
 * gives the extension hint and is named in messages. On success fills *out (out->text owned
 * by the caller); on failure returns RK_E_UNSUPPORTED (a format or variant that cannot be
 * read), RK_E_FORMAT (damaged), RK_E_NOMEM, with err naming the format and the fix, and
 * leaves *out untouched. An empty text is not an error here. */
rk_status rk_extract_bytes(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err);

/* Reads path (a regular file up to RK_EXTRACT_MAX_BYTES) and extracts it as above. */
rk_status rk_extract_file(const char *path, rk_extract_result *out, rk_err *err);

/* Reads a stream (stdin) to its end, up to RK_EXTRACT_MAX_BYTES, into a malloc'd,
 * NUL-terminated buffer owned by the caller. */
rk_status rk_extract_read_fd(int fd, const char *name, char **data, size_t *len, rk_err *err);
