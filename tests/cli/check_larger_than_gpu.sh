#!/usr/bin/env bash
# A model larger than the GPU, on the emulated one (docs/cuda-emulation.md): the GPU is given
# PDTRAIN_CUDA_EMU_MEMORY = LIMIT_MIB, less than the deck's model needs for its parameters,
# gradients and AdamW state (16 bytes a parameter), and
#  (a) PD with a CPU holder and a bounded pd.cache_mb trains the deck's steps on it with the
#      same losses and final params_crc32c, bit for bit, as on an unlimited emulated GPU, its
#      device peak under the limit; and its losses follow the CPU's within 1e-4 relative;
#  (b) the replicated baseline (parallel.holders = 0) on the same GPU stops at once (non-zero,
#      within seconds) with the out-of-memory error naming the rank, the GPU, what it was
#      allocating and the bytes against what the GPU has;
#      on an unlimited GPU it trains, with PD's losses and checksum, bit for bit;
#  (c) `pdtrain plan` predicts PD's device bytes for the deck within 10 % of the run's peak.
# Prints the device peaks (PD limited and unlimited; the baseline's is its unlimited run's).
# Usage: check_larger_than_gpu.sh PDTRAIN OUT_DIR   (an emulated CUDA build's pdtrain)
set -uo pipefail
pdtrain=$1 out=$2
src=$(cd "$(dirname "$0")/../.." && pwd)
deck=$src/tests/cli/decks/larger_than_gpu.toml
mpirun=$src/scripts/mpirun-local
limit_mib=48
fail() { echo "FAIL: $*"; exit 1; }
mkdir -p "$out"

# run NAME NP LIMIT [--set ...]: trains the deck into $out/NAME, log in $out/NAME.log, status
# and seconds in $rc and $secs. LIMIT "" leaves the emulation's default (8 GiB).
run() {
  local name=$1 np=$2 limit=$3
  shift 3
  rm -rf "${out:?}/$name"
  local t0=$SECONDS
  if [ -n "$limit" ]; then
    PDTRAIN_CUDA_EMU_MEMORY=$limit timeout 600 "$mpirun" -np "$np" "$pdtrain" "$deck" \
      --set run.out_dir="$out/$name" "$@" >"$out/$name.log" 2>&1
  else
    timeout 600 "$mpirun" -np "$np" "$pdtrain" "$deck" --set run.out_dir="$out/$name" "$@" \
      >"$out/$name.log" 2>&1
  fi
  rc=$? secs=$((SECONDS - t0))
}
losses() { awk -F, 'NR > 1 {print $1, $2}' "$out/$1/metrics.csv"; }
final() { grep -oE "final step=[0-9]+ loss=[^ ]+ params_crc32c=[0-9a-f]+" "$out/$1.log"; }
# The reporting rank's device peak in bytes, from its summary ("peak 41.3 MiB allocated").
peak_bytes() {
  grep -oE "peak [0-9.]+ (B|KiB|MiB|GiB) allocated by this rank" "$out/$1.log" | awk '
    {m = ($3 == "GiB") ? 1073741824 : ($3 == "MiB") ? 1048576 : ($3 == "KiB") ? 1024 : 1
     printf "%.0f\n", $2 * m}'
}
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

# The premise: the model's parameters, gradients and AdamW state exceed the limit. The run
# header counts the parameters.
run pd-unlimited 2 ""
[ $rc -eq 0 ] || { cat "$out/pd-unlimited.log"; fail "PD on an unlimited emulated GPU exited with $rc"; }
params=$(grep -oE "[0-9]+ parameters" "$out/pd-unlimited.log" | head -1 | awk '{print $1}')
[ -n "$params" ] || { cat "$out/pd-unlimited.log"; fail "the run header counts no parameters"; }
state=$((16 * params))
[ "$state" -gt $((limit_mib * 1048576)) ] ||
  fail "the deck's $params parameters need only $(mib $state) for values, gradients and AdamW state: not more than the ${limit_mib} MiB GPU"
echo "model: $params parameters, $(mib $state) of parameters + gradients + AdamW state; emulated GPU: ${limit_mib} MiB"

# (a) PD under the limit: the unlimited run's numbers, bit for bit.
run pd-limited 2 "${limit_mib}M"
[ $rc -eq 0 ] || { cat "$out/pd-limited.log"; fail "PD on the ${limit_mib} MiB GPU exited with $rc"; }
[ "$(losses pd-limited)" = "$(losses pd-unlimited)" ] ||
  { paste <(losses pd-limited) <(losses pd-unlimited); fail "PD's losses differ on the limited GPU"; }
[ "$(final pd-limited)" = "$(final pd-unlimited)" ] ||
  fail "final lines differ: '$(final pd-limited)' against '$(final pd-unlimited)'"
