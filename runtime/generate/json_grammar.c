/* JSON grammar for constrained sampling: a JSON Schema subset compiled into nodes, and a
 * byte-level pushdown automaton over them. A state is a stack of frames (root, object,
 * array, string, number, literal); each byte either moves the top frame on, finishes it
 * (the parent then moves on), or — for a number or literal that may end there — pops it
 * and is offered to the parent. Nothing is allocated while feeding. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gen.h"

enum { T_OBJ = 1, T_ARR = 2, T_STR = 4, T_NUM = 8, T_INT = 16, T_BOOL = 32, T_NULL = 64, T_ANY = 127 };
#define MAX_PROPS 64
#define MAX_LITS 64
#define MAX_NODES 4096
#define MAX_DIGITS 32

typedef struct jnode {
    uint8_t types;
    bool props;       /* object: "properties" given (only they may appear) */
    int32_t n_props;  /* object */
    char **prop_name; /* (n_props) owned */
    size_t *prop_len;
    int32_t *prop_node;
    uint64_t required;
    int32_t items;                /* array: node of the items (0: any) */
    int64_t min_items, max_items; /* max -1: none */
    int64_t min_len, max_len;     /* string, in characters; max -1: none */
    int32_t n_lit;                /* enum / const: the values as plain JSON text (owned) */
    char **lit;
    size_t *lit_len;
} jnode;

struct rk_json_grammar {
    jnode *nodes; /* node 0: any value */
    int32_t n_nodes, cap;
    int32_t root;
};

/* ---- compiling a schema ----------------------------------------------------------------- */
typedef struct comp {
    rk_json_grammar *g;
    json_object *doc;
    rk_err *err;
} comp;

static rk_status compile(comp *c, json_object *s, const char *path, int depth, int32_t *out);

static int32_t new_node(comp *c, uint8_t types) {
    rk_json_grammar *g = c->g;
    if (g->n_nodes == MAX_NODES) return -1;
    if (g->n_nodes == g->cap) {
        int32_t cap = g->cap ? g->cap * 2 : 16;
        jnode *p = realloc(g->nodes, (size_t)cap * sizeof *p);
        if (!p) return -1;
        g->nodes = p;
        g->cap = cap;
    }
    jnode *n = &g->nodes[g->n_nodes];
    memset(n, 0, sizeof *n);
    n->types = types;
    n->max_items = n->max_len = -1;
    return g->n_nodes++;
}

static bool is_annotation(const char *k) {
    static const char *const ok[] = {"title", "description", "default", "examples",   "$schema",
                                     "$id",   "$comment",    "$defs",   "definitions"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (!strcmp(k, ok[i])) return true;
    return false;
}

static rk_status type_bits(comp *c, json_object *t, const char *path, uint8_t *out) {
    static const char *const names[] = {"object", "array", "string", "number", "integer", "boolean", "null"};
    size_t n = json_object_is_type(t, json_type_array) ? json_object_array_length(t) : 1;
    uint8_t bits = 0;
    for (size_t i = 0; i < n; i++) {
        json_object *e = json_object_is_type(t, json_type_array) ? json_object_array_get_idx(t, i) : t;
        size_t k = 0;
        if (json_object_is_type(e, json_type_string))
            while (k < 7 && strcmp(names[k], json_object_get_string(e))) k++;
        if (!json_object_is_type(e, json_type_string) || k == 7)
            return rk_err_set(c->err, RK_E_INVALID_ARG,
                              "json schema: 'type' at %s must be object, array, string, number, integer, boolean or "
                              "null (got %.40s)",
                              path, json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN));
        bits |= (uint8_t)(1u << k);
    }
    if (!bits) return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: 'type' at %s is an empty array", path);
    *out = bits;
    return RK_OK;
}

static rk_status get_count(comp *c, json_object *v, const char *key, const char *path, int64_t *out) {
    if (!json_object_is_type(v, json_type_int) || json_object_get_int64(v) < 0 || json_object_get_int64(v) > (1 << 24))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: '%s' at %s must be an integer in [0, %d]", key, path,
                          1 << 24);
    *out = json_object_get_int64(v);
    return RK_OK;
}

