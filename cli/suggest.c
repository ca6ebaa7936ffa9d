/* llama.cpp / ollama habits and "did you mean": see suggest.h. */
#include "suggest.h"

#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "catalog.h"
#include "cli.h"

int cli_edit_distance(const char *a, const char *b) {
    /* optimal string alignment: insertions, deletions, substitutions and swaps of two
     * neighbours ("chta" is one step from "chat") */
    const size_t na = strlen(a), nb = strlen(b);
    if (na > 63 || nb > 63) return 64;
    int d[64][64];
    for (size_t i = 0; i <= na; i++) d[i][0] = (int)i;
    for (size_t j = 0; j <= nb; j++) d[0][j] = (int)j;
    for (size_t i = 1; i <= na; i++)
        for (size_t j = 1; j <= nb; j++) {
            int v = d[i - 1][j - 1] + (a[i - 1] != b[j - 1]);
            if (d[i - 1][j] + 1 < v) v = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < v) v = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < v)
                v = d[i - 2][j - 2] + 1;
            d[i][j] = v;
        }
    return d[na][nb];
}

/* Close enough to be a typo of each other: a distance of at most a third of the longer
 * name, and at most 2. */
static bool near(int d, const char *a, const char *b) {
    const size_t la = strlen(a), lb = strlen(b), l = la > lb ? la : lb;
    return d > 0 && d <= 2 && (size_t)d * 3 <= l;
}

/* ---- llama.cpp's flags (common/arg.cpp) that have a ridgekv answer ------------------- */
static const struct {
    const char *names; /* " -x --long " */
    const char *here;  /* ridgekv's way; "%s" takes --kv's item for the value (cache types) */
} k_llama[] = {
    {" -ngl --n-gpu-layers --gpu-layers ", "--backend cuda (the whole model runs on the GPU; no layer split)"},
    {" -dev --device ", "--backend cpu|cuda"},
    {" -ctk --cache-type-k -ctv --cache-type-v ", "--kv %s (one type for K and V: f16, f32, q8, q4, lowram)"},
    {" -sys --system-prompt ", "--system TEXT"},
    {" -sysf --system-prompt-file ", "--system \"$(cat FILE)\""},
    {" --temperature ", "--temp T"},
    {" -s ", "--seed S"},
    {" --predict ", "-n N (--n-predict)"},
    {" -ub --ubatch-size ", "-b N (one batch size)"},
    {" -tb --threads-batch ", "-t N (one thread count)"},
    {" -fa --flash-attn ", "nothing: ridgekv has no flash-attention switch; drop the flag"},
    {" --host --port ", "`ridgekv serve --http ADDR:PORT` (serve also takes --host ADDR --port PORT)"},
    {" -hf --hf-repo -hff --hf-file -mu --model-url ", "`ridgekv pull NAME`, then -m NAME (ridgekv models lists them)"},
    {" -i --interactive -if --interactive-first -cnv --conversation ", "`ridgekv chat` (a conversation)"},
    {" -no-cnv --no-conversation ", "`ridgekv run` (one prompt, no conversation)"},
    {" --mlock --no-mmap --mmap ", "nothing: the model is always mapped read-only; drop the flag"},
    {" -np --parallel -cb --cont-batching ", "nothing: serve answers one request at a time; drop the flag"},
    {" --rope-freq-scale ", "--rope-scale F (the factor itself: llama.cpp's value is 1/F)"},
    {" --reverse-prompt ", "-r TEXT (--stop)"},
    {" --jinja --chat-template ", "nothing: the template comes from the model file (ChatML when it names none); "
                                  "`run --chat` and `chat` apply it"},
};

/* --kv's item for a llama.cpp cache type (q8_0 -> q8). */
static const char *kv_item(const char *v) {
    if (!v) return "q8";
    if (!strcmp(v, "q8_0")) return "q8";
    if (!strcmp(v, "q4_0") || !strcmp(v, "q4_1")) return "q4";
    if (!strcmp(v, "f16") || !strcmp(v, "f32")) return v;
    return "f16|f32|q8|q4";
}

/* Flags parsed before the common parser (each command's own). */
static const struct {
    const char *cmd, *flags;
} k_own[] = {
    {"serve", " --jsonl --http --max-line --http-max-body --host --port "},
    {"ask", " --doc "},
    {"pull", " --force --from --prepare "},
    {"prepare", " --text --max-tokens --force "},
};

/* The nearest name in list (" --a --b ") to a, or none: *best set, returns its distance. */
static int nearest_in(const char *list, const char *a, char *best, size_t cap, int bd) {
    for (const char *p = list; p && *p;) {
        p += strspn(p, " ");
        const size_t n = strcspn(p, " ");
        if (!n) break;
        char name[64];
        if (n < sizeof name) {
            memcpy(name, p, n);
            name[n] = 0;
            const int d = cli_edit_distance(a, name);
            if (near(d, a, name) && d < bd) bd = d, snprintf(best, cap, "%s", name);
        }
        p += n;
    }
    return bd;
}

