/* Format detection, plain text (BOMs, UTF-16), the shared text builder, and the entry
 * points of rk_extract.h. */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "extract_impl.h"

const char *rk_doc_format_name(rk_doc_format f) {
    switch (f) {
    case RK_DOC_TEXT: return "text";
    case RK_DOC_PDF: return "PDF";
    case RK_DOC_HTML: return "HTML";
    case RK_DOC_EPUB: return "EPUB";
    case RK_DOC_DOCX: return "DOCX";
    default: return "unknown";
    }
}

/* ---- the text builder ---------------------------------------------------------- */

void rk_tbuf_free(rk_tbuf *b) {
    if (!b) return;
    free(b->p);
    *b = (rk_tbuf){0};
}

static bool tb_reserve(rk_tbuf *b, size_t extra) {
    if (b->oom) return false;
    if (extra > RK_EXTRACT_MAX_BYTES || b->n + extra + 1 > RK_EXTRACT_MAX_BYTES * 4) {
        b->oom = true; /* more text than any document ask reads: treated as out of memory */
        return false;
    }
    if (b->n + extra + 1 <= b->cap) return true;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra + 1) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->oom = true;
        return false;
    }
    b->p = p;
    b->cap = cap;
    return true;
}

static void tb_flush(rk_tbuf *b) {
    if (b->n == 0) {
        b->want_nl = 0;
        b->want_space = false;
        return;
    }
    if (b->want_nl) {
        /* lines end without trailing spaces */
        while (b->n && b->p[b->n - 1] == ' ') b->n--;
        int have = 0;
        for (size_t i = b->n; i > 0 && b->p[i - 1] == '\n' && have < 2; i--) have++;
        for (int k = have; k < b->want_nl; k++)
            if (tb_reserve(b, 1)) b->p[b->n++] = '\n';
    } else if (b->want_space && b->p[b->n - 1] != ' ' && b->p[b->n - 1] != '\n') {
        if (tb_reserve(b, 1)) b->p[b->n++] = ' ';
    }
    b->want_nl = 0;
    b->want_space = false;
}

void rk_tbuf_raw(rk_tbuf *b, const char *s, size_t n) {
    if (n == 0) return;
    tb_flush(b);
    if (!tb_reserve(b, n)) return;
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void rk_tbuf_text(rk_tbuf *b, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        if (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v') {
            rk_tbuf_space(b);
            i++;
            continue;
        }
        /* U+00A0 (no-break space) is folded like a space */
        if ((unsigned char)s[i] == 0xC2 && i + 1 < n && (unsigned char)s[i + 1] == 0xA0) {
            rk_tbuf_space(b);
            i += 2;
            continue;
        }
        size_t j = i;
        while (j < n && !(s[j] == ' ' || s[j] == '\t' || s[j] == '\n' || s[j] == '\r' || s[j] == '\f' || s[j] == '\v' ||
                          ((unsigned char)s[j] == 0xC2 && j + 1 < n && (unsigned char)s[j + 1] == 0xA0)))
            j++;
        rk_tbuf_raw(b, s + i, j - i);
        i = j;
    }
}

void rk_tbuf_break(rk_tbuf *b, int n) {
    if (n > b->want_nl) b->want_nl = n > 2 ? 2 : n;
}

void rk_tbuf_space(rk_tbuf *b) { b->want_space = true; }

void rk_tbuf_cell(rk_tbuf *b) {
    b->want_space = false;
    rk_tbuf_raw(b, " |", 2);
    b->want_space = true;
}

rk_status rk_tbuf_take(rk_tbuf *b, rk_extract_result *out, rk_doc_format f, const char *name, rk_err *err) {
    if (b->oom || !tb_reserve(b, 1)) {
        rk_tbuf_free(b);
        return rk_err_set(err, RK_E_NOMEM, "extract: out of memory for the text of %s (%s)", name,
                          rk_doc_format_name(f));
    }
    while (b->n && (b->p[b->n - 1] == ' ' || b->p[b->n - 1] == '\n')) b->n--;
    if (b->n) b->p[b->n++] = '\n';
    b->p[b->n] = 0;
    *out = (rk_extract_result){.text = b->p, .len = b->n, .format = f};
    *b = (rk_tbuf){0};
    return RK_OK;
}

/* ---- detection ----------------------------------------------------------------- */

static const char *ext_of(const char *name) {
    if (!name) return "";
    const char *slash = strrchr(name, '/'), *dot = strrchr(name, '.');
    return dot && (!slash || dot > slash) ? dot + 1 : "";
}

