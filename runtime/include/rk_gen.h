/* ridgekv generation API (librk): the one generate loop and the one conversation object,
 * both over rk.h. Same rules as rk.h: rk_status returns with rk_err last, nothing
 * prints, reads the environment or exits. */
#pragma once
#include "rk.h"

/* ---- UTF-8 ----------------------------------------------------------------------- */
/* Length of the well-formed character at p (1..4); 0 when p[0..n) is a proper prefix of
 * one (more bytes could complete it); -1 when p[0] starts no well-formed character
 * (overlongs, surrogates and code points past U+10FFFF are not well-formed). n >= 1. */
int rk_utf8_char(const unsigned char *p, size_t n);
/* True when all n bytes are well-formed UTF-8; else *bad (may be NULL) is the offset of
 * the first bad byte. */
bool rk_utf8_valid(const char *p, size_t n, size_t *bad);
/* p[0..n) with each byte that starts no well-formed character replaced by U+FFFD, as a
 * malloc'd NUL-terminated string (*out_len bytes before the NUL); NULL when out of memory. */
char *rk_utf8_repair(const char *p, size_t n, size_t *out_len);

/* ---- sampler steps (rk_sampler_sample = penalize, then pick) ---------------------- */
/* Applies the repeat / frequency / presence penalties over the last repeat_last_n ids of
 * history, then DRY over the last dry_penalty_last_n, to logits in place. */
void rk_sampler_penalize(rk_sampler *s, float *logits, const int32_t *history, size_t n_history);
/* Picks a token from logits as they are (greedy or the temperature / top-k / top-p / min-p
 * draw); NaN logits are never picked (id 0 when all are NaN). */
int32_t rk_sampler_pick(rk_sampler *s, float *logits);
/* The DRY sequence breakers: token ids a repeat never extends across (copied; replaces
 * the set). RK_E_INVALID_ARG for an id outside the vocabulary. */
rk_status rk_sampler_set_dry_breakers(rk_sampler *s, const int32_t *ids, size_t n, rk_err *err);

/* ---- JSON grammar (constrained sampling) --------------------------------------------- *
 * A compiled JSON Schema subset, and a byte-level state machine that accepts exactly the
 * prefixes of the JSON texts the schema allows (no whitespace before or after the value; at most
 * RK_JSON_MAX_WS whitespace bytes in a row). Keywords: type (a name or an array of names:
 * object, array, string, number, integer, boolean, null), properties (at most 64; only the
 * listed properties may appear, each at most once, in any order), required,
 * additionalProperties (false only), items, minItems, maxItems, minLength, maxLength, enum
 * and const (at most 64 values, matched in json-c's plain form: no spaces), $ref to
 * "#/$defs/NAME" or "#/definitions/NAME" (not recursive), and the annotations title,
 * description, default, examples, $schema, $id, $comment, $defs, definitions. Any other
 * keyword is refused by name. integer admits no fraction or exponent. */
#define RK_JSON_MAX_DEPTH 32 /* nesting of arrays and objects */
#define RK_JSON_MAX_WS 16
typedef struct rk_json_grammar rk_json_grammar;
typedef struct rk_json_state rk_json_state;

/* schema: the JSON text of a schema (len bytes); NULL: any JSON object (OpenAI's
 * "json_object"). RK_E_INVALID_ARG naming the keyword and where it sits ("#/properties/x")
 * for what is outside the subset or malformed. */
rk_status rk_json_grammar_create(const char *schema, size_t len, rk_json_grammar **out, rk_err *err);
void rk_json_grammar_destroy(rk_json_grammar *g);

/* A parse position at the start of the text; borrows g, which must outlive it. */
rk_status rk_json_state_create(const rk_json_grammar *g, rk_json_state **out, rk_err *err);
void rk_json_state_destroy(rk_json_state *st);
void rk_json_state_reset(rk_json_state *st);
/* Feeds p[0..n): true when the text so far followed by p is still a prefix of an allowed
 * text (the state then moves on); false leaves the state unchanged. */
bool rk_json_state_feed(rk_json_state *st, const char *p, size_t n);
/* What rk_json_state_feed would answer, leaving the state unchanged. */
bool rk_json_state_accepts(rk_json_state *st, const char *p, size_t n);
/* The text so far is a whole allowed value (it may still go on: a top-level number). */
bool rk_json_state_can_end(const rk_json_state *st);
/* The text so far is a whole allowed value and nothing may follow it. */
bool rk_json_state_complete(const rk_json_state *st);

