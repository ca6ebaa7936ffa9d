/* Test helpers shared by every suite. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Directory of ../shared (RK_SHARED_DIR, set by meson), or NULL when it is absent or
 * RK_NO_SHARED is set (scripts/test.sh runs the unit suite so: it needs nothing outside
 * the checkout). */
const char *tb_shared_dir(void);
/* Joins the shared dir and a relative path into buf; returns NULL (and leaves a
 * reason in buf) when the shared dir or the file is missing. */
const char *tb_shared_path(char *buf, size_t cap, const char *rel);
/* Reads a whole file into a malloc'd buffer; NULL on failure. */
void *tb_read_file(const char *path, size_t *len);
/* The default model in the cache (RIDGEKV_MODEL or ${XDG_CACHE_HOME:-~/.cache}/ridgekv/...),
 * NULL when absent or RK_NO_SHARED is set. */
const char *tb_default_model(char *buf, size_t cap);
/* Deterministic pseudo-random numbers (splitmix64). */
uint64_t tb_rand_u64(uint64_t *state);
float tb_rand_normal(uint64_t *state);
/* Path of the decompressed F32 twin golden/models/<name>.f32-twin.gguf, made once with
 * `xz -dc` under $TMPDIR/ridgekv-twins-<uid>/ (atomic rename, so parallel tests are safe).
 * NULL (and a reason in buf) when the .xz or xz itself is absent. */
const char *tb_twin_path(const char *name, char *buf, size_t cap);
/* XORs the byte at offset off (off < 0: the file's middle byte) of a file with mask, in
 * place: a corrupt byte for the readers' checks. False when the file cannot be changed. */
bool tb_flip_byte(const char *path, long off, int mask);
/* Reads n floats from a raw little-endian f32 file into a malloc'd array. */
float *tb_read_f32(const char *path, size_t *n);

/* Result of running the ridgekv binary ($RK_BIN) through sh. */
typedef struct tb_result {
    int code;        /* exit status, -1 when killed */
    char *out, *err; /* captured stdout / stderr (malloc'd, NUL-terminated) */
} tb_result;
/* Runs `<env> '$RK_BIN' <args>` with stdin from /dev/null; env may be NULL (e.g.
 * "env -u X Y=1"). code is -2 when RK_BIN is unset. */
tb_result tb_run(const char *env, const char *args);
void tb_result_free(tb_result *r);

/* ---- unique temporary paths ------------------------------------------------------
 * Under $TMPDIR (or /tmp), unique per call and per process, so suites and tests run in
 * parallel. The caller removes what it made (unlink / rmdir). On failure both return
 * NULL with a reason in buf. */
/* Creates an empty file "<tmp>/<stem>-XXXXXX<suffix>" (mkstemps) and returns its path. */
const char *tb_tmp_path(char *buf, size_t cap, const char *stem, const char *suffix);
/* Creates a directory "<tmp>/<stem>-XXXXXX" (mkdtemp) and returns its path. */
const char *tb_tmp_dir(char *buf, size_t cap, const char *stem);

/* ---- tiny generated models (tb_tiny.c) --------------------------------------------
 * Random-weight llama / qwen2 / qwen3 GGUFs of a few hundred KiB, written with the
 * formats library's writer, so runtime tests need no downloads. Weights are drawn per
 * tensor from the seed and the tensor's name (splitmix64 + Box-Muller), then stored in
 * wtype: the same seed gives the same underlying model in every dtype, the quantised
 * ones rounded as ggml's reference quantisers round. Norm weights and biases stay F32
 * (the loader requires it). */

typedef enum tb_arch { TB_ARCH_LLAMA, TB_ARCH_QWEN2, TB_ARCH_QWEN3 } tb_arch;
typedef enum tb_vocab {
    TB_VOCAB_GPT2, /* byte-level BPE: ids 0..255 the bytes, then merges, then specials */
    TB_VOCAB_SPM,  /* SentencePiece "llama": <unk> <s> </s>, 256 <0xXX> byte tokens, pieces */
} tb_vocab;

