#!/usr/bin/env bash
# Builds the profiling build of the emulated CUDA target (docs/cuda-emulation.md, "Kernel
# counts") into ./build/cuda-profile (or $1): the emulated target compiled by clang 14 without
# sanitizers, its kernel sources (the .cu files and the planted kernels of
# test_emulation_profile) with -fsanitize-coverage=edge,trace-loads,trace-stores, whose
# callbacks the emulation runtime implements. A test tool like the emulated target (pdtrain
# says "cuda (emulated on the CPU)"), never the production binary. Builds only what the
# counting needs: pdtrain and test_emulation_profile. perf/kernel_counts.sh uses it.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$src/build/cuda-profile}
mkdir -p "$build"
cxx=${PDTRAIN_PROFILE_CXX:-/usr/bin/clang++}
cc=${PDTRAIN_PROFILE_CC:-/usr/bin/clang}
cmake -S "$src" -B "$build" -DPDTRAIN_CUDA_EMULATED=ON -DPDTRAIN_CUDA_EMU_PROFILE=ON \
      -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g0 -DNDEBUG" -DPDTRAIN_BUILD_PERF=OFF \
      -DPDTRAIN_SANITIZE="" ${CMAKE_ARGS:-} > "$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; echo "build-cuda-profile: configuring failed" >&2; exit 1; }
if ! cmake --build "$build" -j"$(nproc)" --target pdtrain test_emulation_profile \
     > "$build/build.log" 2>&1; then
  grep -E "error|Error" "$build/build.log" | head -40
  echo "build-cuda-profile: the build failed (log: $build/build.log)" >&2
  exit 1
fi
"$build/pdtrain" --version | grep -q "cuda (emulated on the CPU)" ||
  { echo "build-cuda-profile: pdtrain --version does not say it is emulated" >&2; exit 1; }
echo "build-cuda-profile: built $build"
