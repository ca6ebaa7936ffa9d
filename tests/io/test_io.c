/* io: rk_io_read_file (missing, empty, normal, directory, FIFO, size limit), rk_io_write_file_atomic
 * (new, overwrite, no temp left behind, failure keeps the old file), rk_io_mkdir_p and
 * SHA-256 against the FIPS 180-2 test vectors, one-shot and streamed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rk_io.h"
#include "tb.h"

static void write_bytes(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    cr_assert(f, "%s", path);
    cr_assert_eq(fwrite(p, 1, n, f), n);
    fclose(f);
}

static bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

/* ---- read ------------------------------------------------------------------------ */

Test(io, read_file_missing_empty_and_normal) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-io-read", ".bin"), "%s", path);
    rk_err e = {0};
    char *data = NULL;
    size_t len = 0;
    /* empty: OK, length 0, still NUL-terminated */
    cr_assert_eq(rk_io_read_file(path, &data, &len, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(len, 0);
    cr_expect(data && data[0] == '\0');
    free(data);
    /* normal, with NUL bytes inside: every byte, exact length, a terminating NUL */
    unsigned char buf[70000];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(i * 31 + (i >> 8));
    buf[5] = 0;
    write_bytes(path, buf, sizeof buf);
    cr_assert_eq(rk_io_read_file(path, &data, &len, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(len, sizeof buf);
    cr_expect(memcmp(data, buf, sizeof buf) == 0);
    cr_expect_eq(data[len], '\0');
    free(data);
    /* missing: RK_E_NOT_FOUND naming the path, out-params untouched */
    unlink(path);
    data = (char *)"keep";
    len = 77;
    cr_expect_eq(rk_io_read_file(path, &data, &len, &e), RK_E_NOT_FOUND);
    cr_expect(strstr(e.msg, path), "%s", e.msg);
    cr_expect(strcmp(data, "keep") == 0 && len == 77);
    /* a directory is not a readable regular file */
    char dir[512];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-io-dir"), "%s", dir);
    cr_expect_eq(rk_io_read_file(dir, &data, &len, &e), RK_E_IO, "%s", e.msg);
    cr_expect(strstr(e.msg, dir), "%s", e.msg);
    rmdir(dir);
}

/* A FIFO with no writer would block open(2) for reading: every open path refuses it at once,
 * naming the kind (the timeout fails a regression that waits). */
Test(io, fifo_is_refused_without_blocking, .timeout = 10) {
    char dir[512], fifo[600];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-io-fifo"), "%s", dir);
    snprintf(fifo, sizeof fifo, "%s/pipe", dir);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "%s", strerror(errno));
    rk_err e = {0};
    char *data = NULL;
    size_t len = 0;
    cr_expect_eq(rk_io_read_file(fifo, &data, &len, &e), RK_E_IO, "%s", e.msg);
    cr_expect(strstr(e.msg, "FIFO") && strstr(e.msg, fifo), "%s", e.msg);
    rk_mapping m = {0};
    cr_expect_eq(rk_mapping_open(fifo, &m, &e), RK_E_IO, "%s", e.msg);
    cr_expect(strstr(e.msg, "FIFO"), "%s", e.msg);
    cr_expect_eq(rk_mapping_open_huge(fifo, &m, &e), RK_E_IO, "%s", e.msg);
    char hex[65];
    cr_expect_eq(rk_sha256_file(fifo, hex, &e), RK_E_IO, "%s", e.msg);
    int fd = -1;
    cr_expect_eq(rk_file_open_regular("/dev/null", &fd, &len, &e), RK_E_IO, "%s", e.msg);
    cr_expect(strstr(e.msg, "character device"), "%s", e.msg);
    unlink(fifo);
    rmdir(dir);
}

/* rk_io_read_file_max refuses from the size (a sparse 2 GiB file: nothing read, nothing
 * allocated) and reads a file at the limit. */
Test(io, read_file_max_refuses_from_the_size) {
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-io-sparse", ".txt"), "%s", path);
    cr_assert_eq(truncate(path, (off_t)2 << 30), 0, "%s", strerror(errno));
    rk_err e = {0};
    char *data = (char *)"keep";
    size_t len = 7;
    cr_expect_eq(rk_io_read_file_max(path, (size_t)1 << 20, &data, &len, &e), RK_E_INVALID_ARG, "%s", e.msg);
    cr_expect(strstr(e.msg, "2147483648 bytes") && strstr(e.msg, path), "%s", e.msg);
    cr_expect(strcmp(data, "keep") == 0 && len == 7);
    cr_assert_eq(truncate(path, 4096), 0);
    cr_expect_eq(rk_io_read_file_max(path, 4096, &data, &len, &e), RK_OK, "%s", e.msg);
    cr_expect_eq(len, 4096);
    free(data);
    unlink(path);
}

/* ---- atomic write ---------------------------------------------------------------- */

Test(io, atomic_write_creates_replaces_and_leaves_no_temp) {
    char dir[512], path[600], tmp[700];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-io-atomic"), "%s", dir);
    snprintf(path, sizeof path, "%s/out.bin", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    rk_err e = {0};
    cr_assert_eq(rk_io_write_file_atomic(path, "first version", 13, &e), RK_OK, "%s", e.msg);
    char *data;
    size_t len;
    cr_assert_eq(rk_io_read_file(path, &data, &len, &e), RK_OK);
    cr_expect(len == 13 && memcmp(data, "first version", 13) == 0);
    free(data);
    cr_assert_eq(rk_io_write_file_atomic(path, "v2", 2, &e), RK_OK, "%s", e.msg);
    cr_assert_eq(rk_io_read_file(path, &data, &len, &e), RK_OK);
    cr_expect(len == 2 && memcmp(data, "v2", 2) == 0, "replaced, not appended");
    free(data);
    cr_expect_not(exists(tmp), "temp file left behind");
    cr_assert_eq(rk_io_write_file_atomic(path, "", 0, &e), RK_OK, "%s", e.msg);
    struct stat st;
    cr_expect(stat(path, &st) == 0 && st.st_size == 0);
    unlink(path);
    rmdir(dir);
}

/* A rename that cannot happen (the target is a non-empty directory) fails with RK_E_IO,
 * leaves the target as it was and removes the temp file. */
Test(io, atomic_write_failure_keeps_the_old_file) {
    char dir[512], inner[600], tmp[700];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-io-fail"), "%s", dir);
    snprintf(inner, sizeof inner, "%s/keep", dir);
    write_bytes(inner, "old", 3);
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", dir, (long)getpid());
    rk_err e = {0};
    cr_expect_eq(rk_io_write_file_atomic(dir, "new", 3, &e), RK_E_IO);
    cr_expect(strstr(e.msg, "rename"), "%s", e.msg);
    cr_expect_not(exists(tmp), "temp file left behind after a failed rename");
    char *data;
    size_t len;
    cr_assert_eq(rk_io_read_file(inner, &data, &len, &e), RK_OK, "%s", e.msg);
    cr_expect(len == 3 && memcmp(data, "old", 3) == 0);
    free(data);
    /* a missing parent directory: RK_E_IO naming the temp path */
    char missing[700];
    snprintf(missing, sizeof missing, "%s/no/such/dir/f", dir);
    cr_expect_eq(rk_io_write_file_atomic(missing, "x", 1, &e), RK_E_IO);
    cr_expect(strstr(e.msg, "no/such/dir"), "%s", e.msg);
    unlink(inner);
    rmdir(dir);
}

Test(io, mkdir_p_creates_parents_and_accepts_existing) {
    char dir[512], deep[700];
    cr_assert(tb_tmp_dir(dir, sizeof dir, "rk-io-mkdir"), "%s", dir);
    snprintf(deep, sizeof deep, "%s/a/b/c", dir);
    rk_err e = {0};
    cr_assert_eq(rk_io_mkdir_p(deep, &e), RK_OK, "%s", e.msg);
    struct stat st;
    cr_expect(stat(deep, &st) == 0 && S_ISDIR(st.st_mode));
    cr_expect_eq(rk_io_mkdir_p(deep, &e), RK_OK, "existing is fine");
    strcat(deep, "/");
    cr_expect_eq(rk_io_mkdir_p(deep, &e), RK_OK, "trailing slash");
    cr_expect_eq(rk_io_mkdir_p("", &e), RK_E_INVALID_ARG);
    /* a file in the way */
    char file[700];
    snprintf(file, sizeof file, "%s/a/f", dir);
    write_bytes(file, "x", 1);
    strcat(file, "/sub");
    cr_expect_eq(rk_io_mkdir_p(file, &e), RK_E_IO, "%s", e.msg);
    snprintf(file, sizeof file, "%s/a/f", dir);
    unlink(file);
    snprintf(deep, sizeof deep, "%s/a/b/c", dir);
    rmdir(deep);
    snprintf(deep, sizeof deep, "%s/a/b", dir);
    rmdir(deep);
    snprintf(deep, sizeof deep, "%s/a", dir);
    rmdir(deep);
    rmdir(dir);
}

/* ---- SHA-256 ------------------------------------------------------------------------ */

static void sha_hex(const void *p, size_t n, char hex[65]) {
    rk_sha256 s;
    uint8_t d[32];
    rk_sha256_init(&s);
    rk_sha256_update(&s, p, n);
    rk_sha256_final(&s, d);
    rk_sha256_hex(d, hex);
}

/* FIPS 180-2 appendix B (and the NIST example values): "abc", the empty string, the
 * 448-bit two-block message and one million 'a'; plus the 896-bit message of FIPS 180-4's
 * SHA-512 examples (its SHA-256 from the NIST CSRC example set). */
static const struct {
    const char *msg;
    const char *hex;
} k_vectors[] = {
    {"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
    {"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
    {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
    {"abcdefghbcdefghicdefghijdefghijkefghijklfghijklmghijklmnhijklmnoijklmnopjklmnopqklmnopqrlmnopqrsmnopqrst"
     "nopqrstu",
     "cf5b16a778af8380036ce59e7b0492370b249b11e8f07a51afac45037afee9d1"},
};

Test(io, sha256_fips_vectors) {
    char hex[65];
    for (size_t i = 0; i < sizeof k_vectors / sizeof k_vectors[0]; i++) {
        sha_hex(k_vectors[i].msg, strlen(k_vectors[i].msg), hex);
        cr_expect_str_eq(hex, k_vectors[i].hex, "vector %zu", i);
    }
    size_t n = 1000000;
    char *a = malloc(n);
    memset(a, 'a', n);
    sha_hex(a, n, hex);
    cr_expect_str_eq(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
    free(a);
}

/* Any split of the input into update calls gives the same digest (block-buffer edges:
 * 55/56/63/64 bytes pad differently). */
Test(io, sha256_streaming_equals_one_shot) {
    const char *m = k_vectors[3].msg; /* 112 bytes: crosses a block boundary */
    const size_t n = strlen(m);
    for (size_t cut = 0; cut <= n; cut++) {
        rk_sha256 s;
        uint8_t d[32];
        char hex[65];
        rk_sha256_init(&s);
        rk_sha256_update(&s, m, cut);
        rk_sha256_update(&s, m + cut, n - cut);
        rk_sha256_final(&s, d);
        rk_sha256_hex(d, hex);
        cr_expect_str_eq(hex, k_vectors[3].hex, "split at %zu", cut);
    }
    rk_sha256 s;
    uint8_t d[32];
    char hex[65];
    rk_sha256_init(&s);
    for (size_t i = 0; i < n; i++) rk_sha256_update(&s, m + i, 1);
    rk_sha256_final(&s, d);
    rk_sha256_hex(d, hex);
    cr_expect_str_eq(hex, k_vectors[3].hex, "byte by byte");
    /* padding edges (55 fits the length in the block, 56..63 need another, 64 is a full
     * block; 119/120 the same one block later), through rk_sha256_file; the digests are
     * Python hashlib's */
    static const struct {
        size_t n;
        const char *hex;
    } edges[] = {
        {55, "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318"},
        {56, "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a"},
        {63, "7d3e74a05d7db15bce4ad9ec0658ea98e3f06eeecf16b4c6fff2da457ddc2f34"},
        {64, "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb"},
        {65, "635361c48bb9eab14198e76ea8ab7f1a41685d6ad62aa9146d301d4f17eb0ae0"},
        {119, "31eba51c313a5c08226adf18d4a359cfdfd8d2e816b13f4af952f7ea6584dcfb"},
        {120, "2f3d335432c70b580af0e8e1b3674a7c020d683aa5f73aaaedfdc55af904c21c"},
        {128, "6836cf13bac400e9105071cd6af47084dfacad4e5e302c94bfed24e013afb73e"},
    };
    char path[512];
    cr_assert(tb_tmp_path(path, sizeof path, "rk-io-sha", ".bin"), "%s", path);
    char buf[128];
    memset(buf, 'a', sizeof buf);
    rk_err e = {0};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
        write_bytes(path, buf, edges[i].n);
        cr_assert_eq(rk_sha256_file(path, hex, &e), RK_OK, "%s", e.msg);
        cr_expect_str_eq(hex, edges[i].hex, "%zu x 'a' (file)", edges[i].n);
        sha_hex(buf, edges[i].n, hex);
        cr_expect_str_eq(hex, edges[i].hex, "%zu x 'a' (memory)", edges[i].n);
    }
    unlink(path);
    cr_expect_eq(rk_sha256_file(path, hex, &e), RK_E_NOT_FOUND, "%s", e.msg);
}
