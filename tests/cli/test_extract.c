/* Document text extraction (cli/extract): each format on a fixture made here, the markers
 * an answer can cite, and each refusal's message (format named, what to do). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "doc_fixtures.h"
#include "rk_extract.h"

static rk_extract_result ok(const void *data, size_t len, const char *name, rk_doc_format want) {
    rk_extract_result r = {0};
    rk_err e = {0};
    rk_status st = rk_extract_bytes(data, len, name, &r, &e);
    cr_assert_eq(st, RK_OK, "%s: %s", name, e.msg);
    cr_assert_eq(r.format, want, "%s: format %s", name, rk_doc_format_name(r.format));
    cr_assert(r.text && strlen(r.text) == r.len, "%s: NUL-terminated text of len bytes", name);
    return r;
}

/* Fails with st and a message holding each of the (NULL-terminated) needles. */
static void refused(const void *data, size_t len, const char *name, rk_status st, const char *const *needles) {
    rk_extract_result r = {.text = (char *)"untouched"};
    rk_err e = {0};
    rk_status got = rk_extract_bytes(data, len, name, &r, &e);
    cr_expect_eq(got, st, "%s: status %d, message: %s", name, got, e.msg);
    cr_expect_str_eq(r.text, "untouched", "%s: out-param written on failure", name);
    for (; *needles; needles++) cr_expect(strstr(e.msg, *needles), "%s: no \"%s\" in: %s", name, *needles, e.msg);
}

Test(extract, pdf_pages_with_markers) {
    const char *lines[] = {"The first page names Paris.", "The second page names Berlin."};
    size_t len;
    char *pdf = fx_pdf(FX_PDF_TEXT, lines, 2, &len);
    rk_extract_result r = ok(pdf, len, "two.pdf", RK_DOC_PDF);
    cr_expect_str_eq(r.text, "[page 1]\nThe first page names Paris.\n\n[page 2]\nThe second page names Berlin.\n");
    free(r.text);
    /* magic first: a PDF named .txt is still a PDF */
    r = ok(pdf, len, "misnamed.txt", RK_DOC_PDF);
    cr_expect(strstr(r.text, "[page 2]\nThe second page"), "%s", r.text);
    free(r.text);
    free(pdf);
}

Test(extract, pdf_refusals) {
    const char *lines[] = {"secret", "secret"};
    size_t len;
    char *pdf = fx_pdf(FX_PDF_ENCRYPTED, lines, 1, &len);
    refused(pdf, len, "locked.pdf", RK_E_UNSUPPORTED,
            (const char *[]){"locked.pdf", "encrypted PDF", "qpdf --decrypt", NULL});
    free(pdf);
    pdf = fx_pdf(FX_PDF_NO_TEXT, lines, 2, &len);
    refused(pdf, len, "scan.pdf", RK_E_UNSUPPORTED,
            (const char *[]){"scan.pdf", "no text layer", "2 pages", "run OCR first (e.g. ocrmypdf", NULL});
    free(pdf);
    const char garbage[] = "%PDF-1.7\n\x01\x02 this is no PDF body at all \xff\xfe\n";
    refused(garbage, sizeof garbage - 1, "junk.pdf", RK_E_FORMAT, (const char *[]){"junk.pdf", "PDF", "damaged", NULL});
    /* a truncated PDF (the first 60% of a good one) must not crash; poppler may recover */
    pdf = fx_pdf(FX_PDF_TEXT, (const char *[]){"alpha", "beta"}, 2, &len);
    rk_extract_result r = {0};
    rk_err e = {0};
    if (rk_extract_bytes(pdf, len * 6 / 10, "cut.pdf", &r, &e) == RK_OK) free(r.text);
    else cr_expect(strstr(e.msg, "cut.pdf") && strstr(e.msg, "PDF"), "%s", e.msg);
    free(pdf);
    refused("just words", 10, "fake.pdf", RK_E_FORMAT, (const char *[]){"fake.pdf", "not a PDF", NULL});
}

