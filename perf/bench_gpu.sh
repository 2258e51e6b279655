#!/usr/bin/env bash
# GPT-2 training on one GPU: the replicated GPU baseline against PD with CPU holders (issue 13,
# "Benchmarks"; perf/RESULTS.md, "GPU: GPT-2 124M on one H200").
#
#   perf/bench_gpu.sh [--short] [--cpu] [--budget S] [--steps N] [--fetch-thread]
#                     [--set KEY=VALUE]... [--results FILE] [--pytorch FILE] [BUILD_DIR]
#   perf/bench_gpu.sh --compare RESULTS_FILE PYTORCH_FILE
#
# Configurations, each on one compute rank (the GPU) at micro-batch 16 x 1024 tokens in bf16,
# 32 micro-batches accumulated per optimizer step (524,288 tokens, as llm.c), decks
# perf/decks/gpt2_124m_gpu.toml and gpt2_350m_gpu.toml, in this order (the most important
# first; later ones are skipped when --budget would be exceeded):
#   124m a      parallel.holders = 0: the GPU baseline (AdamW on the GPU), 1 rank
#   124m b4s0   PD: 4 CPU holder ranks + the GPU compute rank, pd.staleness = 0
#   124m b4s1   the same with pd.staleness = 1
#   350m a, 350m b4s0                      GPT-2 350M (24 layers, 16 heads, d 1024)
#   124m b8s0   8 holder ranks
#   124m b4s0c  4 holders, pd.cache_mb bounded to 2 x the least pdtrain accepts (the memory
#               side: every micro-batch fetches the layers again; bf16 keeps a bf16 copy beside
#               the fp32 values, 1.5 x the bytes the least counts)
#   350m b4s1
# Each runs `--stop-after N` (5 steps for 124m, 4 for 350m: no evaluation pass inside them);
# step 1 warms up and the mean step time of steps 2..N gives tokens/s. For each:
#   tokens/s; MFU against 989e12 FLOP/s (H200 dense bf16) and against the bf16 cuBLASLt GEMM
#   ceiling at the model's shapes measured in this run (perf/bench_gemm_cuda, its step-weighted
#   `ceiling: bf16_tflops`); peak device memory (nvidia-smi memory.used sampled every 100 ms,
#   less the figure before the run: the whole process, CUDA context and workspaces included);
#   pdtrain's own device allocator peak (its summary's `device: ... | peak X allocated`, all
#   device buffers: parameters, gradients, optimizer, activations, workspaces); parameters +
#   gradients + optimizer state on the device (pgo): for (a) pdtrain's allocation plan for the
#   compute rank (its --dry-run line, printed as `plan`: the stage's params (x1.5 in bf16: a
#   bf16 copy beside fp32) + grads + the replica's params, AdamW m and v and reduced grads),
#   for PD the parameter cache's measured peak (its `cache:` line) + the plan's grads.
# FLOPs per token: 6 N + 6 L T C (N every parameter, embeddings at the padded vocabulary, the
# tied head counted once; L layers, T sequence, C d_model): llm.c's gpt2_estimate_mfu
# convention; its attention term is half of the 12 L T C that counts a full T x T score matrix
# (nanoGPT/PaLM), i.e. it counts causal attention's half. perf/pytorch_gpt2.py uses the same.
# Recomputation (train.recompute = attention) is not counted as useful work.
#
# Prints, per configuration, a `config` line (step breakdown and pdtrain's summary), the PD
# cache and holder lines, and one greppable line:
#   ratio model=124m config=a holders=0 staleness=0 steps=4 step_ms=.. tokens_per_s=..
#     mfu_989=.. mfu_ceiling=.. peak_mem_mib=.. device_alloc_mib=.. pgo_mib=..
#     (target mfu_989 >= 0.40: met|not met)
#   ratio model=124m config=b4s0 ... time_per_token_vs_a=.. (target <= 1.10: met|not met)
#     pgo_vs_a=.. (target <= 0.25: met|not met)
# then a `targets:` summary and `bench_gpu: ok`. A configuration that fails prints FAIL (the
# rest still run); one cut by its timeout reports the steps it finished, marked TIMEOUT; one
# skipped for the budget says so. Values that cannot be measured print n/a.
#
# --short: a tiny model (2 layers, d 128, vocab 512, seq 64, 2 micro-batches of 4 x 64) and 3
#   steps, with 2 holders; --cpu runs it with compute.device = cpu (no GEMM ceiling, no device
#   memory: n/a), which is the ctest perf.bench_gpu_short (tests the script's plumbing here).
# --budget S: start no configuration that is not expected to end within S seconds of the
#   script's start (estimated from the runs so far; default 270, --short 120; 0: no limit).
# --steps N: N steps per run (the first warms up) instead of 5 (124m), 4 (350m), 3 (--short).
# --fetch-thread: pd.fetch_thread = true in the PD configurations (spare cores: 16 here).
# --set KEY=VALUE: a deck override for every run (e.g. --set train.recompute=none), after the
#   bench's own.
# --results FILE: also append the ratio and ceiling lines to FILE.
# --pytorch FILE: when FILE (perf/pytorch_gpt2.py --results) exists, compare at the end.
# --compare: only the comparison of a results file with perf/pytorch_gpt2.py's: (a) against
#   PyTorch eager and torch.compile tokens/s (target: (a) >= eager); exit 77 if either is
#   missing (a skipped or failed benchmark).
# BUILD_DIR: default build-cuda when it has pdtrain, else build (--cpu: build).
# Each pdtrain run has a timeout (150 s for 124m, 240 s for 350m, 90 s --short, at most the
# budget left + 60 s; BENCH_GPU_RUN_TIMEOUT=S sets it); the steps it finished still count.
# On the GPU a run that has used no GPU memory (nvidia-smi: < 64 MiB more than before it)
# after 30 s (15 s --short; BENCH_GPU_GRACE=S), or by its end, is a failure and the rest are
# skipped (the training loop is not on the GPU); a pdtrain whose --version names no cuda
# backend is refused at the start.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PEAK_FLOPS=989e12

