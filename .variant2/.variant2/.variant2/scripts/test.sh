#!/usr/bin/env bash
# Builds epcomm and runs every test: CPU tests always; GPU tests when a CUDA GPU is visible,
# otherwise ctest lists them as skipped and this script says why; then the Python package's tests.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
build_dir=${EPCOMM_BUILD_DIR:-build}
# The GPU test program exits 77 with its reason when no GPU is usable; say so before ctest does.
set +e
probe=$("$build_dir"/tests/gpu/epcomm_gpu_tests layout 2>&1 </dev/null)
probe_status=$?
set -e
if [ "$probe_status" -eq 77 ]; then
  echo "$probe"
  echo "The GPU tests (ctest label 'gpu') will be reported as skipped; the CPU tests run."
fi
ctest --test-dir "$build_dir" --output-on-failure "$@"
scripts/python_tests.sh