Test(extract, html_drops_scripts_and_styles_decodes_entities) {
    const char *html =
        "<!DOCTYPE html>\n<html><head><title>Tide tables</title><style>body { color: red; }</style>"
        "<script>var hidden = 'no';</script></head>\n<body>\n<h1>Harbour &amp; Tides</h1>\n"
        "<p>High   tide\n is at <b>6&nbsp;pm</b>&#8212;caf&eacute; opens &lt;early&gt;.</p>"
        "<script type=\"text/javascript\">document.write('nope')</script><noscript>enable js</noscript>"
        "<h2>Table</h2><table><tr><th>Day</th><th>Time</th></tr><tr><td>Mon</td><td><p>06:10</p></td></tr></table>"
        "<ul><li>one</li><li>two</li></ul><pre>a  b\n  c</pre><!-- a comment --><p>End<br>line two</p>"
        "</body></html>\n";
    rk_extract_result r = ok(html, strlen(html), "page.html", RK_DOC_HTML);
    cr_expect_str_eq(r.text, "# Harbour & Tides\n\nHigh tide is at 6 pm\xE2\x80\x94"
                             "caf\xC3\xA9 opens <early>.\n\n## Table\n\nDay | Time\nMon | 06:10\n- one\n- two\n\n"
                             "a  b\n  c\n\nEnd\nline two\n");
    cr_expect(!strstr(r.text, "hidden") && !strstr(r.text, "color") && !strstr(r.text, "nope") &&
                  !strstr(r.text, "comment"),
              "%s", r.text);
    free(r.text);
    /* no heading in the body: the <title> is the first line; a fragment named .htm is HTML */
    const char *frag = "<p>Only a paragraph &quot;quoted&quot;.</p><title>T</title>";
    r = ok(frag, strlen(frag), "frag.htm", RK_DOC_HTML);
    cr_expect(strstr(r.text, "Only a paragraph \"quoted\".") && !strstr(r.text, "<p>"), "%s", r.text);
    free(r.text);
    /* the same fragment named .txt stays text, tags and all */
    r = ok(frag, strlen(frag), "frag.txt", RK_DOC_TEXT);
    cr_expect_str_eq(r.text, frag);
    free(r.text);
}

Test(extract, epub_spine_order_and_chapter_markers) {
    size_t len;
    char *epub = fx_epub(&len);
    rk_extract_result r = ok(epub, len, "book.epub", RK_DOC_EPUB);
    /* the spine lists chapter two first; one's heading names its marker, two has only <title> */
    cr_expect_str_eq(r.text,
                     "[chapter 1: Two]\n\nBefore the harbour came the storm.\n\n"
                     "[chapter 2: The Harbour]\n\n# The Harbour\n\nThe boat is called Marguerite & it is blue.\n");
    free(r.text);
    /* magic first: detected with no name at all */
    r = ok(epub, len, NULL, RK_DOC_EPUB);
    free(r.text);
    /* a truncated archive is refused as a damaged zip */
    refused(epub, len / 2, "book.epub", RK_E_FORMAT,
            (const char *[]){"book.epub", "damaged zip", "EPUB", "truncated or corrupt", NULL});
    free(epub);
}

Test(extract, docx_paragraphs_headings_tabs_tables) {
    size_t len;
    char *docx = fx_docx(&len);
    rk_extract_result r = ok(docx, len, "report.docx", RK_DOC_DOCX);
    cr_expect_str_eq(r.text, "# Quarterly Report\n\nSales rose twelve percent.\nName\tValue\nNext line\n\n"
                             "Region | Total\nNorth | 42\n\n## Outlook\n\nSteady.\n");
    cr_expect(!strstr(r.text, "deleted"), "deleted text is dropped: %s", r.text);
    free(r.text);
    refused(docx, len - 30, "report.docx", RK_E_FORMAT, (const char *[]){"report.docx", "damaged zip", "DOCX", NULL});
    free(docx);
    /* a zip that is neither */
    size_t zl;
    char *zip = fx_zip((const char *[]){"a.txt"}, (const char *[]){"hello"}, 1, &zl);
    refused(zip, zl, "archive.zip", RK_E_UNSUPPORTED, (const char *[]){"neither EPUB nor DOCX", NULL});
    /* named .docx but without word/document.xml */
    refused(zip, zl, "empty.docx", RK_E_FORMAT, (const char *[]){"empty.docx", "word/document.xml", NULL});
    free(zip);
}