typedef struct tb_tiny_spec {
    tb_arch arch;        /* llama (rope NORM), qwen2 (NEOX, QKV bias), qwen3 (NEOX, q/k norm) */
    int32_t n_layer;     /* 0: 2 */
    int32_t n_embd;      /* 0: 64 */
    int32_t n_head;      /* 0: 4 */
    int32_t n_head_kv;   /* 0: n_head / 2 */
    int32_t head_dim;    /* 0: n_embd / n_head (may differ: then q_dim != n_embd) */
    int32_t n_ff;        /* 0: 96 */
    int32_t n_ctx_train; /* 0: 64 */
    int32_t n_rot;       /* rotated dims per head; 0: head_dim */
    float rope_base;     /* 0: 10000 */
    float rms_eps;       /* 0: 1e-5 */
    bool untied;         /* write output.weight; false: logits use token_embd */
    uint32_t wtype;      /* matrices: RK_DT_F32 (0), F16, BF16, Q8_0, Q4_0, Q4_1; quantised
                              * types need n_embd, n_ff and n_head*head_dim multiples of 32 */
    tb_vocab vocab;
    bool add_bos; /* gpt2 vocab: write add_bos_token = true (spm always adds BOS) */
    uint64_t seed;
    const char *chat_template; /* NULL: a ChatML template; "": none written */
    const char *rope_scaling;  /* NULL: no keys; "linear" / "yarn": rope.scaling.type, .factor and
                                * .original_context_length (= n_ctx_train) are written */
    float rope_factor;         /* rope.scaling.factor with rope_scaling */
} tb_tiny_spec;

/* The GPT-2 vocab's layout: token id b < 256 is byte b (as GPT-2's printable code point),
 * TB_GPT2_N_MERGES merge tokens follow, then <|endoftext|> (BOS and EOS), <|im_start|>,
 * <|im_end|> (control tokens). */
#define TB_GPT2_N_MERGES 24
#define TB_GPT2_ENDOFTEXT (256 + TB_GPT2_N_MERGES)
#define TB_GPT2_IM_START (TB_GPT2_ENDOFTEXT + 1)
#define TB_GPT2_IM_END (TB_GPT2_ENDOFTEXT + 2)
#define TB_GPT2_N_VOCAB (TB_GPT2_ENDOFTEXT + 3)
/* The SPM vocab's layout: 0 <unk>, 1 <s>, 2 </s>, 3 + b the byte token <0xXX> of byte b,
 * TB_SPM_N_PIECES pieces (single characters and merges, scores falling with the id), then
 * <|im_start|>, <|im_end|> (control). */
#define TB_SPM_N_PIECES 40
#define TB_SPM_FIRST_PIECE 259
#define TB_SPM_IM_START (TB_SPM_FIRST_PIECE + TB_SPM_N_PIECES)
#define TB_SPM_IM_END (TB_SPM_IM_START + 1)
#define TB_SPM_N_VOCAB (TB_SPM_IM_END + 1)

/* The merge rules of the GPT-2 vocab in rank order ("Ġt h" style, byte-level text) and the
 * texts of the SPM pieces in id order; used by tests that predict exact token ids. */
extern const char *const tb_gpt2_merges[TB_GPT2_N_MERGES];
extern const char *const tb_spm_pieces[TB_SPM_N_PIECES];

/* stories260K's shape (llama, 5 layers, n_embd 64, 8 heads, 4 KV heads of 8 dims, n_ff 172,
 * context 512, untied f32 matrices) with the SPM vocab and random weights from seed: the
 * shape the runtime suites were written for, without ../shared. */
tb_tiny_spec tb_tiny_stories_spec(uint64_t seed);
/* The spec with every 0 replaced by its default (see the fields). */
tb_tiny_spec tb_tiny_spec_resolve(const tb_tiny_spec *spec);
/* Tokens in the spec's vocab. */
int32_t tb_tiny_n_vocab(const tb_tiny_spec *spec);
/* Serialises the model into a malloc'd buffer; NULL (reason in why) for an impossible spec. */
void *tb_tiny_gguf(const tb_tiny_spec *spec, size_t *len, char *why, size_t why_cap);
/* Writes the model to a fresh unique file (tb_tmp_path) and returns path, or NULL with the
 * reason in path. The caller unlinks it. */
const char *tb_tiny_model(const tb_tiny_spec *spec, char *path, size_t cap);

/* ---- an independent reference forward (tb_ref.c) ------------------------------------
 * Reads a llama / qwen2 / qwen3 GGUF (parsed with the formats library, hparams from the
 * GGUF keys with llama.cpp's defaults), dequantises F32/F16/BF16/Q8_0/Q4_0/Q4_1 itself and
 * runs the textbook forward pass in double precision over ids (positions 0..n-1).
 * Returns n * n_vocab logits (row i predicts the token after ids[i]) and *n_vocab, or NULL
 * with the reason in why. Slow and simple on purpose: an oracle for tiny models. */
float *tb_ref_logits(const char *path, const int32_t *ids, size_t n, int32_t *n_vocab, char *why, size_t why_cap);
/* Dequantises one row of n elements of a tensor stored as type; false for other types. */
bool tb_dequant_row(uint32_t type, const void *src, double *dst, int64_t n);