static bool starts(const unsigned char *p, size_t n, const char *magic, size_t m) {
    return n >= m && !memcmp(p, magic, m);
}

/* The first bytes look like HTML: a doctype or an <html>/<head>/<body> tag near the start
 * (strict: the first tag must be the doctype or <html>, for files named as text). */
static bool sniff_html(const unsigned char *p, size_t n, bool strict) {
    size_t i = 0, lim = n < 1024 ? n : 1024;
    if (starts(p, n, "\xEF\xBB\xBF", 3)) i = 3;
    while (i < lim && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r' || p[i] == '\n')) i++;
    if (i < lim && p[i] != '<') return false;
    static const char *tags[] = {"<!doctype html", "<html", "<head", "<body"};
    if (strict)
        return (i + 14 <= lim && !strncasecmp((const char *)p + i, tags[0], 14)) ||
               (i + 5 <= lim && !strncasecmp((const char *)p + i, tags[1], 5));
    for (size_t k = i; k < lim; k++) {
        if (p[k] != '<') continue;
        for (size_t t = 0; t < sizeof tags / sizeof *tags; t++) {
            size_t m = strlen(tags[t]);
            if (k + m <= lim && !strncasecmp((const char *)p + k, tags[t], m)) return true;
        }
    }
    return false;
}

static bool has_bytes(const unsigned char *p, size_t n, const char *s) {
    size_t m = strlen(s);
    return n >= m && memmem(p, n, s, m) != NULL;
}

rk_doc_format rk_extract_detect(const void *data, size_t len, const char *name) {
    const unsigned char *p = data;
    const char *ext = ext_of(name);
    /* "%PDF-" opens a PDF; readers also accept it later in the first KiB (after junk a
     * mailer or a web server put in front), which is trusted only for a .pdf name so that
     * a text about PDFs stays text */
    if (starts(p, len, "%PDF-", 5) ||
        (!strcasecmp(ext, "pdf") && len >= 5 && memmem(p, len < 1024 ? len : 1024, "%PDF-", 5)))
        return RK_DOC_PDF;
    if (starts(p, len, "PK\x03\x04", 4) || starts(p, len, "PK\x05\x06", 4)) {
        /* EPUB's first member is an uncompressed "mimetype"; zip names are stored in clear */
        if (len >= 58 && !memcmp(p + 30, "mimetypeapplication/epub+zip", 28)) return RK_DOC_EPUB;
        if (has_bytes(p, len, "word/document.xml")) return RK_DOC_DOCX;
        if (!strcasecmp(ext, "epub")) return RK_DOC_EPUB;
        if (!strcasecmp(ext, "docx")) return RK_DOC_DOCX;
        return RK_DOC_UNKNOWN;
    }
    if (starts(p, len, "\xFF\xFE", 2) || starts(p, len, "\xFE\xFF", 2)) return RK_DOC_TEXT;
    if (sniff_html(p, len, !strcasecmp(ext, "txt") || !strcasecmp(ext, "md") || !strcasecmp(ext, "markdown")))
        return RK_DOC_HTML;
    if (memchr(p, 0, len)) return RK_DOC_UNKNOWN;
    if (!strcasecmp(ext, "html") || !strcasecmp(ext, "htm") || !strcasecmp(ext, "xhtml")) return RK_DOC_HTML;
    if (starts(p, len, "{\\rtf", 5)) return RK_DOC_UNKNOWN;
    if (!strcasecmp(ext, "pdf") || !strcasecmp(ext, "epub") || !strcasecmp(ext, "docx") || !strcasecmp(ext, "doc"))
        return RK_DOC_UNKNOWN; /* named as a binary format, holding none of its bytes */
    return RK_DOC_TEXT;
}

/* The refusal for bytes of no format read here, naming what they look like. */
static rk_status refuse_unknown(const unsigned char *p, size_t len, const char *name, rk_err *err) {
    const char *ext = ext_of(name);
    if (starts(p, len, "\xD0\xCF\x11\xE0\xA1\xB1\x1A\xE1", 8))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "extract: %s is an old binary Office file (.doc, .xls or .ppt): save it as .docx "
                          "(or PDF) and ask again",
                          name);
    if (starts(p, len, "{\\rtf", 5))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "extract: %s is an RTF document: save it as .docx or .txt and ask again", name);
    if (len >= 30 + 39 && starts(p, len, "PK\x03\x04", 4) &&
        !memcmp(p + 30, "mimetypeapplication/vnd.oasis.opendocument", 39))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "extract: %s is an OpenDocument file (ODT, ODS, ODP): save it as .docx or PDF and ask "
                          "again",
                          name);
    if (starts(p, len, "PK\x03\x04", 4) || starts(p, len, "PK\x05\x06", 4))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "extract: %s is a zip archive that is neither EPUB nor DOCX (no mimetype "
                          "application/epub+zip, no word/document.xml): save the document as .docx, "
                          "EPUB, PDF or text",
                          name);
    static const struct {
        const char *magic;
        size_t n;
        const char *what;
    } img[] = {{"\x89PNG", 4, "PNG"}, {"\xFF\xD8\xFF", 3, "JPEG"}, {"GIF8", 4, "GIF"},
               {"II*\0", 4, "TIFF"},  {"MM\0*", 4, "TIFF"},        {"RIFF", 4, "RIFF (WebP?)"}};
    for (size_t i = 0; i < sizeof img / sizeof *img; i++)
        if (starts(p, len, img[i].magic, img[i].n))
            return rk_err_set(err, RK_E_UNSUPPORTED,
                              "extract: %s is an image (%s), not text: run OCR first (e.g. tesseract) and "
                              "ask about its output",
                              name, img[i].what);
    if (!strcasecmp(ext, "pdf"))
        return rk_err_set(err, RK_E_FORMAT, "extract: %s is named .pdf but is not a PDF (no %%PDF- header): damaged?",
                          name);
    if (!strcasecmp(ext, "docx") || !strcasecmp(ext, "epub"))
        return rk_err_set(err, RK_E_FORMAT,
                          "extract: %s is named .%s but is not a zip archive (no PK header): damaged?", name, ext);
    if (!strcasecmp(ext, "doc"))
        return rk_err_set(err, RK_E_UNSUPPORTED,
                          "extract: %s is named .doc but is no Word file read here: save it as .docx and ask again",
                          name);
    return rk_err_set(err, RK_E_UNSUPPORTED,
                      "extract: %s is binary data of an unknown format (it contains NUL bytes); ask reads text "
                      "(UTF-8, UTF-16 with a BOM), PDF, HTML, EPUB and DOCX",
                      name);
}

