/* Writes small valid GGUF seeds for fuzz_gguf:
 *   gguf_seeds OUTDIR [MODEL.gguf ...]
 * Each model is copied with all of its keys but every tensor cut to one or two
 * blocks per row (same names, types and n_dims), so a seed is a few KB to tens
 * of KB and still parses. Two synthetic seeds cover every value type and a
 * non-default alignment with several tensor types. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rk_gguf.h"

static int save(const char *dir, const char *name, rk_gguf_writer *w) {
    rk_err err = {0};
    void *bytes = NULL;
    size_t len = 0;
    if (rk_gguf_writer_finish(w, &bytes, &len, &err)) {
        fprintf(stderr, "gguf_seeds: %s: %s\n", name, err.msg);
        return 1;
    }
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    int bad = !f || fwrite(bytes, 1, len, f) != len;
    if (f && fclose(f)) bad = 1;
    if (bad) fprintf(stderr, "gguf_seeds: cannot write %s\n", path);
    free(bytes);
    return bad;
}

static void *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    void *buf = NULL;
    long n;
    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0) {
        buf = malloc((size_t)n + 1);
        if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = NULL;
        }
        *len = (size_t)n;
    }
    fclose(f);
    return buf;
}

/* Adds a tensor of the given type and n_dims with a tiny shape; data is a byte ramp. */
static rk_status add_small(rk_gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, rk_err *err) {
    const rk_dtype_traits *tr = rk_dtype_get(type);
    if (!tr) return rk_err_set(err, RK_E_GGUF_TYPE, "unknown type %u", type);
    int64_t ne[4] = {tr->blck_size == 1 ? 4 : tr->blck_size, 2, 1, 1};
    uint64_t rows = n_dims > 1 ? 2 : 1, row;
    if (!rk_dtype_row_bytes(type, (uint64_t)ne[0], &row)) return rk_err_set(err, RK_E_GGUF_DIM, "row size");
    uint8_t *data = malloc((size_t)(row * rows));
    if (!data) return rk_err_set(err, RK_E_NOMEM, "out of memory");
    for (uint64_t i = 0; i < row * rows; i++) data[i] = (uint8_t)(i * 13 + 1);
    rk_status st = rk_gguf_writer_add_tensor(w, name, type, n_dims, ne, data, row * rows, err);
    free(data);
    return st;
}

static int seed_model(const char *dir, const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    size_t len = 0;
    void *bytes = slurp(path, &len);
    rk_err err = {0};
    rk_gguf *g = NULL;
    rk_gguf_writer *w = NULL;
    int rc = 1;
    if (!bytes) {
        rk_err_set(&err, RK_E_IO, "cannot read the file");
        goto fail;
    }
    if (rk_gguf_parse(bytes, len, &g, &err) || rk_gguf_writer_create(rk_gguf_alignment(g), &w, &err)) goto fail;
    for (uint64_t i = 0; i < rk_gguf_n_kv(g); i++)
        if (rk_gguf_writer_set_kv(w, rk_gguf_kv_at(g, i), &err)) goto fail;
    for (uint64_t i = 0; i < rk_gguf_n_tensors(g); i++) {
        const rk_gguf_tensor *t = rk_gguf_tensor_at(g, i);
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(t->name.len < 255 ? t->name.len : 255), t->name.ptr);
        if (add_small(w, name, t->type, t->n_dims, &err)) goto fail;
    }
    char out[512];
    snprintf(out, sizeof out, "%s.small.gguf", base);
    rc = save(dir, out, w);
fail:
    if (err.code) fprintf(stderr, "gguf_seeds: %s: %s\n", path, err.msg);
    rk_gguf_writer_destroy(w);
    rk_gguf_destroy(g);
    free(bytes);
    return rc;
}

/* Every value type, then every tensor type at alignment 64. */
static int seed_synthetic(const char *dir) {
    rk_err err = {0};
    rk_gguf_writer *w = NULL, *w2 = NULL;
    int rc = 1;
    static const int16_t i16[] = {-3, 4};
    static const double f64[] = {0.5, -2.0};
    static const char *const strs[] = {"<s>", "", "a b"};
    static const uint32_t types[] = {RK_DT_F32,  RK_DT_F16,  RK_DT_BF16, RK_DT_Q8_0,
                                     RK_DT_Q4_0, RK_DT_Q4_1, RK_DT_Q4_K, RK_DT_Q6_K};
    if (rk_gguf_writer_create(32, &w, &err) || rk_gguf_writer_set_u32(w, "k.u32", 7, &err) ||
        rk_gguf_writer_set_i32(w, "k.i32", -7, &err) || rk_gguf_writer_set_u64(w, "k.u64", 1ull << 40, &err) ||
        rk_gguf_writer_set_f32(w, "k.f32", 1.5f, &err) || rk_gguf_writer_set_f64(w, "k.f64", -0.25, &err) ||
        rk_gguf_writer_set_bool(w, "k.bool", true, &err) || rk_gguf_writer_set_str(w, "k.str", "hello", &err) ||
        rk_gguf_writer_set_arr(w, "a.u8", RK_GGUF_U8, "\1\2\3", 3, &err) ||
        rk_gguf_writer_set_arr(w, "a.i16", RK_GGUF_I16, i16, 2, &err) ||
        rk_gguf_writer_set_arr(w, "a.f64", RK_GGUF_F64, f64, 2, &err) ||
        rk_gguf_writer_set_arr_str(w, "a.str", strs, 3, &err) || add_small(w, "t.f32", RK_DT_F32, 1, &err) ||
        rk_gguf_writer_create(64, &w2, &err))
        goto fail;
    for (uint32_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        char name[32];
        snprintf(name, sizeof name, "blk.%u.weight", i);
        if (add_small(w2, name, types[i], 1 + i % 4, &err)) goto fail;
    }
    rc = save(dir, "synthetic-kv.gguf", w) | save(dir, "synthetic-tensors.gguf", w2);
fail:
    if (err.code) fprintf(stderr, "gguf_seeds: synthetic: %s\n", err.msg);
    rk_gguf_writer_destroy(w);
    rk_gguf_writer_destroy(w2);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: gguf_seeds OUTDIR [MODEL.gguf ...]\n");
        return 2;
    }
    int bad = seed_synthetic(argv[1]);
    for (int i = 2; i < argc; i++) bad |= seed_model(argv[1], argv[i]);
    return bad ? 1 : 0;
}
