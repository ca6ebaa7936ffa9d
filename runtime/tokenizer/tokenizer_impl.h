/* Tokenizers built from GGUF metadata (tokenizer.ggml.*), following llama.cpp's
 * llama-vocab.cpp:
 *   "llama" : SentencePiece-style; scores, bigram merge by score, <0xXX> byte fallback,
 *             dummy-prefix space.
 *   "gpt2"  : GPT-2 byte-level BPE; merge ranks, pre-tokenizer chosen by tokenizer.ggml.pre.
 * Plus the UTF-8 and Unicode-category helpers the pre-tokenizers need, and a streaming
 * UTF-8 joiner for printing pieces.
 *
 * Sections: API (used by the rest of runtime/ and cli/), Unicode helpers, and internals
 * shared only by tokenizer.c / tokenizer_spm.c / tokenizer_bpe.c. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "rk_base.h"
#include "rk_gguf.h"

/* ======================================================================
 * API
 * ====================================================================== */

typedef struct rk_tokenizer rk_tokenizer;

/* tokenizer.ggml.token_type values. */
typedef enum rk_toktype {
    RK_TOKTYPE_UNDEFINED = 0,
    RK_TOKTYPE_NORMAL = 1,
    RK_TOKTYPE_UNKNOWN = 2,
    RK_TOKTYPE_CONTROL = 3,
    RK_TOKTYPE_USER_DEFINED = 4,
    RK_TOKTYPE_UNUSED = 5,
    RK_TOKTYPE_BYTE = 6,
} rk_toktype;

typedef enum rk_tok_kind { RK_TOK_SPM = 1, RK_TOK_BPE = 2 } rk_tok_kind;

/* Pre-tokenizer rule sets (BPE only). Each names the llama.cpp regex family. */
typedef enum rk_tok_pre {
    RK_TOK_PRE_NONE = 0,  /* SPM: no pre-tokenizer */
    RK_TOK_PRE_DEFAULT,   /* llama.cpp "default" BPE: punctuation runs, gpt-2, \p{N}+, [0-9]{3} */
    RK_TOK_PRE_GPT2,      /* 's|'t|... ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    RK_TOK_PRE_STARCODER, /* \p{N} split first, then gpt-2 (starcoder, smollm, refact, ...) */
    RK_TOK_PRE_QWEN2,     /* (?:'[sS]|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s..]+[\r\n]*|... */
    RK_TOK_PRE_LLAMA3,    /* as QWEN2 with \p{N}{1,3}; whole-word vocab hits skip merges */
} rk_tok_pre;

/* Builds a tokenizer from g's tokenizer.ggml.* keys.
 * Borrows: token and merge strings stay views into the file bytes g was parsed from
 * (the model mapping), which must outlive the tokenizer; g itself may be destroyed
 * after this returns. Everything else (scores, types, hash tables) is copied.
 * Errors: RK_E_NOT_FOUND (no tokenizer.ggml.model / tokens), RK_E_UNSUPPORTED (model
 * other than "llama" / "gpt2"), RK_E_GGUF_TYPE / RK_E_GGUF_COUNT (wrong types, array
 * lengths that disagree), RK_E_NOMEM. Unknown pre-tokenizer names are not an error:
 * gpt-2 rules are used and rk_tokenizer_pre_fallback() says so. */
rk_status rk_tokenizer_create(const rk_gguf *g, rk_tokenizer **out, rk_err *err);
void rk_tokenizer_destroy(rk_tokenizer *t); /* accepts NULL */

/* Text -> token ids. *ids is malloc'd (caller frees with free(); NULL when *n_ids == 0).
 * add_special: prepend BOS when the vocab says add_bos (tokenizer.ggml.add_bos_token;
 *   default true for "llama" and llama3-style BPE, false for other BPE), append EOS when
 *   add_eos.
 * parse_special: text equal to a CONTROL or UNKNOWN token (e.g. "<|im_start|>") becomes
 *   that token, longest first. USER_DEFINED tokens are always matched, as in llama.cpp
 *   and HF tokenizers.
 * Bytes that are not valid UTF-8 never fail, and give llama.cpp's ids: SPM keeps them
 * as <0xXX> byte tokens; BPE replaces each with U+FFFD (so decode gives U+FFFD there).
 * len above RK_TOK_MAX_TEXT -> RK_E_INVALID_ARG.
 * The tokenizer is read-only here: concurrent calls are safe. */
#define RK_TOK_MAX_TEXT ((size_t)1 << 29) /* 512 MiB: symbol indices stay in int32 */
rk_status rk_tokenizer_encode(const rk_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                              int32_t **ids, size_t *n_ids, rk_err *err);