# ------------------------------------------------------------------------------- compare --
compare() {  # RESULTS_FILE PYTORCH_FILE
  local res=$1 pt=$2
  [[ -s $res ]] || { echo "bench_gpu compare: SKIP: no pdtrain results in $res (perf/bench_gpu.sh did not run or failed)"; return 77; }
  [[ -s $pt ]] || { echo "bench_gpu compare: SKIP: no PyTorch results in $pt (perf/pytorch_gpt2.py did not run: no torch?)"; return 77; }
  local n=0 model line a_tps a_mfu a_mem eager comp
  field() { sed -nE "s/.* $1=([0-9.]+|n\/a).*/\1/p" <<< "$2"; }
  for model in $(grep -oE '^ratio model=[^ ]+ config=a ' "$res" | sed -E 's/^ratio model=([^ ]+) .*/\1/' | sort -u); do
    line=$(grep -E "^ratio model=$model config=a " "$res" | tail -1)
    a_tps=$(field tokens_per_s "$line"); a_mfu=$(field mfu_989 "$line"); a_mem=$(field peak_mem_mib "$line")
    [[ -n $a_tps ]] || continue
    eager=$(grep -E "^pytorch model=$model mode=eager " "$pt" | tail -1)
    comp=$(grep -E "^pytorch model=$model mode=compile " "$pt" | tail -1)
    awk -v m="$model" -v a="$a_tps" -v am="${a_mfu:-n/a}" -v amem="${a_mem:-n/a}" \
        -v e="$(field tokens_per_s "$eager")" -v em="$(field mfu_989 "$eager")" -v emem="$(field peak_reserved_mib "$eager")" \
        -v c="$(field tokens_per_s "$comp")" -v cm="$(field mfu_989 "$comp")" -v cmem="$(field peak_reserved_mib "$comp")" 'BEGIN {
      printf "compare model=%s pdtrain_a: %.0f tok/s, MFU %s, peak %s MiB", m, a, am, amem
      if (e != "") printf " | pytorch eager: %.0f tok/s, MFU %s, peak reserved %s MiB; a/eager=%.3f (target >= 1.00: %s)", e, em, emem, a / e, (a >= e ? "met" : "not met")
      else printf " | pytorch eager: n/a"
      if (c != "") printf " | torch.compile: %.0f tok/s, MFU %s, peak reserved %s MiB; a/compile=%.3f", c, cm, cmem, a / c
      else printf " | torch.compile: n/a"
      printf "\n" }'
    n=$((n + 1))
  done
  (( n > 0 )) || { echo "bench_gpu compare: SKIP: no config=a line in $res"; return 77; }
  echo "bench_gpu compare: ok"
}

