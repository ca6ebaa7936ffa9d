/* `ridgekv prepare` and the maps ask finds by fingerprint, on stories260K (skips without
 * ../shared): fit once into the cache, found again without refitting, a corrupt cached
 * file is refitted, ask says what it uses and --no-ridgefill turns it off, a missing or
 * non-gzip text is named; `prepare --sparse` writes the sparse-attention calibration beside
 * the maps, ask -v says it uses it with --sparse on, and a bad --sparse is a usage error. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tb.h"

static tb_result run(const char *cache, const char *args) {
    char env[1200];
    snprintf(env, sizeof env, "XDG_CACHE_HOME='%s'", cache);
    tb_result r = tb_run(env, args);
    cr_assert(r.code != -2, "RK_BIN not set (meson sets it)");
    return r;
}

/* The one map file under <cache>/ridgekv/maps (path into buf), or NULL. */
static const char *cached_maps(const char *cache, char *buf, size_t cap) {
    char dir[1100];
    snprintf(dir, sizeof dir, "%s/ridgekv/maps", cache);
    DIR *d = opendir(dir);
    if (!d) return NULL;
    struct dirent *de;
    int n = 0;
    while ((de = readdir(d)))
        if (strstr(de->d_name, ".maps.gguf") && !strstr(de->d_name, ".tmp")) {
            snprintf(buf, cap, "%s/%s", dir, de->d_name);
            n++;
        }
    closedir(d);
    return n == 1 ? buf : NULL;
}

Test(prepare, fits_once_finds_by_fingerprint_refits_corrupt_and_ask_uses_it, .timeout = 300) {
    char sp[1024], txt[1024], cache[256], maps[1400], args[4096], doc[1300];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(txt, sizeof txt, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", txt);
    cr_assert(tb_tmp_dir(cache, sizeof cache, "rkprep"), "%s", cache);
    snprintf(args, sizeof args, "prepare -m '%s' --text '%s' --max-tokens 6000 -t 1", sp, txt);
    tb_result r = run(cache, args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "wrote "), "%s", r.err);
    /* progress of the forward pass (plain lines: stderr is not a terminal), then the solve */
    cr_expect(strstr(r.err, "prepare: fit 6000/6000 tokens (100%)") && strstr(r.err, "solving the maps"), "%s", r.err);
    cr_assert(cached_maps(cache, maps, sizeof maps), "one map file in the cache");
    /* named by the model's fingerprint: the architecture leads */
    cr_expect(strstr(maps, "/maps/llama-"), "%s", maps);
    tb_result_free(&r);
    /* found again: no refit */
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "already in the cache") && !strstr(r.err, "wrote "), "%s", r.err);
    tb_result_free(&r);
    /* ask finds them and says so; --no-ridgefill turns them off */
    snprintf(doc, sizeof doc, "%s/doc.txt", cache);
    FILE *f = fopen(doc, "w");
    cr_assert(f);
    fputs("Lily had a red ball. She played with it in the park every day with her dog Max.\n", f);
    fclose(f);
    snprintf(args, sizeof args, "ask -m '%s' -n 4 --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    /* a short document: nothing said about RidgeFill (it cannot change the prompt) */
    cr_expect(!strcasestr(r.err, "ridgefill") && !strstr(r.err, maps), "%s", r.err);
    tb_result_free(&r);
    /* -v: the default for long prompts is quality mode, grouped (rk_fill_params_default),
     * with the maps' path */
    snprintf(args, sizeof args, "ask -m '%s' -n 4 -v --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "RidgeFill quality for prompts over 2048 tokens") && strstr(r.err, maps) &&
                  strstr(r.err, "filled rows in groups of 16"),
              "%s", r.err);
    tb_result_free(&r);
    /* --fill off: exact, and said so */
    snprintf(args, sizeof args, "ask -m '%s' -n 4 --fill off --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(!strcasestr(r.err, "ridgefill"), "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, "ask -m '%s' -n 4 --fill quality --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, maps), "the maps' path only with -v: %s", r.err);
    tb_result_free(&r);
    /* maps named by the user without --fill: quality (rk_fill_params_default), not speed */
    snprintf(args, sizeof args, "ask -m '%s' -n 4 --ridgefill '%s' --doc '%s' 'What did Lily have?'", sp, maps, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(!strstr(r.err, "ridgefill: ") && !strstr(r.err, "RidgeFill"), "%s", r.err);
    tb_result_free(&r);
    /* quality mode groups filled rows by default (rk_fill_default_group: 16); --fill-group 0
     * turns it off, --fill-group G sets it, and -v's fill line says which */
    snprintf(args, sizeof args, "ask -m '%s' -n 4 -v --ridgefill '%s' --doc '%s' 'What did Lily have?'", sp, maps, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "ridgefill quality, split") && strstr(r.err, "tail 2048, group 16,"), "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, "ask -m '%s' -n 4 -v --ridgefill '%s' --fill-group 0 --doc '%s' 'What did Lily have?'",
             sp, maps, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "tail 2048, group 0,"), "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, "ask -m '%s' -n 4 -v --ridgefill '%s' --fill-group 8 --doc '%s' 'What did Lily have?'",
             sp, maps, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "tail 2048, group 8,"), "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, "ask -m '%s' -n 4 --no-ridgefill --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(!strcasestr(r.err, "ridgefill"), "nothing said without -v: %s", r.err);
    tb_result_free(&r);
    /* a truncated cached file is not trusted: prepare fits again */
    cr_assert_eq(truncate(maps, 100), 0);
    snprintf(args, sizeof args, "prepare -m '%s' --text '%s' --max-tokens 6000 -t 1", sp, txt);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "unusable") && strstr(r.err, "wrote "), "%s", r.err);
    tb_result_free(&r);
    /* a missing .gz text and a text that is not gzip data are named; nothing is written */
    snprintf(args, sizeof args, "prepare -m '%s' --force --text '%s/none.txt.gz'", sp, cache);
    r = run(cache, args);
    cr_expect_eq(r.code, 5, "%s", r.err);
    cr_expect(strstr(r.err, "none.txt.gz"), "%s", r.err);
    tb_result_free(&r);
    /* too little text is a usage error, not a poor fit */
    snprintf(args, sizeof args, "prepare -m '%s' --force --text '%s'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "too few"), "%s", r.err);
    tb_result_free(&r);
    unlink(doc);
    unlink(maps);
    char d[1100];
    snprintf(d, sizeof d, "%s/ridgekv/maps", cache);
    rmdir(d);
    snprintf(d, sizeof d, "%s/ridgekv", cache);
    rmdir(d);
    rmdir(cache);
}