[ "$(losses pd-limited | wc -l)" -ge 3 ] || fail "PD trained fewer than 3 steps"
pd_peak=$(peak_bytes pd-limited) pd_peak_free=$(peak_bytes pd-unlimited)
[ -n "$pd_peak" ] || fail "PD's summary gives no device peak"
[ "$pd_peak" -le $((limit_mib * 1048576)) ] || fail "PD's device peak $(mib "$pd_peak") passes the limit"
echo "PD (1 holder, pd.cache_mb 4): $(final pd-limited); device peak $(mib "$pd_peak") (unlimited GPU: $(mib "$pd_peak_free"))"

# ... and the CPU's losses within 1e-4 relative (test_gpu_training's fp32 tolerance).
run pd-cpu 2 "" --set compute.device=cpu
[ $rc -eq 0 ] || { cat "$out/pd-cpu.log"; fail "PD on the CPU exited with $rc"; }
paste -d' ' <(losses pd-limited) <(losses pd-cpu) | awk '
  {d = $2 - $4; if (d < 0) d = -d; if (d > 1e-4 * $4) {bad = 1; print "step " $1 ": GPU " $2 ", CPU " $4}}
  END {exit bad}' || fail "PD on the GPU strays from the CPU by more than 1e-4 relative"

# (b) The baseline on the same GPU: out of memory at once, the rank and the bytes named.
run base-limited 1 "${limit_mib}M" --set parallel.holders=0
cat "$out/base-limited.log"
[ $rc -ne 0 ] || fail "the baseline trained on the ${limit_mib} MiB GPU (exit 0)"
[ $rc -ne 124 ] && [ "$secs" -le 60 ] || fail "the baseline took ${secs}s (status $rc) to stop"
msg=$(grep -E "pdtrain: error \(rank 0\): out of GPU memory on cuda:0 " "$out/base-limited.log") ||
  fail "no out-of-memory error naming rank 0 and its GPU"
echo "$msg" | grep -qE "allocating .+ needs [0-9]+ bytes \([0-9.]+ MiB\) but the GPU has [0-9]+ bytes \([0-9.]+ MiB\) free of $((limit_mib * 1048576)) " ||
  fail "the error does not give the bytes needed against the GPU's free and total"
echo "$msg" | grep -qE "Hint: with parameter holders \(parallel.holders >= 1\) and pd.cache_mb set" ||
  fail "the error gives no hint"
echo "baseline on ${limit_mib} MiB: exit $rc after ${secs}s"
run base-unlimited 1 "" --set parallel.holders=0
[ $rc -eq 0 ] || { cat "$out/base-unlimited.log"; fail "the baseline on an unlimited GPU exited with $rc"; }
base_peak=$(peak_bytes base-unlimited)
echo "baseline (holders 0): $(final base-unlimited); device peak $(mib "$base_peak") on an unlimited GPU"
[ "$base_peak" -gt $((limit_mib * 1048576)) ] || fail "the baseline's peak $(mib "$base_peak") fits the limit"
# The baseline computes what PD computes (as on the CPU, where both end at the same checksum).
[ "$(losses base-unlimited)" = "$(losses pd-unlimited)" ] && [ "$(final base-unlimited)" = "$(final pd-unlimited)" ] ||
  fail "the baseline's losses or checksum differ from PD's"

# (d) PD with a batch whose activations do not fit: the error names the activations, their
#     bytes and what needs less.
run pd-big-batch 2 "${limit_mib}M" --set train.batch_size=64
[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ "$secs" -le 60 ] ||
  { cat "$out/pd-big-batch.log"; fail "PD with batch 64 on the ${limit_mib} MiB GPU: status $rc after ${secs}s"; }
grep -qE "out of GPU memory on cuda:0 .*allocating the stage's activations and backward scratch \([0-9]+ bytes in all: 1 micro-batch slot\(s\) of 64 x 16 tokens, 8 layer\(s\) and the classifier; train.recompute or a smaller micro-batch needs less\)" "$out/pd-big-batch.log" ||
  { cat "$out/pd-big-batch.log"; fail "the out-of-memory error does not name the stage's activations"; }
echo "PD with batch 64 on ${limit_mib} MiB: exit $rc after ${secs}s, the activations named"

# (c) The plan's device bytes for PD's run (stage 0, the only one) against the run's peak.
plan=$("$pdtrain" plan "$deck" --machine h200 --ranks 2 2>&1) || { echo "$plan"; fail "pdtrain plan failed"; }
predicted=$(echo "$plan" | grep -oE "stage0_bytes=[0-9]+" | cut -d= -f2)
[ -n "$predicted" ] || { echo "$plan"; fail "the plan printed no stage0_bytes"; }
echo "plan: PD's device $(mib "$predicted") against the run's $(mib "$pd_peak")"
awk -v p="$predicted" -v r="$pd_peak" 'BEGIN {d = p - r; if (d < 0) d = -d; exit !(d <= 0.10 * r)}' ||
  fail "the plan's $(mib "$predicted") is not within 10 % of the run's $(mib "$pd_peak")"
echo "PASS"
