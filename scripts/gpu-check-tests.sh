#!/usr/bin/env bash
# The ctest-free test driver of scripts/gpu-check.sh: runs GoogleTest executables one by one,
# directly or under mpirun, and prints a PASS/FAIL/SKIP line for each.
#
#   gpu-check-tests.sh [--np N] [--timeout S] TEST... [--np M] TEST...
#
# --np N runs the TESTs after it under `mpirun-local -np N` (--np 0: directly, the default);
# --timeout S (default 300) limits each TEST. A TEST is a name on PATH (the bundle puts
# build/tests and build/perf there) or a path. Exit status 77 from a TEST means SKIP (no GPU);
# 124/137 mean it timed out; with GPU_CHECK_REQUIRE_GPU=1, 77 is a failure too. The driver
# exits 1 if any TEST failed, 77 if every TEST was skipped, 0 otherwise. GTEST_FILTER and other GTEST_* variables pass through.
set -uo pipefail

np=0
per_test_timeout=300
results=()
failed=0 passed=0 skipped=0
export GTEST_COLOR=${GTEST_COLOR:-no}

run_one() {
  local t=$1 exe rc start secs status
  if [[ $t == */* ]]; then exe=$t; else exe=$(command -v "$t" || true); fi
  if [[ -z $exe || ! -x $exe ]]; then
    echo "gpu-check-tests: $t: no such executable (PATH=$PATH)"
    results+=("FAIL  $t (not found)"); failed=$((failed + 1)); return
  fi
  local cmd=("$exe")
  (( np > 0 )) && cmd=(mpirun-local -np "$np" "$exe")
  echo "----- gpu-check-tests: ${cmd[*]} (timeout ${per_test_timeout}s)"
  start=$(date +%s)
  timeout -k 15 "$per_test_timeout" "${cmd[@]}"
  rc=$?
  secs=$(( $(date +%s) - start ))
  case $rc in
    0) status=PASS; passed=$((passed + 1)) ;;
    77) if [[ ${GPU_CHECK_REQUIRE_GPU:-0} == 1 ]]; then
          status=FAIL; failed=$((failed + 1)); rc="77: skipped, but GPU_CHECK_REQUIRE_GPU=1"
        else
          status=SKIP; skipped=$((skipped + 1))
        fi ;;
    124|137) status=FAIL; failed=$((failed + 1)); rc="$rc, timed out after ${per_test_timeout}s" ;;
    *) status=FAIL; failed=$((failed + 1)) ;;
  esac
  echo "----- gpu-check-tests: $status $t (exit $rc, ${secs}s)"
  results+=("$(printf '%-5s %s%s (%ss)' "$status" "$t" "$( (( np > 0 )) && echo " -np $np")" "$secs")")
}

(( $# > 0 )) || { echo "usage: gpu-check-tests.sh [--np N] [--timeout S] TEST..." >&2; exit 2; }
while (( $# > 0 )); do
  case $1 in
    --np) np=$2; shift 2 ;;
    --timeout) per_test_timeout=$2; shift 2 ;;
    -*) echo "gpu-check-tests: unknown option $1" >&2; exit 2 ;;
    *) run_one "$1"; shift ;;
  esac
done

echo "gpu-check-tests: $passed passed, $failed failed, $skipped skipped"
printf '  %s\n' "${results[@]}"
(( failed > 0 )) && exit 1
(( passed == 0 && skipped > 0 )) && { echo "SKIP: every test exited 77 (no GPU)"; exit 77; }
exit 0
