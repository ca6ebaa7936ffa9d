/* io: the block store. Round trips on both backends (io_uring, the thread pool) with many
 * operations in flight, a reopened file indexed by its headers, compression (a block that
 * compresses is stored smaller; random bytes are stored raw), and every fault the store
 * must detect: short write, ENOSPC, EIO, a corrupt byte, a truncated file, another format
 * version, a foreign file, a header that lies. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rk_blockstore.h"
#include "tb.h"

enum { N_BLOCKS = 24, BLOCK = 70000 };

/* Block i: half of them compressible (a pattern), half random; sizes vary (0 included). */
static size_t fill_block(int i, uint8_t *buf) {
    const size_t n = i == 3 ? 0 : (size_t)(BLOCK - 997 * i);
    uint64_t rng = 0x1234u + (uint64_t)i;
    for (size_t k = 0; k < n; k++)
        buf[k] = (i & 1) ? (uint8_t)tb_rand_u64(&rng) : (uint8_t)((k / 64) * 7 + (uint64_t)i);
    return n;
}

static rk_bs *open_store(const char *path, rk_bs_mode mode, rk_bs_backend be, rk_bs_fault fault) {
    rk_bs_params p = rk_bs_params_default();
    p.backend = be;
    p.queue_depth = 4;
    p.max_block = BLOCK;
    p.fault = fault;
    rk_err e = {0};
    rk_bs *bs = NULL;
    rk_status st = rk_bs_open(path, mode, &p, &bs, &e);
    if (st == RK_E_UNSUPPORTED && be == RK_BS_URING) cr_skip_test("io_uring unusable here: %s", e.msg);
    cr_assert_eq(st, RK_OK, "%s", e.msg);
    return bs;
}

/* Puts every block asynchronously (4 in flight), then gets them all back asynchronously. */
static void round_trip(rk_bs_backend be) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs", ".bin"), "%s", path);
    rk_bs *bs = open_store(path, RK_BS_CREATE, be, (rk_bs_fault){0});
    cr_expect_eq(rk_bs_backend_used(bs), be == RK_BS_AUTO ? rk_bs_backend_used(bs) : be);
    uint8_t *src = malloc(BLOCK), *dst[N_BLOCKS];
    rk_err e = {0};
    int done = 0;
    rk_bs_done d[8];
    for (int i = 0; i < N_BLOCKS; i++) {
        const size_t n = fill_block(i, src);
        cr_assert_eq(rk_bs_put(bs, 100 + (uint64_t)i, src, n, (void *)(intptr_t)i, &e), RK_OK, "%s", e.msg);
        int got = rk_bs_wait(bs, 0, d, 8);
        for (int k = 0; k < got; k++) cr_assert_eq(d[k].status, RK_OK, "%s", d[k].msg);
        done += got;
    }
    while (rk_bs_in_flight(bs)) {
        int got = rk_bs_wait(bs, 1, d, 8);
        for (int k = 0; k < got; k++) {
            cr_assert_eq(d[k].status, RK_OK, "%s", d[k].msg);
            cr_assert(d[k].is_put);
            cr_assert_eq(d[k].id, 100 + (uint64_t)(intptr_t)d[k].ud);
        }
        done += got;
    }
    cr_assert_eq(done, N_BLOCKS);
    cr_assert_eq(rk_bs_sync(bs, &e), RK_OK, "%s", e.msg);
    for (int i = 0; i < N_BLOCKS; i++) {
        dst[i] = malloc(BLOCK);
        cr_assert_eq(rk_bs_get(bs, 100 + (uint64_t)i, dst[i], BLOCK, (void *)(intptr_t)i, &e), RK_OK, "%s", e.msg);
    }
    int n_got = 0;
    while (rk_bs_in_flight(bs)) {
        int got = rk_bs_wait(bs, 1, d, 8);
        for (int k = 0; k < got; k++) {
            const int i = (int)(intptr_t)d[k].ud;
            cr_assert_eq(d[k].status, RK_OK, "%s", d[k].msg);
            const size_t n = fill_block(i, src);
            cr_assert_eq(d[k].len, n, "block %d: %zu bytes back of %zu", i, d[k].len, n);
            cr_assert(!memcmp(dst[i], src, n), "block %d differs", i);
        }
        n_got += got;
    }
    cr_assert_eq(n_got, N_BLOCKS);
    rk_bs_stats stt;
    rk_bs_get_stats(bs, &stt);
    cr_expect_eq(stt.puts, N_BLOCKS);
    cr_expect_eq(stt.gets, N_BLOCKS);
    cr_expect_eq(rk_bs_get(bs, 5, dst[0], BLOCK, NULL, &e), RK_E_NOT_FOUND);
    rk_bs_close(bs);

    /* reopened: the frames are indexed from their headers and read back the same */
    bs = open_store(path, RK_BS_READ, be, (rk_bs_fault){0});
    for (int i = N_BLOCKS - 1; i >= 0; i--) {
        size_t len = 0, n = fill_block(i, src);
        cr_assert(rk_bs_block_len(bs, 100 + (uint64_t)i, &len) && len == n);
        memset(dst[i], 0xee, BLOCK);
        cr_assert_eq(rk_bs_get_sync(bs, 100 + (uint64_t)i, dst[i], BLOCK, &len, &e), RK_OK, "%s", e.msg);
        cr_assert(len == n && !memcmp(dst[i], src, n), "block %d after reopen", i);
        free(dst[i]);
    }
    rk_bs_close(bs);
    free(src);
    unlink(path);
}

