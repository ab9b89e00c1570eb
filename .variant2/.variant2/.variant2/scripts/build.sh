#!/usr/bin/env bash
# Configures and builds epcomm (Release) into ${EPCOMM_BUILD_DIR:-build}, with every core.
# Used by the README's two commands; any extra arguments go to CMake's configure step.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${EPCOMM_BUILD_DIR:-build}
jobs=${EPCOMM_BUILD_JOBS:-$(nproc)}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@"
else
  cmake -S . -B "$build_dir" "$@" >/dev/null  # a kept folder still records the current revision
fi
cmake --build "$build_dir" -j "$jobs"