static rk_status add_lit(comp *c, jnode *n, json_object *v, const char *path) {
    if (n->n_lit == MAX_LITS)
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: more than %d enum values at %s", MAX_LITS, path);
    size_t len = 0;
    const char *s = json_object_to_json_string_length(v, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
    char **lit = realloc(n->lit, (size_t)(n->n_lit + 1) * sizeof *lit);
    if (lit) n->lit = lit;
    size_t *ll = realloc(n->lit_len, (size_t)(n->n_lit + 1) * sizeof *ll);
    if (ll) n->lit_len = ll;
    char *copy = malloc(len + 1);
    if (!lit || !ll || !copy) {
        free(copy);
        return rk_err_set(c->err, RK_E_NOMEM, "json schema: out of memory");
    }
    memcpy(copy, s, len + 1);
    n->lit[n->n_lit] = copy;
    n->lit_len[n->n_lit++] = len;
    return RK_OK;
}

/* "#/$defs/NAME" or "#/definitions/NAME" in the document. */
static rk_status resolve_ref(comp *c, json_object *ref, const char *path, json_object **out) {
    const char *r = json_object_is_type(ref, json_type_string) ? json_object_get_string(ref) : "";
    const char *name = NULL, *where = NULL;
    if (!strncmp(r, "#/$defs/", 8)) where = "$defs", name = r + 8;
    else if (!strncmp(r, "#/definitions/", 14)) where = "definitions", name = r + 14;
    json_object *defs = NULL, *def = NULL;
    if (!name || !json_object_object_get_ex(c->doc, where, &defs) || !json_object_is_type(defs, json_type_object) ||
        !json_object_object_get_ex(defs, name, &def))
        return rk_err_set(c->err, RK_E_INVALID_ARG,
                          "json schema: '$ref' at %s must name an entry of the root's $defs or definitions (got "
                          "\"%.80s\")",
                          path, r);
    *out = def;
    return RK_OK;
}

static rk_status compile_props(comp *c, int32_t id, json_object *props, json_object *req, const char *path, int depth) {
    char sub[512];
    if (!json_object_is_type(props, json_type_object))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: 'properties' at %s must be an object", path);
    int32_t n = (int32_t)json_object_object_length(props);
    if (n > MAX_PROPS)
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: %d properties at %s (at most %d)", (int)n, path,
                          MAX_PROPS);
    jnode *nd = &c->g->nodes[id];
    nd->props = true;
    nd->prop_name = calloc((size_t)n + 1, sizeof *nd->prop_name);
    nd->prop_len = calloc((size_t)n + 1, sizeof *nd->prop_len);
    nd->prop_node = calloc((size_t)n + 1, sizeof *nd->prop_node);
    if (!nd->prop_name || !nd->prop_len || !nd->prop_node)
        return rk_err_set(c->err, RK_E_NOMEM, "json schema: out of memory");
    int32_t i = 0;
    json_object_object_foreach(props, key, val) {
        size_t len = strlen(key);
        for (size_t k = 0; k < len; k++)
            if (key[k] == '"' || key[k] == '\\' || (unsigned char)key[k] < 0x20)
                return rk_err_set(c->err, RK_E_INVALID_ARG,
                                  "json schema: property name \"%.40s\" at %s needs escaping (not supported)", key,
                                  path);
        nd = &c->g->nodes[id];
        if (!(nd->prop_name[i] = strdup(key))) return rk_err_set(c->err, RK_E_NOMEM, "json schema: out of memory");
        nd->prop_len[i] = len;
        nd->n_props = i + 1;
        snprintf(sub, sizeof sub, "%s/properties/%s", path, key);
        int32_t child;
        rk_status st = compile(c, val, sub, depth + 1, &child);
        if (st) return st;
        c->g->nodes[id].prop_node[i++] = child;
    }
    if (!req) return RK_OK;
    if (!json_object_is_type(req, json_type_array))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: 'required' at %s must be an array of names", path);
    nd = &c->g->nodes[id];
    for (size_t k = 0; k < json_object_array_length(req); k++) {
        json_object *e = json_object_array_get_idx(req, k);
        const char *name = json_object_is_type(e, json_type_string) ? json_object_get_string(e) : NULL;
        int32_t j = 0;
        while (name && j < nd->n_props && strcmp(nd->prop_name[j], name)) j++;
        if (!name || j == nd->n_props)
            return rk_err_set(c->err, RK_E_INVALID_ARG,
                              "json schema: 'required' at %s names %.40s, which is not in 'properties'", path,
                              json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN));
        nd->required |= 1ull << j;
    }
    return RK_OK;
}

