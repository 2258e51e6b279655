#!/usr/bin/env bash
# The NCCL watchdog (parallel.nccl_timeout_s) ends a job whose peer is alive but stalled, which
# real NCCL would wait on forever. The command (a NCCL run on two emulated GPUs, holders 0, with
# PDTRAIN_TEST_STALL=1:dp_reduce:STALL_STEP and the emulated NCCL's own timeout far past
# LIMIT_S, so that only the watchdog can end it) must:
#  - end with status 1, rank 0 naming the group, its rank and the watchdog ("NCCL dp group
#    (rank 0 of 2): no progress for ... (parallel.nccl_timeout_s = LIMIT_S s) waiting on its
#    peers for ..."), not the emulation's timeout;
#  - end between LIMIT_S and LIMIT_S + 30 s after rank 1 stalls (by the output's arrival times:
#    the emulation polls slowly under the sanitizers);
#  - keep what it wrote before: metrics.csv in OUT_DIR has the rows of steps 1 .. STALL_STEP-1.
# Prints the seconds from the stall to the error.
# Usage: check_nccl_watchdog.sh OUT_DIR LIMIT_S STALL_STEP -- command...
set -uo pipefail
out=$1 limit=$2 stall_step=$3
shift 4
fail() { echo "FAIL: $*"; echo "--- output (with the time each line arrived):"; cat "$log"; exit 1; }
rm -rf "${out:?}"
mkdir -p "$out"
log=$out.log

# Every line of output with the time it arrived (seconds since the epoch).
timeout --kill-after=5 600 "$@" 2>&1 |
  while IFS= read -r line; do printf '%s %s\n' "$EPOCHREALTIME" "$line"; done >"$log"
status=${PIPESTATUS[0]}

[ "$status" -eq 1 ] || fail "exit status $status, expected 1"
pattern='error \(rank 0\): NCCL dp group \(rank 0 of 2\): no progress for [0-9.]+ s \(parallel\.nccl_timeout_s = '"$limit"' s\) waiting on its peers for .*a stalled peer\? its communicator was aborted; raise parallel\.nccl_timeout_s'
error_line=$(grep -E -m1 "$pattern" "$log") || fail "no watchdog error from rank 0 naming the dp group"
grep -q "PDTRAIN_CUDA_EMU_NCCL_TIMEOUT" "$log" && fail "the emulated NCCL's timeout fired, not the watchdog"
stall_line=$(grep -m1 "test hook: rank 1 stalls at dp_reduce" "$log") || fail "rank 1 never stalled"
stalled_at=${stall_line%% *} ended_at=${error_line%% *}
took=$(awk -v a="$stalled_at" -v b="$ended_at" 'BEGIN { printf "%.1f", b - a }')
echo "watchdog: the job ended ${took} s after rank 1 stalled (limit ${limit} s)"
awk -v t="$took" -v l="$limit" 'BEGIN { exit !(t >= l - 1 && t <= l + 30) }' ||
  fail "the job ended ${took} s after the stall; expected ${limit} .. ${limit} + 30 s"

metrics=$out/metrics.csv
[ -f "$metrics" ] || fail "no $metrics"
steps=$(tail -n +2 "$metrics" | cut -d, -f1 | tr '\n' ' ')
want=$(seq -s ' ' 1 $((stall_step - 1)))
[ "$steps" = "$want " ] || fail "metrics.csv has steps '$steps', expected '$want ' (the steps before the stall)"
echo "PASS: status 1, the dp group and rank 0 named, metrics.csv keeps steps $want"
