#!/usr/bin/env bash
# Runs a benchmark's self-check and prints "FAIL: ..." when it exits non-zero: ctest ignores the
# exit status of a test that has PASS_REGULAR_EXPRESSION, so the status must show in its output
# (every perf.*_short test has FAIL_REGULAR_EXPRESSION "FAIL"). Exit status 77 (skipped: no GPU,
# no PyTorch) passes through as the skip it is.
# Usage: status_or_fail.sh COMMAND [ARGS...]
"$@"
status=$?
if [ "$status" -ne 0 ] && [ "$status" -ne 77 ]; then
  echo "FAIL: $(basename "$1") exited with status $status"
fi
exit "$status"