if [[ ${1:-} == --compare ]]; then
  [[ $# -eq 3 ]] || { echo "usage: perf/bench_gpu.sh --compare RESULTS_FILE PYTORCH_FILE" >&2; exit 2; }
  compare "$2" "$3"
  exit $?
fi

# ------------------------------------------------------------------------------ arguments --
short=0 cpu=0 budget="" fetch_thread=0 results="" pytorch="" build="" steps_override="" extra=()
while (( $# > 0 )); do
  case $1 in
    --short) short=1 ;;
    --cpu) cpu=1 ;;
    --budget) budget=$2; shift ;;
    --fetch-thread) fetch_thread=1 ;;
    --results) results=$2; shift ;;
    --pytorch) pytorch=$2; shift ;;
    --steps) steps_override=$2; shift ;;
    --set) extra+=(--set "$2"); shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench_gpu: unknown option $1" >&2; exit 2 ;;
    *) build=$1 ;;
  esac
  shift
done
if [[ -z $build ]]; then
  build=build
  if (( cpu == 0 )) && [[ -x build-cuda/pdtrain ]]; then build="build-cuda"; fi
fi
[[ -z $budget ]] && budget=$(( short ? 120 : 270 ))
[[ $budget =~ ^[0-9]+$ ]] || { echo "bench_gpu: --budget takes whole seconds" >&2; exit 2; }
bin=$build/pdtrain
gemm=$build/perf/bench_gemm_cuda
[[ -x $bin ]] || { echo "bench_gpu: FAIL: no $bin (build first)"; exit 1; }
[[ -n $results ]] && : > "$results"

out=$(mktemp -d "${TMPDIR:-/tmp}/bench_gpu.XXXXXX")
smi_pid=""
trap '[[ -n $smi_pid ]] && kill "$smi_pid" 2>/dev/null; rm -rf "$out"' EXIT
t_start=$(date +%s)
failures=0

say() {  # a result line: stdout, and the results file
  echo "$*"
  [[ -n $results ]] && echo "$*" >> "$results"
  return 0
}

# ------------------------------------------------------------------------------- the GPU --
have_smi=0
if (( cpu == 0 )); then
  if ! command -v nvidia-smi > /dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
    echo "bench_gpu: SKIP: no NVIDIA GPU (nvidia-smi -L finds none); --cpu checks the script on the CPU"
    exit 77
  fi
  have_smi=1
  echo "bench_gpu: GPU $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader -i 0)"
fi
version=$(scripts/mpirun-local -np 1 "$bin" --version 2>&1 < /dev/null)
backends=$(sed -n 's/^backends: //p' <<< "$version")
echo "bench_gpu: $bin ($(head -1 <<< "$version"); backends: ${backends:-?}); compute.device=$( ((cpu)) && echo cpu || echo cuda );" \
     "$(nproc) cores; budget ${budget}s; FLOPs/token = 6 N + 6 L T C (llm.c); peak $PEAK_FLOPS FLOP/s"
if (( cpu == 0 )) && [[ $backends != *cuda* ]]; then
  echo "bench_gpu: FAIL: $bin has no CUDA backend (backends: ${backends:-unknown}; build with -DPDTRAIN_CUDA=ON)"
  exit 1
fi

# The processes of one run: with setsid, its session (the run's pid is the session id).
setsid=""; command -v setsid > /dev/null 2>&1 && setsid=setsid
session_pids() { [[ -n $setsid ]] && ps -s "$1" -o pid= 2>/dev/null; return 0; }
end_session() {  # pid: SIGKILL whatever is left of the run's session
  local p
  for p in $(session_pids "$1"); do kill -KILL "$p" 2>/dev/null; done
  return 0
}
end_run() {  # pid: TERM the run (timeout and mpirun: mpirun ends its ranks), KILL it after 10 s
  if [[ -n $setsid ]]; then kill -TERM -- "-$1" 2>/dev/null; else kill -TERM "$1" 2>/dev/null; fi
  for _ in $(seq 10); do kill -0 "$1" 2>/dev/null || break; sleep 1; done
  end_session "$1"
  kill -KILL "$1" 2>/dev/null
  return 0
}

gpu_grace=${BENCH_GPU_GRACE:-$(( short ? 15 : 30 ))}  # seconds a run has to show GPU memory
used_mib() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 2>/dev/null | head -1 | tr -dc '0-9'; }

