#!/usr/bin/env bash
# Pipes a few requests, good and bad, into `ridgekv serve --jsonl` and prints the events it
# writes back (one JSON object per line). The server's log line goes to stderr.
#
#   samples/serve_demo.sh                      # default model from the cache
#   samples/serve_demo.sh -m path/to/model.gguf -t 4
#
# RIDGEKV=/path/to/ridgekv picks the binary (default: build/cli/ridgekv next to this folder).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${RIDGEKV:-$root/build/cli/ridgekv}"
if [ ! -x "$bin" ]; then
  echo "serve_demo: no ridgekv binary at $bin (build it, or set RIDGEKV=/path/to/ridgekv)" >&2
  exit 1
fi

{
  # model summary
  echo '{"id":1,"op":"info"}'
  # a chat turn, streamed token by token (greedy, so the output is repeatable)
  echo '{"id":2,"op":"chat","messages":[{"role":"user","content":"Name three fruits."}],"temperature":0,"max_tokens":32}'
  # a question about a document, one `done` event with the whole text
  echo '{"id":"q","op":"ask","docs":[{"name":"memo","text":"The meeting moved to Thursday at 3 pm."}],"question":"When is the meeting?","temperature":0,"max_tokens":24,"stream":false}'
  # raw completion that ends at a stop string (the stop text itself is not returned)
  echo '{"id":4,"op":"complete","prompt":"1, 2, 3, 4,","temperature":0,"max_tokens":32,"stop":" 8","stream":false}'
  # tokens and their text
  echo '{"id":5,"op":"tokenize","text":"Hello, world!","pieces":true}'
  # bad lines: each gets one error event and the server carries on
  echo '{"id":6,"op":"complete","prompt":'            # bad_json (id null: the line is not JSON)
  echo '{"id":7,"op":"translate"}'                    # unknown_op
  echo '{"id":8,"op":"complete","prompt":"x","max_tokens":"ten"}'   # invalid_request
  printf '{"id":9,"op":"complete","prompt":"caf\xe9"}\n'            # invalid_utf8 (Latin-1 byte)
  echo ''                                             # blank lines are skipped, no event
  echo '{"id":10,"op":"complete","prompt":"The end","temperature":0,"max_tokens":4}'
} | "$bin" serve --jsonl "$@"
