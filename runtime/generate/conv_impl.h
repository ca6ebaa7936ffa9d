/* Internal to runtime/generate: the conversation's state, shared by conversation.c (turns)
 * and conv_io.c (save / load). */
#pragma once
#include "gen_impl.h"

typedef struct rk_ids {
    int32_t *p;
    size_t n, cap;
} rk_ids;

bool rk_ids_reserve(rk_ids *v, size_t n);
bool rk_ids_append(rk_ids *v, const int32_t *x, size_t n);

typedef struct rk_conv_msg {
    const char *role; /* static string (rk_conv_role) */
    char *content;    /* owned, NUL-terminated */
    size_t len;
    int32_t *ids; /* the tokens standing for the content (owned); valid when have_ids */
    size_t n_ids;
    bool have_ids; /* tokenized, or the model's own answer tokens */
} rk_conv_msg;

struct rk_conv {
    const rk_model *m;
    rk_session *s;
    rk_conv_params p;
    rk_chat_family fam;
    rk_conv_msg *msgs;
    size_t n_msgs, cap_msgs;
    rk_ids kv; /* the tokens in the cache as this conversation put them (kv.n == n_past
                          while nobody else used the session) */
    rk_conv_fit fit;
};

/* "system", "user", "assistant" as static strings; NULL for anything else. */
const char *rk_conv_role(const char *r);
/* The rules for message i: a known role, system only first, no NUL in content[0..len). */
rk_status rk_conv_check(size_t i, const char *role, const char *content, size_t len, rk_err *err);
void rk_conv_msgs_free(rk_conv_msg *v, size_t n);
/* The prompt tokens of all messages with the assistant turn opened. */
rk_status rk_conv_build(rk_conv *c, rk_ids *out, rk_err *err);
