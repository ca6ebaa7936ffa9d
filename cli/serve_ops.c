/* serve --jsonl: the ops. A generating request picks its session (the server's, or one
 * with the request's KV policy) and its fill, starts from an empty cache, and runs
 * rk_generate (complete) or an rk_conv turn (chat, ask: the same prompt rules as the
 * CLI); tokens stream as events. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "doc_cache_cli.h"
#include "long_cli.h"
#include "serve.h"

/* ---- events ------------------------------------------------------------------------- */
static json_object *event(json_object *id, const char *name) {
    json_object *ev = json_object_new_object();
    if (!ev) return NULL;
    json_object_object_add(ev, "id", id ? json_object_get(id) : NULL);
    json_object_object_add(ev, "event", json_object_new_string(name));
    return ev;
}

/* Writes ev as one line and releases it. After a failed write nothing more is written. */
static void emit(server *sv, json_object *ev) {
    if (!sv->write_failed) {
        size_t n = 0;
        const char *s =
            ev ? json_object_to_json_string_length(ev, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &n)
               : NULL;
        errno = 0;
        if (!s) errno = ENOMEM;
        if (!s || fwrite(s, 1, n, stdout) != n || putc('\n', stdout) == EOF || fflush(stdout) == EOF) {
            sv->write_failed = true;
            sv->write_errno = errno ? errno : EIO;
        }
    }
    json_object_put(ev);
}

void serve_emit_error(server *sv, json_object *id, serve_code code, const char *msg) {
    json_object *ev = event(id, "error");
    serve_buf clean = {0}; /* messages may quote engine text: keep the line well-formed */
    serve_utf8_sanitize(&clean, msg, strlen(msg));
    json_object_object_add(ev, "code", json_object_new_string(serve_code_name(code)));
    json_object_object_add(ev, "message", json_object_new_string_len(clean.p ? clean.p : "", (int)clean.n));
    serve_buf_free(&clean);
    emit(sv, ev);
}

