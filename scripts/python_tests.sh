#!/usr/bin/env bash
# Builds and installs the Python package (pip install ., no torch needed to build) and runs its
# tests. Tests that need torch or a GPU skip, saying why. Without network access, have
# scikit-build-core, nanobind and pytest installed already (EPCOMM_PIP_OFFLINE=1 skips fetching).
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "Python tests skipped: $python has no pip"
  exit 0
fi
if [ "${EPCOMM_PIP_OFFLINE:-0}" != 1 ]; then
  "$python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind>=2.0" pytest 2>&1 |
    { grep -v "Running pip as" || true; }
fi
log=$(mktemp)
if ! CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
    "$python" -m pip install --disable-pip-version-check --no-build-isolation . >"$log" 2>&1; then
  tail -40 "$log"
  echo "Python tests: building or installing the package failed (above)" >&2
  exit 1
fi
rm -f "$log"
repo=$PWD
# Run from elsewhere so `import epcomm` finds the installed package, not the source folder.
cd /tmp && "$python" -m pytest -q -rs "$repo/python/tests" "$@"
