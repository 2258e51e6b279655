#!/usr/bin/env bash
# Configures and builds pdtrain (Release) into ./build, or into $BUILD_DIR.
# Prints only errors, warnings and the final "Built target pdtrain"; a failed build fails the
# script, so tests never run an old binary left over from an earlier build.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE=${CMAKE_BUILD_TYPE:-Release} ${CMAKE_ARGS:-} >/dev/null
# The filter never fails (grep finding nothing is not an error); pipefail passes on the build's
# own status. Progress lines are dropped even when a file name contains "error".
quiet() { grep -E "error|warning|Error|Built target pdtrain$" | grep -vE "^\[ *[0-9]+%\] (Building|Linking)" || true; }
if ! cmake --build "$BUILD_DIR" -j"$(nproc)" 2>&1 | quiet; then
  echo "build.sh: the build failed" >&2
  exit 1
fi
test -x "$BUILD_DIR/pdtrain"
