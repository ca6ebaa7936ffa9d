/* HTML (and the XHTML of EPUB) to text through libxml2's HTML parser: block elements end
 * lines, headings become "# " lines, table rows "a | b" lines, list items "- " lines;
 * scripts, styles and the head are dropped; entities arrive decoded from the parser. */
#include <libxml/HTMLparser.h>
#include <libxml/tree.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "extract_impl.h"

#define MAX_DEPTH 512 /* deeper elements are skipped (the parser's own limit is lower) */

typedef struct walk {
    rk_tbuf *b;
    int pre;     /* inside <pre>: whitespace kept */
    int in_cell; /* inside a table cell or heading: blocks do not end the line */
    int n_cell;  /* cells written in the current row */
    char *heading, *title;
} walk;

static bool is(const xmlNode *n, const char *name) { return !strcasecmp((const char *)n->name, name); }

static bool any(const xmlNode *n, const char *const *names) {
    for (; *names; names++)
        if (is(n, *names)) return true;
    return false;
}

static void brk(walk *w, int n) {
    if (w->in_cell) rk_tbuf_space(w->b);
    else rk_tbuf_break(w->b, n);
}

/* Folded text content of a node (NULL when only whitespace). */
static char *folded(const xmlNode *n) {
    xmlChar *c = xmlNodeGetContent(n);
    if (!c) return NULL;
    rk_tbuf t = {0};
    rk_tbuf_text(&t, (const char *)c, strlen((const char *)c));
    xmlFree(c);
    rk_extract_result r;
    if (t.n == 0 || rk_tbuf_take(&t, &r, RK_DOC_HTML, "", NULL) != RK_OK) {
        rk_tbuf_free(&t);
        return NULL;
    }
    if (r.len && r.text[r.len - 1] == '\n') r.text[--r.len] = 0;
    return r.text;
}

static const char *const skipped[] = {"script", "style",  "noscript", "template", "svg",
                                      "math",   "iframe", "object",   "select",   NULL};
static const char *const blocks[] = {"div",   "section",  "article",    "header",  "footer",  "main",   "nav",
                                     "aside", "figure",   "figcaption", "address", "ul",      "ol",     "dl",
                                     "dt",    "dd",       "table",      "thead",   "tbody",   "tfoot",  "caption",
                                     "form",  "fieldset", "legend",     "details", "summary", "center", "body",
                                     "html",  "dialog",   "menu",       NULL};
static const char *const paras[] = {"p", "blockquote", NULL};

static void walk_node(walk *w, xmlNode *n, int depth);

static void walk_children(walk *w, xmlNode *n, int depth) {
    for (xmlNode *c = n->children; c; c = c->next) walk_node(w, c, depth + 1);
}

static void walk_element(walk *w, xmlNode *n, int depth) {
    const char *name = (const char *)n->name;
    if (any(n, skipped)) return;
    if (is(n, "head")) {
        for (xmlNode *c = n->children; c; c = c->next)
            if (c->type == XML_ELEMENT_NODE && is(c, "title") && !w->title) w->title = folded(c);
        return;
    }
    if (is(n, "title")) return; /* a <title> outside <head> (the parser may move it) */
    if ((name[0] == 'h' || name[0] == 'H') && name[1] >= '1' && name[1] <= '6' && !name[2]) {
        char *t = folded(n);
        if (!t) return;
        if (!w->heading) w->heading = strdup(t);
        if (w->in_cell) {
            rk_tbuf_text(w->b, t, strlen(t));
        } else {
            char hashes[8] = "######";
            rk_tbuf_break(w->b, 2);
            rk_tbuf_raw(w->b, hashes, (size_t)(name[1] - '0'));
            rk_tbuf_raw(w->b, " ", 1);
            rk_tbuf_raw(w->b, t, strlen(t));
            rk_tbuf_break(w->b, 2);
        }
        free(t);
        return;
    }
    if (is(n, "br")) {
        brk(w, 1);
        return;
    }
    if (is(n, "hr")) {
        brk(w, 2);
        return;
    }
    if (is(n, "pre")) {
        brk(w, 2);
        w->pre++;
        walk_children(w, n, depth);
        w->pre--;
        brk(w, 2);
        return;
    }
    if (is(n, "tr")) {
        int saved = w->n_cell;
        brk(w, 1);
        w->n_cell = 0;
        walk_children(w, n, depth);
        w->n_cell = saved;
        brk(w, 1);
        return;
    }
    if (is(n, "td") || is(n, "th")) {
        if (w->n_cell++ > 0) rk_tbuf_cell(w->b);
        w->in_cell++;
        walk_children(w, n, depth);
        w->in_cell--;
        return;
    }
    if (is(n, "li")) {
        brk(w, 1);
        if (!w->in_cell) rk_tbuf_raw(w->b, "- ", 2);
        walk_children(w, n, depth);
        brk(w, 1);
        return;
    }
    if (any(n, paras)) {
        brk(w, 2);
        walk_children(w, n, depth);
        brk(w, 2);
        return;
    }
    if (any(n, blocks)) {
        brk(w, 1);
        walk_children(w, n, depth);
        brk(w, 1);
        return;
    }
    walk_children(w, n, depth);
}