static rk_status compile(comp *c, json_object *s, const char *path, int depth, int32_t *out) {
    if (depth > RK_JSON_MAX_DEPTH)
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: nested deeper than %d at %s (a recursive $ref?)",
                          RK_JSON_MAX_DEPTH, path);
    if (json_object_is_type(s, json_type_boolean) && json_object_get_boolean(s)) return *out = 0, RK_OK;
    if (!json_object_is_type(s, json_type_object))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: the schema at %s must be an object (got %s)", path,
                          json_type_to_name(json_object_get_type(s)));
    json_object *v;
    if (json_object_object_get_ex(s, "$ref", &v)) {
        json_object *def = NULL;
        rk_status st = resolve_ref(c, v, path, &def);
        if (st) return st;
        char sub[512];
        snprintf(sub, sizeof sub, "%.400s", json_object_get_string(v));
        return compile(c, def, sub, depth + 1, out);
    }
    static const char *const known[] = {"type",      "properties", "required", "additionalProperties",
                                        "items",     "minItems",   "maxItems", "minLength",
                                        "maxLength", "enum",       "const"};
    json_object_object_foreach(s, key, val) {
        (void)val;
        size_t k = 0;
        while (k < sizeof known / sizeof known[0] && strcmp(known[k], key)) k++;
        if (k == sizeof known / sizeof known[0] && !is_annotation(key))
            return rk_err_set(c->err, RK_E_INVALID_ARG,
                              "json schema: unsupported keyword '%.60s' at %s (supported: type, properties, required, "
                              "additionalProperties: false, items, minItems, maxItems, minLength, maxLength, enum, "
                              "const, $ref to $defs)",
                              key, path);
    }
    uint8_t types = 0;
    rk_status st;
    if (json_object_object_get_ex(s, "type", &v) && (st = type_bits(c, v, path, &types))) return st;
    json_object *props = NULL, *req = NULL, *items = NULL, *en = NULL, *cn = NULL, *ap = NULL;
    json_object_object_get_ex(s, "properties", &props);
    json_object_object_get_ex(s, "required", &req);
    json_object_object_get_ex(s, "items", &items);
    json_object_object_get_ex(s, "enum", &en);
    json_object_object_get_ex(s, "const", &cn);
    json_object_object_get_ex(s, "additionalProperties", &ap);
    if (!types) types = props || req || ap ? T_OBJ : items ? T_ARR : T_ANY;
    if (ap && !(json_object_is_type(ap, json_type_boolean) && !json_object_get_boolean(ap)))
        return rk_err_set(c->err, RK_E_INVALID_ARG,
                          "json schema: unsupported keyword 'additionalProperties' at %s: only false is supported "
                          "(the listed properties are the only ones allowed)",
                          path);
    if (req && !props)
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: 'required' at %s without 'properties'", path);
    const int32_t id = new_node(c, types);
    if (id < 0) return rk_err_set(c->err, RK_E_NOMEM, "json schema: more than %d nodes or out of memory", MAX_NODES);
    if (props && (st = compile_props(c, id, props, req, path, depth))) return st;
    if (ap && !props) c->g->nodes[id].props = true; /* additionalProperties false alone: {} */
    if (items) {
        char sub[512];
        snprintf(sub, sizeof sub, "%s/items", path);
        int32_t child;
        if ((st = compile(c, items, sub, depth + 1, &child))) return st;
        c->g->nodes[id].items = child;
    }
    jnode *nd = &c->g->nodes[id];
    if (json_object_object_get_ex(s, "minItems", &v) && (st = get_count(c, v, "minItems", path, &nd->min_items)))
        return st;
    if (json_object_object_get_ex(s, "maxItems", &v) && (st = get_count(c, v, "maxItems", path, &nd->max_items)))
        return st;
    if (json_object_object_get_ex(s, "minLength", &v) && (st = get_count(c, v, "minLength", path, &nd->min_len)))
        return st;
    if (json_object_object_get_ex(s, "maxLength", &v) && (st = get_count(c, v, "maxLength", path, &nd->max_len)))
        return st;
    if ((nd->max_items >= 0 && nd->max_items < nd->min_items) || (nd->max_len >= 0 && nd->max_len < nd->min_len))
        return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: a maximum below its minimum at %s", path);
    if (en) {
        if (!json_object_is_type(en, json_type_array) || json_object_array_length(en) == 0)
            return rk_err_set(c->err, RK_E_INVALID_ARG, "json schema: 'enum' at %s must be a non-empty array", path);
        for (size_t k = 0; k < json_object_array_length(en); k++)
            if ((st = add_lit(c, &c->g->nodes[id], json_object_array_get_idx(en, k), path))) return st;
    }
    if (cn && (st = add_lit(c, &c->g->nodes[id], cn, path))) return st;
    *out = id;
    return RK_OK;
}