/* Bytes of one token as printed while streaming: byte tokens give their raw byte,
 * SPM "▁" -> ' ', BPE byte-level text mapped back to bytes; CONTROL / UNKNOWN tokens
 * give their text only when render_special (else nothing); UNUSED / UNDEFINED and
 * out-of-range ids give nothing. Returns the piece length; writes it to buf only when
 * it fits in cap (no NUL, no partial write). A piece is never longer than
 * rk_tokenizer_max_piece_bytes(). May end inside a UTF-8 character: see rk_utf8_stream. */
size_t rk_tokenizer_piece(const rk_tokenizer *t, int32_t id, bool render_special, char *buf, size_t cap);
size_t rk_tokenizer_max_piece_bytes(const rk_tokenizer *t);

/* Concatenated pieces, NUL-terminated, malloc'd (*len excludes the NUL). When the vocab
 * adds a space prefix (SPM), one leading space of the first token's piece is dropped;
 * as in llama.cpp, a leading BOS uses up that strip, so pass ids + 1 to decode text
 * that follows a BOS. No clean-up of spaces before punctuation. */
rk_status rk_tokenizer_decode(const rk_tokenizer *t, const int32_t *ids, size_t n_ids, bool render_special, char **text,
                              size_t *len, rk_err *err);

int32_t rk_tokenizer_n_vocab(const rk_tokenizer *t);
int32_t rk_tokenizer_bos(const rk_tokenizer *t); /* -1 when none */
int32_t rk_tokenizer_eos(const rk_tokenizer *t); /* -1 when none */
bool rk_tokenizer_add_bos(const rk_tokenizer *t);
/* End of generation: eos, eot/eom ids, and tokens whose text is one of <|eot_id|>,
 * <|im_end|>, <|end|>, <end_of_turn>, <|endoftext|>, <|eom_id|>, <EOT>, _<EOT>,
 * <|end_of_text|>, <end_of_utterance>, <|return|>, <|call|> (made CONTROL, as llama.cpp
 * does), or a CONTROL "</s>". */
bool rk_tokenizer_is_eog(const rk_tokenizer *t, int32_t id);
/* The EOG ids, ascending; borrowed for the tokenizer's life. */
size_t rk_tokenizer_eog_ids(const rk_tokenizer *t, const int32_t **ids);
/* Id of the vocab entry whose stored text is exactly text (e.g. "<|im_end|>", "Ġthe",
 * "▁the"), or -1. */
int32_t rk_tokenizer_find(const rk_tokenizer *t, const char *text);
/* Stored text (borrowed view into the file) and type of a token; {NULL,0} / UNDEFINED
 * for out-of-range ids. */
rk_str rk_tokenizer_text(const rk_tokenizer *t, int32_t id);
rk_toktype rk_tokenizer_type(const rk_tokenizer *t, int32_t id);

rk_tok_kind rk_tokenizer_kind(const rk_tokenizer *t);
/* Rule set in use, and its name ("gpt-2", "starcoder", "qwen2", "llama3", "default";
 * "" for SPM). */
rk_tok_pre rk_tokenizer_pre(const rk_tokenizer *t);
const char *rk_tokenizer_pre_name(const rk_tokenizer *t);
/* True when tokenizer.ggml.pre named rules we do not know and gpt-2 rules are used
 * instead; *stored (may be NULL) gets the name as written in the file. */
bool rk_tokenizer_pre_fallback(const rk_tokenizer *t, rk_str *stored);

/* 64-bit FNV-1a fingerprint of everything that decides tokenization: model kind and
 * pre-rules names ("llama"/"gpt2", rk_tokenizer_pre_name(), each NUL-terminated),
 * n_vocab, every token's (length, bytes, score bits, type after the EOG fix-up), the
 * merges (length, left half, length, right half), bos/eos/unk ids and the add_bos |
 * add_eos << 1 | add_space_prefix << 2 flags. Numbers are hashed as little-endian
 * 32-bit words. Stable across runs and platforms. */
uint64_t rk_tokenizer_hash(const rk_tokenizer *t);

/* ======================================================================
 * UTF-8 and Unicode categories (unicode.c, tables in unicode_data.c)
 * ====================================================================== */

/* Coarse general category: first letter of the Unicode category; Cn kept apart.
 * Numbering is shared with scripts/gen_unicode.py. */