Test(prepare, sparse_calibration_beside_the_maps_and_ask_uses_it, .timeout = 300) {
    char sp[1024], txt[1024], cache[256], args[4096], doc[1300];
    if (!tb_shared_path(sp, sizeof sp, "models/stories260K/stories260K-f32.gguf")) cr_skip_test("%s", sp);
    if (!tb_shared_path(txt, sizeof txt, "corpus/doyle_sherlock_holmes_pg1661.txt")) cr_skip_test("%s", txt);
    cr_assert(tb_tmp_dir(cache, sizeof cache, "rkprepsp"), "%s", cache);
    snprintf(args, sizeof args, "prepare -m '%s' --text '%s' --max-tokens 5000 --sparse -t 1", sp, txt);
    tb_result r = run(cache, args);
    cr_assert_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "measuring sparse attention") && strstr(r.err, ".sparse.gguf"), "%s", r.err);
    tb_result_free(&r);
    r = run(cache, args); /* both found again */
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "sparse-attention calibration for") && strstr(r.err, "already in the cache"), "%s", r.err);
    tb_result_free(&r);
    snprintf(doc, sizeof doc, "%s/doc.txt", cache);
    FILE *f = fopen(doc, "w");
    cr_assert(f);
    fputs("Lily had a red ball. She played with it in the park every day with her dog Max.\n", f);
    fclose(f);
    snprintf(args, sizeof args, "ask -m '%s' -n 2 -v --no-cache --sparse on --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 0, "%s", r.err);
    cr_expect(strstr(r.err, "sparse attention with the calibration") && strstr(r.err, ".sparse.gguf"), "%s", r.err);
    tb_result_free(&r);
    snprintf(args, sizeof args, "ask -m '%s' -n 2 --sparse on:mass=2 --doc '%s' 'What did Lily have?'", sp, doc);
    r = run(cache, args);
    cr_expect_eq(r.code, 2, "%s", r.err);
    cr_expect(strstr(r.err, "--sparse") && strstr(r.err, "mass"), "%s", r.err);
    tb_result_free(&r);
}
