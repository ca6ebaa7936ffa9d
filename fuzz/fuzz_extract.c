/* libFuzzer target for the document extractors of `ridgekv ask` (cli/extract): any bytes,
 * under a name whose extension the first byte picks (the detector's second opinion), are
 * read or refused; a read gives NUL-terminated text of the stated length, a refusal a
 * message. Build: cli/extract/*.c + this file, poppler-glib, libxml2, libzip,
 * -Icli/extract -Ibase/include.
 * Seeds: a small PDF, HTML, EPUB or DOCX file (tests/cli/doc_fixtures.c makes them) with
 * one byte in front. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "rk_extract.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check(bool ok) {
    if (!ok) __builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const char *const names[] = {NULL, "f.pdf", "f.html", "f.epub", "f.docx", "f.txt", "f.doc", "f"};
    if (size == 0) return 0;
    const char *name = names[data[0] % (sizeof names / sizeof *names)];
    rk_extract_result r = {0};
    rk_err e = {0};
    rk_status st = rk_extract_bytes(data + 1, size - 1, name, &r, &e);
    if (st == RK_OK) {
        check(r.text != NULL && r.text[r.len] == 0);
        check(r.format != RK_DOC_UNKNOWN);
        free(r.text);
    } else {
        check(e.msg[0] != 0 && r.text == NULL);
    }
    return 0;
}
