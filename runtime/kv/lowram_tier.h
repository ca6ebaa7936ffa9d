/* Internal: LowRAM under a KV budget (lowram_tier.c; docs/TIERS.md). The codec's arrays
 * stay as they are; cold cells (a chunk's coefficient and residual rows of one layer
 * group, one frame each) go to the block store, their pages are released, and they are
 * read back in place when decode selects their chunks. lowram_attn.c calls
 * the three hooks below when c->tier is set (c->tier is NULL without a budget). */
#pragma once
#include "lowram_impl.h"

/* lowram with p->budget: the codec of rk_kv_lowram_init, its ops wrapped by the tier's. */
rk_status rk_kv_lowram_tier_init(rk_kv *kv, const rk_model *m, const rk_kv_params *p, int n_threads, char *warning,
                                 size_t warning_cap, rk_err *err);

/* Start of attention of layer l. selective: the caller will name the chunks it reads per
 * KV head (lr_tier_need); otherwise every chunk of the layer is made resident here. */
rk_status lr_tier_begin(rk_kv_codec *c, int layer, bool selective, rk_err *err);
/* Makes the coefficient rows (of the layer's group) and the residual rows (of layer, KV
 * head h) of chunks sel[0..n) resident before attention reads them. */
rk_status lr_tier_need(rk_kv_codec *c, int layer, int h, const int32_t *sel, int64_t n, rk_err *err);
/* End of attention of layer l: read ahead what the next layer selected last step, and
 * release what is over the budget. */
void lr_tier_end(rk_kv_codec *c, int layer);
