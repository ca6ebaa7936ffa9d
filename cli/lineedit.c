#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lineedit.h"

#ifdef RK_HAVE_LIBEDIT
#include <histedit.h>
#include <langinfo.h>
#include <locale.h>
#include <poll.h>
#include <wchar.h>
#endif

/* The one piece of process-wide state: a signal handler can only talk through it. */
static volatile sig_atomic_t g_sigint, g_second_exits;
static struct sigaction g_old_sigint;
static bool g_installed;
/* Self-pipe: the handler writes a byte so that a poll() that started just after the flag
 * was checked still wakes up (a plain flag would leave that read blocked). */
static int g_pipe[2] = {-1, -1};

static void on_sigint(int sig) {
    (void)sig;
    int saved = errno;
    if (g_sigint && g_second_exits) {
        static const char msg[] = "\nridgekv: interrupted\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
        _exit(130);
    }
    if (!g_sigint && g_second_exits) {
        static const char msg[] = "\nridgekv: stopping (Ctrl-C again to quit at once)\n";
        ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
        (void)w;
    }
    g_sigint = 1;
    if (g_pipe[1] >= 0) {
        ssize_t w = write(g_pipe[1], "i", 1);
        (void)w;
    }
    errno = saved;
}

static void drain_pipe(void) {
    char b[64];
    if (g_pipe[0] >= 0)
        while (read(g_pipe[0], b, sizeof b) > 0) {
        }
}

void cli_sigint_install(bool second_exits) {
    g_second_exits = second_exits;
    if (g_pipe[0] < 0 && pipe2(g_pipe, O_NONBLOCK | O_CLOEXEC) != 0) g_pipe[0] = g_pipe[1] = -1;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0; /* no SA_RESTART: reads must return EINTR */
    if (sigaction(SIGINT, &sa, &g_old_sigint) == 0) g_installed = true;
}

void cli_sigint_restore(void) {
    if (g_installed) sigaction(SIGINT, &g_old_sigint, NULL);
    g_installed = false;
    for (int i = 0; i < 2; i++)
        if (g_pipe[i] >= 0) close(g_pipe[i]);
    g_pipe[0] = g_pipe[1] = -1;
}

bool cli_sigint_pending(void) { return g_sigint != 0; }

void cli_sigint_clear(void) {
    g_sigint = 0;
    drain_pipe();
}

struct cli_lineedit {
    bool interactive;
#ifdef RK_HAVE_LIBEDIT
    EditLine *el;
    History *hist;
    const char *prompt; /* borrowed for the duration of one read */
#endif
    char *buf; /* getline buffer */
    size_t cap;
};

#ifdef RK_HAVE_LIBEDIT
/* One byte of stdin: 1, 0 at the end, -1 with errno EINTR after Ctrl-C. */
static int wait_byte(int fd, unsigned char *b) {
    for (;;) {
        if (g_sigint) {
            errno = EINTR;
            return -1;
        }
        struct pollfd p[2] = {{.fd = fd, .events = POLLIN}, {.fd = g_pipe[0], .events = POLLIN}};
        int n = poll(p, g_pipe[0] >= 0 ? 2 : 1, -1);
        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (g_pipe[0] >= 0 && p[1].revents) {
            drain_pipe();
            continue;
        }
        if (!p[0].revents) continue;
        ssize_t r = read(fd, b, 1);
        if (r == 1) return 1;
        if (r == 0 || (r < 0 && errno == EIO)) return 0; /* hung-up terminal: end of input */
        if (errno != EINTR && errno != EAGAIN) return -1;
    }
}

/* libedit's character reader, replaced so that Ctrl-C cannot slip in between the
 * check of the flag and a blocking read(). Decodes the locale's multibyte text. */
static int le_getc(EditLine *el, wchar_t *wc) {
    (void)el;
    mbstate_t st;
    memset(&st, 0, sizeof st);
    for (;;) {
        unsigned char b;
        int r = wait_byte(STDIN_FILENO, &b);
        if (r <= 0) return r;
        size_t n = mbrtowc(wc, (const char *)&b, 1, &st);
        if (n == (size_t)-2) continue; /* inside a character */
        if (n == (size_t)-1) {         /* not valid here: drop the byte */
            memset(&st, 0, sizeof st);
            continue;
        }
        if (n == 0) *wc = 0;
        return 1;
    }
}

