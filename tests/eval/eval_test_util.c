/* Helpers shared by the eval CLI tests. */
#include "eval_test_util.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

json_object *et_mode_obj(json_object *j, const char *name) {
    json_object *modes = json_object_object_get(j, "modes");
    for (size_t i = 0; i < json_object_array_length(modes); i++) {
        json_object *m = json_object_array_get_idx(modes, i);
        if (!strcmp(json_object_get_string(json_object_object_get(m, "mode")), name)) return m;
    }
    cr_assert_fail("mode %s missing", name);
    return NULL;
}

int et_count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, ch;
    while ((ch = fgetc(f)) != EOF) n += ch == '\n';
    fclose(f);
    return n;
}

tb_result et_run(const char *args) {
    const char *shared = tb_shared_dir();
    char env[1024];
    snprintf(env, sizeof env, "RIDGEKV_CORPUS='%s/corpus'", shared ? shared : ".");
    tb_result r = tb_run(env, args);
    cr_assert(r.code != -2, "RK_BIN not set (meson sets it)");
    return r;
}