static void walk_node(walk *w, xmlNode *n, int depth) {
    if (depth > MAX_DEPTH) return;
    switch (n->type) {
    case XML_TEXT_NODE:
    case XML_CDATA_SECTION_NODE:
        if (!n->content) return;
        if (w->pre) rk_tbuf_raw(w->b, (const char *)n->content, strlen((const char *)n->content));
        else rk_tbuf_text(w->b, (const char *)n->content, strlen((const char *)n->content));
        return;
    case XML_ELEMENT_NODE: walk_element(w, n, depth); return;
    case XML_DOCUMENT_NODE:
    case XML_HTML_DOCUMENT_NODE: walk_children(w, n, depth); return;
    default: return; /* comments, processing instructions, doctypes */
    }
}

/* Structurally valid UTF-8 (the parser is then told so, instead of guessing Latin-1). */
static bool utf8_ok(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = p[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return false;
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xC0) != 0x80) return false;
        i += k;
    }
    return true;
}

bool rk_html_to_text(const void *data, size_t len, rk_tbuf *b, char **heading, char **title) {
    if (len == 0 || len > INT32_MAX) return false;
    xmlInitParser();
    int opts = HTML_PARSE_RECOVER | HTML_PARSE_NOERROR | HTML_PARSE_NOWARNING | HTML_PARSE_NONET;
    const char *enc = utf8_ok(data, len) ? "UTF-8" : NULL;
    htmlDocPtr doc = htmlReadMemory(data, (int)len, NULL, enc, opts);
    if (!doc) return false;
    walk w = {.b = b};
    walk_node(&w, (xmlNode *)doc, 0);
    xmlFreeDoc(doc);
    if (heading) *heading = w.heading;
    else free(w.heading);
    if (title) *title = w.title;
    else free(w.title);
    return true;
}

rk_status rk_extract_html(const void *data, size_t len, const char *name, rk_extract_result *out, rk_err *err) {
    rk_tbuf b = {0};
    char *heading = NULL, *title = NULL;
    if (!rk_html_to_text(data, len, &b, &heading, &title)) {
        rk_tbuf_free(&b);
        return rk_err_set(err, RK_E_FORMAT, "extract: %s is HTML that libxml2 cannot parse (empty or damaged)", name);
    }
    /* a page whose body has no heading keeps its <title> as the first line */
    if (title && !heading) {
        rk_tbuf t = {0};
        rk_tbuf_raw(&t, "# ", 2);
        rk_tbuf_raw(&t, title, strlen(title));
        rk_tbuf_break(&t, 2);
        rk_tbuf_raw(&t, b.p, b.n);
        rk_tbuf_free(&b);
        b = t;
    }
    free(heading);
    free(title);
    return rk_tbuf_take(&b, out, RK_DOC_HTML, name, err);
}
