#!/usr/bin/env bash
# Builds the emulated CUDA target (docs/cuda-emulation.md): pdtrain's CUDA sources compiled for
# the CPU against emulation/cuda, with AddressSanitizer and UBSan, into ./build/cuda-emulated (or
# $1). A test tool: its pdtrain says "cuda (emulated on the CPU)" and is never the production
# binary (scripts/build.sh builds that). Builds what the GPU tests need; then
#   ctest --test-dir build/cuda-emulated -L gpu
# runs them (the main build's ctest runs them too, as emulated.*).
# PDTRAIN_SANITIZE="" builds without sanitizers (faster, for a quick look).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build/cuda-emulated}
mkdir -p "$build"
targets=(pdtrain test_backend_cuda test_gpu_training test_gpu_nccl test_emulation_runtime
         test_emulation_wmma test_emulation_profile test_emulation_ptx test_emulation_cublaslt test_emulation_cudnn test_emulation_nccl)
cmake -S "$src" -B "$build" -DPDTRAIN_CUDA_EMULATED=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DPDTRAIN_BUILD_PERF=OFF \
      -DPDTRAIN_SANITIZE="${PDTRAIN_SANITIZE-address;undefined}" > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "build-cuda-emulated: configuring failed" >&2; exit 1; }
if ! cmake --build "$build" -j"$(nproc)" --target "${targets[@]}" > "$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -40
  echo "build-cuda-emulated: the build failed (log: $build/build.log)" >&2
  exit 1
fi
grep -E "warning" "$build/build.log" | grep -v "Wrestrict" | head -20 || true
"$build/pdtrain" --version | grep -q "cuda (emulated on the CPU)" ||
  { echo "build-cuda-emulated: pdtrain --version does not say it is emulated" >&2; exit 1; }
echo "build-cuda-emulated: built $build"