__attribute__((format(printf, 4, 5))) static void emit_errorf(server *sv, json_object *id, serve_code code,
                                                              const char *fmt, ...) {
    char msg[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    serve_emit_error(sv, id, code, msg);
}

/* A number with a fixed count of decimals, as it is printed. */
static json_object *num(double v, int decimals) {
    char b[64];
    if (!isfinite(v)) v = 0;
    snprintf(b, sizeof b, "%.*f", decimals, v);
    return json_object_new_double_s(v, b);
}

static serve_code status_code(rk_status st) {
    return st == RK_E_CONTEXT       ? SERVE_CONTEXT_OVERFLOW
           : st == RK_E_INVALID_ARG ? SERVE_INVALID_REQUEST
                                    : SERVE_INTERNAL;
}

/* ---- session and fill of a request -------------------------------------------------- */
/* Same policy: the same kind, and for lowram the same options as written. */
static bool same_kv(const char *a, const char *b) {
    size_t na = strcspn(a, ":"), nb = strcspn(b, ":");
    if (na != nb || strncmp(a, b, na)) return false;
    return strncmp(a, "lowram", 6) || !strcmp(a, b);
}

/* A file a request named could not be used: past opening it (which says why without
 * reading it), the message says what was expected and never quotes the file's bytes (a
 * magic, a key, a name), which would let a client read files through the errors. */
static void client_file_error(rk_err *e, rk_status st, const char *path, const char *expected) {
    if (st == RK_E_NOMEM || st == RK_E_IO || st == RK_E_NOT_FOUND) return;
    snprintf(e->msg, sizeof e->msg, "%.200s is not %s", path, expected);
}

static rk_status build_conv(server *sv, const serve_req *r, rk_session *s, rk_conv **conv, rk_err *e);

/* An ask request without "kv" on a server started without --kv: the KV policy and budget
 * `ridgekv ask` takes at the length of its prompt (rk_long_defaults_get: q8 from
 * RK_LONG_Q8_MIN_TOKENS prompt tokens, or when f16 rows would crowd the free memory; a
 * budget when even those would, unless the server has --kv-budget), with one stderr line.
 * NULL: the request's "kv" or the server's policy. The context and the RoPE scaling are
 * the server's (-c). */
static const char *ask_default_kv(server *sv, const serve_req *r, uint64_t *budget) {
    *budget = 0;
    if (r->op != SERVE_OP_ASK || r->gen.kv || !sv->o || sv->o->kv) return NULL;
    rk_conv *conv = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    rk_err e = {0};
    rk_status st = build_conv(sv, r, sv->s, &conv, &e);
    if (!st) st = rk_conv_prompt(conv, &ids, &n, &e);
    rk_conv_destroy(conv);
    free(ids);
    if (st) return NULL; /* the run says why */
    const int64_t answer = r->gen.max_tokens >= 0 ? r->gen.max_tokens : (int64_t)n / 3 + 1;
    const rk_long_request q = cli_long_request(sv->o, sv->m, (int64_t)n, (int64_t)n + answer);
    rk_long_defaults d;
    if (rk_long_defaults_get(sv->m, &q, &d, &e)) return NULL;
    const bool kind = d.kv_why == RK_LONG_KV_LONG || d.kv_why == RK_LONG_KV_MEMORY;
    if (!kind && !d.kv_budget) return NULL;
    *budget = d.kv_budget;
    fprintf(stderr, "ridgekv serve: ask of %zu prompt tokens: KV cache %s", n, rk_kv_kind_name(d.kv));
    if (d.kv_why == RK_LONG_KV_LONG) fprintf(stderr, ", q8 from %d prompt tokens on", RK_LONG_Q8_MIN_TOKENS);
    else if (d.kv_why == RK_LONG_KV_MEMORY) fprintf(stderr, ", q8 as f16 would take over half of the free memory");
    if (d.kv_budget) fprintf(stderr, "; --kv-budget %lluM", (unsigned long long)(d.kv_budget >> 20));
    fprintf(stderr, " (--kv or --kv-budget given to serve override)\n");
    return rk_kv_kind_name(d.kv);
}

/* The session for the request: the server's, or one with the request's KV policy, or for
 * an ask the default policy and budget of its length (ask_default_kv), made for it and kept
 * for the next request asking the same. */
static rk_session *pick_session(server *sv, const serve_req *r) {
    uint64_t budget = 0;
    const char *dflt = ask_default_kv(sv, r, &budget), *kv = dflt ? dflt : r->gen.kv;
    if (!kv || (!budget && same_kv(kv, sv->kv))) return sv->s;
    if (sv->alt && same_kv(kv, sv->alt_kv) && (dflt != NULL) == sv->alt_default && budget == sv->alt_budget)
        return sv->alt;
    rk_err e = {0};
    rk_session_params sp = sv->sp;
    rk_status st = rk_kv_params_parse(kv, &sp.kv, &e);
    if (!st && dflt) { /* as ask's default policy: the tier settings, the budget of the length */
        cli_kv_apply(sv->o, &sp.kv);
        if (budget) sp.kv.budget = budget;
    }
    if (!st && sp.kv.lowram.n_threads == 0) sp.kv.lowram.n_threads = sp.n_threads;
    rk_session *s = NULL;
    if (!st) st = rk_session_create(sv->m, &sp, &s, &e);
    if (st && st != RK_E_INVALID_ARG && sp.kv.lowram.predictor[0])
        client_file_error(&e, st, sp.kv.lowram.predictor,
                          "a LowRAM predictor file for this model and group size (a GGUF file of general.type "
                          "ridgekv.lowram_predictor with this model's fingerprint)");
    if (st) {
        emit_errorf(sv, r->id, st == RK_E_NOMEM ? SERVE_INTERNAL : SERVE_INVALID_REQUEST, "field 'kv': %s", e.msg);
        return NULL;
    }
    rk_session_destroy(sv->alt);
    sv->alt = s;
    sv->alt_default = dflt != NULL;
    sv->alt_budget = budget;
    snprintf(sv->alt_kv, sizeof sv->alt_kv, "%s", kv);
    return s;
}

/* The fill of the request: the server's, with "fill", "ridgefill" and "tail" replacing
 * its parts; checked on s. */
static bool pick_fill(server *sv, const serve_req *r, rk_session *s, rk_fill_params *out) {
    rk_fill_params fp = sv->fill;
    const serve_gen *g = &r->gen;
    rk_err e = {0};
    if (g->ridgefill) {
        if (!sv->req_maps || strcmp(sv->req_maps_path, g->ridgefill)) {
            rk_ridge_maps_destroy(sv->req_maps);
            sv->req_maps = NULL;
            char warn[512];
            rk_status st = rk_ridge_maps_load(g->ridgefill, sv->m, &sv->req_maps, warn, sizeof warn, &e);
            if (st) {
                client_file_error(&e, st, g->ridgefill,
                                  "a RidgeFill map file for this model (a GGUF file of general.type "
                                  "ridgekv.ridge_maps with this model's fingerprint)");
                emit_errorf(sv, r->id, st == RK_E_NOMEM ? SERVE_INTERNAL : SERVE_INVALID_REQUEST,
                            "field 'ridgefill': %s", e.msg);
                return false;
            }
            snprintf(sv->req_maps_path, sizeof sv->req_maps_path, "%s", g->ridgefill);
        }
        fp.maps = sv->req_maps;
        if (!g->fill) fp.mode = rk_fill_params_default().mode;
    }
    if (g->fill && !rk_fill_mode_parse(g->fill, &fp.mode)) {
        emit_errorf(sv, r->id, SERVE_INVALID_REQUEST,
                    "field 'fill' must be off, speed, quality, identity or plumb (got \"%.32s\")", g->fill);
        return false;
    }
    if (g->tail) fp.tail = g->tail;
    fp.group = cli_fill_group(sv->o, fp.mode); /* the mode's grouping (--fill-group or its default) */
    if (rk_session_set_fill(s, &fp, &e)) {
        emit_errorf(sv, r->id, SERVE_INVALID_REQUEST, "field 'fill': %s", e.msg);
        return false;
    }
    *out = fp;
    return true;
}

/* ---- generation --------------------------------------------------------------------- */
typedef struct gen_ctx {
    server *sv;
    const serve_req *r;
} gen_ctx;

static bool on_token(void *ud, int32_t tok, const char *text, size_t n) {
    gen_ctx *g = ud;
    json_object *ev = event(g->r->id, "token");
    json_object_object_add(ev, "text", json_object_new_string_len(n ? text : "", (int)n));
    json_object_object_add(ev, "token", json_object_new_int(tok));
    emit(g->sv, ev);
    return !g->sv->write_failed; /* nobody is listening */
}

/* The done event of a generation. */
static void emit_done(server *sv, const serve_req *r, rk_session *s, const rk_fill_params *fp, const rk_gen_result *res,
                      double t_before) {
    json_object *ev = event(r->id, "done");
    json_object_object_add(ev, "finish_reason", json_object_new_string(rk_stop_reason_name(res->stop)));
    /* the text not yet sent: all of it without streaming, else what was held back at the end */
    if (!r->gen.stream || res->n_text > res->n_streamed)
        json_object_object_add(
            ev, "text", json_object_new_string_len(res->text + res->n_streamed, (int)(res->n_text - res->n_streamed)));
    json_object *usage = json_object_new_object();
    json_object_object_add(usage, "prompt_tokens", json_object_new_int64(res->n_prompt));
    json_object_object_add(usage, "completion_tokens", json_object_new_int64(res->n_gen));
    json_object_object_add(ev, "usage", usage);
    json_object_object_add(ev, "ttft_ms", res->ttft_s >= 0 ? num(1000.0 * (t_before + res->ttft_s), 1) : NULL);
    json_object_object_add(ev, "prefill_tok_s", num(res->prefill_tok_s, 1));
    json_object_object_add(ev, "decode_tok_s", num(res->decode_tok_s, 1));
    rk_kv_bytes kb;
    rk_session_kv_bytes(s, &kb);
    json_object_object_add(ev, "kv", json_object_new_string(s == sv->s ? sv->kv : sv->alt_kv));
    json_object_object_add(ev, "kv_bytes", json_object_new_int64((int64_t)kb.total));
    json_object_object_add(ev, "fill", json_object_new_string(rk_fill_mode_name(fp->mode)));
    json_object_object_add(ev, "filled_rows", json_object_new_int64((int64_t)res->filled_rows));
    emit(sv, ev);
    if (sv->verbose)
        fprintf(stderr,
                "ridgekv serve: prompt %lld tokens (%.0f tok/s), generated %lld (%.1f tok/s), %s, kv %s, fill %s\n",
                (long long)res->n_prompt, res->prefill_tok_s, (long long)res->n_gen, res->decode_tok_s,
                rk_stop_reason_name(res->stop), s == sv->s ? sv->kv : sv->alt_kv, rk_fill_mode_name(fp->mode));
}

/* The conversation of a chat or ask request (NULL for complete). */
static rk_status build_conv(server *sv, const serve_req *r, rk_session *s, rk_conv **conv, rk_err *e) {
    rk_conv_params cp = {0}; /* room for one token, nothing dropped: the prompt fits or is refused */
    rk_status st = rk_conv_create(sv->m, s, &cp, conv, e);
    if (st) return st;
    if (r->op == SERVE_OP_CHAT) {
        for (size_t i = 0; i < r->n_msgs && !st; i++)
            if ((st = rk_conv_add(*conv, r->msgs[i].role, r->msgs[i].content, strlen(r->msgs[i].content), e)))
                rk_err_wrap(e, "messages[%zu]", i);
        return st;
    }
    rk_doc *docs = calloc(r->n_docs + 1, sizeof *docs);
    if (!docs) return rk_err_set(e, RK_E_NOMEM, "out of memory for the documents");
    for (size_t i = 0; i < r->n_docs; i++)
        docs[i] = (rk_doc){r->docs[i].name, r->docs[i].text, strlen(r->docs[i].text)};
    st = rk_conv_add_ask(*conv, r->system, docs, r->n_docs, r->question, e);
    free(docs);
    return st;
}

/* ask: the documents are read apart from the question, through the document cache, keyed
 * by the settings of the session the request runs on (its KV policy and fill). */
static rk_status ask_prefix(server *sv, const serve_req *r, rk_session *s, rk_conv *conv, rk_err *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    rk_status st = rk_conv_prompt(conv, &ids, &n, e);
    rk_doc *docs = st ? NULL : calloc(r->n_docs + 1, sizeof *docs);
    if (!st && !docs) st = rk_err_set(e, RK_E_NOMEM, "out of memory for the documents");
    for (size_t i = 0; !st && i < r->n_docs; i++)
        docs[i] = (rk_doc){r->docs[i].name, r->docs[i].text, strlen(r->docs[i].text)};
    cli_prefix pre;
    if (!st)
        st = cli_doc_prefix(sv->o, "serve", sv->cache, sv->m, s, r->system, docs, r->n_docs, ids, n, NULL, NULL, &pre,
                            e);
    free(docs);
    free(ids);
    return st;
}

rk_status serve_prompt_fits(server *sv, const serve_req *r, rk_session *s, rk_err *e) {
    int32_t *ids = NULL;
    size_t n = 0;
    rk_conv *conv = NULL;
    rk_status st;
    if (r->op == SERVE_OP_COMPLETE) {
        st = rk_model_tokenize(sv->m, r->text, r->text_len, r->add_special, r->parse_special, &ids, &n, e);
    } else {
        st = build_conv(sv, r, s, &conv, e);
        if (!st) st = rk_conv_prompt(conv, &ids, &n, e);
    }
    const int64_t n_ctx = rk_session_n_ctx(s);
    if (!st && (int64_t)n >= n_ctx)
        st = rk_err_set(e, RK_E_CONTEXT,
                        "the prompt has %zu tokens but the context holds %lld, and at least one more is needed to "
                        "generate",
                        n, (long long)n_ctx);
    rk_conv_destroy(conv);
    free(ids);
    return st;
}

rk_status serve_run_gen(server *sv, const serve_req *r, rk_session *s, const rk_gen_params *gp, rk_conv **conv,
                        int32_t **ids, size_t *n_ids, rk_gen_result *res, const char **what, double *t_call,
                        rk_err *e) {
    rk_status st;
    rk_session_reset(s); /* requests do not see each other */
    if (r->op == SERVE_OP_COMPLETE) {
        st = rk_model_tokenize(sv->m, r->text, r->text_len, r->add_special, r->parse_special, ids, n_ids, e);
        *what = "tokenizing the prompt";
        if (!st) {
            *what = "generate";
            *t_call = rk_time_now();
            st = rk_generate(sv->m, s, *ids, *n_ids, gp, res, e);
        }
    } else {
        st = build_conv(sv, r, s, conv, e);
        if (!st && r->op == SERVE_OP_ASK && sv->o) st = ask_prefix(sv, r, s, *conv, e);
        *t_call = rk_time_now();
        if (!st) st = rk_conv_generate(*conv, gp, res, e);
    }
    cli_kv_budget_check("serve", s);
    return st;
}

/* complete, chat, ask: exactly one terminal event (done or error). */
static void op_generate(server *sv, const serve_req *r, double t_req) {
    rk_session *s = pick_session(sv, r);
    rk_fill_params fp;
    if (!s || !pick_fill(sv, r, s, &fp)) return;
    rk_err e = {0};
    rk_status st = RK_OK;
    rk_conv *conv = NULL;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    rk_gen_result res = {0};
    const serve_gen *g = &r->gen;
    gen_ctx ctx = {sv, r};
    rk_gen_params gp = rk_gen_params_default();
    gp.sampler = g->sp;
    gp.max_tokens = g->max_tokens;
    gp.stop = g->stop;
    gp.stop_len = g->stop_len;
    gp.n_stop = g->n_stop;
    gp.grammar = r->grammar;
    if (g->stream) gp.on_token = on_token, gp.token_ud = &ctx;
    const char *what = NULL;
    double t_call = 0;
    st = serve_run_gen(sv, r, s, &gp, &conv, &ids, &n_ids, &res, &what, &t_call, &e);
    const double t_before = t_call - t_req; /* reading, parsing, tokenizing: part of the TTFT */
    if (sv->write_failed) goto done;
    if (st == RK_E_CONTEXT)
        emit_errorf(sv, r->id, SERVE_CONTEXT_OVERFLOW,
                    "%s (shorten the prompt, or start the server with a larger -c, "
                    "up to the model's %lld)",
                    e.msg, (long long)rk_model_n_ctx_max(sv->m));
    else if (st) {
        /* the library's messages already start with "generate: "; other steps are named */
        int named = what && strcmp(what, "generate") != 0;
        emit_errorf(sv, r->id, status_code(st), "%s%s%s", named ? what : "", named ? ": " : "", e.msg);
    } else emit_done(sv, r, s, &fp, &res, t_before > 0 ? t_before : 0);
done:
    rk_gen_result_deinit(&res);
    rk_conv_destroy(conv);
    free(ids);
}

/* ---- tokenize, info ------------------------------------------------------------------- */
/* Bytes of token tok as text (borrowed from sv->piece until the next call). */
static const char *piece(server *sv, int32_t tok, size_t *n) {
    size_t need = rk_model_token_piece(sv->m, tok, true, sv->piece.p, sv->piece.cap);
    if (need > sv->piece.cap) {
        char *p = realloc(sv->piece.p, need);
        if (!p) {
            *n = 0;
            return "";
        }
        sv->piece.p = p;
        sv->piece.cap = need;
        need = rk_model_token_piece(sv->m, tok, true, sv->piece.p, sv->piece.cap);
    }
    *n = need;
    return need ? sv->piece.p : "";
}

static void op_tokenize(server *sv, const serve_req *r) {
    rk_err e = {0};
    int32_t *ids = NULL;
    size_t n = 0;
    rk_status st = rk_model_tokenize(sv->m, r->text, r->text_len, r->add_special, r->parse_special, &ids, &n, &e);
    if (st) {
        emit_errorf(sv, r->id, status_code(st), "tokenize: %s", e.msg);
        return;
    }
    json_object *ev = event(r->id, "tokens");
    json_object *toks = json_object_new_array_ext((int)n);
    json_object *pieces = r->pieces ? json_object_new_array_ext((int)n) : NULL;
    serve_buf clean = {0};
    for (size_t i = 0; i < n; i++) {
        json_object_array_add(toks, json_object_new_int(ids[i]));
        if (!pieces) continue;
        size_t pn;
        const char *p = piece(sv, ids[i], &pn);
        clean.n = 0; /* a byte-level piece may hold part of a character: show U+FFFD for it */
        serve_utf8_sanitize(&clean, p, pn);
        json_object_array_add(pieces, json_object_new_string_len(clean.n ? clean.p : "", (int)clean.n));
    }
    serve_buf_free(&clean);
    json_object_object_add(ev, "tokens", toks);
    if (pieces) json_object_object_add(ev, "pieces", pieces);
    emit(sv, ev);
    emit(sv, event(r->id, "done"));
    free(ids);
}

static void op_info(server *sv, const serve_req *r) {
    const rk_hparams *hp = sv->hp;
    json_object *ev = event(r->id, "info");
    json_object_object_add(ev, "name", json_object_new_string(rk_model_name(sv->m)));
    json_object_object_add(ev, "arch", json_object_new_string(hp->arch_name));
    json_object_object_add(ev, "n_layer", json_object_new_int(hp->n_layer));
    json_object_object_add(ev, "n_embd", json_object_new_int(hp->n_embd));
    json_object_object_add(ev, "n_head", json_object_new_int(hp->n_head));
    json_object_object_add(ev, "n_head_kv", json_object_new_int(hp->n_head_kv));
    json_object_object_add(ev, "n_vocab", json_object_new_int(hp->n_vocab));
    json_object_object_add(ev, "n_ctx", json_object_new_int64(rk_session_n_ctx(sv->s)));
    json_object_object_add(ev, "n_ctx_train", json_object_new_int(hp->n_ctx_train));
    json_object_object_add(ev, "n_ctx_max", json_object_new_int64(rk_model_n_ctx_max(sv->m)));
    json_object_object_add(ev, "rope_scaling", json_object_new_string(rk_rope_scaling_name(hp->rope_scaling.type)));
    json_object_object_add(ev, "chat_template",
                           json_object_new_string(rk_chat_family_name(rk_model_chat_family(sv->m))));
    json_object_object_add(ev, "weight_bytes", json_object_new_int64((int64_t)rk_model_weight_bytes(sv->m)));
    json_object_object_add(ev, "kv", json_object_new_string(sv->kv));
    json_object_object_add(ev, "fill", json_object_new_string(rk_fill_mode_name(sv->fill.mode)));
    emit(sv, ev);
    emit(sv, event(r->id, "done"));
}

void serve_handle_line(server *sv, const char *line, size_t n) {
    double t_req = rk_time_now();
    serve_req r;
    char msg[512];
    serve_code code = serve_req_parse(line, n, &sv->defaults, &r, msg, sizeof msg);
    if (code) {
        serve_emit_error(sv, r.id, code, msg);
    } else {
        switch (r.op) {
        case SERVE_OP_COMPLETE:
        case SERVE_OP_CHAT:
        case SERVE_OP_ASK: op_generate(sv, &r, t_req); break;
        case SERVE_OP_TOKENIZE: op_tokenize(sv, &r); break;
        case SERVE_OP_INFO: op_info(sv, &r); break;
        }
    }
    serve_req_deinit(&r);
}

void serve_deinit(server *sv) {
    rk_doc_cache_close(sv->cache);
    serve_buf_free(&sv->piece);
    rk_session_destroy(sv->alt);
    rk_session_destroy(sv->s);
    rk_ridge_maps_destroy(sv->req_maps);
    rk_ridge_maps_destroy(sv->maps);
    rk_model_destroy(sv->m);
}
