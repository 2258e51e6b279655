#!/usr/bin/env bash
# Configures and builds pdtrain (Release) into ./build, or into $BUILD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} ${CMAKE_ARGS:-} >/dev/null
cmake --build "$BUILD_DIR" -j"$(nproc)" 2>&1 | grep -E "error|warning|Error|Built target pdtrain$" || true
test -x "$BUILD_DIR/pdtrain"
