#!/usr/bin/env bash
# pd.fetch_path: by default (auto) a compute rank copies fetched blocks from its holder's shared
# segment; `mpi` sends them as messages; a node whose shared-memory directory lacks room falls
# back to messages and says so. All three train the same bits (params_crc32c).
# Usage: check_fetch_paths.sh OUT_DIR -- launcher... pdtrain [args...]
set -u
out=$1
shift 2
fail=0
# Runs in a command substitution (a subshell): it returns the run's status, which the caller
# turns into `fail` (a variable set in the subshell would be lost).
run() {  # TAG [env...] -- prints the run's output; returns non-zero when the run failed
  local tag=$1 status=0
  shift
  env "$@" "${cmd[@]}" --set run.out_dir="$out/$tag" 2>&1 || status=$?
  [ $status -eq 0 ] || echo "FAIL: the $tag run exited with $status" >&2
  return $status
}
cmd=("$@")
auto=$(run auto) || fail=1
cmd=("$@" --set pd.fetch_path=mpi)
mpi=$(run mpi) || fail=1
cmd=("$@")
full=$(run full OMPI_MCA_osc_sm_backing_directory="$out/no-such-dir") || fail=1
crc() { grep -o 'params_crc32c=[0-9a-f]*' <<<"$1"; }
shared_mib() { grep -o '([0-9.]* through shared memory)' <<<"$1" | head -n 1 | tr -dc '0-9.'; }
[ -n "$(crc "$auto")" ] || { echo "FAIL: the auto run printed no params_crc32c"; fail=1; }
[ "$(crc "$auto")" = "$(crc "$mpi")" ] || { echo "FAIL: auto $(crc "$auto") != mpi $(crc "$mpi")"; fail=1; }
[ "$(crc "$auto")" = "$(crc "$full")" ] || { echo "FAIL: auto $(crc "$auto") != fallback $(crc "$full")"; fail=1; }
awk -v m="$(shared_mib "$auto")" 'BEGIN { exit !(m > 0) }' \
  || { echo "FAIL: auto copied nothing through shared memory ('$(shared_mib "$auto")')"; fail=1; }
[ "$(shared_mib "$mpi")" = "0.000" ] || { echo "FAIL: pd.fetch_path=mpi used shared memory"; fail=1; }
[ "$(shared_mib "$full")" = "0.000" ] || { echo "FAIL: the fallback used shared memory"; fail=1; }
grep -q "note: fetches go by MPI message: a node's $out/no-such-dir lacks [0-9]* MiB" <<<"$full" \
  || { echo "FAIL: the fallback did not say why"; fail=1; }
[ $fail -eq 0 ] && echo "PASS: shared memory ($(shared_mib "$auto") MiB/step), MPI messages and the fallback give $(crc "$auto")"
exit $fail