/* ---- generation ------------------------------------------------------------------ */
typedef enum rk_stop_reason {
    RK_STOP_LENGTH = 0, /* max_tokens generated (max_tokens 0: prefill only) */
    RK_STOP_EOG,        /* the model sampled an end-of-generation token (not part of the output) */
    RK_STOP_STRING,     /* a stop string matched: the text ends just before it */
    RK_STOP_CONTEXT,    /* the context is full: the last token was sampled but not evaluated */
    RK_STOP_CANCELLED,  /* on_token returned false (decode); a cancelled prefill is RK_E_CANCELLED */
} rk_stop_reason;

/* "length", "eog", "stop", "context", "cancelled" (the JSONL finish_reason names). */
const char *rk_stop_reason_name(rk_stop_reason r);

/* Called once per generated token (end-of-generation tokens excluded) with the text this
 * token decided: whole UTF-8 characters only (a partial character is held until it
 * completes; bytes that can never form one become U+FFFD) and never text that could
 * still be the start of a stop string (held until decided). n may be 0. text is borrowed
 * for the call. Returning false stops the generation after this token (RK_STOP_CANCELLED). */
typedef bool (*rk_gen_token_fn)(void *ud, int32_t token, const char *text, size_t n);

typedef struct rk_gen_params {
    rk_sampler_params sampler;
    int32_t max_tokens;      /* -1: until end of generation or a full context; 0: prefill only */
    const char *const *stop; /* n_stop stop strings (borrowed for the call), each 1.. bytes */
    const size_t *stop_len;  /* their lengths; NULL: strlen */
    int32_t n_stop;
    int64_t n_reuse;            /* the first n_reuse prompt tokens are what the session holds in rows
                                    [0, n_reuse) (the caller knows; rk_conv works it out): those rows are
                                    kept, later rows dropped, and only the rest of the prompt is read.
                                    0: the session is reset first. At most n_past; capped at n_prompt - 1
                                    so at least one token is read for fresh logits. */
    const rk_fill_params *fill; /* NULL: the session's fill setting as it is; else applied with
                                    rk_session_set_fill before the prefill (and left set) */
    rk_progress_fn progress;    /* prefill progress (see rk_session_set_progress); returning false
                                    after a chunk that is not the last cancels the prefill:
                                    RK_E_CANCELLED. Cleared after the prefill. */
    void *progress_ud;
    rk_gen_token_fn on_token; /* NULL: no streaming, the text is in the result */
    void *token_ud;
    bool ignore_eog;                 /* decode through end-of-generation tokens (bench) */
    const rk_json_grammar *grammar;  /* NULL: free text; else only tokens whose bytes keep the text a
                                       prefix the grammar allows are sampled, end-of-generation only
                                       when it can end, and the generation stops (RK_STOP_EOG) once the
                                       value is complete (borrowed for the call) */
    const char *const *dry_breakers; /* DRY sequence breakers as text: a token whose text holds one
                                        breaks a repeat; NULL: "\n", ":", "\"", "*" (llama.cpp's) */
    int32_t n_dry_breakers;
} rk_gen_params;

/* sampler = rk_sampler_params_default(), max_tokens 256, everything else 0 / NULL. */
rk_gen_params rk_gen_params_default(void);

typedef struct rk_gen_result {
    rk_stop_reason stop;
    char *text; /* the whole generated text, well-formed UTF-8, NUL-terminated,
                               without the stop string (owned; rk_gen_result_deinit) */
    size_t n_text;
    size_t n_streamed; /* bytes of text already handed to on_token: text + n_streamed is the
                               rest (text held back at the end, or everything without on_token) */
    int32_t *tokens;   /* (n_gen) generated ids (owned) */
    int64_t n_gen;
    int64_t n_prompt;     /* prompt tokens */
    int64_t n_prefill;    /* of them read by the prefill (n_prompt - rows kept) */
    uint64_t filled_rows; /* (row, layer) pairs whose K/V the prefill took from RidgeFill's
                               predicted inputs (0 without fill) */
    double prefill_s;     /* seconds of the prefill */
    double ttft_s;        /* from the call to the first sampled token; < 0 when none was sampled */
    double decode_s;      /* from the end of the prefill to the end */
    double prefill_tok_s; /* n_prefill / prefill_s */
    double decode_tok_s;  /* n_gen / decode_s (0 when nothing was generated) */
} rk_gen_result;

