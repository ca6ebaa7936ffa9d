#include "rt_shared.h"

#include <criterion/criterion.h>
#include <stdlib.h>

#include "tb.h"

rk_model *rt_load_shared(const char *rel) {
    char p[1024];
    if (!tb_shared_path(p, sizeof p, rel)) cr_skip_test("%s", p);
    rk_err e = {0};
    rk_model *m = NULL;
    cr_assert_eq(rk_model_load(p, &m, &e), RK_OK, "%s", e.msg);
    return m;
}

int32_t *rt_story_ids(const rk_model *m, size_t want) {
    char p[1024];
    if (!tb_shared_path(p, sizeof p, "golden/perplexity/tinystories_sample_clean.txt")) cr_skip_test("%s", p);
    size_t len, n;
    char *txt = tb_read_file(p, &len);
    cr_assert(txt);
    rk_err e = {0};
    int32_t *ids;
    cr_assert_eq(rk_model_tokenize(m, txt, len, true, false, &ids, &n, &e), RK_OK, "%s", e.msg);
    free(txt);
    cr_assert(n >= want, "only %zu tokens", n);
    return ids;
}