# --------------------------------------------------------------------------------- models --
# name -> deck, --set overrides, steps
declare -A DECK STEPS SETS CEIL
if (( short )); then
  tiny=(--set model.n_layer=2 --set model.d_model=128 --set model.n_head=4 --set model.vocab_size=512
        --set model.seq_len=64 --set train.batch_size=8 --set parallel.micro_batches=2)
  DECK[tiny]=perf/decks/gpt2_124m_gpu.toml;  SETS[tiny]="${tiny[*]}"; STEPS[tiny]=3
  DECK[tiny4]=perf/decks/gpt2_124m_gpu.toml; SETS[tiny4]="${tiny[*]} --set model.n_layer=4"; STEPS[tiny4]=3
  H=2
  # model label holders staleness cache(x least, 0 = none)
  configs=("tiny a 0 0 0" "tiny b${H}s0 $H 0 0" "tiny b${H}s1 $H 1 0" "tiny4 a 0 0 0" "tiny4 b${H}s0 $H 0 0"
           "tiny b${H}s0c $H 0 2")
else
  DECK[124m]=perf/decks/gpt2_124m_gpu.toml; SETS[124m]=""; STEPS[124m]=5
  DECK[350m]=perf/decks/gpt2_350m_gpu.toml; SETS[350m]=""; STEPS[350m]=4
  configs=("124m a 0 0 0" "124m b4s0 4 0 0" "124m b4s1 4 1 0" "350m a 0 0 0" "350m b4s0 4 0 0"
           "124m b8s0 8 0 0" "124m b4s0c 4 0 2" "350m b4s1 4 1 0")
fi
common=(--set run.steps=1000)  # the schedule's target; --stop-after ends each run
(( cpu )) && common+=(--set compute.device=cpu)
common+=("${extra[@]}")
if [[ -n $steps_override ]]; then
  [[ $steps_override =~ ^[0-9]+$ && $steps_override -ge 2 ]] || { echo "bench_gpu: --steps needs N >= 2" >&2; exit 2; }
  for m in "${!STEPS[@]}"; do STEPS[$m]=$steps_override; done
fi

# model_sets MODEL: the --set words of a model
model_sets() { local s=${SETS[$1]}; [[ -n $s ]] && echo "$s"; return 0; }