static char *le_prompt(EditLine *el) {
    cli_lineedit *le = NULL;
    el_get(el, EL_CLIENTDATA, &le);
    return (char *)(le && le->prompt ? le->prompt : "");
}
#endif

cli_lineedit *cli_le_open(const char *prog, bool interactive) {
    cli_lineedit *le = calloc(1, sizeof *le);
    if (!le) return NULL;
    le->interactive = interactive;
#ifdef RK_HAVE_LIBEDIT
    if (interactive) {
        /* libedit decodes keys by the locale; model text is UTF-8, so insist on UTF-8 */
        const char *loc = setlocale(LC_CTYPE, "");
        if (!loc || strcmp(nl_langinfo(CODESET), "UTF-8")) setlocale(LC_CTYPE, "C.UTF-8");
        le->el = el_init(prog, stdin, stdout, stderr);
        le->hist = history_init();
        if (le->el && le->hist) {
            HistEvent ev;
            history(le->hist, &ev, H_SETSIZE, 500);
            history(le->hist, &ev, H_SETUNIQUE, 1);
            el_set(le->el, EL_CLIENTDATA, le);
            el_set(le->el, EL_PROMPT, le_prompt);
            el_set(le->el, EL_GETCFN, le_getc);
            el_set(le->el, EL_EDITOR, "emacs");
            el_set(le->el, EL_HIST, history, le->hist);
            el_source(le->el, NULL); /* the user's ~/.editrc, if any */
        } else {
            /* libedit could not start (odd terminal): fall back to plain reads */
            if (le->el) el_end(le->el);
            if (le->hist) history_end(le->hist);
            le->el = NULL;
            le->hist = NULL;
        }
    }
#else
    (void)prog;
#endif
    return le;
}

void cli_le_close(cli_lineedit *le) {
    if (!le) return;
#ifdef RK_HAVE_LIBEDIT
    if (le->el) el_end(le->el);
    if (le->hist) history_end(le->hist);
#endif
    free(le->buf);
    free(le);
}

const char *cli_le_kind(const cli_lineedit *le) {
#ifdef RK_HAVE_LIBEDIT
    if (le && le->el) return "libedit";
#else
    (void)le;
#endif
    return "plain";
}

void cli_le_history_add(cli_lineedit *le, const char *entry) {
#ifdef RK_HAVE_LIBEDIT
    if (le && le->hist && entry && *entry) {
        HistEvent ev;
        history(le->hist, &ev, H_ENTER, entry);
    }
#else
    (void)le;
    (void)entry;
#endif
}

static char *dup_line(const char *s, size_t n) {
    while (n && (s[n - 1] == '\n' || s[n - 1] == '\r')) n--;
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

cli_le_result cli_le_read(cli_lineedit *le, const char *prompt, char **line, bool *had_text) {
    *had_text = false;
#ifdef RK_HAVE_LIBEDIT
    if (le->el) {
        int count = 0;
        le->prompt = prompt;
        const char *s = el_gets(le->el, &count);
        int saved = errno;
        le->prompt = NULL;
        if (!s && count < 0 && (g_sigint || saved == EINTR)) {
            const LineInfo *li = el_line(le->el);
            *had_text = li && li->lastchar > li->buffer;
            return CLI_LE_INTERRUPT;
        }
        if (!s || count == 0) return count < 0 ? CLI_LE_ERROR : CLI_LE_EOF;
        if (!(*line = dup_line(s, (size_t)count))) return CLI_LE_ERROR;
        return CLI_LE_LINE;
    }
#endif
    if (le->interactive && prompt) {
        fputs(prompt, stdout);
        fflush(stdout);
    }
    errno = 0;
    ssize_t n = getline(&le->buf, &le->cap, stdin);
    if (n < 0) {
        int saved = errno;
        bool eof = feof(stdin);
        clearerr(stdin);
        if (!eof && saved == EINTR) return CLI_LE_INTERRUPT;
        return eof ? CLI_LE_EOF : CLI_LE_ERROR;
    }
    if (!(*line = dup_line(le->buf, (size_t)n))) return CLI_LE_ERROR;
    return CLI_LE_LINE;
}
