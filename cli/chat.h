/* ridgekv chat, internal to the binary: the chat's state (cmd_chat.c), the /commands
 * (chat_cmds.c) and reading a turn from the terminal or a pipe (chat_input.c). The
 * conversation itself, its cache reuse and its rules are rk_conv's (rk_gen.h). */
#pragma once
#include "cli_gen.h"
#include "lineedit.h"
#include "progress.h"

typedef struct chat {
    cli_opts o;
    rk_model *m;
    rk_session *s;
    rk_ridge_maps *maps;
    rk_conv *conv;
    bool interactive;
    bool drop_told;   /* the drop notice of the turn in progress was printed */
    bool fill_told;   /* the RidgeFill notice was printed (once per chat) */
    cli_progress bar; /* the turn's reading: a bar on a terminal when it takes over a second */
    int64_t last_prefill_n, last_decode_n;
    double last_prefill_s, last_decode_s;
} chat;

/* "[msg]" on a terminal, "ridgekv chat: msg" otherwise, on stderr (a progress bar on the
 * line ends first). */
void chat_notice(const chat *c, const char *msg);
/* A line starting with '/': runs it. Returns 1 to leave the chat, 0 to go on. */
int chat_command(chat *c, char *line);
/* Trims spaces and tabs at both ends, in place. */
char *chat_trim(char *s);
/* Reads one turn: a line, lines joined by a trailing backslash, or a """ block. */
cli_le_result chat_read_turn(chat *c, cli_lineedit *le, char **out, bool *had_text);
