/* PDF text through poppler-glib: "[page N]" before each page, lines folded, no text layer
 * and encryption refused with what to do. */
#include <poppler.h>
#include <stdio.h>
#include <string.h>

#include "extract_impl.h"

/* One page's text (poppler's layout lines) into b: each line folded, an empty line kept as
 * a paragraph break. Returns the count of non-space bytes. */
static size_t page_text(rk_tbuf *b, const char *t) {
    size_t n_ink = 0;
    while (*t) {
        const char *e = strchr(t, '\n');
        size_t n = e ? (size_t)(e - t) : strlen(t);
        size_t ink = 0;
        for (size_t i = 0; i < n; i++) ink += t[i] != ' ' && t[i] != '\t' && t[i] != '\r' && t[i] != '\f';
        if (ink) {
            rk_tbuf_text(b, t, n);
            rk_tbuf_break(b, 1);
        } else {
            rk_tbuf_break(b, 2);
        }
        n_ink += ink;
        t += n + (e ? 1 : 0);
    }
    return n_ink;
}

rk_status rk_extract_pdf(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err) {
    rk_status st = RK_OK;
    rk_tbuf b = {0};
    GError *gerr = NULL;
    GBytes *bytes = g_bytes_new_static(data, len);
    PopplerDocument *doc = poppler_document_new_from_bytes(bytes, NULL, &gerr);
    if (!doc) {
        if (gerr && gerr->domain == POPPLER_ERROR && gerr->code == POPPLER_ERROR_ENCRYPTED)
            st = rk_err_set(err, RK_E_UNSUPPORTED,
                            "extract: %s is an encrypted PDF (it needs a password): decrypt it first "
                            "(e.g. qpdf --decrypt --password=PASSWORD in.pdf out.pdf) and ask about the copy",
                            name);
        else
            st = rk_err_set(err, RK_E_FORMAT, "extract: %s is a damaged PDF that cannot be opened (poppler: %s)", name,
                            gerr && gerr->message ? gerr->message : "no reason given");
        goto fail;
    }
    int n_pages = poppler_document_get_n_pages(doc);
    if (n_pages <= 0) {
        st = rk_err_set(err, RK_E_FORMAT, "extract: %s is a PDF with no pages (damaged?)", name);
        goto fail;
    }
    size_t n_ink = 0;
    for (int i = 0; i < n_pages; i++) {
        char marker[32];
        int m = snprintf(marker, sizeof marker, "[page %d]", i + 1);
        rk_tbuf_break(&b, 2);
        rk_tbuf_raw(&b, marker, (size_t)m);
        rk_tbuf_break(&b, 1);
        PopplerPage *page = poppler_document_get_page(doc, i);
        if (!page) continue;
        char *t = poppler_page_get_text(page);
        if (t) n_ink += page_text(&b, t);
        g_free(t);
        g_object_unref(page);
    }
    if (n_ink == 0) {
        st = rk_err_set(err, RK_E_UNSUPPORTED,
                        "extract: %s is a PDF with no text layer (%d page%s of images, a scan?): run OCR "
                        "first (e.g. ocrmypdf in.pdf out.pdf) and ask about the copy",
                        name, n_pages, n_pages == 1 ? "" : "s");
        goto fail;
    }
    g_object_unref(doc);
    g_bytes_unref(bytes);
    return rk_tbuf_take(&b, out, RK_DOC_PDF, name, err);
fail:
    if (doc) g_object_unref(doc);
    if (gerr) g_error_free(gerr);
    g_bytes_unref(bytes);
    rk_tbuf_free(&b);
    return st;
}
