/* EPUB and DOCX: zip archives (libzip, read from memory) of XML and XHTML (libxml2).
 * EPUB: META-INF/container.xml names the OPF; the OPF's spine lists the XHTML files in
 * reading order; each becomes "[chapter N: TITLE]" and its text. DOCX: the paragraphs of
 * word/document.xml, headings as "# " lines, tables as "a | b" rows. */
#include <libxml/parser.h>
#include <libxml/tree.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <zip.h>

#include "extract_impl.h"

#define MAX_DEPTH 512

/* ---- zip members ----------------------------------------------------------------- */

/* Reads one member (at most RK_EXTRACT_MAX_BYTES) into a malloc'd NUL-terminated buffer. */
static rk_status read_member(zip_t *za, const char *member, const char *name, char **data, size_t *len, rk_err *err) {
    zip_int64_t idx = zip_name_locate(za, member, 0);
    if (idx < 0) return rk_err_set(err, RK_E_NOT_FOUND, "extract: %s has no member %s", name, member);
    zip_stat_t zs;
    zip_stat_init(&zs);
    if (zip_stat_index(za, (zip_uint64_t)idx, 0, &zs) != 0 || !(zs.valid & ZIP_STAT_SIZE))
        return rk_err_set(err, RK_E_FORMAT, "extract: %s: the zip entry of %s is damaged (%s)", name, member,
                          zip_strerror(za));
    if (zs.size > RK_EXTRACT_MAX_BYTES)
        return rk_err_set(err, RK_E_UNSUPPORTED, "extract: %s: member %s unpacks to %llu bytes (at most %zu)", name,
                          member, (unsigned long long)zs.size, RK_EXTRACT_MAX_BYTES);
    zip_file_t *f = zip_fopen_index(za, (zip_uint64_t)idx, 0);
    if (!f) {
        zip_error_t *ze = zip_get_error(za);
        if (zip_error_code_zip(ze) == ZIP_ER_NOPASSWD || zip_error_code_zip(ze) == ZIP_ER_WRONGPASSWD)
            return rk_err_set(err, RK_E_UNSUPPORTED,
                              "extract: %s is password-protected (member %s is encrypted): save an unprotected "
                              "copy and ask about that",
                              name, member);
        return rk_err_set(err, RK_E_FORMAT, "extract: %s: cannot unpack %s (libzip: %s): the file is damaged", name,
                          member, zip_strerror(za));
    }
    size_t cap = (size_t)zs.size;
    char *buf = malloc(cap + 1);
    if (!buf) {
        zip_fclose(f);
        return rk_err_set(err, RK_E_NOMEM, "extract: out of memory for %s of %s (%zu bytes)", member, name, cap + 1);
    }
    size_t n = 0;
    for (;;) {
        char extra;
        zip_int64_t r = n < cap ? zip_fread(f, buf + n, cap - n) : zip_fread(f, &extra, 1);
        if (r < 0) {
            rk_err_set(err, RK_E_FORMAT, "extract: %s: %s is damaged (libzip: %s)", name, member, zip_file_strerror(f));
            free(buf);
            zip_fclose(f);
            return RK_E_FORMAT;
        }
        if (r == 0) break;
        if (n >= cap) {
            free(buf);
            zip_fclose(f);
            return rk_err_set(err, RK_E_FORMAT, "extract: %s: %s holds more than its stated %zu bytes (damaged)", name,
                              member, cap);
        }
        n += (size_t)r;
    }
    zip_fclose(f);
    buf[n] = 0;
    *data = buf;
    *len = n;
    return RK_OK;
}

static xmlDocPtr parse_xml(const char *data, size_t len) {
    if (len == 0 || len > INT32_MAX) return NULL;
    xmlInitParser();
    return xmlReadMemory(data, (int)len, NULL, NULL,
                         XML_PARSE_RECOVER | XML_PARSE_NONET | XML_PARSE_NOERROR | XML_PARSE_NOWARNING);
}

