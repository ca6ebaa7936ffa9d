/* See doc_fixtures.h. */
#include "doc_fixtures.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zip.h>

char *fx_pdf(fx_pdf_kind kind, const char *const *lines, int n_pages, size_t *len) {
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    cr_assert(f);
    long off[64] = {0};
    cr_assert(n_pages > 0 && 5 + 2 * n_pages < 64);
    /* objects: 1 catalog, 2 page tree, 3 font, 4+2i page i, 5+2i its content, last: /Encrypt */
    int n_obj = 4 + 2 * n_pages + (kind == FX_PDF_ENCRYPTED);
    fprintf(f, "%%PDF-1.4\n%%\xE2\xE3\xCF\xD3\n");
    off[1] = ftell(f);
    fprintf(f, "1 0 obj\n<< /Type /Catalog /Pages 2 0 R >>\nendobj\n");
    off[2] = ftell(f);
    fprintf(f, "2 0 obj\n<< /Type /Pages /Kids [");
    for (int i = 0; i < n_pages; i++) fprintf(f, "%d 0 R ", 4 + 2 * i);
    fprintf(f, "] /Count %d >>\nendobj\n", n_pages);
    off[3] = ftell(f);
    fprintf(f, "3 0 obj\n<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica /Encoding /WinAnsiEncoding >>\nendobj\n");
    for (int i = 0; i < n_pages; i++) {
        char content[512];
        if (kind == FX_PDF_NO_TEXT) snprintf(content, sizeof content, "0 0 m 300 300 l S");
        else snprintf(content, sizeof content, "BT /F1 12 Tf 72 720 Td (%s) Tj ET", lines[i]);
        off[4 + 2 * i] = ftell(f);
        fprintf(f,
                "%d 0 obj\n<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> "
                ">> /Contents %d 0 R >>\nendobj\n",
                4 + 2 * i, 5 + 2 * i);
        off[5 + 2 * i] = ftell(f);
        fprintf(f, "%d 0 obj\n<< /Length %zu >>\nstream\n%s\nendstream\nendobj\n", 5 + 2 * i, strlen(content), content);
    }
    if (kind == FX_PDF_ENCRYPTED) {
        off[n_obj - 1] = ftell(f);
        fprintf(f, "%d 0 obj\n<< /Filter /Standard /V 1 /R 2 /P -44 /O <", n_obj - 1);
        for (int i = 0; i < 32; i++) fprintf(f, "%02x", (unsigned)(0x11 * i + 7) & 0xFF);
        fprintf(f, "> /U <");
        for (int i = 0; i < 32; i++) fprintf(f, "%02x", (unsigned)(0x35 * i + 3) & 0xFF);
        fprintf(f, "> >>\nendobj\n");
    }
    long xref = ftell(f);
    fprintf(f, "xref\n0 %d\n0000000000 65535 f \n", n_obj);
    for (int i = 1; i < n_obj; i++) fprintf(f, "%010ld 00000 n \n", off[i]);
    fprintf(f, "trailer\n<< /Size %d /Root 1 0 R", n_obj);
    if (kind == FX_PDF_ENCRYPTED)
        fprintf(f, " /Encrypt %d 0 R /ID [<0123456789abcdef0123456789abcdef> <0123456789abcdef0123456789abcdef>]",
                n_obj - 1);
    fprintf(f, " >>\nstartxref\n%ld\n%%%%EOF\n", xref);
    cr_assert_eq(fclose(f), 0);
    *len = n;
    return buf;
}

char *fx_zip(const char *const *names, const char *const *texts, int n, size_t *len) {
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_buffer_create(NULL, 0, 0, &ze);
    cr_assert(src, "zip_source_buffer_create: %s", zip_error_strerror(&ze));
    zip_t *za = zip_open_from_source(src, ZIP_TRUNCATE, &ze);
    cr_assert(za, "zip_open_from_source: %s", zip_error_strerror(&ze));
    zip_error_fini(&ze);
    zip_source_keep(src);
    for (int i = 0; i < n; i++) {
        zip_source_t *s = zip_source_buffer(za, texts[i], strlen(texts[i]), 0);
        cr_assert(s);
        zip_int64_t idx = zip_file_add(za, names[i], s, ZIP_FL_ENC_UTF_8);
        cr_assert(idx >= 0, "zip_file_add %s: %s", names[i], zip_strerror(za));
        zip_set_file_compression(za, (zip_uint64_t)idx, i == 0 ? ZIP_CM_STORE : ZIP_CM_DEFLATE, 0);
    }
    cr_assert_eq(zip_close(za), 0);
    cr_assert_eq(zip_source_open(src), 0);
    cr_assert_eq(zip_source_seek(src, 0, SEEK_END), 0);
    zip_int64_t size = zip_source_tell(src);
    cr_assert(size > 0);
    cr_assert_eq(zip_source_seek(src, 0, SEEK_SET), 0);
    char *buf = malloc((size_t)size);
    cr_assert(buf);
    cr_assert_eq(zip_source_read(src, buf, (zip_uint64_t)size), size);
    zip_source_close(src);
    zip_source_free(src);
    *len = (size_t)size;
    return buf;
}

