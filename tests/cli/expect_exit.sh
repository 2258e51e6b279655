#!/usr/bin/env bash
# Runs a command and checks its exit status, how long it took, and that its output contains a
# pattern. Usage: expect_exit.sh STATUS MAX_SECONDS PATTERN -- command...
# Used for error paths: a bad deck or layout must end the whole MPI job quickly with the right
# status and a message that names the cause.
set -u
want=$1 max=$2 pattern=$3
shift 4
out=$(mktemp)
start=$(date +%s)
timeout --kill-after=5 "$((max + 10))" "$@" >"$out" 2>&1
got=$?
elapsed=$(( $(date +%s) - start ))
fail=0
if [ "$got" -ne "$want" ]; then echo "FAIL: exit status $got, expected $want"; fail=1; fi
if [ "$elapsed" -gt "$max" ]; then echo "FAIL: took ${elapsed}s, limit ${max}s"; fail=1; fi
if ! grep -qE -- "$pattern" "$out"; then echo "FAIL: output lacks /$pattern/"; fail=1; fi
if [ "$fail" -ne 0 ]; then echo "--- output of: $*"; cat "$out"; fi
rm -f "$out"
exit $fail