Test(extract, text_boms_and_utf16) {
    /* "héllo 𝄞\n" in UTF-16LE and BE with BOMs, and UTF-8 with a BOM */
    const unsigned char le[] = {0xFF, 0xFE, 'h', 0, 0xE9, 0,    'l',  0,    'l',  0,
                                'o',  0,    ' ', 0, 0x34, 0xD8, 0x1E, 0xDD, '\n', 0};
    const unsigned char be[] = {0xFE, 0xFF, 0, 'h', 0,    0xE9, 0,    'l',  0, 'l',
                                0,    'o',  0, ' ', 0xD8, 0x34, 0xDD, 0x1E, 0, '\n'};
    const char *want = "h\xC3\xA9llo \xF0\x9D\x84\x9E\n";
    rk_extract_result r = ok(le, sizeof le, "le.txt", RK_DOC_TEXT);
    cr_expect_str_eq(r.text, want);
    free(r.text);
    r = ok(be, sizeof be, "be.txt", RK_DOC_TEXT);
    cr_expect_str_eq(r.text, want);
    free(r.text);
    const char bom8[] = "\xEF\xBB\xBFh\xC3\xA9llo \xF0\x9D\x84\x9E\n";
    r = ok(bom8, sizeof bom8 - 1, "bom.md", RK_DOC_TEXT);
    cr_expect_str_eq(r.text, want);
    free(r.text);
    /* an unpaired surrogate and an odd last byte become U+FFFD */
    const unsigned char bad[] = {0xFF, 0xFE, 0x00, 0xD8, 'a', 0, 'z'};
    r = ok(bad, sizeof bad, "bad.txt", RK_DOC_TEXT);
    cr_expect_str_eq(r.text, "\xEF\xBF\xBD"
                             "a\xEF\xBF\xBD");
    free(r.text);
}

Test(extract, detection_magic_first_extension_second) {
    const char *md = "# Notes\nA PDF starts with %PDF-1.7 and HTML with <html>.\n";
    cr_expect_eq(rk_extract_detect(md, strlen(md), "notes.md"), RK_DOC_TEXT);
    const char *tagged = "<p>markdown may hold tags</p>\n<body> too\n";
    cr_expect_eq(rk_extract_detect(tagged, strlen(tagged), "notes.md"), RK_DOC_TEXT);
    cr_expect_eq(rk_extract_detect(tagged, strlen(tagged), "page"), RK_DOC_HTML);
    cr_expect_eq(rk_extract_detect(tagged, strlen(tagged), NULL), RK_DOC_HTML);
    const char *doctype = "\n  <!DOCTYPE html><p>x</p>";
    cr_expect_eq(rk_extract_detect(doctype, strlen(doctype), "saved.txt"), RK_DOC_HTML);
    const char *junk = "Content-Type: application/pdf\r\n\r\n%PDF-1.4\n";
    cr_expect_eq(rk_extract_detect(junk, strlen(junk), "mail.pdf"), RK_DOC_PDF);
    cr_expect_eq(rk_extract_detect(junk, strlen(junk), "mail.txt"), RK_DOC_TEXT);
    cr_expect_eq(rk_extract_detect("", 0, NULL), RK_DOC_TEXT);
    cr_expect_str_eq(rk_doc_format_name(RK_DOC_DOCX), "DOCX");
}

