#!/usr/bin/env bash
# The CUDA backend builds wherever the CUDA toolkit is, so it never rots on machines without a
# GPU: configures and builds SOURCE_DIR with -DPDTRAIN_CUDA=ON into BUILD_DIR, then runs that
# build's GPU tests (which must report "Skipped" without a GPU, and pass with one) and its
# compute.device error test. Exits 77 (skipped) when there is no nvcc.
# Usage: check_cuda_build.sh SOURCE_DIR BUILD_DIR [NVCC]
set -uo pipefail
src=$1 build=$2
nvcc=${3:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
if [ ! -x "$nvcc" ]; then
  echo "SKIP: no CUDA toolkit (nvcc) on this machine: the CUDA backend is not built"
  exit 77
fi
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DPDTRAIN_CUDA=ON \
      -DCMAKE_CUDA_COMPILER="$nvcc" -DPDTRAIN_BUILD_PERF=ON > "$build.configure.log" 2>&1 ||
  { cat "$build.configure.log"; echo "FAIL: configuring the CUDA build"; exit 1; }
# What has CUDA in it: the binary, the GPU tests (the rest of the tree is the CPU build's code).
targets=(pdtrain test_backend_cuda test_gpu_training bench_collectives bench_attention_kernels)
# The NCCL tests exist when the toolkit has NCCL (cmake/PdtrainCuda.cmake).
# (grep reads the whole list: with -q it would stop early and, under pipefail, the launcher's
# broken pipe would read as "not found".)
cmake --build "$build" --target help | grep "test_gpu_nccl" > /dev/null && targets+=(test_gpu_nccl)
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" > "$build.build.log" 2>&1 ||
  { grep -E "error|Error" "$build.build.log" | head -40; echo "FAIL: building the CUDA backend"; exit 1; }
grep -E "warning" "$build.build.log" | grep -v "Wrestrict" | head -20
"$build/pdtrain" --version | grep -q "cuda" || { echo "FAIL: pdtrain --version names no cuda backend"; exit 1; }
out=$(ctest --test-dir "$build" -L gpu -R "backend_cuda|gpu\\." 2>&1); rc=$?
echo "$out" | tail -8
[ $rc -eq 0 ] || { echo "FAIL: GPU tests of the CUDA build"; exit 1; }
if ! command -v nvidia-smi > /dev/null || ! nvidia-smi -L > /dev/null 2>&1; then
  echo "$out" | grep -q "Skipped" || { echo "FAIL: without a GPU the GPU tests must be reported skipped"; exit 1; }
fi
ctest --test-dir "$build" -R "cli.device_cuda" --output-on-failure | tail -3 ||
  { echo "FAIL: compute.device error test of the CUDA build"; exit 1; }
echo "cuda build: ok"
