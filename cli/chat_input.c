/* ridgekv chat: reading one turn (see chat.h). */
#include <stdlib.h>
#include <string.h>

#include "chat.h"

static bool str_append(char **s, size_t *len, size_t *cap, const char *p, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        char *q = realloc(*s, c);
        if (!q) return false;
        *s = q;
        *cap = c;
    }
    memcpy(*s + *len, p, n);
    *len += n;
    (*s)[*len] = 0;
    return true;
}

char *chat_trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = 0;
    return s;
}

cli_le_result chat_read_turn(chat *c, cli_lineedit *le, char **out, bool *had_text) {
    char *line = NULL, *acc = NULL;
    size_t len = 0, cap = 0;
    bool block = false, first = true, any = false;
    cli_le_result r;
    *out = NULL;
    for (;;) {
        r = cli_le_read(le, first ? ">>> " : "... ", &line, had_text);
        if (r != CLI_LE_LINE) {
            if (r == CLI_LE_INTERRUPT && !first) *had_text = true;
            if (r == CLI_LE_EOF && !first) break; /* piped input ended inside a block: send it */
            free(acc);
            return r;
        }
        size_t ln = strlen(line);
        if (ln && line[ln - 1] == '\r') line[--ln] = 0; /* CRLF input */
        bool fence = !strcmp(chat_trim(line), "\"\"\"");
        if (first && fence) {
            block = true;
        } else if (block && fence) {
            free(line);
            break;
        } else {
            size_t n = strlen(line);
            bool cont = !block && n && line[n - 1] == '\\';
            if (cont) n--;
            if ((any && !str_append(&acc, &len, &cap, "\n", 1)) || !str_append(&acc, &len, &cap, line, n)) {
                free(line);
                free(acc);
                return CLI_LE_ERROR;
            }
            any = true;
            if (!block && !cont) {
                free(line);
                break;
            }
        }
        free(line);
        line = NULL;
        first = false;
    }
    *out = acc ? acc : strdup("");
    /* the history holds whole messages: a block or joined lines come back as one entry */
    if (*out && c->interactive && **out) cli_le_history_add(le, *out);
    return *out ? CLI_LE_LINE : CLI_LE_ERROR;
}
