#!/usr/bin/env bash
# pdtrain plan against measured runs on this CPU machine: it first calibrates the machine
# (`pdtrain plan --calibrate`, as machines/cpu-local.toml was written, but now: the machine is
# shared, and the runs must be compared with the rates of the same minutes), then for each
# configuration below (holders, dp, tp, pp, micro-batches,
# staleness, cache size, recomputation, the baseline), train a few steps and compare
#   - the median step time of steps 4..12 (metrics.csv's step_ms) with the predicted step time:
#     printed; with PLAN_CPU_CHECK_TIME=1 asserted within 25 % when the machine is idle at the
#     start (1-minute load average <= cores), else the test ends skipped (status 77, never
#     passed) once memory has been checked. Opt-in because the model holds within 25 % on the
#     idle machine but not with margin (optimistic by up to ~22 % where ranks synchronize; see
#     perf/RESULTS.md for the idle runs, their load and errors);
#   - the reporting rank's peak memory (the run's measured cache and gradient peaks plus its
#     activation buffers, which the dry run states) with the predicted bytes of that stage:
#     within 10 %.
# Usage: check_plan_cpu.sh [--dry] PDTRAIN MPIEXEC... ; prints one row per configuration (the
# table in perf/RESULTS.md) and fails if any row is outside its bound.
# --dry: no training and no times: the dry run's memory (params, grads, activations, replica)
# must be the plan's to within 1 % (the dry run prints one decimal): one model for both.
set -u
dry=""
[ "$1" = "--dry" ] && dry=1 && shift
pdtrain=$1
shift
mpi=("$@")
# The time comparison needs the machine to itself: with more runnable processes than cores, the
# neighbours' share of the CPU, not the model, decides the step time (and moves it from one
# minute to the next). Then the times are printed but not asserted, and the test ends skipped
# (status 77, never passed) once memory, which does not depend on the load, has been checked.
# The load is read before the runs: they load the machine themselves.
check_time=${PLAN_CPU_CHECK_TIME:-}
[ "$check_time" = 0 ] && check_time=""
cores=$(nproc)
load=$(cut -d' ' -f1 /proc/loadavg)
busy=""
# PLAN_CPU_IGNORE_LOAD=1 asserts the times anyway (to record what a busy machine gives).
if [ -n "$check_time" ] && [ -z "${PLAN_CPU_IGNORE_LOAD:-}" ] && awk -v l="$load" -v c="$cores" 'BEGIN { exit !(l > c) }'; then
  echo "load average $load on $cores cores: the machine is busy; step times are printed, not checked"
  busy=1
  check_time=""
fi
time_bound=25
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
machine=$out/cpu-calibrated.toml
if [ -n "$dry" ]; then
  machine=$(dirname "$0")/../../machines/cpu-local.toml  # times are not compared
else
  "${mpi[@]}" -np 2 "$pdtrain" plan --calibrate "$machine" >"$out/calibrate.log" 2>&1 </dev/null || {
    echo "FAIL: calibration"; cat "$out/calibrate.log"; exit 1; }
  grep -E "^(peak|memory_bandwidth|latency|bandwidth)" "$machine"
fi
base=(--set model.n_layer=4 --set model.n_head=4 --set model.d_model=256 --set model.vocab_size=256
      --set model.seq_len=64 --set train.batch_size=16 --set run.steps=12 --set train.eval_every=0
      --set train.eval_batches=1 --set checkpoint.every=0)
# name | ranks | settings
configs=(
  "pd-dp1|2|"
  "pd-dp2|3|"
  "pd-2holders|4|--set parallel.holders=2"
  "pd-tp2|3|--set parallel.tp=2"
  "pd-pp2-m4|3|--set parallel.pp=2 --set parallel.micro_batches=4"
  "pd-dp2-m2|3|--set parallel.micro_batches=2"
  "pd-stale1|3|--set pd.staleness=1 --set pd.staleness_warmup=0"
  "pd-cache-m2|2|--set pd.cache_mb=6 --set parallel.micro_batches=2"
  "pd-recompute|2|--set train.recompute=\"full\""
  "baseline-dp2|2|--set parallel.holders=0"
  "pd-tp2-pp2|5|--set parallel.tp=2 --set parallel.pp=2 --set parallel.micro_batches=2"
)

# "12.3 MiB" -> bytes
to_bytes() { awk -v v="$1" -v u="$2" 'BEGIN { m = u == "KiB" ? 1024 : u == "MiB" ? 1048576 : u == "GiB" ? 1073741824 : 1; printf "%.0f", v * m }'; }
# median of stdin
median() { sort -g | awk '{ a[NR] = $1 } END { if (NR == 0) print "nan"; else print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'; }