/* ---- plain text ---------------------------------------------------------------- */

static size_t put_utf8(char *o, uint32_t c) {
    if (c < 0x80) return o[0] = (char)c, 1;
    if (c < 0x800) return o[0] = (char)(0xC0 | (c >> 6)), o[1] = (char)(0x80 | (c & 0x3F)), 2;
    if (c < 0x10000) {
        o[0] = (char)(0xE0 | (c >> 12)), o[1] = (char)(0x80 | ((c >> 6) & 0x3F)), o[2] = (char)(0x80 | (c & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (c >> 18)), o[1] = (char)(0x80 | ((c >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((c >> 6) & 0x3F)), o[3] = (char)(0x80 | (c & 0x3F));
    return 4;
}

/* UTF-16 (after its BOM) to UTF-8; unpaired surrogates, U+0000 and an odd last byte
 * become U+FFFD. */
static rk_status utf16_to_utf8(const unsigned char *p, size_t len, bool be, const char *name, rk_extract_result *out,
                               rk_err *err) {
    size_t n_units = len / 2;
    /* each unit gives at most 3 bytes (a surrogate pair: 4 bytes for 2 units) */
    char *o = malloc(3 * n_units + 4);
    if (!o) return rk_err_set(err, RK_E_NOMEM, "extract: out of memory converting %s from UTF-16", name);
    size_t w = 0;
    for (size_t i = 0; i < n_units; i++) {
        uint32_t u = be ? (uint32_t)(p[2 * i] << 8 | p[2 * i + 1]) : (uint32_t)(p[2 * i + 1] << 8 | p[2 * i]);
        uint32_t c = u;
        if (u >= 0xD800 && u < 0xDC00 && i + 1 < n_units) {
            uint32_t v =
                be ? (uint32_t)(p[2 * i + 2] << 8 | p[2 * i + 3]) : (uint32_t)(p[2 * i + 3] << 8 | p[2 * i + 2]);
            if (v >= 0xDC00 && v < 0xE000) {
                c = 0x10000 + ((u - 0xD800) << 10) + (v - 0xDC00);
                i++;
            } else {
                c = 0xFFFD;
            }
        } else if ((u >= 0xD800 && u < 0xE000) || u == 0) {
            c = 0xFFFD;
        }
        w += put_utf8(o + w, c);
    }
    if (len % 2) w += put_utf8(o + w, 0xFFFD);
    o[w] = 0;
    *out = (rk_extract_result){.text = o, .len = w, .format = RK_DOC_TEXT};
    return RK_OK;
}

static rk_status extract_text(const unsigned char *p, size_t len, const char *name, rk_extract_result *out,
                              rk_err *err) {
    if (starts(p, len, "\xFF\xFE", 2)) return utf16_to_utf8(p + 2, len - 2, false, name, out, err);
    if (starts(p, len, "\xFE\xFF", 2)) return utf16_to_utf8(p + 2, len - 2, true, name, out, err);
    if (starts(p, len, "\xEF\xBB\xBF", 3)) p += 3, len -= 3;
    char *o = malloc(len + 1);
    if (!o) return rk_err_set(err, RK_E_NOMEM, "extract: out of memory for %s (%zu bytes)", name, len + 1);
    memcpy(o, p, len);
    o[len] = 0;
    *out = (rk_extract_result){.text = o, .len = len, .format = RK_DOC_TEXT};
    return RK_OK;
}

/* ---- entry points -------------------------------------------------------------- */

rk_status rk_extract_bytes(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err) {
    const unsigned char *p = data ? data : (const unsigned char *)"";
    if (!name) name = "the document";
    if (len > RK_EXTRACT_MAX_BYTES)
        return rk_err_set(err, RK_E_UNSUPPORTED, "extract: %s is too large (%zu bytes vs at most %zu)", name, len,
                          RK_EXTRACT_MAX_BYTES);
    switch (rk_extract_detect(p, len, name)) {
    case RK_DOC_TEXT: return extract_text(p, len, name, out, err);
    case RK_DOC_PDF: return rk_extract_pdf(p, len, name, out, err);
    case RK_DOC_HTML: return rk_extract_html(p, len, name, out, err);
    case RK_DOC_EPUB:
    case RK_DOC_DOCX: return rk_extract_zip(p, len, name, out, err);
    default: return refuse_unknown(p, len, name, err);
    }
}

rk_status rk_extract_read_fd(int fd, const char *name, char **data, size_t *len, rk_err *err) {
    size_t n = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    if (!buf) return rk_err_set(err, RK_E_NOMEM, "extract: out of memory reading %s", name);
    for (;;) {
        if (n + 1 >= cap) {
            if (cap > RK_EXTRACT_MAX_BYTES) {
                free(buf);
                return rk_err_set(err, RK_E_UNSUPPORTED, "extract: %s is too large (over %zu bytes)", name,
                                  RK_EXTRACT_MAX_BYTES);
            }
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                return rk_err_set(err, RK_E_NOMEM, "extract: out of memory reading %s (%zu bytes)", name, cap * 2);
            }
            buf = p;
            cap *= 2;
        }
        ssize_t r = read(fd, buf + n, cap - 1 - n);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            free(buf);
            return rk_err_set(err, RK_E_IO, "extract: reading %s failed at byte %zu (%s)", name, n, strerror(e));
        }
        if (r == 0) break;
        n += (size_t)r;
        if (n > RK_EXTRACT_MAX_BYTES) {
            free(buf);
            return rk_err_set(err, RK_E_UNSUPPORTED, "extract: %s is too large (over %zu bytes)", name,
                              RK_EXTRACT_MAX_BYTES);
        }
    }
    buf[n] = 0;
    *data = buf;
    *len = n;
    return RK_OK;
}

rk_status rk_extract_file(const char *path, rk_extract_result *out, rk_err *err) {
    /* never blocks on a FIFO; refuses devices, directories and sockets by kind */
    int fd = -1;
    size_t size = 0;
    rk_status so = rk_file_open_regular(path, &fd, &size, err);
    if (so) return so;
    if ((uint64_t)size > RK_EXTRACT_MAX_BYTES) {
        close(fd);
        return rk_err_set(err, RK_E_UNSUPPORTED, "extract: %s is too large (%zu bytes vs at most %zu)", path, size,
                          (size_t)RK_EXTRACT_MAX_BYTES);
    }
    char *data = NULL;
    size_t len = 0;
    rk_status st_read = rk_extract_read_fd(fd, path, &data, &len, err);
    close(fd);
    if (st_read) return st_read;
    rk_status s = rk_extract_bytes(data, len, path, out, err);
    free(data);
    return s;
}
