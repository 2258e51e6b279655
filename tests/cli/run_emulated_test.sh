#!/usr/bin/env bash
# Runs test NAME of the emulated CUDA build tree BUILD (scripts/build-cuda-emulated.sh, built by
# the emulated.build fixture) and passes only when it ran and passed: a skipped or missing test
# fails here, so an emulated GPU test can never count as passed without running.
# Usage: run_emulated_test.sh BUILD NAME
set -uo pipefail
build=$1 name=$2
out=$(ctest --test-dir "$build" -R "^${name}\$" --output-on-failure --no-tests=error 2>&1); rc=$?
echo "$out"
[ $rc -eq 0 ] || exit 1
echo "$out" | grep -q "100% tests passed, 0 tests failed out of 1" ||
  { echo "FAIL: $name did not run exactly once and pass"; exit 1; }
if echo "$out" | grep -qE "Skipped|Not Run"; then echo "FAIL: $name was skipped"; exit 1; fi
