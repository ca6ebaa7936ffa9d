/* Terminal input for the interactive commands: one line at a time, with line editing
 * and history through libedit when the build found it (RK_HAVE_LIBEDIT), plain
 * getline() otherwise; plus the Ctrl-C flag that chat and ask poll. */
#pragma once
#include <stdbool.h>

typedef struct cli_lineedit cli_lineedit;

typedef enum cli_le_result {
    CLI_LE_LINE,      /* *line holds one line without its newline */
    CLI_LE_EOF,       /* Ctrl-D on an empty line, or the end of piped input */
    CLI_LE_INTERRUPT, /* Ctrl-C while reading; *had_text says whether a line was being typed */
    CLI_LE_ERROR,     /* read error or out of memory */
} cli_le_result;

/* interactive: stdin and stdout are terminals, so prompts are shown and libedit (when
 * built in) edits the line. Returns NULL when out of memory. */
cli_lineedit *cli_le_open(const char *prog, bool interactive);
void cli_le_close(cli_lineedit *le); /* accepts NULL */
/* prompt is shown only in interactive mode. *line is malloc'd (caller frees). */
cli_le_result cli_le_read(cli_lineedit *le, const char *prompt, char **line, bool *had_text);
/* Adds an entry to the in-memory history (interactive libedit only; a no-op otherwise). */
void cli_le_history_add(cli_lineedit *le, const char *entry);
/* "libedit" or "plain" */
const char *cli_le_kind(const cli_lineedit *le);

/* SIGINT sets a flag instead of killing the process. The handler is installed without
 * SA_RESTART so that a blocking read returns with EINTR and the caller sees the flag.
 * second_exits: the first SIGINT says on stderr that a second one quits, and a second
 * SIGINT before the flag is cleared ends the process at once (exit 130), for work that
 * only checks the flag now and then. */
void cli_sigint_install(bool second_exits);
void cli_sigint_restore(void);
bool cli_sigint_pending(void);
void cli_sigint_clear(void);