void rk_json_grammar_destroy(rk_json_grammar *g) {
    if (!g) return;
    for (int32_t i = 0; i < g->n_nodes; i++) {
        jnode *n = &g->nodes[i];
        for (int32_t k = 0; k < n->n_props; k++) free(n->prop_name[k]);
        for (int32_t k = 0; k < n->n_lit; k++) free(n->lit[k]);
        free(n->prop_name);
        free(n->prop_len);
        free(n->prop_node);
        free(n->lit);
        free(n->lit_len);
    }
    free(g->nodes);
    free(g);
}

rk_status rk_json_grammar_create(const char *schema, size_t len, rk_json_grammar **out, rk_err *err) {
    rk_json_grammar *g = calloc(1, sizeof *g);
    if (!g) return rk_err_set(err, RK_E_NOMEM, "json schema: out of memory");
    comp c = {g, NULL, err};
    rk_status st = RK_OK;
    if (new_node(&c, T_ANY) != 0) {
        st = rk_err_set(err, RK_E_NOMEM, "json schema: out of memory");
        goto fail;
    }
    if (!schema) {
        if ((g->root = new_node(&c, T_OBJ)) < 0) st = rk_err_set(err, RK_E_NOMEM, "json schema: out of memory");
        goto fail;
    }
    json_tokener *tok = json_tokener_new_ex(RK_JSON_MAX_DEPTH * 4);
    if (!tok) {
        st = rk_err_set(err, RK_E_NOMEM, "json schema: out of memory");
        goto fail;
    }
    c.doc = len <= (size_t)INT32_MAX ? json_tokener_parse_ex(tok, schema, (int)len) : NULL;
    enum json_tokener_error je = json_tokener_get_error(tok);
    if (je == json_tokener_continue) c.doc = json_tokener_parse_ex(tok, "", 1), je = json_tokener_get_error(tok);
    json_tokener_free(tok);
    if (!c.doc || je != json_tokener_success) {
        st = rk_err_set(err, RK_E_INVALID_ARG, "json schema: not valid JSON (%s)",
                        je != json_tokener_success ? json_tokener_error_desc(je) : "too large");
        goto fail;
    }
    st = compile(&c, c.doc, "#", 0, &g->root);
fail:
    json_object_put(c.doc);
    if (st) {
        rk_json_grammar_destroy(g);
        return st;
    }
    *out = g;
    return RK_OK;
}