/* Accepts a zeroed or deinitialised result. */
void rk_gen_result_deinit(rk_gen_result *r);

/* Reads the prompt into s (a session of m; see n_reuse for what is kept), then samples,
 * streams and evaluates tokens until a stop reason. The prompt must leave room for one
 * generated token (n_prompt < n_ctx): RK_E_CONTEXT otherwise, naming both numbers; an
 * empty prompt is RK_E_INVALID_ARG. The cache then holds the prompt and the generated
 * tokens except a last one that was sampled but not evaluated (length, stop string,
 * context, cancelled). *out (zeroed by the caller) is filled on RK_OK only; after
 * RK_E_CANCELLED the session holds the kept prompt rows. Allocates before the decode loop
 * (sampler, logits, history); the loop itself only grows the text buffers. */
rk_status rk_generate(const rk_model *m, rk_session *s, const int32_t *prompt, size_t n_prompt, const rk_gen_params *p,
                      rk_gen_result *out, rk_err *err);

/* ---- conversation ---------------------------------------------------------------- *
 * Messages in the model's chat template (rk_model_chat_family), kept with the tokens
 * that stand for them, over a borrowed session whose cache holds the conversation
 * between turns. Rules, the same for every caller (CLI chat, ask, JSONL chat and ask,
 * /load):
 * - roles are system, user, assistant; a system message may only be the first message;
 * - the template markup is tokenized with special tokens, message contents never are
 *   (a message holding "<|im_end|>" stays text); each piece is its own tokenizer call, so
 *   with SentencePiece vocabularies each content starts a text fragment (dummy-prefix
 *   space), as ask has always done;
 * - each turn reuses the cache rows of the longest common token prefix of the new
 *   prompt and what the cache holds (rk_session_tokens when the session has it, else the
 *   conversation's own record of what it evaluated) and reads only the rest; the model's
 *   own answer tokens stand for its answers as they were generated;
 * - a turn must leave answer room: n_answer tokens, at most n_ctx / room_div (1 token when
 *   room_div is 0). When it does not fit, with drop_oldest the oldest exchanges (a user
 *   message and what follows it up to the next user message; never the system message or
 *   the newest message) are dropped one at a time until it does, and a newest message that
 *   fits alone (without the full room) gets what is left; without drop_oldest, or when the
 *   newest message does not fit even alone, the turn is refused with RK_E_CONTEXT. */
typedef struct rk_conv rk_conv;

typedef struct rk_conv_params {
    int32_t n_answer; /* answer tokens a turn wants room for (-n); <= 0: the cap */
    int32_t room_div; /* the answer room is at most n_ctx / room_div (chat 2, ask 4); 0: 1 token */
    bool drop_oldest; /* the overflow rule above (chat); false: RK_E_CONTEXT (ask, JSONL) */
} rk_conv_params;

/* The conversation borrows m and s (a session of m), which must outlive it. It starts
 * empty; it does not reset s (the first turn keeps whatever prefix s holds, when
 * rk_session_tokens tells; else it resets s). */
rk_status rk_conv_create(const rk_model *m, rk_session *s, const rk_conv_params *p, rk_conv **out, rk_err *err);
void rk_conv_destroy(rk_conv *c);

/* Appends a message (content copied). RK_E_INVALID_ARG for another role, a system message
 * that is not the first, or a content with a NUL byte (len is the content's length). */
rk_status rk_conv_add(rk_conv *c, const char *role, const char *content, size_t len, rk_err *err);

/* The system prompt of rk_conv_add_ask when the caller gives none. */
#define RK_ASK_SYSTEM "You are a helpful assistant. Answer the question using the document. Keep the answer short."

typedef struct rk_doc {
    const char *name; /* shown in the header; NULL: unnamed */
    const char *text; /* borrowed for the call */
    size_t len;
} rk_doc;

