#!/usr/bin/env bash
# Optional tooling: builds the GEMM layer against oneDNN 3.x (Intel's onednn wheels on PyPI;
# Debian 12 ships 2.6) and runs the GEMM, bf16 and mixed-precision kernel tests on it, so the
# oneDNN 2.x/3.x adapter in src/kernels/gemm_onednn.cpp is checked on both APIs.
#   scripts/check-onednn3.sh [WORK_DIR]        (needs pip and network; not part of the suite)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-/tmp/pdtrain-onednn3}
mkdir -p "$work"
if [[ ! -d $work/whl ]]; then
  pip download --quiet --no-deps -d "$work/dl" onednn-devel-cpu-gomp==2023.2.0 onednn-cpu-gomp==2023.2.0
  mkdir -p "$work/whl"
  for w in "$work"/dl/*.whl; do python3 -m zipfile -e "$w" "$work/whl"; done
fi
inc=$(dirname "$(dirname "$(find "$work/whl" -path '*include/oneapi/dnnl/dnnl.hpp' | head -1)")")
inc=$(dirname "$inc")
lib=$(dirname "$(find "$work/whl" -name 'libdnnl.so.3' | head -1)")
grep -h "define DNNL_VERSION_M" "$inc/oneapi/dnnl/dnnl_version.h"
g++ -O2 -std=c++20 -fopenmp -DPDTRAIN_GEMM_ONEDNN -Iinclude -isystem "$inc" \
    -isystem /usr/include/trilinos -isystem /usr/include/x86_64-linux-gnu/openblas-pthread \
    src/kernels/gemm.cpp src/kernels/gemm_onednn.cpp src/kernels/bf16.cpp \
    src/kernels/blas_runtime.cpp src/kernels/vector_spans.cpp src/kernels/gpt_kernels.cpp \
    tests/kernels/test_gemm.cpp tests/kernels/test_bf16.cpp tests/kernels/test_mixed_precision.cpp \
    tests/support/kokkos_main.cpp -L"$lib" -Wl,-rpath,"$lib" -ldnnl -ltrilinos_kokkoscore \
    -lopenblas -lgtest -lpthread -ldl -o "$work/test_kernels_onednn3"
OPENBLAS_NUM_THREADS=1 "$work/test_kernels_onednn3"