/* ---- the automaton ---------------------------------------------------------------------- */
enum { F_ROOT, F_OBJ, F_ARR, F_STR, F_NUM, F_LIT };
/* root */
enum { R_BEFORE, R_DONE };
/* object: after '{', in a key (schema properties), in a key (free), before ':', before the
 * value, in the value, after the value, after ',' */
enum { O_START, O_KEY, O_KEYFREE, O_COLON, O_VAL, O_INVAL, O_AFTER, O_NEXT };
/* array: after '[', in an item, after an item, after ',' */
enum { A_START, A_IN, A_AFTER, A_NEXT };
/* string: plain, after '\\', in \\uXXXX (st - S_U0 hex digits read), in a UTF-8 character
 * (st - S_C0 continuation bytes to come) */
enum { S_PLAIN, S_ESC, S_U0, S_U4 = S_U0 + 4, S_C0, S_C3 = S_C0 + 3 };
/* number: after '-', after a leading 0, in the integer digits, after '.', in the fraction,
 * after 'e', after the exponent's sign, in the exponent */
enum { N_MINUS, N_ZERO, N_INT, N_DOT, N_FRAC, N_E, N_ESIGN, N_EXP };

typedef struct jframe {
    uint8_t kind, st;
    bool enum_lit; /* F_LIT: the node's enum values (else true / false / null) */
    bool integer;  /* F_NUM: no fraction or exponent */
    int32_t node;  /* F_STR: -1 for a key of a free object */
    int32_t cur;   /* F_OBJ: the property being read or valued */
    uint32_t n;    /* F_OBJ: key bytes; F_ARR: items; F_STR: characters; F_NUM: digits; F_LIT: bytes */
    uint64_t a, b; /* F_OBJ: properties used (a), keys still possible (b); F_LIT: values still possible (a) */
} jframe;

struct rk_json_state {
    const rk_json_grammar *g;
    int32_t depth;
    uint32_t ws; /* whitespace bytes in a row */
    jframe f[RK_JSON_MAX_DEPTH + 2];
    struct rk_json_state *scratch; /* for rk_json_state_accepts */
};

static const char *const kw[3] = {"true", "false", "null"};
static const size_t kw_len[3] = {4, 5, 4};

static uint64_t kw_mask(uint8_t types) { return (types & T_BOOL ? 3u : 0u) | (types & T_NULL ? 4u : 0u); }

static const char *lit_str(const rk_json_state *S, const jframe *f, int i, size_t *len) {
    if (!f->enum_lit) return *len = kw_len[i], kw[i];
    const jnode *n = &S->g->nodes[f->node];
    return *len = n->lit_len[i], n->lit[i];
}

enum { R_OK, R_REJECT, R_POP, R_END }; /* R_END: a literal's last byte, consumed */