Test(blockstore, round_trip_io_uring) { round_trip(RK_BS_URING); }
Test(blockstore, round_trip_threads) { round_trip(RK_BS_THREADS); }
Test(blockstore, round_trip_auto) { round_trip(RK_BS_AUTO); }

Test(blockstore, compresses_what_pays_and_stores_random_raw) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs-z", ".bin"), "%s", path);
    rk_bs *bs = open_store(path, RK_BS_CREATE, RK_BS_AUTO, (rk_bs_fault){0});
    uint8_t *src = malloc(BLOCK);
    rk_err e = {0};
    rk_bs_stats a, b;
    const size_t n0 = fill_block(0, src); /* the pattern: ~70 KB of runs of 64 equal bytes */
    cr_assert_eq(rk_bs_put_sync(bs, 1, src, n0, &e), RK_OK, "%s", e.msg);
    rk_bs_get_stats(bs, &a);
    /* stored = the padded frame; the pattern compresses far below one 4 KB page per 16 KB */
    cr_expect_leq(a.stored_written, 8192, "pattern block stored in %llu bytes", (unsigned long long)a.stored_written);
    const size_t n1 = fill_block(1, src); /* random: zstd cannot shrink it, stored raw + header + padding */
    cr_assert_eq(rk_bs_put_sync(bs, 2, src, n1, &e), RK_OK, "%s", e.msg);
    rk_bs_get_stats(bs, &b);
    const uint64_t raw_frame = (64 + n1 + 4095) / 4096 * 4096;
    cr_expect_eq(b.stored_written - a.stored_written, raw_frame);
    rk_bs_close(bs);
    free(src);
    unlink(path);
}