static bool named(const xmlNode *n, const char *local) {
    return n->type == XML_ELEMENT_NODE && !strcmp((const char *)n->name, local);
}

/* An attribute by local name, whatever its namespace (malloc'd by libxml2; NULL if absent). */
static char *attr(const xmlNode *n, const char *local) {
    for (xmlAttr *a = n->properties; a; a = a->next)
        if (!strcmp((const char *)a->name, local)) return (char *)xmlNodeGetContent((xmlNode *)a);
    return NULL;
}

/* The first element named local in document order below n (depth-limited). */
static xmlNode *find(xmlNode *n, const char *local, int depth) {
    if (depth > MAX_DEPTH) return NULL;
    for (xmlNode *c = n->children; c; c = c->next) {
        if (named(c, local)) return c;
        xmlNode *r = c->type == XML_ELEMENT_NODE ? find(c, local, depth + 1) : NULL;
        if (r) return r;
    }
    return NULL;
}

/* ---- DOCX -------------------------------------------------------------------------- */

typedef struct dwalk {
    rk_tbuf *b;
    int in_cell, n_cell;
} dwalk;

static void dbrk(dwalk *w, int n) {
    if (w->in_cell) rk_tbuf_space(w->b);
    else rk_tbuf_break(w->b, n);
}

/* Heading level (1..6) of a w:p from its w:pPr (style Heading1..9, Title, Subtitle, or an
 * outline level); 0 for body text. */
static int heading_level(xmlNode *p) {
    int level = 0;
    for (xmlNode *c = p->children; c; c = c->next) {
        if (!named(c, "pPr")) continue;
        for (xmlNode *d = c->children; d; d = d->next) {
            char *v = named(d, "pStyle") || named(d, "outlineLvl") ? attr(d, "val") : NULL;
            if (!v) continue;
            if (named(d, "outlineLvl") && v[0] >= '0' && v[0] <= '8' && !v[1]) level = v[0] - '0' + 1;
            else if (named(d, "pStyle")) {
                size_t k = strlen(v);
                if (!strncasecmp(v, "heading", 7) && k >= 8 && v[k - 1] >= '1' && v[k - 1] <= '9')
                    level = v[k - 1] - '0';
                else if (!strcasecmp(v, "Title")) level = 1;
                else if (!strcasecmp(v, "Subtitle")) level = 2;
            }
            xmlFree(v);
        }
    }
    return level > 6 ? 6 : level;
}

static void docx_walk(dwalk *w, xmlNode *n, int depth);

static void docx_children(dwalk *w, xmlNode *n, int depth) {
    for (xmlNode *c = n->children; c; c = c->next)
        if (c->type == XML_ELEMENT_NODE) docx_walk(w, c, depth + 1);
}

