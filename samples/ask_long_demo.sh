#!/usr/bin/env bash
# `ridgekv ask` over a long document: the first chapter of Persuasion (about 3.7K tokens
# with the default model's tokenizer, half of its 8K context).
#
#   1. with -c 2048 the chapter does not fit: ask refuses with the numbers (exit 4);
#   2. with the model's full context it reads the chapter (progress bar on stderr, then
#      time to first token and decode rate) and answers;
#   3. the same with a second document next to it.
#
#   samples/ask_long_demo.sh                        # default model from the cache
#   samples/ask_long_demo.sh -t 4 --ridgefill maps.gguf   # extra flags go to every ask
#
# RIDGEKV=/path/to/ridgekv picks the binary (default: build/cli/ridgekv next to this
# folder, else ridgekv on the PATH). On a 2-core CPU step 2 takes a minute or two.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RIDGEKV:-$root/build/cli/ridgekv}"
if [ ! -x "$bin" ]; then
  bin="$(command -v ridgekv || true)"
fi
if [ -z "$bin" ]; then
  echo "ask_long_demo: no ridgekv binary (build it, or set RIDGEKV=/path/to/ridgekv)" >&2
  exit 1
fi
doc="$root/samples/docs/austen_persuasion_ch1.txt"
other="$root/samples/docs/austen_pride_and_prejudice_ch1.txt"

echo "== 1. a 2048-token context is too small for the chapter (expect exit 4)"
set +e
"$bin" ask "$@" -c 2048 --doc "$doc" "What is the name of Sir Walter Elliot's eldest daughter?"
code=$?
set -e
echo "(exit $code)"
if [ "$code" -ne 4 ]; then
  echo "ask_long_demo: expected exit 4, got $code" >&2
  exit 1
fi

echo
echo "== 2. the whole chapter in the model's own context"
"$bin" ask "$@" --doc "$doc" "What is the name of Sir Walter Elliot's eldest daughter?"

echo
echo "== 3. two documents, each under its own name"
"$bin" ask "$@" -n 64 --doc "$doc" --doc "$other" "Which of the two documents is about the Bennet family?"