static bool is_ws(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static jframe *push(rk_json_state *S, uint8_t kind, int32_t node) {
    if (S->depth == RK_JSON_MAX_DEPTH + 2) return NULL;
    jframe *f = &S->f[S->depth++];
    memset(f, 0, sizeof *f);
    f->kind = kind;
    f->node = node;
    return f;
}

/* A value of node starting with byte c: pushes its frame, c consumed. */
static bool start_value(rk_json_state *S, int32_t node, uint8_t c) {
    const jnode *n = &S->g->nodes[node];
    jframe *f;
    if (n->n_lit) {
        uint64_t alive = 0;
        for (int32_t i = 0; i < n->n_lit; i++)
            if (n->lit_len[i] && (uint8_t)n->lit[i][0] == c) alive |= 1ull << i;
        if (!alive || !(f = push(S, F_LIT, node))) return false;
        f->enum_lit = true;
        f->a = alive;
        f->n = 1;
    } else if ((c == '{' && (n->types & T_OBJ)) || (c == '[' && (n->types & T_ARR))) {
        /* frames: the root, then one per open array or object */
        if (S->depth > RK_JSON_MAX_DEPTH || !(f = push(S, c == '{' ? F_OBJ : F_ARR, node))) return false;
    } else if (c == '"' && (n->types & T_STR)) {
        if (!(f = push(S, F_STR, node))) return false;
    } else if ((c == '-' || (c >= '0' && c <= '9')) && (n->types & (T_NUM | T_INT))) {
        if (!(f = push(S, F_NUM, node))) return false;
        f->integer = !(n->types & T_NUM);
        f->st = c == '-' ? N_MINUS : c == '0' ? N_ZERO : N_INT;
        f->n = c != '-';
    } else {
        uint64_t alive = 0, m = kw_mask(n->types);
        for (int i = 0; i < 3; i++)
            if ((m >> i & 1) && (uint8_t)kw[i][0] == c) alive |= 1ull << i;
        if (!alive || !(f = push(S, F_LIT, node))) return false;
        f->a = alive;
        f->n = 1;
    }
    return true;
}

/* Whitespace where the grammar allows it. */
static int ws(rk_json_state *S, uint8_t c) {
    if (!is_ws(c) || S->ws >= RK_JSON_MAX_WS) return R_REJECT;
    S->ws++;
    return R_OK;
}

static int step_obj(rk_json_state *S, jframe *f, uint8_t c) {
    const jnode *n = &S->g->nodes[f->node];
    const uint64_t all = n->n_props == 64 ? ~0ull : (1ull << n->n_props) - 1;
    switch (f->st) {
    case O_START:
    case O_NEXT:
        if (is_ws(c)) return ws(S, c);
        if (c == '}' && f->st == O_START && (n->required & ~f->a) == 0) return R_POP;
        if (c != '"') return R_REJECT;
        if (!n->props) {
            jframe *k = push(S, F_STR, -1);
            if (!k) return R_REJECT;
            f = &S->f[S->depth - 2];
            f->st = O_KEYFREE;
            return R_OK;
        }
        f->b = all & ~f->a;
        if (!f->b) return R_REJECT;
        f->n = 0;
        f->st = O_KEY;
        return R_OK;
    case O_KEY: {
        if (c == '"') {
            for (int32_t i = 0; i < n->n_props; i++)
                if ((f->b >> i & 1) && n->prop_len[i] == f->n) {
                    f->cur = i;
                    f->a |= 1ull << i;
                    f->st = O_COLON;
                    return R_OK;
                }
            return R_REJECT;
        }
        uint64_t alive = 0;
        for (int32_t i = 0; i < n->n_props; i++)
            if ((f->b >> i & 1) && n->prop_len[i] > f->n && (uint8_t)n->prop_name[i][f->n] == c) alive |= 1ull << i;
        if (!alive) return R_REJECT;
        f->b = alive;
        f->n++;
        return R_OK;
    }
    case O_COLON:
        if (is_ws(c)) return ws(S, c);
        if (c != ':') return R_REJECT;
        f->st = O_VAL;
        return R_OK;
    case O_VAL: {
        if (is_ws(c)) return ws(S, c);
        const int32_t child = n->props ? n->prop_node[f->cur] : 0;
        f->st = O_INVAL;
        if (start_value(S, child, c)) return R_OK;
        f->st = O_VAL;
        return R_REJECT;
    }
    case O_AFTER:
        if (is_ws(c)) return ws(S, c);
        if (c == '}' && (n->required & ~f->a) == 0) return R_POP;
        if (c == ',' && (!n->props || (all & ~f->a))) {
            f->st = O_NEXT;
            return R_OK;
        }
        return R_REJECT;
    }
    return R_REJECT;
}

static int step_arr(rk_json_state *S, jframe *f, uint8_t c) {
    const jnode *n = &S->g->nodes[f->node];
    switch (f->st) {
    case A_START:
    case A_NEXT:
        if (is_ws(c)) return ws(S, c);
        if (c == ']' && f->st == A_START && n->min_items == 0) return R_POP;
        if (n->max_items >= 0 && f->n >= n->max_items) return R_REJECT;
        f->st = A_IN;
        if (start_value(S, n->items, c)) return R_OK;
        f->st = f->n ? A_NEXT : A_START;
        return R_REJECT;
    case A_AFTER:
        if (is_ws(c)) return ws(S, c);
        if (c == ']' && f->n >= n->min_items) return R_POP;
        if (c == ',' && (n->max_items < 0 || f->n < n->max_items)) {
            f->st = A_NEXT;
            return R_OK;
        }
        return R_REJECT;
    }
    return R_REJECT;
}

static bool is_hex(uint8_t c) { return (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'f'); }

static int step_str(rk_json_state *S, jframe *f, uint8_t c) {
    const jnode *n = f->node >= 0 ? &S->g->nodes[f->node] : NULL;
    const int64_t max = n ? n->max_len : -1, min = n ? n->min_len : 0;
    if (f->st >= S_C0 + 1 && f->st <= S_C3) { /* continuation bytes of a character */
        if ((c & 0xc0) != 0x80) return R_REJECT;
        f->st = f->st == S_C0 + 1 ? S_PLAIN : (uint8_t)(f->st - 1);
        return R_OK;
    }
    if (f->st == S_ESC) {
        if (c == 'u') f->st = S_U0;
        else if (strchr("\"\\/bfnrt", c) && c) f->st = S_PLAIN;
        else return R_REJECT;
        return R_OK;
    }
    if (f->st >= S_U0 && f->st < S_U4) {
        if (!is_hex(c)) return R_REJECT;
        f->st = f->st + 1 == S_U4 ? S_PLAIN : (uint8_t)(f->st + 1);
        return R_OK;
    }
    /* S_PLAIN: a new character, or the end */
    if (c == '"') return f->n >= min ? R_POP : R_REJECT;
    if (c < 0x20 || (max >= 0 && f->n >= max)) return R_REJECT;
    int more = c < 0x80 ? 0 : c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2 : c >= 0xf0 && c <= 0xf4 ? 3 : -1;
    if (more < 0) return R_REJECT;
    f->n++;
    f->st = c == '\\' ? S_ESC : more ? (uint8_t)(S_C0 + more) : S_PLAIN;
    return R_OK;
}

static int step_num(jframe *f, uint8_t c) {
    const bool digit = c >= '0' && c <= '9';
    const bool room = f->n < MAX_DIGITS;
    switch (f->st) {
    case N_MINUS:
        if (!digit) return R_REJECT;
        f->st = c == '0' ? N_ZERO : N_INT;
        f->n++;
        return R_OK;
    case N_ZERO:
    case N_INT:
    case N_FRAC:
        if (digit && f->st != N_ZERO && room) return f->n++, R_OK;
        if (digit) return R_REJECT;
        if (c == '.' && f->st != N_FRAC && !f->integer) return f->st = N_DOT, R_OK;
        if ((c == 'e' || c == 'E') && !f->integer) return f->st = N_E, R_OK;
        return R_POP;
    case N_DOT:
        if (!digit || !room) return R_REJECT;
        f->st = N_FRAC;
        f->n++;
        return R_OK;
    case N_E:
        if (c == '+' || c == '-') return f->st = N_ESIGN, R_OK;
        /* fallthrough */
    case N_ESIGN:
        if (!digit || !room) return R_REJECT;
        f->st = N_EXP;
        f->n++;
        return R_OK;
    case N_EXP:
        if (digit && room) return f->n++, R_OK;
        return digit ? R_REJECT : R_POP;
    }
    return R_REJECT;
}

static bool lit_done(const rk_json_state *S, const jframe *f, uint64_t mask) {
    for (int i = 0; i < 64; i++)
        if (mask >> i & 1) {
            size_t len;
            lit_str(S, f, i, &len);
            if (len == f->n) return true;
        }
    return false;
}

static int step_lit(rk_json_state *S, jframe *f, uint8_t c) {
    uint64_t alive = 0;
    bool longer = false;
    for (int i = 0; i < 64; i++)
        if (f->a >> i & 1) {
            size_t len;
            const char *s = lit_str(S, f, i, &len);
            if (len > f->n && (uint8_t)s[f->n] == c) alive |= 1ull << i;
        }
    if (!alive) return lit_done(S, f, f->a) ? R_POP : R_REJECT;
    f->a = alive;
    f->n++;
    for (int i = 0; i < 64; i++)
        if (alive >> i & 1) {
            size_t len;
            lit_str(S, f, i, &len);
            if (len > f->n) longer = true;
        }
    return longer ? R_OK : R_END; /* every value still possible ends here */
}

/* The top frame is finished: pop it and move the parent on. */
static void finish(rk_json_state *S) {
    S->depth--;
    jframe *p = &S->f[S->depth - 1];
    switch (p->kind) {
    case F_ROOT: p->st = R_DONE; break;
    case F_OBJ: p->st = p->st == O_KEYFREE ? O_COLON : O_AFTER; break;
    case F_ARR:
        p->st = A_AFTER;
        p->n++;
        break;
    }
}

static bool step(rk_json_state *S, uint8_t c) {
    for (;;) {
        jframe *f = &S->f[S->depth - 1];
        int r;
        switch (f->kind) {
        case F_ROOT:
            if (f->st == R_DONE) return false; /* nothing after the value, */
            r = start_value(S, S->g->root, c) ? R_OK : R_REJECT;
            break;
        case F_OBJ: r = step_obj(S, f, c); break;
        case F_ARR: r = step_arr(S, f, c); break;
        case F_STR: r = step_str(S, f, c); break;
        case F_NUM: r = step_num(f, c); break;
        default: r = step_lit(S, f, c); break;
        }
        if (r == R_REJECT) return false;
        if (!is_ws(c)) S->ws = 0;
        if (r == R_OK) return true;
        /* R_POP: for an object, array or string c was the closing byte; for a number or
         * literal that could end, c belongs to the parent */
        const bool consumed = r == R_END || f->kind == F_OBJ || f->kind == F_ARR || f->kind == F_STR;
        finish(S);
        if (consumed) return true;
    }
}

rk_status rk_json_state_create(const rk_json_grammar *g, rk_json_state **out, rk_err *err) {
    rk_json_state *st = calloc(1, sizeof *st), *sc = calloc(1, sizeof *sc);
    if (!st || !sc) {
        free(st);
        free(sc);
        return rk_err_set(err, RK_E_NOMEM, "json grammar: out of memory");
    }
    st->g = sc->g = g;
    st->scratch = sc;
    rk_json_state_reset(st);
    *out = st;
    return RK_OK;
}

void rk_json_state_destroy(rk_json_state *st) {
    if (!st) return;
    free(st->scratch);
    free(st);
}

void rk_json_state_reset(rk_json_state *st) {
    st->depth = 1;
    st->ws = 0;
    memset(&st->f[0], 0, sizeof st->f[0]);
    st->f[0].kind = F_ROOT;
}

static void copy_state(rk_json_state *dst, const rk_json_state *src) {
    dst->depth = src->depth;
    dst->ws = src->ws;
    memcpy(dst->f, src->f, (size_t)src->depth * sizeof src->f[0]);
}

bool rk_json_state_accepts(rk_json_state *st, const char *p, size_t n) {
    rk_json_state *sc = st->scratch;
    copy_state(sc, st);
    for (size_t i = 0; i < n; i++)
        if (!step(sc, (uint8_t)p[i])) return false;
    return true;
}

bool rk_json_state_feed(rk_json_state *st, const char *p, size_t n) {
    if (!rk_json_state_accepts(st, p, n)) return false;
    copy_state(st, st->scratch);
    return true;
}

bool rk_json_state_complete(const rk_json_state *st) { return st->depth == 1 && st->f[0].st == R_DONE; }

bool rk_json_state_can_end(const rk_json_state *st) {
    if (rk_json_state_complete(st)) return true;
    if (st->depth != 2) return false;
    const jframe *f = &st->f[1];
    if (f->kind == F_NUM) return f->st == N_ZERO || f->st == N_INT || f->st == N_FRAC || f->st == N_EXP;
    if (f->kind == F_LIT) return lit_done(st, f, f->a);
    return false;
}