# The model's shape, from a dry run and the deck: SHAPE[model] = "N L C T batch micro_batch"
# (parameters, layers, d_model, sequence, sequences per step and per micro-batch).
declare -A SHAPE PLAN
# An awk function: human-readable bytes as pdtrain prints them ("474.8 MiB") to MiB.
MIB_AWK='function mib(x, u) { return sprintf("%.1f", x * (u == "B" ? 1 / 1048576 : u == "KiB" ? 1 / 1024 : u == "MiB" ? 1 : u == "GiB" ? 1024 : 1048576)) }'
ensure_shape() {
  local m=$1 txt n mb t k L C
  [[ -n ${SHAPE[$m]:-} ]] && return 0
  # shellcheck disable=SC2046
  txt=$(scripts/mpirun-local -np 1 "$bin" "${DECK[$m]}" $(model_sets "$m") "${common[@]}" \
        --set parallel.holders=0 --dry-run 2>&1 < /dev/null) ||
    { echo "$txt" | tail -5; echo "bench_gpu: FAIL: dry run of $m"; return 1; }
  n=$(sed -nE 's/^model: ([0-9]+) parameters.*/\1/p' <<< "$txt")
  read -r mb t k <<< "$(sed -nE 's/.*micro-batch ([0-9]+) x ([0-9]+) tokens, ([0-9]+) micro-batch.*/\1 \2 \3/p' <<< "$txt")"
  L=$(resolved "$m" model.n_layer); C=$(resolved "$m" model.d_model)
  [[ -n $n && -n $mb && -n $t && -n $k && -n $L && -n $C ]] ||
    { echo "bench_gpu: FAIL: cannot read the shape of $m from its dry run"; return 1; }
  SHAPE[$m]="$n $L $C $t $((mb * k)) $mb"
  # pdtrain's allocation plan for the baseline's compute rank (its dry-run line "memory: params
  # P, grads G, activations A (...) + replica (params, AdamW, grads) R"; older builds: "+ AdamW R"):
  # PLAN[model] = "P G A R" in MiB.
  local rank_line b='([0-9.]+) ([KMGT]?i?B)' p g a r
  rank_line=$(grep -m1 'compute 0 ' <<< "$txt")
  read -r p g a <<< "$(sed -nE "s/.*memory: params $b, grads $b, activations $b.*/\1 \2 \3 \4 \5 \6/p" <<< "$rank_line" |
                       awk '{ print mib($1, $2), mib($3, $4), mib($5, $6) } '"$MIB_AWK")"
  r=$(sed -nE "s/.*\+ (replica \(params, AdamW, grads\)|AdamW) $b.*/\2 \3/p" <<< "$rank_line" |
      awk '{ print mib($1, $2) } '"$MIB_AWK")
  PLAN[$m]="${p:-n/a} ${g:-n/a} ${a:-n/a} ${r:-n/a}"
  echo "plan $m (pdtrain --dry-run, baseline compute rank): params ${p:-?} MiB, grads ${g:-?} MiB, activations ${a:-?} MiB, replica/AdamW ${r:-?} MiB"
}
# A deck key's value as used: the last --set of it (the model's, then the caller's), else the deck.
resolved() {  # model key
  local m=$1 key=$2 v
  v=$(grep -oE -- "--set $key=[^ ]+" <<< "$(model_sets "$m") ${extra[*]}" | tail -1 | cut -d= -f2)
  if [[ -z $v ]]; then
    local sec=${key%%.*} k=${key#*.}
    v=$(awk -v sec="[$sec]" -v k="$k" '$0 == sec { on = 1; next } /^\[/ { on = 0 }
          on && $1 == k && $2 == "=" { print $3; exit }' "${DECK[$m]}")
  fi
  echo "$v"
}

# The least pd.cache_mb a model allows (pdtrain names it when asked for less).
least_cache_mb() {
  local m=$1 h=$2 msg
  # shellcheck disable=SC2046
  msg=$(scripts/mpirun-local -np $((h + 1)) "$bin" "${DECK[$m]}" $(model_sets "$m") "${common[@]}" \
        --set parallel.holders="$h" --set pd.cache_mb=0.001 --dry-run 2>&1 < /dev/null)
  sed -nE 's/.*needs ([0-9.]+) MiB.*/\1/p' <<< "$msg" | head -1
}

# ---------------------------------------------------------------------------- the ceiling --
ceiling_of() {  # model: sets CEIL[model] (TFLOP/s) or n/a
  local m=$1 n L C T batch mb
  read -r n L C T batch mb <<< "${SHAPE[$m]}"
  if (( cpu )); then
    CEIL[$m]=n/a
    say "ceiling model=$m: n/a (--cpu: no GPU GEMM ceiling)"
    return 0
  fi
  local vp args rc log=$out/ceiling-$m.log
  vp=$(resolved "$m" model.padded_vocab_size)
  [[ -n $vp && $vp != 0 ]] || vp=$(( ( $(resolved "$m" model.vocab_size) + 127 ) / 128 * 128 ))
  args=(--tokens $((mb * T)) --d-model "$C" --vocab "$vp" --layers "$L")
  (( short )) && args+=(--iters 3 --warmup 1 --algos 2 --square 1024)
  if [[ ! -x $gemm ]]; then
    CEIL[$m]=n/a; failures=$((failures + 1))
    say "ceiling model=$m: FAIL: no $gemm (a -DPDTRAIN_CUDA=ON build has it)"
    return 0
  fi
  timeout -k 10 60 "$gemm" "${args[@]}" > "$log" 2>&1
  rc=$?
  local line; line=$(grep -m1 '^ceiling:' "$log")
  if (( rc != 0 )) || [[ -z $line ]]; then
    tail -5 "$log"
    CEIL[$m]=n/a; failures=$((failures + 1))
    say "ceiling model=$m: FAIL: bench_gemm_cuda ${args[*]} exited $rc"
    return 0
  fi
  grep -E '^(gemm square|model GEMMs)' "$log"
  CEIL[$m]=$(sed -nE 's/.*bf16_tflops=([0-9.]+).*/\1/p' <<< "$line")
  say "ceiling model=$m tokens=$((mb * T)) d_model=$C vocab=$vp layers=$L: ${line#ceiling: }"
}

# --------------------------------------------------------------------------- one config --
declare -A TPS STEPMS PGO WALL
no_gpu_use=0
last_a_wall=""
run_config() {  # model label holders staleness cache_factor
  local m=$1 label=$2 h=$3 s=$4 cf=$5
  local id=$m-$label np=$((h + 1)) dir=$out/$m-$label log=$out/$m-$label.log
  local n L C T batch mb
  ensure_shape "$m" || { failures=$((failures + 1)); return; }
  read -r n L C T batch mb <<< "${SHAPE[$m]}"

  if (( no_gpu_use )); then
    say "ratio model=$m config=$label: skipped (an earlier run used no GPU)"
    return
  fi
  # Budget: the run expected to take as long as the model's baseline did (or 3x the 124m one).
  local now elapsed est=0
  now=$(date +%s); elapsed=$((now - t_start))
  if [[ -n ${WALL[$m-a]:-} ]]; then est=$(( WALL[$m-a] * 5 / 4 ))
  elif [[ $m == 350m && -n ${WALL[124m-a]:-} ]]; then est=$(( WALL[124m-a] * 3 ))
  elif [[ -n $last_a_wall ]]; then est=$last_a_wall
  fi
  if (( budget > 0 && elapsed + est > budget )); then
    say "ratio model=$m config=$label: skipped (time budget: ${elapsed}s elapsed + ~${est}s > ${budget}s)"
    return
  fi
  local tmo=150
  (( short )) && tmo=90
  [[ $m == 350m ]] && tmo=240
  if (( budget > 0 )); then
    local left=$((budget - elapsed + 60))
    (( left < tmo )) && tmo=$left
    (( tmo < 30 )) && tmo=30
  fi
  [[ -n ${BENCH_GPU_RUN_TIMEOUT:-} ]] && tmo=$BENCH_GPU_RUN_TIMEOUT

  [[ -n ${CEIL[$m]:-} ]] || ceiling_of "$m"

  local sets=() cache_mb=0
  # shellcheck disable=SC2206
  sets=($(model_sets "$m") "${common[@]}" --set parallel.holders="$h" --set pd.staleness="$s"
        --set run.out_dir="$dir" --set checkpoint.dir="$dir/ckpt" --stop-after "${STEPS[$m]}")
  if (( h > 0 )); then
    if (( fetch_thread )); then sets+=(--set pd.fetch_thread=true); else sets+=(--set pd.fetch_thread=false); fi
    if [[ $cf != 0 ]]; then
      local least; least=$(least_cache_mb "$m" "$h")
      [[ -n $least ]] || { say "ratio model=$m config=$label: FAIL: cannot learn the least pd.cache_mb"; failures=$((failures + 1)); return; }
      cache_mb=$(awk -v l="$least" -v f="$cf" 'BEGIN { printf "%.1f", l * f }')
      sets+=(--set pd.cache_mb="$cache_mb")
    fi
  fi
  sets+=("${extra[@]}")  # the caller's --set last: it wins

  local base=0 peak_file=$out/$id.mem
  if (( have_smi )); then
    base=$(used_mib); base=${base:-0}
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 -lms 100 > "$peak_file" 2>/dev/null &
    smi_pid=$!
  fi
  local t0 t1 rc pid nogpu=0 waited=0
  t0=$(date +%s.%N)
  # In a session of its own (setsid), so that every process of the run can be found and ended.
  $setsid timeout -k 20 "$tmo" scripts/mpirun-local -np "$np" "$bin" "${DECK[$m]}" "${sets[@]}" > "$log" 2>&1 < /dev/null &
  pid=$!
  # On the GPU: a run that has not touched the GPU's memory after gpu_grace seconds is not
  # using it (a build whose training loop ignores compute.device would train 124M on the CPU
  # for the whole timeout): stop it and say so.
  if (( have_smi )); then
    while kill -0 "$pid" 2>/dev/null; do
      sleep 1; waited=$((waited + 1))
      if (( waited == gpu_grace )) && kill -0 "$pid" 2>/dev/null; then
        local so_far
        so_far=$(awk -v b="$base" '{ v = $1 + 0; if (v > m) m = v } END { printf "%d", m - b }' "$peak_file")
        if (( so_far < 64 )); then nogpu=1; end_run "$pid"; fi
      fi
    done
  fi
  wait "$pid"
  rc=$?
  end_session "$pid"  # ranks a killed mpirun left behind
  t1=$(date +%s.%N)
  if [[ -n $smi_pid ]]; then kill "$smi_pid" 2>/dev/null; wait "$smi_pid" 2>/dev/null; smi_pid=""; fi
  WALL[$id]=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", b - a + 0.999 }')
  (( h == 0 )) && last_a_wall=${WALL[$id]}
  rm -rf "$dir/ckpt"

  local status=ok
  if (( nogpu )); then
    tail -15 "$log"
    say "ratio model=$m config=$label: FAIL: pdtrain used no GPU memory in its first ${gpu_grace}s (compute.device = cuda not in effect?); stopped"
    failures=$((failures + 1))
    no_gpu_use=1  # the other configurations would not either
    return
  fi
  if (( rc == 124 || rc == 137 )); then status=TIMEOUT
  elif (( rc != 0 )); then
    tail -25 "$log"
    say "ratio model=$m config=$label: FAIL: pdtrain exited $rc after ${WALL[$id]}s (log above)"
    failures=$((failures + 1))
    return
  fi
  # Steps 2..N of metrics.csv: count and mean of the step-time columns.
  local means
  means=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) c[$i] = i; next }
                   $1 >= 2 { n++; s += $c["step_ms"]; f += $c["fetch_ms"]; co += $c["compute_ms"];
                             r += $c["reduce_ms"]; p += $c["push_ms"] }
                   END { if (n) printf "%d %.3f %.3f %.3f %.3f %.3f", n, s/n, f/n, co/n, r/n, p/n; else print "0" }' \
          "$dir/metrics.csv" 2>/dev/null)
  local steps step fetch comp red push
  read -r steps step fetch comp red push <<< "${means:-0}"
  if [[ -z $steps || $steps == 0 ]]; then
    tail -25 "$log"
    say "ratio model=$m config=$label: FAIL: no timed steps in $dir/metrics.csv ($status after ${WALL[$id]}s)"
    failures=$((failures + 1))
    return
  fi
  local peak=n/a
  if (( have_smi )) && [[ -s $peak_file ]]; then
    peak=$(awk -v b="$base" '{ v = $1 + 0; if (v > m) m = v } END { printf "%d", m - b }' "$peak_file")
  fi
  if (( have_smi )) && [[ $peak == n/a || $peak -lt 64 ]]; then  # a CUDA context alone is more
    say "ratio model=$m config=$label: FAIL: pdtrain ran ($steps timed steps, $step ms each) but used no GPU memory (peak ${peak} MiB above the start): compute.device = cuda not in effect?"
    failures=$((failures + 1))
    no_gpu_use=1
    return
  fi
  # Parameters + gradients + optimizer state on the device (see the header).
  local cache_peak pgo plan_p plan_g plan_r dev_alloc
  read -r plan_p plan_g _ plan_r <<< "${PLAN[$m]}"
  cache_peak=$(grep -m1 '^cache:' "$log" | sed -nE 's/.*peak ([0-9.]+) MiB.*/\1/p')
  pgo=n/a
  if (( h == 0 )); then
    [[ $plan_p != n/a && $plan_g != n/a && $plan_r != n/a ]] &&
      pgo=$(awk -v p="$plan_p" -v g="$plan_g" -v r="$plan_r" 'BEGIN { printf "%.1f", p + g + r }')
  elif [[ -n $cache_peak && $plan_g != n/a ]]; then
    pgo=$(awk -v c="$cache_peak" -v g="$plan_g" 'BEGIN { printf "%.1f", c + g }')
  fi
  # pdtrain's own device allocator peak (its summary's "device: ... | peak X allocated").
  dev_alloc=$(grep -m1 '^device:' "$log" | sed -nE 's/.*\| peak ([0-9.]+) ([KMGT]?i?B) allocated.*/\1 \2/p' |
              awk '{ print mib($1, $2) } '"$MIB_AWK")
  dev_alloc=${dev_alloc:-n/a}
  TPS[$id]=$(awk -v b="$batch" -v t="$T" -v ms="$step" 'BEGIN { printf "%.1f", b * t / (ms / 1e3) }')
  STEPMS[$id]=$step PGO[$id]=$pgo

  echo "config $m $label: $np ranks ($h holders), $steps timed steps, step $step ms = fetch wait $fetch + compute $comp + reduce $red + push $push ms (means); wall ${WALL[$id]}s$( [[ $cache_mb != 0 ]] && echo ", pd.cache_mb $cache_mb") | $(grep -m1 '^summary:' "$log")"
  grep -m1 '^cache:' "$log" || true
  grep -m1 '^holder 0:' "$log" || true
  grep -m1 -iE '^device' "$log" || true
  local line
  line=$(awk -v m="$m" -v l="$label" -v h="$h" -v s="$s" -v k="$steps" -v ms="$step" -v tps="${TPS[$id]}" \
             -v n="$n" -v L="$L" -v C="$C" -v T="$T" -v peak_flops="$PEAK_FLOPS" -v ceil="${CEIL[$m]:-n/a}" \
             -v mem="$peak" -v dev_alloc="$dev_alloc" -v pgo="$pgo" -v st="$status" -v a_ms="${STEPMS[$m-a]:-}" -v a_pgo="${PGO[$m-a]:-}" 'BEGIN {
    fpt = 6 * n + 6 * L * T * C
    fl = tps * fpt
    printf "ratio model=%s config=%s holders=%d staleness=%d steps=%d step_ms=%.1f tokens_per_s=%.0f mfu_989=%.4f", m, l, h, s, k, ms, tps, fl / peak_flops
    if (ceil == "n/a" || ceil == "") printf " mfu_ceiling=n/a"; else printf " mfu_ceiling=%.4f", fl / (ceil * 1e12)
    printf " peak_mem_mib=%s device_alloc_mib=%s pgo_mib=%s", mem, dev_alloc, pgo
    if (h == 0) printf " (target mfu_989 >= 0.40: %s)", (fl / peak_flops >= 0.40 ? "met" : "not met")
    else {
      if (a_ms != "") { r = ms / a_ms; printf " time_per_token_vs_a=%.3f (target <= 1.10: %s)", r, (r <= 1.10 ? "met" : "not met") }
      else printf " time_per_token_vs_a=n/a"
      if (a_pgo != "" && a_pgo != "n/a" && pgo != "n/a") { q = pgo / a_pgo; printf " pgo_vs_a=%.3f (target <= 0.25: %s)", q, (q <= 0.25 ? "met" : "not met") }
      else printf " pgo_vs_a=n/a"
    }
    if (st != "ok") printf " %s", st
    printf "\n" }')
  say "$line"
}