/* The one "documents + question" prompt (CLI ask and JSONL ask): when the conversation is
 * empty a system message (system, or RK_ASK_SYSTEM when NULL) comes first; then one user
 * message holding each document under a header line ("Document: NAME" for one document,
 * "Document i of n: NAME" for several; without NAME for unnamed ones) between lines
 * of three double quotes (the document's trailing newlines dropped), a blank line after
 * each, then "Question: " and the question. CRLF and lone CR in documents and question
 * become LF, so a file and the same text sent as JSON give the same tokens. */
rk_status rk_conv_add_ask(rk_conv *c, const char *system, const rk_doc *docs, size_t n_docs, const char *question,
                          rk_err *err);

/* Removes the last message (a no-op when empty). */
void rk_conv_pop(rk_conv *c);
/* Forgets every message (the system message stays when keep_system) and resets s. */
void rk_conv_reset(rk_conv *c, bool keep_system);

size_t rk_conv_n_messages(const rk_conv *c);
/* Message i (< n_messages): role and content borrowed until the conversation changes. */
rk_chat_msg rk_conv_message(const rk_conv *c, size_t i);
/* User messages so far. */
size_t rk_conv_n_exchanges(const rk_conv *c);
rk_chat_family rk_conv_family(const rk_conv *c);
/* The answer room the rule asks of every turn, in tokens. */
int64_t rk_conv_answer_room(const rk_conv *c);

/* The tokens of the conversation with the assistant turn opened: what the next turn reads
 * (before any dropping). *ids malloc'd (caller frees). */
rk_status rk_conv_prompt(rk_conv *c, int32_t **ids, size_t *n, rk_err *err);

/* What the last rk_conv_generate found when fitting the turn (also after RK_E_CONTEXT). */
typedef struct rk_conv_fit {
    int64_t n_prompt; /* tokens of the prompt read for the turn (after dropping) */
    int64_t n_before; /* tokens before anything was dropped */
    int64_t n_room;   /* answer room asked for */
    int64_t n_ctx;
    int32_t n_dropped;    /* exchanges dropped by the overflow rule */
    int64_t n_reused;     /* prompt tokens whose cache rows were kept */
    int64_t n_answer_cap; /* the answer's cap: max_tokens, at most the room left for it when
                             room_div > 0 (-1: none) */
    bool too_long;        /* the turn was refused: it does not fit (RK_E_CONTEXT) */
} rk_conv_fit;
rk_conv_fit rk_conv_last_fit(const rk_conv *c);

/* One assistant turn: fits the conversation (the rule above), reuses the cached prefix,
 * generates with p (its n_reuse is worked out here; with room_div > 0 its max_tokens is
 * capped by the answer room, or by what is left when the newest message fits only without
 * the full room, so that an answer never fills the context the next turn needs) and, on
 * RK_OK, appends the answer as
 * an assistant message (also when stopped part way). On an error, including RK_E_CONTEXT
 * and RK_E_CANCELLED, no answer is added and the newest message stays (rk_conv_pop
 * removes it). *out as for rk_generate. */
rk_status rk_conv_generate(rk_conv *c, const rk_gen_params *p, rk_gen_result *out, rk_err *err);

/* Writes the messages to path atomically as JSON ({"format": "ridgekv-chat", "version",
 * "model", "template", "messages": [{"role", "content"}]}). When the session can export
 * its cache (rk_session_kv_export), the block goes beside it in path + ".kv" and the JSON
 * names it ("kv": {"file", "n_tokens"}); *kv_saved (may be NULL) says whether it did.
 * RK_E_UNSUPPORTED from the export is not an error: the file then holds messages only. */
rk_status rk_conv_save(const rk_conv *c, const char *path, bool *kv_saved, rk_err *err);
/* Replaces the conversation with the file's messages. A file that cannot be read
 * (RK_E_IO), is not such JSON or breaks the rules above (RK_E_INVALID_ARG, naming why)
 * leaves the conversation unchanged. When the file names a KV block that can be read, s
 * is reset and the block imported (*kv_loaded, may be NULL): the next turn reuses it; if
 * the import fails the cache stays empty and the next turn reads everything. Without a
 * block the cache keeps what it held and the next turn reads what does not match. */
rk_status rk_conv_load(rk_conv *c, const char *path, bool *kv_loaded, rk_err *err);
