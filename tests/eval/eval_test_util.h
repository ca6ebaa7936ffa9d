/* Helpers shared by the eval CLI tests (test_eval.c, test_eval_kv_modes.c). */
#pragma once
#include <json-c/json.h>

#include "tb.h"

/* `ridgekv ARGS` with RIDGEKV_CORPUS at ../shared/corpus (RK_BIN from meson). */
tb_result et_run(const char *args);

/* The entry of an eval --json object's "modes" array whose "mode" is name (the test fails
 * when there is none). */
json_object *et_mode_obj(json_object *j, const char *name);
/* Newlines in the file at path, -1 when it cannot be opened. */
int et_count_lines(const char *path);
