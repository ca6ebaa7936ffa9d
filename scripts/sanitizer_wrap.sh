#!/usr/bin/env bash
# meson test --wrapper for the ASan+UBSan build: Criterion reports a test as passed before
# LeakSanitizer (or a UBSan report in a forked worker) prints anything, so the reports
# never reach the exit status. This runs the test, keeps its output, and fails it when a
# sanitizer spoke.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
"$@" 2> >(tee "$log" >&2)
rc=$?
wait
if grep -qE "ERROR: (LeakSanitizer|AddressSanitizer)|runtime error:" "$log"; then
  echo "sanitizer_wrap: a sanitizer reported a problem in $1 (see above)" >&2
  [ $rc -eq 0 ] && rc=1
fi
exit $rc
