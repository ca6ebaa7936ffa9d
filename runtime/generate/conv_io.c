/* rk_conv_save / rk_conv_load: the conversation as JSON, and the KV block beside it when
 * the session can export its cache. */
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conv_impl.h"
#include "rk_io.h"

/* path + ".kv" into buf; false when it does not fit. */
static bool kv_path(const char *path, char *buf, size_t cap) {
    int w = snprintf(buf, cap, "%s.kv", path);
    return w > 0 && (size_t)w < cap;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s && s[1] ? s + 1 : p;
}

/* Exports the cache into path.kv; true when a block was written. The JSON then names it. */
static bool save_kv(const rk_conv *c, const char *path, json_object *root) {
    const int64_t n_past = rk_session_n_past(c->s);
    char kp[4096];
    void *blk = NULL;
    size_t n = 0;
    if (n_past <= 0 || !kv_path(path, kp, sizeof kp)) return false;
    if (rk_session_kv_export(c->s, 0, n_past, &blk, &n, NULL)) return false; /* RK_E_UNSUPPORTED: messages only */
    bool ok = rk_io_write_file_atomic(kp, blk, n, NULL) == RK_OK;
    free(blk);
    if (!ok) return false;
    json_object *kv = json_object_new_object();
    json_object_object_add(kv, "file", json_object_new_string(base_name(kp)));
    json_object_object_add(kv, "n_tokens", json_object_new_int64(n_past));
    json_object_object_add(root, "kv", kv);
    return true;
}

rk_status rk_conv_save(const rk_conv *c, const char *path, bool *kv_saved, rk_err *err) {
    json_object *root = json_object_new_object(), *arr = json_object_new_array();
    if (!root || !arr) {
        json_object_put(root);
        json_object_put(arr);
        return rk_err_set(err, RK_E_NOMEM, "conv: out of memory saving %s", path);
    }
    json_object_object_add(root, "format", json_object_new_string("ridgekv-chat"));
    json_object_object_add(root, "version", json_object_new_int(1));
    json_object_object_add(root, "model", json_object_new_string(rk_model_name(c->m)));
    json_object_object_add(root, "template", json_object_new_string(rk_chat_family_name(c->fam)));
    for (size_t i = 0; i < c->n_msgs; i++) {
        json_object *o = json_object_new_object();
        json_object_object_add(o, "role", json_object_new_string(c->msgs[i].role));
        json_object_object_add(o, "content", json_object_new_string_len(c->msgs[i].content, (int)c->msgs[i].len));
        json_object_array_add(arr, o);
    }
    json_object_object_add(root, "messages", arr);
    const bool kv = save_kv(c, path, root);
    const char *s = json_object_to_json_string_ext(root, JSON_C_TO_STRING_PRETTY | JSON_C_TO_STRING_NOSLASHESCAPE);
    rk_status st = RK_OK;
    char *text = s ? malloc(strlen(s) + 2) : NULL;
    if (!text) {
        st = rk_err_set(err, RK_E_NOMEM, "conv: out of memory saving %s", path);
    } else {
        size_t n = strlen(s);
        memcpy(text, s, n);
        text[n] = '\n';
        st = rk_io_write_file_atomic(path, text, n + 1, err);
    }
    free(text);
    json_object_put(root);
    if (!st && kv_saved) *kv_saved = kv;
    return st;
}