char *fx_epub(size_t *len) {
    /* chapter two's href is percent-encoded in the OPF ("two%20b.xhtml") */
    const char *names[] = {"mimetype", "META-INF/container.xml", "OEBPS/content.opf", "OEBPS/text/one.xhtml",
                           "OEBPS/text/two b.xhtml"};
    const char *texts[] = {
        "application/epub+zip",
        "<?xml version=\"1.0\"?>\n<container version=\"1.0\" "
        "xmlns=\"urn:oasis:names:tc:opendocument:xmlns:container\"><rootfiles><rootfile "
        "full-path=\"OEBPS/content.opf\" media-type=\"application/oebps-package+xml\"/></rootfiles></container>\n",
        "<?xml version=\"1.0\"?>\n<package xmlns=\"http://www.idpf.org/2007/opf\" version=\"3.0\" "
        "unique-identifier=\"id\"><metadata xmlns:dc=\"http://purl.org/dc/elements/1.1/\"><dc:title>Fixture</dc:title>"
        "</metadata><manifest><item id=\"c1\" href=\"text/one.xhtml\" media-type=\"application/xhtml+xml\"/>"
        "<item id=\"c2\" href=\"text/two%20b.xhtml\" media-type=\"application/xhtml+xml\"/>"
        "<item id=\"css\" href=\"style.css\" media-type=\"text/css\"/></manifest>"
        "<spine><itemref idref=\"c2\"/><itemref idref=\"c1\"/></spine></package>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<html xmlns=\"http://www.w3.org/1999/xhtml\"><head><title>One"
        "</title><style>p { color: red }</style></head><body><h1>The Harbour</h1><p>The boat is "
        "called <em>Marguerite</em> &amp; it is blue.</p></body></html>\n",
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<html xmlns=\"http://www.w3.org/1999/xhtml\"><head><title>Two"
        "</title></head><body><p>Before the harbour came the storm.</p></body></html>\n",
    };
    return fx_zip(names, texts, 5, len);
}

char *fx_docx(size_t *len) {
    const char *names[] = {"[Content_Types].xml", "_rels/.rels", "word/document.xml"};
    const char *texts[] = {
        "<?xml version=\"1.0\"?><Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\">"
        "<Default Extension=\"xml\" ContentType=\"application/xml\"/></Types>",
        "<?xml version=\"1.0\"?><Relationships "
        "xmlns=\"http://schemas.openxmlformats.org/package/2006/relationships\"/>",
        "<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n"
        "<w:document xmlns:w=\"http://schemas.openxmlformats.org/wordprocessingml/2006/main\"><w:body>"
        "<w:p><w:pPr><w:pStyle w:val=\"Heading1\"/></w:pPr><w:r><w:t>Quarterly Report</w:t></w:r></w:p>"
        "<w:p><w:r><w:t xml:space=\"preserve\">Sales rose </w:t></w:r><w:r><w:rPr><w:b/></w:rPr>"
        "<w:t>twelve</w:t></w:r><w:r><w:t xml:space=\"preserve\"> percent.</w:t></w:r>"
        "<w:r><w:delText>deleted words</w:delText></w:r></w:p>"
        "<w:p><w:r><w:t>Name</w:t><w:tab/><w:t>Value</w:t><w:br/><w:t>Next line</w:t></w:r></w:p>"
        "<w:tbl><w:tr><w:tc><w:p><w:r><w:t>Region</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>Total</w:t></w:r>"
        "</w:p></w:tc></w:tr><w:tr><w:tc><w:p><w:r><w:t>North</w:t></w:r></w:p></w:tc><w:tc><w:p><w:r><w:t>42"
        "</w:t></w:r></w:p></w:tc></w:tr></w:tbl>"
        "<w:p><w:pPr><w:pStyle w:val=\"Heading2\"/></w:pPr><w:r><w:t>Outlook</w:t></w:r></w:p>"
        "<w:p><w:r><w:t>Steady.</w:t></w:r></w:p><w:sectPr/></w:body></w:document>\n",
    };
    return fx_zip(names, texts, 3, len);
}

void fx_write(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}