# --------------------------------------------------------------------------------- run all --
for c in "${configs[@]}"; do
  # shellcheck disable=SC2086
  run_config $c
done

# Targets in one place (the ratio lines above carry the numbers).
summary=""
for c in "${configs[@]}"; do
  read -r m label h s cf <<< "$c"
  id=$m-$label
  [[ -n ${TPS[$id]:-} ]] || continue
  read -r n L C T batch mb <<< "${SHAPE[$m]}"
  if (( h == 0 )); then
    summary+=$(awk -v id="$id" -v t="${TPS[$id]}" -v n="$n" -v L="$L" -v C="$C" -v T="$T" -v p="$PEAK_FLOPS" \
                 'BEGIN { f = t * (6 * n + 6 * L * T * C) / p; printf " %s: MFU %.3f (>= 0.40 %s);", id, f, (f >= 0.4 ? "met" : "not met") }')
  elif [[ -n ${STEPMS[$m-a]:-} ]]; then
    summary+=$(awk -v id="$id" -v b="${STEPMS[$id]}" -v a="${STEPMS[$m-a]}" -v pb="${PGO[$id]}" -v pa="${PGO[$m-a]}" 'BEGIN {
                 r = b / a; printf " %s: time/token %.3f x a (<= 1.10 %s)", id, r, (r <= 1.1 ? "met" : "not met")
                 if (pb != "n/a" && pa != "n/a") { q = pb / pa; printf ", p+g+o %.3f x a (<= 0.25 %s)", q, (q <= 0.25 ? "met" : "not met") }
                 printf ";" }')
  fi
done
echo "targets:${summary:- none measured}"
if [[ -n $pytorch ]]; then
  if [[ -s $pytorch && -n $results ]]; then compare "$results" "$pytorch"
  else echo "bench_gpu: no PyTorch comparison (${pytorch} missing or no --results)"; fi
fi
if (( failures > 0 )); then
  echo "bench_gpu: FAIL: $failures failure(s) above; $(( $(date +%s) - t_start ))s"
  exit 1
fi
echo "bench_gpu: ok ($(( $(date +%s) - t_start ))s)"