fail=0
echo "load average at the start: $load on $cores cores"
printf "%-14s %5s %12s %12s %7s %14s %14s %7s\n" config ranks measured_ms predicted_ms error measured_mem predicted_mem error
for c in "${configs[@]}"; do
  IFS='|' read -r name ranks settings <<<"$c"
  # shellcheck disable=SC2206
  extra=($settings)
  dir=$out/$name
  [ -z "$dry" ] && { "${mpi[@]}" -np "$ranks" "$pdtrain" "${base[@]}" "${extra[@]}" --set run.out_dir="$dir" >"$dir.log" 2>&1 </dev/null || {
    echo "FAIL: $name: training failed"; cat "$dir.log"; fail=1; continue; }; }
  "${mpi[@]}" -np "$ranks" "$pdtrain" "${base[@]}" "${extra[@]}" --set run.out_dir="$dir-dry" --dry-run >"$dir.dry" 2>&1 </dev/null
  "$pdtrain" plan --machine "$machine" --ranks "$ranks" "${base[@]}" "${extra[@]}" >"$dir.plan" 2>&1 </dev/null || {
    echo "FAIL: $name: plan failed"; cat "$dir.plan"; fail=1; continue; }
  measured_ms=nan
  [ -z "$dry" ] && measured_ms=$(awk -F, 'NR > 4 { print $7 }' "$dir/metrics.csv" | median)
  predicted_ms=$(sed -n 's/^predicted: step_s=\([^ ]*\).*/\1/p' "$dir.plan" | awk '{ printf "%.3f", $1 * 1000 }')
  # The reporter: the last stage's tp rank 0 of replica 0 (what prints the cache and grads lines).
  stages=$(grep -o 'stage[0-9]*_bytes=[0-9]*' "$dir.plan" | wc -l)
  predicted_mem=$(grep -o "stage$((stages - 1))_bytes=[0-9]*" "$dir.plan" | cut -d= -f2)
  holders=$(sed -n 's/.* = \([0-9]*\) holder(s) .*/\1/p' "$dir.dry" | head -1)
  acts_line=$(grep -E "^  rank [0-9]+: compute" "$dir.dry" | awk -v want="$((stages - 1))" '$0 ~ "pp "want || want == 0' | head -1)
  read -r av au <<<"$(sed -n 's/.*activations \([0-9.]*\) \([KMG]*i*B\).*/\1 \2/p' <<<"$acts_line")"
  rv=0 ru=B
  if [ "$holders" != "0" ] && [ -z "$dry" ]; then
    read -r pv pu <<<"$(sed -n 's/^cache: .*| peak \([0-9.]*\) \([KMG]*i*B\) .*/\1 \2/p' "$dir.log")"
    read -r gv gu <<<"$(sed -n 's/^grads: .*| peak \([0-9.]*\) \([KMG]*i*B\) held.*/\1 \2/p' "$dir.log")"
    measured_mem=$(( $(to_bytes "$pv" "$pu") + $(to_bytes "$gv" "$gu") + $(to_bytes "$av" "$au") ))
  else  # the baseline (and --dry): the dry run's figures; the baseline also holds its replica
    read -r pv pu <<<"$(sed -n 's/.*memory: params \([0-9.]*\) \([KMG]*i*B\).*/\1 \2/p' <<<"$acts_line")"
    read -r gv gu <<<"$(sed -n 's/.*grads \([0-9.]*\) \([KMG]*i*B\).*/\1 \2/p' <<<"$acts_line")"
    [ "$holders" = "0" ] && read -r rv ru <<<"$(sed -n 's/.*replica (params, AdamW, grads) \([0-9.]*\) \([KMG]*i*B\).*/\1 \2/p' <<<"$acts_line")"
    measured_mem=$(( $(to_bytes "$pv" "$pu") + $(to_bytes "$gv" "$gu") + $(to_bytes "$av" "$au") + $(to_bytes "$rv" "$ru") ))
  fi
  t_err=$(awk -v m="$measured_ms" -v p="$predicted_ms" 'BEGIN { printf "%+.1f", 100 * (p / m - 1) }')
  m_err=$(awk -v m="$measured_mem" -v p="$predicted_mem" 'BEGIN { printf "%+.1f", 100 * (p / m - 1) }')
  printf "%-14s %5s %12s %12s %6s%% %14s %14s %6s%%\n" "$name" "$ranks" "$measured_ms" "$predicted_ms" "$t_err" "$measured_mem" "$predicted_mem" "$m_err"
  # The run's own phase timers (medians over the same steps): where a step's time goes.
  [ -z "$dry" ] && printf "  %-12s fetch %s, compute %s, reduce %s, push %s ms\n" "phases:" \
    "$(awk -F, 'NR > 4 { print $8 }' "$dir/metrics.csv" | median)" "$(awk -F, 'NR > 4 { print $9 }' "$dir/metrics.csv" | median)" \
    "$(awk -F, 'NR > 4 { print $10 }' "$dir/metrics.csv" | median)" "$(awk -F, 'NR > 4 { print $11 }' "$dir/metrics.csv" | median)"
  bound=10
  [ -n "$dry" ] && bound=1
  [ -z "$dry" ] && [ -n "$check_time" ] && awk -v e="$t_err" -v b="$time_bound" 'BEGIN { exit !(e > b || e < -b) }' && { echo "FAIL: $name: step time off by $t_err % (bound $time_bound %)"; fail=1; }
  awk -v e="$m_err" -v b="$bound" 'BEGIN { exit !(e > b || e < -b) }' && { echo "FAIL: $name: peak memory off by $m_err % (bound $bound %)"; fail=1; }
done
uptime
[ "$fail" = 0 ] && [ -n "$busy" ] && [ -z "$dry" ] && { echo "SKIPPED: memory within bounds; step times not checked (busy machine)"; exit 77; }
exit $fail
