/* Look-ups in the model catalogue (the table: catalog_table.c; tests link their own). */
#include "catalog.h"

#include <string.h>

const cli_model_entry *cli_catalog_default(void) { return &cli_catalog[0]; }

const cli_model_entry *cli_catalog_find(const char *name) {
    if (!name) return NULL;
    for (int i = 0; i < cli_catalog_n; i++)
        if (!strcmp(name, cli_catalog[i].name)) return &cli_catalog[i];
    return NULL;
}

const cli_model_entry *cli_catalog_by_file(const char *path, const char *arch) {
    if (!path || !arch) return NULL;
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    for (int i = 0; i < cli_catalog_n; i++)
        if (!strcmp(base, cli_catalog[i].file) && cli_catalog[i].arch && !strcmp(arch, cli_catalog[i].arch))
            return &cli_catalog[i];
    return NULL;
}

uint64_t cli_catalog_part_bytes(const cli_model_entry *e, int i) {
    if (e->n_parts <= 1 || !e->part_bytes) return 0;
    if (i < e->n_parts) return e->part_bytes;
    return e->size - (uint64_t)(e->n_parts - 1) * e->part_bytes;
}