static void docx_walk(dwalk *w, xmlNode *n, int depth) {
    if (depth > MAX_DEPTH) return;
    const char *name = (const char *)n->name;
    /* run and paragraph properties, deleted text, field codes, the Fallback copy of
     * mc:AlternateContent (its Choice is read), tracked deletions and moved-from text */
    static const char *const skip[] = {"pPr",     "rPr",       "sectPr",   "tblPr", "tblGrid",  "trPr", "tcPr",
                                       "delText", "instrText", "Fallback", "del",   "moveFrom", NULL};
    for (const char *const *s = skip; *s; s++)
        if (!strcmp(name, *s)) return;
    if (!strcmp(name, "t")) {
        xmlChar *t = xmlNodeGetContent(n);
        if (t) rk_tbuf_text(w->b, (const char *)t, strlen((const char *)t));
        xmlFree(t);
    } else if (!strcmp(name, "tab")) {
        rk_tbuf_raw(w->b, "\t", 1);
    } else if (!strcmp(name, "br") || !strcmp(name, "cr")) {
        dbrk(w, 1);
    } else if (!strcmp(name, "noBreakHyphen")) {
        rk_tbuf_raw(w->b, "-", 1);
    } else if (!strcmp(name, "p")) {
        int level = w->in_cell ? 0 : heading_level(n);
        if (level) {
            rk_tbuf_break(w->b, 2);
            rk_tbuf_raw(w->b, "######", (size_t)level);
            rk_tbuf_raw(w->b, " ", 1);
            size_t at = w->b->n;
            docx_children(w, n, depth);
            if (w->b->n == at) w->b->n = at - (size_t)level - 1; /* an empty heading leaves no "#" */
            rk_tbuf_break(w->b, 2);
        } else {
            dbrk(w, 1);
            docx_children(w, n, depth);
            dbrk(w, 1);
        }
    } else if (!strcmp(name, "tbl")) {
        dbrk(w, 2);
        docx_children(w, n, depth);
        dbrk(w, 2);
    } else if (!strcmp(name, "tr")) {
        int saved = w->n_cell;
        dbrk(w, 1);
        w->n_cell = 0;
        docx_children(w, n, depth);
        w->n_cell = saved;
        dbrk(w, 1);
    } else if (!strcmp(name, "tc")) {
        if (w->n_cell++ > 0) rk_tbuf_cell(w->b);
        w->in_cell++;
        docx_children(w, n, depth);
        w->in_cell--;
    } else {
        docx_children(w, n, depth);
    }
}

static rk_status extract_docx(zip_t *za, const char *name, rk_extract_result *out, rk_err *err) {
    char *xml = NULL;
    size_t len = 0;
    rk_status st = read_member(za, "word/document.xml", name, &xml, &len, err);
    if (st == RK_E_NOT_FOUND)
        return rk_err_set(err, RK_E_FORMAT, "extract: %s is a zip without word/document.xml: not a DOCX (damaged?)",
                          name);
    if (st) return st;
    xmlDocPtr doc = parse_xml(xml, len);
    free(xml);
    xmlNode *root = doc ? xmlDocGetRootElement(doc) : NULL;
    if (!root) {
        if (doc) xmlFreeDoc(doc);
        return rk_err_set(err, RK_E_FORMAT, "extract: %s: word/document.xml is not XML (damaged DOCX)", name);
    }
    rk_tbuf b = {0};
    dwalk w = {.b = &b};
    docx_walk(&w, root, 0);
    xmlFreeDoc(doc);
    return rk_tbuf_take(&b, out, RK_DOC_DOCX, name, err);
}

/* ---- EPUB -------------------------------------------------------------------------- */

static int hexval(char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                  : -1;
}

/* dir (ending in '/' or empty) + href with %XX decoded, "#fragment" dropped, "x/../" and
 * "./" folded. NULL when out of memory. */
