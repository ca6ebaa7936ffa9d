#!/usr/bin/env bash
# Fails when a tracked .c / .h file differs from what clang-format (the repository's
# .clang-format) would write; generated tables are left out. `clang-format -i FILE` fixes one.
# Usage: scripts/check_format.sh [files...]   (default: every tracked .c / .h file)
set -euo pipefail
cd "$(dirname "$0")/.."
# written by scripts/gen_unicode.py
GENERATED=(runtime/tokenizer/unicode_data.c)
CF=${CLANG_FORMAT:-}
if [ -z "$CF" ]; then
  for c in clang-format clang-format-14 clang-format-15 clang-format-16 clang-format-17 clang-format-18; do
    if command -v "$c" >/dev/null; then CF=$c; break; fi
  done
fi
if [ -z "$CF" ]; then
  echo "check_format: clang-format not found (apt-get install clang-format)" >&2
  exit 1
fi
if [ $# -gt 0 ]; then files=("$@"); else
  mapfile -t files < <(git ls-files '*.c' '*.h' | grep -v -x -F -f <(printf '%s\n' "${GENERATED[@]}"))
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! printf '%s\0' "${files[@]}" | xargs -0 -n 50 "$CF" --style=file --dry-run --Werror 2>"$log"; then
  grep -E '^[^ ].*: (error|warning):' "$log" | sed 's/: error: .*//; s/: warning: .*//' | cut -d: -f1 | sort | uniq -c |
    awk '{print "check_format: " $2 " (" $1 " place(s))"}' >&2
  n=$(grep -cE ': (error|warning):' "$log" || true)
  echo "check_format: $n place(s) differ from .clang-format ($("$CF" --version | head -1)); run clang-format -i on the files above" >&2
  exit 1
fi
echo "check_format: ok (${#files[@]} files)"