typedef enum rk_ucat {
    RK_UCAT_CN = 0, /* unassigned */
    RK_UCAT_L = 1,
    RK_UCAT_M = 2,
    RK_UCAT_N = 3,
    RK_UCAT_P = 4,
    RK_UCAT_S = 5,
    RK_UCAT_Z = 6,
    RK_UCAT_C = 7, /* Cc Cf Cs Co */
} rk_ucat;

/* Category flags of one code point, for the pre-tokenizer matchers. */
enum {
    RK_UF_LETTER = 1u << 0, /* \p{L} */
    RK_UF_NUMBER = 1u << 1, /* \p{N} */
    RK_UF_PUNCT = 1u << 2,  /* \p{P} */
    RK_UF_SPACE = 1u << 3,  /* \s: the Unicode White_Space property */
};

rk_ucat rk_unicode_category(uint32_t cp); /* code points above 0x10FFFF -> CN */
bool rk_unicode_is_space(uint32_t cp);
unsigned rk_unicode_flags(uint32_t cp); /* RK_UF_* bits */

/* Sequence length implied by a lead byte, llama.cpp's rule (continuation and invalid
 * lead bytes count 1; F8..FF count 4). */
size_t rk_utf8_len_lead(unsigned char c);
/* Decodes one sequence from s[0..n), n >= 1. Structural check plus cp <= 0x10FFFF
 * (as llama.cpp, overlong forms and surrogates pass). On an invalid or truncated
 * sequence returns 1 and sets *cp = 0xFFFD, *valid = false. */
size_t rk_utf8_decode(const char *s, size_t n, uint32_t *cp, bool *valid);
/* Writes 1..4 bytes; cp above 0x10FFFF writes U+FFFD. */
size_t rk_utf8_encode(uint32_t cp, char out[4]);

/* Joins streamed pieces so a UTF-8 character split across pieces is printed whole.
 * Holds back at most 3 bytes: a tail that is a proper prefix of a valid sequence.
 * Bytes that can never complete a character pass through unchanged. */
typedef struct rk_utf8_stream {
    unsigned char pend[4];
    unsigned n_pend;
} rk_utf8_stream;

void rk_utf8_stream_init(rk_utf8_stream *s);
/* Appends in[0..n) and writes every byte that is ready to out; returns how many (0 when
 * all of it is held back). Needs cap >= n + 3: with less, nothing is consumed and
 * SIZE_MAX is returned. */
size_t rk_utf8_stream_push(rk_utf8_stream *s, const char *in, size_t n, char *out, size_t cap);
/* Writes out the held-back bytes (an unfinished character at end of stream) and resets;
 * cap >= 3 always suffices (else SIZE_MAX, nothing written). */
size_t rk_utf8_stream_flush(rk_utf8_stream *s, char *out, size_t cap);

/* unicode_data.c (generated) */
extern const uint32_t rk_unicode_ranges[];
extern const size_t rk_unicode_n_ranges;

/* ======================================================================
 * Internals of tokenizer*.c
 * ====================================================================== */

/* Open-addressing table of int32 values, keyed by the caller's strings. */
typedef struct rk_tok_table {
    int32_t *slot; /* (mask + 1); -1 = empty */
    uint32_t mask;
} rk_tok_table;

struct rk_tokenizer {
    rk_tok_kind kind;
    rk_tok_pre pre;
    bool pre_fallback;
    rk_str pre_stored; /* borrowed; {NULL,0} when the key is absent */

    uint32_t n_vocab;
    rk_str *text;  /* (n_vocab) borrowed views into the file */
    float *score;  /* (n_vocab) 0 when the file has no scores */
    uint8_t *type; /* (n_vocab) rk_toktype, after the EOG -> CONTROL fix-up */
    rk_tok_table by_text;
    size_t max_text_bytes;

    int32_t bos, eos, unk, eot, eom; /* -1 = none */
    bool add_bos, add_eos, add_space_prefix;
    bool ignore_merges; /* llama3: a word that is a vocab entry is emitted whole */

    int32_t byte_tok[256]; /* SPM: id of <0xXX>, -1 when absent */
    /* SPM: every pair of adjacent characters inside some token, as (cp1 << 21 | cp2) + 1;
     * 0 = empty slot. A text position between two characters that form no such pair
     * can never be inside a merged symbol, so the text is merged in pieces cut there. */
    uint64_t *pair;
    uint64_t pair_mask;

    uint32_t n_merges;         /* BPE */
    rk_str *merge_l, *merge_r; /* (n_merges) borrowed halves of "left right" */
    rk_tok_table merges;       /* value: merge index = rank */
    size_t max_merge_part;