static char *resolve(const char *dir, const char *href) {
    size_t nd = strlen(dir), nh = strlen(href);
    char *p = malloc(nd + nh + 1);
    if (!p) return NULL;
    memcpy(p, dir, nd);
    size_t w = nd;
    for (size_t i = 0; i < nh && href[i] != '#'; i++) {
        int hi = i + 2 < nh ? hexval(href[i + 1]) : -1, lo = i + 2 < nh ? hexval(href[i + 2]) : -1;
        if (href[i] == '%' && hi >= 0 && lo >= 0) {
            p[w++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            p[w++] = href[i];
        }
    }
    p[w] = 0;
    /* fold segments: an output stack of path pieces */
    char *o = p, *r = p;
    while (*r) {
        char *e = strchr(r, '/');
        size_t n = e ? (size_t)(e - r) : strlen(r);
        if (n == 1 && r[0] == '.') {
            /* "./": nothing */
        } else if (n == 2 && r[0] == '.' && r[1] == '.') {
            if (o > p) {
                o--; /* the '/' after the last kept piece */
                while (o > p && o[-1] != '/') o--;
            }
        } else if (n > 0) {
            memmove(o, r, n);
            o += n;
            if (e) *o++ = '/';
        }
        r += n + (e ? 1 : 0);
    }
    *o = 0;
    return p;
}

typedef struct item {
    char *id, *href, *type;
} item;

static void collect_items(xmlNode *n, item **items, size_t *n_items, size_t *cap, int depth) {
    if (depth > MAX_DEPTH) return;
    for (xmlNode *c = n->children; c; c = c->next) {
        if (c->type != XML_ELEMENT_NODE) continue;
        if (named(c, "item")) {
            if (*n_items == *cap) {
                size_t nc = *cap ? *cap * 2 : 64;
                item *p = realloc(*items, nc * sizeof *p);
                if (!p) return;
                *items = p;
                *cap = nc;
            }
            (*items)[(*n_items)++] = (item){attr(c, "id"), attr(c, "href"), attr(c, "media-type")};
        } else {
            collect_items(c, items, n_items, cap, depth + 1);
        }
    }
}

/* A DRM'd EPUB lists its content documents (not only fonts) in META-INF/encryption.xml. */
static bool drm_protected(zip_t *za, const char *name) {
    char *x = NULL;
    size_t n = 0;
    if (read_member(za, "META-INF/encryption.xml", name, &x, &n, NULL)) return false;
    bool drm = strstr(x, ".xhtml") || strstr(x, ".html") || strstr(x, ".htm\"");
    free(x);
    return drm;
}

static rk_status extract_epub(zip_t *za, const char *name, rk_extract_result *out, rk_err *err) {
    rk_status st = RK_OK;
    char *xml = NULL, *opf_path = NULL, *dir = NULL;
    size_t len = 0, n_items = 0, cap = 0;
    item *items = NULL;
    xmlDocPtr cdoc = NULL, odoc = NULL;
    rk_tbuf b = {0};
    if (drm_protected(za, name)) {
        st = rk_err_set(err, RK_E_UNSUPPORTED,
                        "extract: %s is a DRM-protected EPUB (its chapters are encrypted): ask about a DRM-free "
                        "copy",
                        name);
        goto fail;
    }
    if ((st = read_member(za, "META-INF/container.xml", name, &xml, &len, err))) {
        if (st == RK_E_NOT_FOUND)
            st = rk_err_set(err, RK_E_FORMAT, "extract: %s is an EPUB without META-INF/container.xml (damaged)", name);
        goto fail;
    }
    cdoc = parse_xml(xml, len);
    free(xml);
    xml = NULL;
    xmlNode *rootfile = cdoc && xmlDocGetRootElement(cdoc) ? find((xmlNode *)cdoc, "rootfile", 0) : NULL;
    opf_path = rootfile ? attr(rootfile, "full-path") : NULL;
    if (!opf_path || !opf_path[0]) {
        st = rk_err_set(err, RK_E_FORMAT, "extract: %s: META-INF/container.xml names no rootfile (damaged EPUB)", name);
        goto fail;
    }
    if ((st = read_member(za, opf_path, name, &xml, &len, err))) {
        if (st == RK_E_NOT_FOUND)
            st = rk_err_set(err, RK_E_FORMAT, "extract: %s: the package file %s is missing (damaged EPUB)", name,
                            opf_path);
        goto fail;
    }
    odoc = parse_xml(xml, len);
    free(xml);
    xml = NULL;
    xmlNode *spine = odoc && xmlDocGetRootElement(odoc) ? find((xmlNode *)odoc, "spine", 0) : NULL;
    xmlNode *manifest = odoc && xmlDocGetRootElement(odoc) ? find((xmlNode *)odoc, "manifest", 0) : NULL;
    if (!spine || !manifest) {
        st = rk_err_set(err, RK_E_FORMAT, "extract: %s: the package file %s has no %s (damaged EPUB)", name, opf_path,
                        spine ? "manifest" : "spine");
        goto fail;
    }
    collect_items(manifest, &items, &n_items, &cap, 0);
    const char *slash = strrchr(opf_path, '/');
    dir = strndup(opf_path, slash ? (size_t)(slash - opf_path) + 1 : 0);
    if (!dir) {
        st = rk_err_set(err, RK_E_NOMEM, "extract: out of memory reading %s", name);
        goto fail;
    }
    int n_chapters = 0;
    for (xmlNode *c = spine->children; c; c = c->next) {
        if (!named(c, "itemref")) continue;
        char *idref = attr(c, "idref");
        const item *it = NULL;
        for (size_t i = 0; idref && i < n_items && !it; i++)
            if (items[i].id && !strcmp(items[i].id, idref)) it = &items[i];
        xmlFree(idref);
        if (!it || !it->href || (it->type && !strstr(it->type, "html"))) continue;
        char *path = resolve(dir, it->href);
        if (!path) {
            st = rk_err_set(err, RK_E_NOMEM, "extract: out of memory reading %s", name);
            goto fail;
        }
        char *page = NULL;
        size_t page_len = 0;
        st = read_member(za, path, name, &page, &page_len, err);
        if (st == RK_E_NOT_FOUND) { /* a spine entry without its file: skipped */
            free(path);
            st = RK_OK;
            continue;
        }
        if (st) {
            free(path);
            goto fail;
        }
        rk_tbuf ch = {0};
        char *heading = NULL, *title = NULL;
        bool ok = rk_html_to_text(page, page_len, &ch, &heading, &title);
        free(page);
        if (ok && ch.n > 0) {
            const char *t = heading ? heading : title ? title : it->href;
            char marker[96];
            int m = snprintf(marker, sizeof marker, "[chapter %d: ", ++n_chapters);
            rk_tbuf_break(&b, 2);
            rk_tbuf_raw(&b, marker, (size_t)m);
            rk_tbuf_text(&b, t, strlen(t));
            rk_tbuf_raw(&b, "]", 1);
            rk_tbuf_break(&b, 2);
            rk_tbuf_raw(&b, ch.p, ch.n);
        }
        rk_tbuf_free(&ch);
        free(heading);
        free(title);
        free(path);
    }
    if (n_chapters == 0) {
        st = rk_err_set(err, RK_E_UNSUPPORTED,
                        "extract: %s is an EPUB whose spine holds no text (images only?): nothing to read", name);
        goto fail;
    }
    st = rk_tbuf_take(&b, out, RK_DOC_EPUB, name, err);
fail:
    for (size_t i = 0; i < n_items; i++) xmlFree(items[i].id), xmlFree(items[i].href), xmlFree(items[i].type);
    free(items);
    free(dir);
    xmlFree(opf_path);
    if (cdoc) xmlFreeDoc(cdoc);
    if (odoc) xmlFreeDoc(odoc);
    free(xml);
    rk_tbuf_free(&b);
    return st;
}

/* ---- entry --------------------------------------------------------------------------- */

rk_status rk_extract_zip(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err) {
    rk_doc_format f = rk_extract_detect(data, len, name);
    const char *what = f == RK_DOC_EPUB ? "EPUB" : "DOCX";
    zip_error_t ze;
    zip_error_init(&ze);
    zip_source_t *src = zip_source_buffer_create(data, len, 0, &ze);
    zip_t *za = src ? zip_open_from_source(src, ZIP_RDONLY | ZIP_CHECKCONS, &ze) : NULL;
    if (!za) {
        rk_status st = rk_err_set(err, RK_E_FORMAT,
                                  "extract: %s is a damaged zip archive (libzip: %s): the %s file is truncated or "
                                  "corrupt; download or export it again",
                                  name, zip_error_strerror(&ze), what);
        zip_error_fini(&ze);
        if (src) zip_source_free(src);
        return st;
    }
    zip_error_fini(&ze);
    rk_status st = f == RK_DOC_EPUB ? extract_epub(za, name, out, err) : extract_docx(za, name, out, err);
    zip_discard(za); /* frees src too */
    return st;
}