/* The messages of a saved file, checked by the conversation rules, into *out (n). */
static rk_status parse_messages(json_object *root, const char *path, rk_conv_msg **out, size_t *n_out, rk_err *err) {
    json_object *arr;
    if (!json_object_is_type(root, json_type_object) || !json_object_object_get_ex(root, "messages", &arr) ||
        !json_object_is_type(arr, json_type_array))
        return rk_err_set(err, RK_E_INVALID_ARG, "conv: %s has no \"messages\" array", path);
    const size_t n = json_object_array_length(arr);
    rk_conv_msg *v = calloc(n + 1, sizeof *v);
    if (!v) return rk_err_set(err, RK_E_NOMEM, "conv: out of memory loading %s", path);
    rk_status st = RK_OK;
    size_t i = 0;
    for (; i < n && !st; i++) {
        json_object *o = json_object_array_get_idx(arr, i), *r, *t;
        if (!json_object_is_type(o, json_type_object) || !json_object_object_get_ex(o, "role", &r) ||
            !json_object_is_type(r, json_type_string) || !json_object_object_get_ex(o, "content", &t) ||
            !json_object_is_type(t, json_type_string)) {
            st = rk_err_set(err, RK_E_INVALID_ARG, "conv: %s: message %zu lacks a string role or content", path, i);
            break;
        }
        const char *content = json_object_get_string(t);
        const size_t len = (size_t)json_object_get_string_len(t);
        if ((st = rk_conv_check(i, json_object_get_string(r), content, len, err))) {
            rk_err_wrap(err, "%s", path);
            break;
        }
        if (!(v[i].content = malloc(len + 1))) {
            st = rk_err_set(err, RK_E_NOMEM, "conv: out of memory loading %s", path);
            break;
        }
        memcpy(v[i].content, content, len + 1);
        v[i].len = len;
        v[i].role = rk_conv_role(json_object_get_string(r));
    }
    if (st) {
        rk_conv_msgs_free(v, n); /* calloc'd: entries not reached are empty */
        free(v);
        return st;
    }
    *out = v;
    *n_out = n;
    return RK_OK;
}

/* Imports the block the file names (beside it) into the reset session; true when the
 * cache then holds its rows and the tokens are known. */
static bool load_kv(rk_conv *c, json_object *root, const char *path) {
    json_object *kv, *file;
    if (!json_object_object_get_ex(root, "kv", &kv) || !json_object_object_get_ex(kv, "file", &file) ||
        !json_object_is_type(file, json_type_string))
        return false;
    const char *f = json_object_get_string(file);
    if (strchr(f, '/')) return false; /* only beside the JSON file */
    char kp[4096];
    const char *slash = strrchr(path, '/');
    int w = slash ? snprintf(kp, sizeof kp, "%.*s/%s", (int)(slash - path), path, f) : snprintf(kp, sizeof kp, "%s", f);
    if (w <= 0 || (size_t)w >= sizeof kp) return false;
    char *blk = NULL;
    size_t n = 0;
    if (rk_io_read_file(kp, &blk, &n, NULL)) return false;
    rk_session_reset(c->s);
    c->kv.n = 0;
    bool ok = rk_session_kv_import(c->s, blk, n, NULL) == RK_OK;
    free(blk);
    const int32_t *toks = ok ? rk_session_tokens(c->s) : NULL;
    const int64_t n_past = rk_session_n_past(c->s);
    if (!toks || !rk_ids_append(&c->kv, toks, (size_t)n_past)) {
        rk_session_reset(c->s); /* rows we cannot name are no use: read everything */
        c->kv.n = 0;
        return false;
    }
    return true;
}

rk_status rk_conv_load(rk_conv *c, const char *path, bool *kv_loaded, rk_err *err) {
    char *data = NULL;
    size_t len = 0;
    rk_status st = rk_io_read_file(path, &data, &len, err);
    if (st) return st;
    enum json_tokener_error jerr = json_tokener_success;
    json_tokener *tok = json_tokener_new();
    json_object *root = tok ? json_tokener_parse_ex(tok, data, (int)(len < 0x7fffffff ? len : 0x7fffffff)) : NULL;
    if (tok) jerr = json_tokener_get_error(tok);
    json_tokener_free(tok);
    rk_conv_msg *msgs = NULL;
    size_t n = 0;
    if (!root)
        st = rk_err_set(err, RK_E_INVALID_ARG, "conv: %s is not JSON (%s)", path,
                        jerr == json_tokener_success ? "empty" : json_tokener_error_desc(jerr));
    else st = parse_messages(root, path, &msgs, &n, err);
    if (!st) {
        rk_conv_msgs_free(c->msgs, c->n_msgs);
        free(c->msgs);
        c->msgs = msgs;
        c->n_msgs = n;
        c->cap_msgs = n + 1; /* calloc'd with one spare */
        const bool kv = load_kv(c, root, path);
        if (kv_loaded) *kv_loaded = kv;
    }
    json_object_put(root);
    free(data);
    return st;
}