/* A store with a fault, one put or get, the completion that must report it. */
static rk_bs_done faulty(rk_bs_backend be, rk_bs_fault_kind kind, bool put_fails) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs-f", ".bin"), "%s", path);
    rk_bs *bs = open_store(path, RK_BS_CREATE, be, (rk_bs_fault){kind, 1});
    uint8_t *src = malloc(BLOCK), *dst = malloc(BLOCK);
    rk_err e = {0};
    rk_bs_done d = {0};
    const size_t n = fill_block(0, src);
    /* the first of each kind is clean (nth = 1) */
    cr_assert_eq(rk_bs_put_sync(bs, 7, src, n, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_bs_get_sync(bs, 7, dst, BLOCK, NULL, &e), RK_OK, "%s", e.msg);
    if (put_fails) {
        cr_assert_eq(rk_bs_put(bs, 8, src, n, NULL, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_bs_wait(bs, 1, &d, 1), 1);
        cr_expect(!rk_bs_block_len(bs, 8, NULL), "a failed put must not be indexed");
    } else {
        cr_assert_eq(rk_bs_get(bs, 7, dst, BLOCK, NULL, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_bs_wait(bs, 1, &d, 1), 1);
    }
    /* the store stays usable: the good block still reads back */
    size_t len = 0;
    cr_assert_eq(rk_bs_get_sync(bs, 7, dst, BLOCK, &len, &e), RK_OK, "%s", e.msg);
    cr_assert(len == n && !memcmp(src, dst, n));
    rk_bs_close(bs);
    free(src), free(dst);
    unlink(path);
    return d;
}

Test(blockstore, fault_short_write) {
    for (int be = RK_BS_URING; be <= RK_BS_THREADS; be++) {
        rk_bs_done d = faulty((rk_bs_backend)be, RK_BS_FAULT_SHORT_WRITE, true);
        cr_expect_eq(d.status, RK_E_IO, "%s", d.msg);
        cr_expect(strstr(d.msg, "short write"), "%s", d.msg);
    }
}

Test(blockstore, fault_enospc) {
    rk_bs_done d = faulty(RK_BS_AUTO, RK_BS_FAULT_ENOSPC, true);
    cr_expect_eq(d.status, RK_E_IO, "%s", d.msg);
    cr_expect(strstr(d.msg, strerror(ENOSPC)), "%s", d.msg);
}

Test(blockstore, fault_eio) {
    rk_bs_done d = faulty(RK_BS_AUTO, RK_BS_FAULT_EIO, false);
    cr_expect_eq(d.status, RK_E_IO, "%s", d.msg);
    cr_expect(strstr(d.msg, strerror(EIO)), "%s", d.msg);
}

Test(blockstore, fault_corrupt_byte) {
    for (int be = RK_BS_URING; be <= RK_BS_THREADS; be++) {
        rk_bs_done d = faulty((rk_bs_backend)be, RK_BS_FAULT_CORRUPT, false);
        cr_expect_eq(d.status, RK_E_FORMAT, "%s", d.msg);
        cr_expect(strstr(d.msg, "corrupt"), "%s", d.msg);
    }
}

Test(blockstore, fault_parse) {
    rk_bs_fault f;
    rk_err e = {0};
    cr_assert_eq(rk_bs_fault_parse("eio@3", &f, &e), RK_OK, "%s", e.msg);
    cr_expect(f.kind == RK_BS_FAULT_EIO && f.nth == 3);
    cr_assert_eq(rk_bs_fault_parse("corrupt@all", &f, &e), RK_OK, "%s", e.msg);
    cr_expect(f.kind == RK_BS_FAULT_CORRUPT && f.nth == -1);
    cr_expect_eq(rk_bs_fault_parse("melt", &f, &e), RK_E_INVALID_ARG);
    cr_expect_eq(rk_bs_fault_parse("eio@x", &f, &e), RK_E_INVALID_ARG);
}

/* Writes two blocks, closes, edits the file with edit(), and reopens. */
static rk_status reopen_edited(void (*edit)(const char *path), rk_err *e) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs-e", ".bin"), "%s", path);
    rk_bs *bs = open_store(path, RK_BS_CREATE, RK_BS_AUTO, (rk_bs_fault){0});
    uint8_t *src = malloc(BLOCK);
    for (int i = 0; i < 2; i++) {
        const size_t n = fill_block(i, src);
        cr_assert_eq(rk_bs_put_sync(bs, (uint64_t)i, src, n, e), RK_OK, "%s", e->msg);
    }
    rk_bs_close(bs);
    free(src);
    edit(path);
    rk_bs_params p = rk_bs_params_default();
    p.max_block = BLOCK;
    bs = NULL;
    rk_status st = rk_bs_open(path, RK_BS_READ, &p, &bs, e);
    rk_bs_close(bs);
    unlink(path);
    return st;
}

static void poke(const char *path, long off, uint8_t x) {
    FILE *f = fopen(path, "r+b");
    cr_assert(f);
    fseek(f, off, SEEK_SET);
    int c = fgetc(f);
    fseek(f, off, SEEK_SET);
    fputc((uint8_t)c ^ x, f);
    fclose(f);
}
static void cut_last_page(const char *path) {
    struct stat st;
    cr_assert(stat(path, &st) == 0);
    cr_assert(truncate(path, st.st_size - 4096) == 0);
}
static void cut_odd(const char *path) {
    struct stat st;
    cr_assert(stat(path, &st) == 0);
    cr_assert(truncate(path, st.st_size - 100) == 0);
}
static void bump_version(const char *path) { poke(path, 4, 0x02); }
static void foreign(const char *path) { poke(path, 0, 0x20); }
static void header_lie(const char *path) { poke(path, 24, 0x10); } /* stored size, under the header checksum */

Test(blockstore, truncated_file_detected) {
    rk_err e = {0};
    cr_expect_eq(reopen_edited(cut_last_page, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "truncated"), "%s", e.msg);
    cr_expect_eq(reopen_edited(cut_odd, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "truncated"), "%s", e.msg);
}

Test(blockstore, wrong_version_foreign_and_lying_header_detected) {
    rk_err e = {0};
    cr_expect_eq(reopen_edited(bump_version, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "version 3"), "%s", e.msg);
    cr_expect_eq(reopen_edited(foreign, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "magic"), "%s", e.msg);
    cr_expect_eq(reopen_edited(header_lie, &e), RK_E_FORMAT);
    cr_expect(strstr(e.msg, "header checksum"), "%s", e.msg);
}

Test(blockstore, missing_file_and_oversized_put) {
    rk_err e = {0};
    rk_bs *bs = NULL;
    cr_expect_eq(rk_bs_open("/nonexistent-dir/x.bin", RK_BS_READ, NULL, &bs, &e), RK_E_NOT_FOUND);
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs-o", ".bin"), "%s", path);
    bs = open_store(path, RK_BS_CREATE, RK_BS_AUTO, (rk_bs_fault){0});
    uint8_t *big = calloc(1, BLOCK + 1);
    cr_expect_eq(rk_bs_put(bs, 1, big, BLOCK + 1, NULL, &e), RK_E_INVALID_ARG);
    rk_bs_close(bs);
    free(big);
    unlink(path);
}

/* A get decompresses only into its own raw bytes, even when cap allows more: the document
 * cache reads the pieces of one KV block into one buffer (cap = the rest of it), and
 * completions come in any order. zstd may use the spare room past the frame's content as
 * scratch (literals are decoded there), which once clobbered a neighbouring piece that had
 * already arrived. Pieces read back last-first make that order certain. */
static void gets_stay_inside_their_block(rk_bs_backend be) {
    enum { PIECES = 6, PIECE = 65536 };
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs-cap", ".bin"), "%s", path);
    rk_bs_params p = rk_bs_params_default();
    p.backend = be;
    p.max_block = PIECE;
    rk_err e = {0};
    rk_bs *bs = NULL;
    rk_status st = rk_bs_open(path, RK_BS_CREATE, &p, &bs, &e);
    if (st == RK_E_UNSUPPORTED && be == RK_BS_URING) cr_skip_test("io_uring unusable here: %s", e.msg);
    cr_assert_eq(st, RK_OK, "%s", e.msg);
    const size_t len = (size_t)PIECES * PIECE;
    uint8_t *src = malloc(len), *back = malloc(len);
    cr_assert(src && back);
    uint64_t rng = 77;
    /* like f16 KV rows: one random byte, one from a few values; zstd keeps many literals */
    for (size_t k = 0; k < len; k++)
        src[k] = (k & 1) ? (uint8_t)tb_rand_u64(&rng) : (uint8_t)(0x30 + (tb_rand_u64(&rng) & 7));
    for (int i = 0; i < PIECES; i++)
        cr_assert_eq(rk_bs_put_sync(bs, 1 + (uint64_t)i, src + (size_t)i * PIECE, PIECE, &e), RK_OK, "%s", e.msg);
    memset(back, 0, len);
    for (int i = PIECES - 1; i >= 0; i--) {
        size_t got = 0;
        cr_assert_eq(rk_bs_get_sync(bs, 1 + (uint64_t)i, back + (size_t)i * PIECE, len - (size_t)i * PIECE, &got, &e),
                     RK_OK, "%s", e.msg);
        cr_assert_eq(got, (size_t)PIECE);
    }
    for (int i = 0; i < PIECES; i++)
        cr_expect(!memcmp(src + (size_t)i * PIECE, back + (size_t)i * PIECE, PIECE),
                  "piece %d changed after it was read", i);
    rk_bs_close(bs);
    unlink(path);
    free(src);
    free(back);
}
Test(blockstore, gets_stay_inside_their_block_io_uring) { gets_stay_inside_their_block(RK_BS_URING); }
Test(blockstore, gets_stay_inside_their_block_threads) { gets_stay_inside_their_block(RK_BS_THREADS); }

/* rk_bs_getv: a frame (compressed or raw) into uneven pieces, batched in one submission
 * (rk_bs_batch); pieces that are too small are a clear error, the store stays usable. */
static void getv_pieces(rk_bs_backend be) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-bs-v", ".bin"), "%s", path);
    rk_bs *bs = open_store(path, RK_BS_CREATE, be, (rk_bs_fault){0});
    uint8_t *src[2] = {malloc(BLOCK), malloc(BLOCK)}, *dst = malloc(BLOCK + 64);
    size_t n[2];
    rk_err e = {0};
    for (int i = 0; i < 2; i++) { /* block 0: the pattern (zstd frame); block 1: random (raw frame) */
        n[i] = fill_block(i, src[i]);
        cr_assert_eq(rk_bs_put_sync(bs, 50 + (uint64_t)i, src[i], n[i], &e), RK_OK, "%s", e.msg);
    }
    for (int i = 0; i < 2; i++) {
        memset(dst, 0xee, BLOCK + 64);
        /* pieces of 1, 4095, 30000 and the rest, with gaps of 16 bytes between them */
        const size_t a = 1, b = 4095, c = 30000, d = n[i] - a - b - c;
        rk_bs_iov iov[4] = {{dst, a}, {dst + a + 16, b}, {dst + a + b + 32, c}, {dst + a + b + c + 48, d}};
        rk_bs_batch(bs, true);
        cr_assert_eq(rk_bs_getv(bs, 50 + (uint64_t)i, iov, 4, (void *)(intptr_t)i, &e), RK_OK, "%s", e.msg);
        rk_bs_batch(bs, false);
        rk_bs_done dn;
        cr_assert_eq(rk_bs_wait(bs, 1, &dn, 1), 1);
        cr_assert_eq(dn.status, RK_OK, "%s", dn.msg);
        cr_expect_eq(dn.len, n[i]);
        size_t o = 0;
        for (int k = 0; k < 4; k++) {
            cr_expect(!memcmp(iov[k].base, src[i] + o, iov[k].len), "block %d piece %d", i, k);
            o += iov[k].len;
        }
        cr_expect_eq(dst[a], 0xee, "the gap after piece 0 is untouched");
        /* pieces short of the block: refused at the completion, nothing written past them */
        rk_bs_iov small[2] = {{dst, 100}, {dst + 200, 100}};
        cr_assert_eq(rk_bs_getv(bs, 50 + (uint64_t)i, small, 2, NULL, &e), RK_OK, "%s", e.msg);
        cr_assert_eq(rk_bs_wait(bs, 1, &dn, 1), 1);
        cr_expect_neq(dn.status, RK_OK, "block %d into 200 bytes of pieces must fail", i);
        cr_expect(strstr(dn.msg, "buffer") != NULL, "the message names the buffer: %s", dn.msg);
    }
    size_t len = 0;
    cr_assert_eq(rk_bs_get_sync(bs, 51, dst, BLOCK, &len, &e), RK_OK, "%s", e.msg);
    cr_expect(len == n[1] && !memcmp(dst, src[1], n[1]));
    rk_bs_close(bs);
    free(src[0]), free(src[1]), free(dst);
    unlink(path);
}

Test(blockstore, getv_pieces_io_uring) { getv_pieces(RK_BS_URING); }
Test(blockstore, getv_pieces_threads) { getv_pieces(RK_BS_THREADS); }
