/* What a user of llama.cpp or ollama types, answered: llama.cpp flags with a ridgekv
 * equivalent are refused naming it, a mistyped command or flag gets the nearest names
 * ("did you mean"), an unknown model name gets the nearest catalogue names, and a
 * positional argument that names a model is recognised (ollama's `run MODEL`). */
#pragma once
#include <stdbool.h>

/* Levenshtein distance between a and b (bytes; strings past 63 bytes count as far). */
int cli_edit_distance(const char *a, const char *b);
/* The unknown flag a of cmd (v: the argument after it, NULL at the end): one stderr line
 * naming llama.cpp's equivalent here, or the nearest of known (" --flag --flag ... ") and
 * of cmd's own flags. Returns RK_EXIT_USAGE. */
int cli_unknown_flag(const char *cmd, const char *a, const char *v, const char *known);
/* An unknown command c: one stderr line with the nearest command (or, when c names a
 * model, `ridgekv run`/`chat` with it). Returns RK_EXIT_USAGE. */
int cli_unknown_command(const char *c);
/* -m NAME that is neither a file nor a catalogue name: stderr says so, names the nearest
 * catalogue names and `ridgekv models`. */
void cli_unknown_model(const char *name);
/* Whether arg names a model: a catalogue name, or an existing file that starts with the
 * GGUF magic. */
bool cli_names_model(const char *arg);
