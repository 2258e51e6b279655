# Helpers for the steps in scripts/gpu-check.steps; sourced by scripts/gpu-check.sh into the
# bash that runs each step (the bundle's environment is already set). See gpu-check.steps.

# GoogleTest executables, directly or under mpirun (scripts/gpu-check-tests.sh).
gtests() { bash "$GPU_CHECK_SCRIPTS/gpu-check-tests.sh" "$@"; }

# expect REGEX... -- CMD...: runs CMD; passes when it exits 0, each extended REGEX matches some
# line of its output and no line contains FAIL (like the ctest PASS/FAIL_REGULAR_EXPRESSION of
# the perf tests). Exit status 77 (SKIP) passes through.
expect() {
  local regexes=() out rc re missing=0
  while (( $# > 0 )) && [[ $1 != -- ]]; do regexes+=("$1"); shift; done
  [[ ${1:-} == -- ]] || { echo "expect: usage: expect REGEX... -- CMD..." >&2; return 2; }
  shift
  out=$(mktemp "$GPU_CHECK_WORK/expect.XXXXXX")
  "$@" 2>&1 | tee "$out"
  rc=${PIPESTATUS[0]}
  if (( rc == 77 )); then rm -f "$out"; return 77; fi
  if (( rc != 0 )); then echo "expect: FAILED: '$*' exited with status $rc"; rm -f "$out"; return 1; fi
  for re in "${regexes[@]}"; do
    grep -Eq -- "$re" "$out" || { echo "expect: FAILED: no line of the output matches /$re/"; missing=1; }
  done
  if grep -q FAIL "$out"; then echo "expect: FAILED: the output has a line with FAIL"; missing=1; fi
  rm -f "$out"
  return $missing
}

# The machine's own environment for a command (python3 and PyTorch must not load the bundle's
# libraries).
sysenv() {
  if [[ -n ${GPU_CHECK_ORIG_LD_LIBRARY_PATH:-} ]]; then
    env LD_LIBRARY_PATH="$GPU_CHECK_ORIG_LD_LIBRARY_PATH" "$@"
  else
    env -u LD_LIBRARY_PATH "$@"
  fi
}

# 0 when an NVIDIA GPU is usable; otherwise prints why and returns 77 (SKIP), or 1 (FAIL) with
# GPU_CHECK_REQUIRE_GPU=1 (on the GPU machine a missing GPU is a failure, not a skip). A driver
# that is installed but fails for another reason is a failure either way.
no_gpu() {
  if [[ ${GPU_CHECK_REQUIRE_GPU:-0} == 1 ]]; then
    echo "need_gpu: FAILED: $* (GPU_CHECK_REQUIRE_GPU=1)"; return 1
  fi
  echo "SKIP: $*"; return 77
}
need_gpu() {
  local out rc
  command -v nvidia-smi > /dev/null 2>&1 || { no_gpu "no NVIDIA GPU here (nvidia-smi not found)"; return; }
  out=$(nvidia-smi -L 2>&1); rc=$?
  if (( rc == 0 )) && grep -q '^GPU ' <<< "$out"; then return 0; fi
  if grep -qiE 'no devices were found|couldn.t communicate with the nvidia driver' <<< "$out"; then
    no_gpu "no NVIDIA GPU here: $(head -1 <<< "$out")"; return
  fi
  echo "need_gpu: nvidia-smi -L failed (status $rc): $out"; return 1
}

# 0 when python3 imports torch and it sees a CUDA device; otherwise 77 (SKIP).
need_torch() {
  command -v python3 > /dev/null 2>&1 || { echo "SKIP: no python3"; return 77; }
  local out
  if ! out=$(sysenv python3 -c 'import torch; print(torch.__version__, torch.cuda.is_available())' 2>&1); then
    echo "SKIP: python3 cannot import torch: ${out##*$'\n'}"; return 77
  fi
  [[ $out == *" True" ]] || { no_gpu "torch $out: no CUDA device"; return; }
  echo "torch ${out% *}"
}

# Step gpu-info: the GPU(s), the driver and the CUDA toolkit found; SKIP without a GPU.
gpu_info() {
  need_gpu || return $?
  nvidia-smi || return 1
  nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,compute_cap,compute_mode --format=csv || return 1
  # Several ranks share GPU 0 in the shared-GPU tests: only the Default compute mode allows it.
  echo "compute mode: $(nvidia-smi --query-gpu=compute_mode --format=csv,noheader | head -1)"
  echo "GPU: $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
  if command -v nvcc > /dev/null 2>&1; then nvcc --version | tail -2; else echo "nvcc: not on PATH"; fi
  command -v compute-sanitizer > /dev/null 2>&1 && echo "compute-sanitizer: $(command -v compute-sanitizer)"
  command -v ncu > /dev/null 2>&1 && echo "ncu: $(command -v ncu)"
  return 0
}

# Step bundle-libs: every bundled executable, MCA component and plugin finds each library it
# needs, and each comes from the bundle, except glibc's own, libstdc++/libgcc_s when the
# machine's are new enough (see GPU_CHECK_LIBSTDCXX), and the CUDA driver/toolkit libraries
# (the machine's). Anything else from the machine would mean the bundle is not self-contained.
check_libs() {
  local f name arrow path bad=0 n=0 cuda_missing=()
  local files=()
  while IFS= read -r -d '' f; do files+=("$f"); done < <(
    find "$GPU_CHECK_PREFIX/build" "$GPU_CHECK_PREFIX/ompi/bin" "$GPU_CHECK_PREFIX/ompi/lib" \
         "$GPU_CHECK_PREFIX/pmix/lib" "$GPU_CHECK_PREFIX/lib" -type f \( -perm -u+x -o -name '*.so*' \) -print0)
  for f in "${files[@]}"; do
    head -c 4 "$f" | grep -q $'\x7fELF' || continue
    n=$((n + 1))
    while read -r name arrow path _; do
      [[ $arrow == "=>" ]] || continue
      if [[ $path == not ]]; then
        if [[ $name =~ $GPU_CHECK_CUDA_LIB_RE ]]; then cuda_missing+=("${f#$GPU_CHECK_PREFIX/}: $name"); continue; fi
        echo "check_libs: ${f#$GPU_CHECK_PREFIX/}: $name not found"; bad=1; continue
      fi
      case $path in "$GPU_CHECK_PREFIX"/*) continue ;; esac
      [[ $name =~ $GPU_CHECK_GLIBC_LIB_RE ]] && continue
      [[ $name =~ $GPU_CHECK_CUDA_LIB_RE ]] && continue
      if [[ $name =~ ^(libstdc\+\+\.so\.6|libgcc_s\.so\.1)$ && $GPU_CHECK_LIBSTDCXX_USED == system ]]; then continue; fi
      echo "check_libs: ${f#$GPU_CHECK_PREFIX/}: $name comes from the machine ($path), not the bundle"; bad=1
    done < <(ldd "$f" 2>&1)
  done
  echo "check_libs: $n ELF files checked; libstdc++/libgcc_s: $GPU_CHECK_LIBSTDCXX_USED's"
  if (( ${#cuda_missing[@]} > 0 )); then
    printf 'check_libs: CUDA library not found: %s\n' "${cuda_missing[@]}"
    if need_gpu > /dev/null; then bad=1; else echo "check_libs: (no GPU here: the executables that need them cannot run)"; fi
  fi
  (( bad == 0 )) && echo "check_libs: ok"
  return $bad
}