    int32_t *special; /* CONTROL / USER_DEFINED / UNKNOWN ids, longest text first */
    uint32_t n_special;
    int32_t *eog; /* ascending */
    uint32_t n_eog;

    uint64_t hash;
};

/* FNV-1a 64 */
#define RK_FNV_OFFSET 0xcbf29ce484222325ull
#define RK_FNV_PRIME 0x100000001b3ull
static inline uint64_t rk_fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = (const unsigned char *)p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * RK_FNV_PRIME;
    return h;
}

/* Id whose text is s[0..n), or -1. */
int32_t rk_tok_lookup(const rk_tokenizer *t, const char *s, size_t n);
/* tables.c: FNV-1a of a token text; an empty open-addressing table for n texts. */
uint64_t rk_tok_str_hash(const char *s, size_t n);
bool rk_tok_table_init(rk_tok_table *tb, uint32_t n);

typedef struct rk_tok_ids {
    int32_t *v;
    size_t n, cap;
} rk_tok_ids;
bool rk_tok_ids_push(rk_tok_ids *a, int32_t id); /* false on OOM */

/* A run of bytes in the working string; merged symbols keep the left one. */
typedef struct rk_tok_sym {
    uint32_t off, n; /* n == 0: merged away */
    int32_t prev, next;
} rk_tok_sym;

/* Candidate merge of two adjacent symbols; n_left/n_right detect stale entries. */
typedef struct rk_tok_bigram {
    double prio; /* higher first; ties: smaller left first */
    uint32_t left, right, n_left, n_right;
} rk_tok_bigram;

/* Reusable buffers of one encode call. */
typedef struct rk_tok_work {
    rk_tok_sym *sym;
    size_t sym_cap;
    rk_tok_bigram *heap;
    size_t heap_n, heap_cap;
    char *buf; /* escaped (SPM) or byte-mapped (BPE) text */
    size_t buf_cap;
    uint32_t *cp; /* BPE: code points, their byte offsets (n + 1) and flags */
    uint32_t *cp_off;
    uint8_t *cp_fl;
    size_t cp_cap;
    uint32_t *piece[2]; /* BPE: pre-tokenizer piece lengths, double-buffered */
    size_t piece_n[2], piece_cap[2];
} rk_tok_work;

void rk_tok_work_free(rk_tok_work *w);
/* Grows the array whose pointer is at pptr (any T **) to hold need elements of elem
 * bytes; *cap is its capacity in elements. False on OOM (the array is unchanged). */
bool rk_tok_grow(void *pptr, size_t *cap, size_t need, size_t elem);

/* Priority of merging symbols l and r of s (adjacent), or false if they cannot merge. */
typedef bool (*rk_tok_pair_fn)(const rk_tokenizer *t, const char *s, const rk_tok_sym *l, const rk_tok_sym *r,
                               double *prio);
/* Runs llama.cpp's merge loop over w->sym[0..n) (a chain 0 -> next -> ... -> -1):
 * repeatedly merges the best queued pair until none is left. */
rk_status rk_tok_merge(const rk_tokenizer *t, rk_tok_work *w, size_t n, rk_tok_pair_fn pair, rk_err *err);

/* tokenizer_spm.c */
rk_status rk_tok_spm_init(rk_tokenizer *t, rk_err *err);
/* Encodes one text fragment (no special tokens inside); prefix: add the dummy "▁". */
rk_status rk_tok_spm_encode(const rk_tokenizer *t, rk_tok_work *w, const char *text, size_t len, bool prefix,
                            rk_tok_ids *out, rk_err *err);
size_t rk_tok_spm_piece(const rk_tokenizer *t, int32_t id, char *buf, size_t cap);
int rk_tok_byte_of(rk_str s); /* byte of a "<0xXX>" text, or -1 */

/* tokenizer_bpe.c */
rk_status rk_tok_bpe_init(rk_tokenizer *t, const rk_gguf *g, rk_err *err);
rk_status rk_tok_bpe_encode(const rk_tokenizer *t, rk_tok_work *w, const char *text, size_t len, rk_tok_ids *out,
                            rk_err *err);
size_t rk_tok_bpe_piece(const rk_tokenizer *t, int32_t id, char *buf, size_t cap);
const char *rk_tok_pre_rules_name(rk_tok_pre pre);
/* Word boundaries under the rules pre, for tests and tools: (*ends)[i] is the byte
 * offset where word i ends (malloc'd; caller frees). */
rk_status rk_tok_pretokenize(rk_tok_pre pre, const char *text, size_t len, size_t **ends, size_t *n, rk_err *err);
