#!/usr/bin/env bash
# Builds and installs the Python package (pip install ., no torch needed to build) and runs its
# tests. Tests that need torch or a GPU skip, saying why. When scripts/build.sh has built into
# EPCOMM_BUILD_DIR (default build), pip builds the extension there, reusing the compiled kernels. Without network access, have
# scikit-build-core, nanobind and pytest installed already (EPCOMM_PIP_OFFLINE=1 skips fetching).
# PYTHON picks the interpreter (default python3). A Python that refuses pip installs (Debian's
# system Python: "externally-managed-environment", PEP 668) gets a virtual environment of its own
# under the build folder, made with `python -m venv --system-site-packages`.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
build_dir=${EPCOMM_BUILD_DIR:-build}
if ! "$python" -m pip --version >/dev/null 2>&1; then
  echo "Python tests skipped: $python has no pip"
  exit 0
fi
externally_managed=$("$python" -c 'import os, sys, sysconfig
in_venv = sys.prefix != sys.base_prefix
marker = os.path.join(sysconfig.get_paths()["stdlib"], "EXTERNALLY-MANAGED")
print(int(os.path.exists(marker) and not in_venv))')
if [ "$externally_managed" = 1 ]; then
  venv="$build_dir/python-venv"
  echo "Python tests: $python is externally managed (PEP 668); using a virtual environment in $venv"
  if [ ! -x "$venv/bin/python" ] && ! "$python" -m venv --system-site-packages "$venv"; then
    echo "Python tests: cannot make a virtual environment with $python -m venv (Debian: apt-get install" \
         "python3-venv), or set PYTHON to the python of a virtual environment" >&2
    exit 1
  fi
  python="$venv/bin/python"
fi
echo "Python tests: $("$python" -c 'import sys; print(sys.executable, "(Python " + sys.version.split()[0] + ")")'),"\
     "installing into $("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [ "${EPCOMM_PIP_OFFLINE:-0}" != 1 ]; then
  "$python" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" "nanobind>=2.0" pytest 2>&1 |
    { grep -v "Running pip as" || true; }
fi
log=$(mktemp)
# Where scripts/build.sh built the C++ library, pip builds in that folder too (with the options it
# was configured with), so the kernels are compiled once; otherwise in a wheel folder of its own.
pip_settings=()
if [ -f "$build_dir/CMakeCache.txt" ]; then
  cached() { sed -n "s/^$1:[A-Z]*=//p" "$build_dir/CMakeCache.txt"; }
  pip_settings=(-C "build-dir=$(cd "$build_dir" && pwd)" -C cmake.define.EPCOMM_PIP_BUILD=OFF
                -C "cmake.define.EPCOMM_BUILD_TESTS=$(cached EPCOMM_BUILD_TESTS)"
                -C "cmake.define.EPCOMM_BUILD_TOOLS=$(cached EPCOMM_BUILD_TOOLS)"
                -C "cmake.build-type=$(cached CMAKE_BUILD_TYPE)")
  echo "Python tests: building the extension in $build_dir (pip install .; the kernels are built there already)"
else
  echo "Python tests: building the extension (pip install .; about a minute on 2 cores)"
fi
CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)} \
  "$python" -m pip install --disable-pip-version-check --no-build-isolation "${pip_settings[@]}" . >"$log" 2>&1 &
pip_pid=$!
started=$SECONDS
while kill -0 "$pip_pid" 2>/dev/null; do
  sleep 1
  elapsed=$((SECONDS - started))
  if [ $((elapsed % 15)) -eq 0 ] && kill -0 "$pip_pid" 2>/dev/null; then echo "  ... still building (${elapsed} s)"; fi
done
if ! wait "$pip_pid"; then
  tail -40 "$log"
  echo "Python tests: building or installing the package failed (above)" >&2
  exit 1
fi
echo "Python tests: installed in $((SECONDS - started)) s"
grep -c "Building CUDA object" "$log" | sed "s/^/Python tests: CUDA files compiled by pip: /" || true
rm -f "$log"
repo=$PWD
# Run from elsewhere so `import epcomm` finds the installed package, not the source folder.
cd /tmp && "$python" -m pytest -q -rs "$repo/python/tests" "$@"