int cli_unknown_flag(const char *cmd, const char *a, const char *v, const char *known) {
    char key[72];
    snprintf(key, sizeof key, " %.64s ", a);
    for (size_t i = 0; i < sizeof k_llama / sizeof *k_llama; i++) {
        if (!strstr(k_llama[i].names, key)) continue;
        char here[256];
        snprintf(here, sizeof here, k_llama[i].here, kv_item(v));
        if (!strncmp(here, "nothing: ", 9))
            fprintf(stderr, "ridgekv %s: %s is llama.cpp's flag; %s\n", cmd, a, here + 9);
        else
            fprintf(stderr, "ridgekv %s: %s is llama.cpp's flag; here use %s (see ridgekv %s --help)\n", cmd, a, here,
                    cmd);
        return RK_EXIT_USAGE;
    }
    /* a long flag with one dash ("-temp") is matched as "--temp" too */
    char dashed[72];
    snprintf(dashed, sizeof dashed, "-%.64s", a);
    const char *forms[2] = {a, a[0] == '-' && a[1] != '-' && a[2] ? dashed : NULL};
    char best[80] = "";
    int bd = 99;
    for (int f = 0; f < 2 && forms[f]; f++) {
        if (f == 1) {
            snprintf(key, sizeof key, " %.64s ", dashed);
            if (known && strstr(known, key)) {
                snprintf(best, sizeof best, "%s", dashed);
                break;
            }
        }
        bd = nearest_in(known, forms[f], best, sizeof best, bd);
        for (size_t i = 0; i < sizeof k_own / sizeof *k_own; i++)
            if (!strcmp(k_own[i].cmd, cmd)) bd = nearest_in(k_own[i].flags, forms[f], best, sizeof best, bd);
    }
    if (best[0])
        fprintf(stderr, "ridgekv %s: unknown option '%s'; did you mean %s? (see ridgekv %s --help)\n", cmd, a, best,
                cmd);
    else fprintf(stderr, "ridgekv %s: unknown option '%s' (see ridgekv %s --help)\n", cmd, a, cmd);
    return RK_EXIT_USAGE;
}

/* ---- commands ---------------------------------------------------------------------- */
static const char *const k_cmds[] = {"run",     "info",  "bench", "pull", "models",   "eval",  "calibrate",
                                     "prepare", "serve", "chat",  "ask",  "tokenize", "synth", "cache"};
/* ollama's command names and what they are here */
static const char *const k_ollama[][2] = {
    {"list", "models"}, {"ls", "models"}, {"show", "info"}, {"generate", "run"}, {"server", "serve"}};

int cli_unknown_command(const char *c) {
    for (size_t i = 0; i < sizeof k_ollama / sizeof *k_ollama; i++)
        if (!strcmp(c, k_ollama[i][0])) {
            fprintf(stderr, "ridgekv: unknown command '%s'; here it is `ridgekv %s` (try ridgekv --help)\n", c,
                    k_ollama[i][1]);
            return RK_EXIT_USAGE;
        }
    if (cli_names_model(c)) {
        fprintf(stderr, "ridgekv: '%s' is a model, not a command: `ridgekv run %s PROMPT` or `ridgekv chat -m %s`\n", c,
                c, c);
        return RK_EXIT_USAGE;
    }
    const char *best = NULL;
    int bd = 99;
    for (size_t i = 0; i < sizeof k_cmds / sizeof *k_cmds; i++) {
        const int d = cli_edit_distance(c, k_cmds[i]);
        if (near(d, c, k_cmds[i]) && d < bd) bd = d, best = k_cmds[i];
    }
    if (best) fprintf(stderr, "ridgekv: unknown command '%s'; did you mean '%s'? (try ridgekv --help)\n", c, best);
    else fprintf(stderr, "ridgekv: unknown command '%s' (try ridgekv --help)\n", c);
    return RK_EXIT_USAGE;
}

/* ---- models ------------------------------------------------------------------------ */
/* A catalogue name is near when the two share a prefix of 3 or more characters, one
 * holds the other, or they are a typo apart. */
static bool near_model(const char *name, const char *cat) {
    if (strlen(name) >= 3 && (strstr(cat, name) || strstr(name, cat))) return true;
    size_t k = 0;
    while (name[k] && name[k] == cat[k]) k++;
    if (k >= 3) return true;
    const int d = cli_edit_distance(name, cat);
    return d > 0 && d <= 3;
}

void cli_unknown_model(const char *name) {
    fprintf(stderr, "ridgekv: model '%s' is neither a file nor a catalogue name", name);
    int n = 0;
    for (int i = 0; i < cli_catalog_n; i++)
        if (near_model(name, cli_catalog[i].name))
            fprintf(stderr, "%s%s", n++ ? ", " : "; did you mean ", cli_catalog[i].name);
    fprintf(stderr,
            "%s\n`ridgekv models` lists the catalogue (fetch one with `ridgekv pull NAME`); -m also takes "
            "a GGUF path.\n",
            n ? "?" : "");
}

bool cli_names_model(const char *arg) {
    if (cli_catalog_find(arg)) return true;
    struct stat st;
    if (stat(arg, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    FILE *f = fopen(arg, "rb");
    char magic[4] = {0};
    const bool gguf = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return gguf;
}
