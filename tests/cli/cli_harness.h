/* The harness of the CLI suites that spawn the binary (test_ux.c, test_chat_ask.c): paths
 * from the meson environment, temporary files, a child on a pseudo-terminal, a child on
 * pipes with its exit code and output. */
#pragma once
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* ---- a child on a pseudo-terminal ------------------------------------------------ */
typedef struct term {
    pid_t pid;
    int fd;
    char *buf; /* everything the child wrote, NUL-terminated */
    size_t len, cap;
    bool eof;
} term;

/* ---- children on pipes / files ------------------------------------------------ */
typedef struct result {
    int code;
    char *out, *err;
} result;

const char *bin(void);
const char *stories(char *buf, size_t cap);
char *sample(char *buf, size_t cap, const char *name);
char *tmp_dir(char *buf, size_t cap);
void write_text(const char *path, const char *text);
double now_s(void);
void term_start(term *t, char *const argv[]);
void term_pump(term *t, int ms);
bool term_expect(term *t, size_t from, const char *needle, double timeout_s);
void term_settle(term *t, int ms);
void term_send(term *t, const char *s);
int term_wait(term *t, double timeout_s);
result run_argv(const char *input, char *const args[]);
void done(result *r);
long num_after(const char *text, const char *key);
