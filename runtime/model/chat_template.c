/* Chat formatting for the common template families. We recognise the Jinja template
 * stored in the GGUF by its distinctive markers rather than running Jinja. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model_impl.h"

static bool has(rk_str s, const char *needle) {
    size_t n = strlen(needle);
    if (n == 0 || s.len < n) return false;
    for (uint64_t i = 0; i + n <= s.len; i++)
        if (!memcmp(s.ptr + i, needle, n)) return true;
    return false;
}

rk_chat_family rk_model_chat_family(const rk_model *m) {
    rk_str t;
    if (rk_gguf_get_str(m->gguf, "tokenizer.chat_template", &t, NULL) != RK_OK) return RK_CHAT_CHATML;
    if (has(t, "<|im_start|>")) return RK_CHAT_CHATML;
    if (has(t, "<|start_header_id|>")) return RK_CHAT_LLAMA3;
    if (has(t, "<|user|>") && has(t, "eos_token")) return RK_CHAT_ZEPHYR;
    if (has(t, "[INST]")) return RK_CHAT_LLAMA2;
    return RK_CHAT_CHATML;
}

const char *rk_chat_family_name(rk_chat_family f) {
    switch (f) {
    case RK_CHAT_LLAMA3: return "llama3";
    case RK_CHAT_LLAMA2: return "llama2";
    case RK_CHAT_ZEPHYR: return "zephyr";
    default: return "chatml";
    }
}

typedef struct sbuf {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void put(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(sbuf *b, const char *fmt, ...) {
    if (b->oom) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) {
        b->oom = true;
        return;
    }
    if (b->len + (size_t)n + 1 > b->cap) {
        size_t cap = (b->len + (size_t)n + 1) * 2;
        char *q = realloc(b->p, cap);
        if (!q) {
            b->oom = true;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

rk_status rk_chat_format(rk_chat_family f, const rk_chat_msg *msgs, size_t n, bool add_assistant, char **out,
                         rk_err *err) {
    sbuf b = {0};
    put(&b, "%s", "");
    for (size_t i = 0; i < n; i++) {
        const char *r = msgs[i].role, *c = msgs[i].content ? msgs[i].content : "";
        if (!r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))) {
            free(b.p);
            return rk_err_set(err, RK_E_INVALID_ARG,
                              "chat: message %zu has role '%s' (expected system, user or assistant)", i,
                              r ? r : "(null)");
        }
        switch (f) {
        case RK_CHAT_CHATML: put(&b, "<|im_start|>%s\n%s<|im_end|>\n", r, c); break;
        case RK_CHAT_LLAMA3:
            if (i == 0) put(&b, "<|begin_of_text|>");
            put(&b, "<|start_header_id|>%s<|end_header_id|>\n\n%s<|eot_id|>", r, c);
            break;
        case RK_CHAT_ZEPHYR: put(&b, "<|%s|>\n%s</s>\n", r, c); break;
        case RK_CHAT_LLAMA2:
            /* the system prompt folds into the first user turn */
            if (!strcmp(r, "system")) put(&b, "<s>[INST] <<SYS>>\n%s\n<</SYS>>\n\n", c);
            else if (!strcmp(r, "user")) {
                bool after_sys = i > 0 && !strcmp(msgs[i - 1].role, "system");
                put(&b, after_sys ? "%s [/INST]" : "<s>[INST] %s [/INST]", c);
            } else put(&b, " %s </s>", c);
            break;
        }
    }
    if (add_assistant) {
        switch (f) {
        case RK_CHAT_CHATML: put(&b, "<|im_start|>assistant\n"); break;
        case RK_CHAT_LLAMA3: put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n"); break;
        case RK_CHAT_ZEPHYR: put(&b, "<|assistant|>\n"); break;
        case RK_CHAT_LLAMA2: break;
        }
    }
    if (b.oom) {
        free(b.p);
        return rk_err_set(err, RK_E_NOMEM, "chat: out of memory formatting %zu messages", n);
    }
    *out = b.p;
    return RK_OK;
}

/* A literal "<|im_start|>system" + newline (real, or the two characters \\n of a Jinja
 * string) + text + "<|im_end|>" where the text has no quote or brace: a system turn the
 * template writes itself, i.e. its default system prompt. One built from messages[0]
 * ("...system\\n' + messages[0]['content'] + '<|im_end|>") has a quote and is skipped. */
static char *default_system(rk_str t) {
    static const char open[] = "<|im_start|>system", close[] = "<|im_end|>";
    const size_t no = sizeof open - 1, nc = sizeof close - 1;
    for (uint64_t i = 0; i + no < t.len; i++) {
        if (memcmp(t.ptr + i, open, no)) continue;
        uint64_t j = i + no;
        if (j < t.len && t.ptr[j] == '\n') j += 1;
        else if (j + 1 < t.len && t.ptr[j] == '\\' && t.ptr[j + 1] == 'n') j += 2;
        else continue;
        uint64_t k = j;
        bool literal = true;
        while (k + nc <= t.len && memcmp(t.ptr + k, close, nc)) {
            const char ch = t.ptr[k];
            if (ch == '\'' || ch == '"' || ch == '{' || ch == '}' || ch == '<') {
                literal = false;
                break;
            }
            k++;
        }
        if (!literal || k + nc > t.len || k == j) continue;
        char *out = malloc((size_t)(k - j) + 1);
        if (!out) return NULL;
        size_t n = 0;
        for (uint64_t p = j; p < k; p++) {
            if (t.ptr[p] == '\\' && p + 1 < k && t.ptr[p + 1] == 'n') {
                out[n++] = '\n';
                p++;
            } else {
                out[n++] = t.ptr[p];
            }
        }
        out[n] = '\0';
        return out;
    }
    return NULL;
}

rk_status rk_model_read_chat_rules(rk_model *m, rk_err *err) {
    rk_str t;
    char *d = NULL;
    if (rk_model_chat_family(m) == RK_CHAT_CHATML &&
        rk_gguf_get_str(m->gguf, "tokenizer.chat_template", &t, NULL) == RK_OK)
        d = default_system(t);
    if (!d) d = calloc(1, 1);
    if (!d) return rk_err_set(err, RK_E_NOMEM, "model: out of memory");
    m->chat_default_system = d;
    return RK_OK;
}

const char *rk_model_chat_default_system(const rk_model *m) {
    return m->chat_default_system ? m->chat_default_system : "";
}

rk_status rk_model_chat_format(const rk_model *m, const rk_chat_msg *msgs, size_t n, bool add_assistant, char **out,
                               rk_err *err) {
    const char *d = rk_model_chat_default_system(m);
    const rk_chat_family f = rk_model_chat_family(m);
    if (!d[0] || n == 0 || (msgs[0].role && !strcmp(msgs[0].role, "system")))
        return rk_chat_format(f, msgs, n, add_assistant, out, err);
    rk_chat_msg *all = malloc((n + 1) * sizeof *all);
    if (!all) return rk_err_set(err, RK_E_NOMEM, "chat: out of memory");
    all[0] = (rk_chat_msg){"system", d};
    memcpy(all + 1, msgs, n * sizeof *msgs);
    rk_status st = rk_chat_format(f, all, n + 1, add_assistant, out, err);
    if (st) rk_err_wrap(err, "chat (with the template's default system prompt)");
    free(all);
    return st;
}
