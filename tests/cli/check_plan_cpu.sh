#!/usr/bin/env bash
# pdtrain plan against measured runs on this CPU machine: it first calibrates the machine
# (`pdtrain plan --calibrate`, as machines/cpu-local.toml was written, but now: the machine is
# shared, and the runs must be compared with the rates of the same minutes), then for each
# configuration below (holders, dp, tp, pp, micro-batches, staleness, cache size,
# recomputation, the baseline), trains a few steps and compares
#   - the median step time of steps 4..12 (metrics.csv's step_ms) with the predicted step time:
#     within 25 %. A row outside is trained up to twice more, each time once the machine is
#     quiet (a neighbour's burst can take a run's seconds on a shared VM, and has lasted two
#     runs), and fails if the last run is outside too. The times need the
#     machine to itself: if it stays busy (other processes using more than half a core) for a
#     minute before the runs, the times are printed but not asserted, and the test ends skipped
#     (status 77, never passed) once memory has been checked. PLAN_CPU_CHECK_TIME=0: never
#     assert the times; PLAN_CPU_IGNORE_LOAD=1: assert them on a busy machine too;
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
cores=$(nproc --all)
# Cores busy with other processes over the next second (/proc/stat's line for all online CPUs:
# all but idle and iowait, scaled by their count).
others_busy() {
  local a b online
  online=$(grep -c '^cpu[0-9]' /proc/stat)
  a=($(head -1 /proc/stat)); sleep 1; b=($(head -1 /proc/stat))
  awk -v c="$online" -v u=$((b[1] - a[1] + b[2] - a[2] + b[3] - a[3] + b[6] - a[6] + b[7] - a[7] + b[8] - a[8])) \
      -v i=$((b[4] - a[4] + b[5] - a[5])) 'BEGIN { printf "%.2f", (u + i > 0 ? c * u / (u + i) : 0) }'
}
check_time=1
[ "${PLAN_CPU_CHECK_TIME:-1}" = 0 ] && check_time=""
busy=""
if [ -n "$check_time" ] && [ -z "$dry" ] && [ -z "${PLAN_CPU_IGNORE_LOAD:-}" ]; then
  # The runs load the machine themselves, so this is read before them; the tests before this
  # one have ended, so what is busy now is someone else's.
  busy=1
  for _ in $(seq 60); do
    used=$(others_busy)
    awk -v u="$used" 'BEGIN { exit !(u <= 0.5) }' && { busy=""; break; }
  done
  if [ -n "$busy" ]; then
    echo "other processes kept $used of $cores cores busy for a minute: step times are printed, not checked"
    check_time=""
  fi
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
  grep -E "^(peak|memory_bandwidth|latency|bandwidth|wait_core_share)" "$machine"
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

# The median step time (ms) of steps 4..12 of the run in directory $1.
step_ms() { awk -F, 'NR > 4 { print $7 }' "$1/metrics.csv" | median; }
# The prediction's error (%) against the measurement: error_of MEASURED PREDICTED.
error_of() { awk -v m="$1" -v p="$2" 'BEGIN { printf "%+.1f", 100 * (p / m - 1) }'; }
# Whether an error (%) is outside +-bound: outside ERROR BOUND.
outside() { awk -v e="$1" -v b="$2" 'BEGIN { exit !(e > b || e < -b) }'; }
# Trains the row's configuration ($name's ranks and settings) into directory $1 (log: $1.log).
train() { "${mpi[@]}" -np "$ranks" "$pdtrain" "${base[@]}" "${extra[@]}" --set run.out_dir="$1" >"$1.log" 2>&1 </dev/null; }

fail=0
echo "load average at the start: $(cut -d' ' -f1 /proc/loadavg) on $cores cores"
printf "%-14s %5s %12s %12s %7s %14s %14s %7s\n" config ranks measured_ms predicted_ms error measured_mem predicted_mem error
for c in "${configs[@]}"; do
  IFS='|' read -r name ranks settings <<<"$c"
  # shellcheck disable=SC2206
  extra=($settings)
  dir=$out/$name
  [ -z "$dry" ] && { train "$dir" || { echo "FAIL: $name: training failed"; cat "$dir.log"; fail=1; continue; }; }
  "${mpi[@]}" -np "$ranks" "$pdtrain" "${base[@]}" "${extra[@]}" --set run.out_dir="$dir-dry" --dry-run >"$dir.dry" 2>&1 </dev/null
  "$pdtrain" plan --machine "$machine" --ranks "$ranks" "${base[@]}" "${extra[@]}" >"$dir.plan" 2>&1 </dev/null || {
    echo "FAIL: $name: plan failed"; cat "$dir.plan"; fail=1; continue; }
  measured_ms=nan
  run=$dir  # the run whose times are reported
  [ -z "$dry" ] && measured_ms=$(step_ms "$dir")
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
  t_err=$(error_of "$measured_ms" "$predicted_ms")
  # A shared machine has slow moments that last longer than one run (seen: two runs in a row
  # 55 % slower than the same binary a minute later): up to two more runs, each after the
  # machine has been quiet, before the step time counts as the model's error.
  for again in 1 2; do
    { [ -z "$dry" ] && [ -n "$check_time" ] && outside "$t_err" "$time_bound"; } || break
    echo "  $name: step time off by $t_err % (measured $measured_ms ms); training it again"
    for _ in $(seq 10); do awk -v u="$(others_busy)" 'BEGIN { exit !(u <= 0.5) }' && break; done
    if train "$dir-again$again"; then
      run=$dir-again$again
      measured_ms=$(step_ms "$run")
      t_err=$(error_of "$measured_ms" "$predicted_ms")
    else
      echo "FAIL: $name: training it again failed"; cat "$dir-again$again.log"; fail=1
      break
    fi
  done
  m_err=$(error_of "$measured_mem" "$predicted_mem")
  printf "%-14s %5s %12s %12s %6s%% %14s %14s %6s%%\n" "$name" "$ranks" "$measured_ms" "$predicted_ms" "$t_err" "$measured_mem" "$predicted_mem" "$m_err"
  # The run's own phase timers (medians over the same steps): where a step's time goes.
  [ -z "$dry" ] && printf "  %-12s fetch %s, compute %s, reduce %s, push %s ms\n" "phases:" \
    "$(awk -F, 'NR > 4 { print $8 }' "$run/metrics.csv" | median)" "$(awk -F, 'NR > 4 { print $9 }' "$run/metrics.csv" | median)" \
    "$(awk -F, 'NR > 4 { print $10 }' "$run/metrics.csv" | median)" "$(awk -F, 'NR > 4 { print $11 }' "$run/metrics.csv" | median)"
  bound=10
  [ -n "$dry" ] && bound=1
  [ -z "$dry" ] && [ -n "$check_time" ] && outside "$t_err" "$time_bound" && { echo "FAIL: $name: step time off by $t_err % (bound $time_bound %)"; fail=1; }
  outside "$m_err" "$bound" && { echo "FAIL: $name: peak memory off by $m_err % (bound $bound %)"; fail=1; }
done
uptime
[ "$fail" = 0 ] && [ -n "$busy" ] && [ -z "$dry" ] && { echo "SKIPPED: memory within bounds; step times not checked (busy machine)"; exit 77; }
exit $fail
