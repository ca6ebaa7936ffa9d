/* rk_chat_format for every rk_chat_family: the exact strings the models were trained on
 * (the Jinja templates of Qwen/SmolLM, Llama 3, Llama 2 and Zephyr rendered by hand),
 * with and without the opened assistant turn and a system message. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "rk.h"

static const rk_chat_msg k_conv[] = {
    {"system", "Be brief."},
    {"user", "Hi"},
    {"assistant", "Hello!"},
    {"user", "2+2?"},
};

static void expect_format(rk_chat_family f, const rk_chat_msg *m, size_t n, bool add, const char *want) {
    char *out = NULL;
    rk_err e = {0};
    cr_assert_eq(rk_chat_format(f, m, n, add, &out, &e), RK_OK, "%s", e.msg);
    cr_expect_str_eq(out, want, "%s (add_assistant %d)", rk_chat_family_name(f), add);
    free(out);
}

Test(chat_template, chatml) {
    expect_format(RK_CHAT_CHATML, k_conv, 4, true,
                  "<|im_start|>system\nBe brief.<|im_end|>\n"
                  "<|im_start|>user\nHi<|im_end|>\n"
                  "<|im_start|>assistant\nHello!<|im_end|>\n"
                  "<|im_start|>user\n2+2?<|im_end|>\n"
                  "<|im_start|>assistant\n");
    expect_format(RK_CHAT_CHATML, k_conv + 1, 1, false, "<|im_start|>user\nHi<|im_end|>\n");
}

Test(chat_template, llama3) {
    expect_format(RK_CHAT_LLAMA3, k_conv, 4, true,
                  "<|begin_of_text|>"
                  "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>"
                  "<|start_header_id|>user<|end_header_id|>\n\n2+2?<|eot_id|>"
                  "<|start_header_id|>assistant<|end_header_id|>\n\n");
    expect_format(RK_CHAT_LLAMA3, k_conv + 1, 1, false,
                  "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
}

/* The system prompt folds into the first user turn; each exchange is its own <s>...</s>. */
Test(chat_template, llama2) {
    expect_format(RK_CHAT_LLAMA2, k_conv, 4, true,
                  "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
    /* nothing to open for the assistant: the turn is open after [/INST] */
    expect_format(RK_CHAT_LLAMA2, k_conv, 4, false,
                  "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello! </s><s>[INST] 2+2? [/INST]");
    expect_format(RK_CHAT_LLAMA2, k_conv + 1, 1, true, "<s>[INST] Hi [/INST]");
}

Test(chat_template, zephyr) {
    expect_format(RK_CHAT_ZEPHYR, k_conv, 4, true,
                  "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello!</s>\n<|user|>\n2+2?</s>\n"
                  "<|assistant|>\n");
    expect_format(RK_CHAT_ZEPHYR, k_conv + 1, 1, false, "<|user|>\nHi</s>\n");
}

Test(chat_template, empty_and_null_content) {
    expect_format(RK_CHAT_CHATML, NULL, 0, false, "");
    expect_format(RK_CHAT_CHATML, NULL, 0, true, "<|im_start|>assistant\n");
    const rk_chat_msg m[] = {{"user", NULL}, {"assistant", ""}};
    expect_format(RK_CHAT_CHATML, m, 2, false, "<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n");
}

Test(chat_template, unknown_roles_are_refused) {
    const rk_chat_msg bad[] = {{"user", "a"}, {"tool", "b"}};
    const rk_chat_msg none[] = {{NULL, "a"}};
    char *out = (char *)"untouched";
    rk_err e = {0};
    for (int f = RK_CHAT_CHATML; f <= RK_CHAT_ZEPHYR; f++) {
        cr_expect_eq(rk_chat_format((rk_chat_family)f, bad, 2, true, &out, &e), RK_E_INVALID_ARG);
        cr_expect(strstr(e.msg, "message 1") && strstr(e.msg, "'tool'"), "%s", e.msg);
        cr_expect_eq(rk_chat_format((rk_chat_family)f, none, 1, true, &out, &e), RK_E_INVALID_ARG);
    }
    cr_expect_str_eq(out, "untouched", "out written on failure");
}

Test(chat_template, family_names) {
    cr_expect_str_eq(rk_chat_family_name(RK_CHAT_CHATML), "chatml");
    cr_expect_str_eq(rk_chat_family_name(RK_CHAT_LLAMA3), "llama3");
    cr_expect_str_eq(rk_chat_family_name(RK_CHAT_LLAMA2), "llama2");
    cr_expect_str_eq(rk_chat_family_name(RK_CHAT_ZEPHYR), "zephyr");
}