Test(extract, binary_refusals_name_the_format_and_the_fix) {
    const unsigned char doc[] = {0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1, 0, 0, 0, 0};
    refused(doc, sizeof doc, "old.doc", RK_E_UNSUPPORTED, (const char *[]){"old.doc", "save it as .docx", NULL});
    const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n', 0, 0, 0, 13};
    refused(png, sizeof png, "shot.png", RK_E_UNSUPPORTED, (const char *[]){"image (PNG)", "OCR", NULL});
    const unsigned char bin[] = {0x7F, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0};
    refused(bin, sizeof bin, "a.out", RK_E_UNSUPPORTED,
            (const char *[]){"a.out", "unknown format", "PDF, HTML, EPUB and DOCX", NULL});
    size_t zl;
    char *odt =
        fx_zip((const char *[]){"mimetype", "content.xml"},
               (const char *[]){"application/vnd.oasis.opendocument.text", "<office:document-content/>"}, 2, &zl);
    refused(odt, zl, "letter.odt", RK_E_UNSUPPORTED, (const char *[]){"letter.odt", "OpenDocument", ".docx", NULL});
    free(odt);
    refused("{\\rtf1 hi}", 10, "x.rtf", RK_E_UNSUPPORTED, (const char *[]){"RTF", ".docx", NULL});
}

Test(extract, file_and_stream_entry_points) {
    char dir[] = "/tmp/rk_extract_XXXXXX", path[64];
    cr_assert(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/notes.pdf", dir);
    size_t len;
    char *pdf = fx_pdf(FX_PDF_TEXT, (const char *[]){"Filed text."}, 1, &len);
    fx_write(path, pdf, len);
    rk_extract_result r = {0};
    rk_err e = {0};
    cr_assert_eq(rk_extract_file(path, &r, &e), RK_OK, "%s", e.msg);
    cr_expect_str_eq(r.text, "[page 1]\nFiled text.\n");
    free(r.text);
    cr_expect_eq(rk_extract_file(dir, &r, &e), RK_E_IO, "a directory: %s", e.msg);
    snprintf(path, sizeof path, "%s/missing.txt", dir);
    cr_expect_eq(rk_extract_file(path, &r, &e), RK_E_NOT_FOUND, "%s", e.msg);
    /* a stream read to its end */
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    cr_assert_eq(write(fds[1], pdf, len), (ssize_t)len);
    close(fds[1]);
    char *data = NULL;
    size_t n = 0;
    cr_assert_eq(rk_extract_read_fd(fds[0], "stdin", &data, &n, &e), RK_OK, "%s", e.msg);
    close(fds[0]);
    cr_expect(n == len && !memcmp(data, pdf, len) && data[n] == 0);
    free(data);
    free(pdf);
    snprintf(path, sizeof path, "%s/notes.pdf", dir);
    unlink(path);
    rmdir(dir);
}

/* Every prefix of each fixture (and a few bit flips) is read or refused, never a crash. */
Test(extract, damaged_fixtures_never_crash) {
    size_t lens[3];
    char *docs[3] = {fx_epub(&lens[0]), fx_docx(&lens[1]),
                     fx_pdf(FX_PDF_TEXT, (const char *[]){"a", "b"}, 2, &lens[2])};
    for (int d = 0; d < 3; d++) {
        for (size_t cut = 0; cut < lens[d]; cut += 1 + lens[d] / 97) {
            rk_extract_result r = {0};
            rk_err e = {0};
            if (rk_extract_bytes(docs[d], cut, "cut", &r, &e) == RK_OK) free(r.text);
            else cr_expect(e.msg[0], "a refusal has a message");
        }
        char *copy = malloc(lens[d]);
        for (size_t at = 7; at < lens[d]; at += 1 + lens[d] / 53) {
            memcpy(copy, docs[d], lens[d]);
            copy[at] ^= 0x5A;
            rk_extract_result r = {0};
            rk_err e = {0};
            if (rk_extract_bytes(copy, lens[d], "flip", &r, &e) == RK_OK) free(r.text);
        }
        free(copy);
        free(docs[d]);
    }
}
