/* ridgekv ask on the document formats of cli/extract, through the binary: a PDF made here
 * read and answered by the default model with its page markers in the prompt, --doc - from
 * stdin (text and PDF), and the refusals with exit 5. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli_harness.h"
#include "doc_fixtures.h"
#include "tb.h"

static const char *const facts[] = {"The lighthouse keeper is named Orla Finch.",
                                    "The lighthouse stands on Skerry Point and was built in 1871."};

Test(ask_formats, ask_reads_a_pdf_and_answers_from_it) {
    char mp[1024], dir[64], pdf[96];
    if (!tb_default_model(mp, sizeof mp))
        cr_skip_test("default model absent (run `ridgekv pull`); ask on a real model not checked");
    snprintf(pdf, sizeof pdf, "%s/keeper.pdf", tmp_dir(dir, sizeof dir));
    size_t len;
    char *bytes = fx_pdf(FX_PDF_TEXT, facts, 2, &len);
    fx_write(pdf, bytes, len);
    free(bytes);
    result r = run_argv(NULL, (char *[]){"ask", "-m", mp, "-n", "24", "--no-cache", "-v", "--verbose-prompt", "--doc",
                                         pdf, "What is the name of the lighthouse keeper?", NULL});
    unlink(pdf);
    rmdir(dir);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.out, "Orla"), "the answer names the keeper: %s", r.out);
    /* the prompt holds the extracted text with its page markers, under the file's name */
    cr_expect(strstr(r.err, "Document: keeper.pdf"), "%s", r.err);
    cr_expect(strstr(r.err, "[page 1]\nThe lighthouse keeper is named Orla Finch.\n\n[page 2]\nThe lighthouse stands"),
              "%s", r.err);
    long n_prompt = num_after(r.err, "document, prompt ");
    cr_expect(n_prompt > 40 && n_prompt < 200, "prompt tokens: %ld: %s", n_prompt, r.err);
    done(&r);
}

Test(ask_formats, doc_dash_reads_stdin) {
    char sp[1024];
    stories(sp, sizeof sp);
    const char *text = "\xEF\xBB\xBFLily had a red ball. She played with it in the park.\n";
    result r = run_argv(text, (char *[]){"ask", "-m", sp, "-n", "4", "--no-cache", "-v", "--verbose-prompt", "--doc",
                                         "-", "What did Lily have?", NULL});
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "Document: stdin"), "%s", r.err);
    cr_expect(strstr(r.err, "Lily had a red ball.") && !strstr(r.err, "\xEF\xBB\xBF"), "the BOM is dropped: %s", r.err);
    done(&r);
    /* a PDF on stdin is found by its magic bytes (the fixture holds no NUL byte) */
    size_t len;
    char *bytes = fx_pdf(FX_PDF_TEXT, facts, 2, &len);
    cr_assert(!memchr(bytes, 0, len));
    char *pdf = strndup(bytes, len);
    free(bytes);
    r = run_argv(pdf, (char *[]){"ask", "-m", sp, "-n", "4", "--no-cache", "--verbose-prompt", "--doc", "-",
                                 "Who keeps the light?", NULL});
    free(pdf);
    cr_assert_eq(r.code, 0, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "[page 2]") && strstr(r.err, "Skerry Point"), "%s", r.err);
    done(&r);
    r = run_argv("x", (char *[]){"ask", "-m", sp, "--doc", "-", "--doc", "-", "Why?", NULL});
    cr_expect_eq(r.code, 2, "stdin twice: exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "--doc - (stdin) can be given once"), "%s", r.err);
    done(&r);
    r = run_argv("", (char *[]){"ask", "-m", sp, "--doc", "-", "Why?", NULL});
    cr_expect_eq(r.code, 5, "empty stdin: exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "document stdin is empty"), "%s", r.err);
    done(&r);
}

Test(ask_formats, unreadable_documents_exit_5_with_the_fix) {
    char sp[1024], dir[64], path[96];
    stories(sp, sizeof sp);
    tmp_dir(dir, sizeof dir);
    size_t len;
    char *bytes = fx_pdf(FX_PDF_ENCRYPTED, facts, 1, &len);
    snprintf(path, sizeof path, "%s/locked.pdf", dir);
    fx_write(path, bytes, len);
    free(bytes);
    result r = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", path, "Why?", NULL});
    cr_expect_eq(r.code, 5, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "locked.pdf is an encrypted PDF") && strstr(r.err, "qpdf --decrypt"), "%s", r.err);
    done(&r);
    unlink(path);
    bytes = fx_pdf(FX_PDF_NO_TEXT, facts, 1, &len);
    snprintf(path, sizeof path, "%s/scan.pdf", dir);
    fx_write(path, bytes, len);
    free(bytes);
    r = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", path, "Why?", NULL});
    cr_expect_eq(r.code, 5, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "no text layer") && strstr(r.err, "ocrmypdf"), "%s", r.err);
    done(&r);
    unlink(path);
    const unsigned char ole[] = {0xD0, 0xCF, 0x11, 0xE0, 0xA1, 0xB1, 0x1A, 0xE1, 0, 0, 0, 0};
    snprintf(path, sizeof path, "%s/old.doc", dir);
    fx_write(path, ole, sizeof ole);
    r = run_argv(NULL, (char *[]){"ask", "-m", sp, "--doc", path, "Why?", NULL});
    cr_expect_eq(r.code, 5, "exit %d: %s", r.code, r.err);
    cr_expect(strstr(r.err, "old.doc is an old binary Office file") && strstr(r.err, "save it as .docx"), "%s", r.err);
    done(&r);
    unlink(path);
    rmdir(dir);
}
