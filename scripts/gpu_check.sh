#!/usr/bin/env bash
# The one command for a GPU machine. Run in the repository root:
#   scripts/gpu_check.sh [RESULTS_DIR]        (or set EPCOMM_RESULTS_DIR)
# Builds with every core, starts MPS when ranks must share GPUs, runs the whole test suite (CPU
# tests and GPU tests at 1, 2, 4 and 8 ranks), runs epcomm-bench at 1, 2, 4 and 8 ranks and a
# config sweep at 8 ranks (EPCOMM_SWEEP=0 skips it), stops MPS, and leaves in RESULTS_DIR:
# and cold-start trials at 1 and 8 ranks (EPCOMM_COLD=0 skips them)
# (EPCOMM_TEST_EXCLUDE: a ctest regex to skip; EPCOMM_BENCH_RANKS: rank counts to benchmark;
# EPCOMM_BENCH_ARGS: more epcomm-bench options)
# build.log, tests.log, bench.jsonl, bench.log, machine.txt, summary.txt. Exits non-zero if the build, a test or a benchmark failed.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-${EPCOMM_RESULTS_DIR:-results/$(date -u +%Y%m%d-%H%M%S)}}
mkdir -p "$results"
results=$(cd "$results" && pwd)
summary="$results/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# NVLink multicast stays off in every process we start (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

{
  date -u
  nvidia-smi || true
  nvidia-smi topo -m || true
  nvcc --version || /usr/local/cuda/bin/nvcc --version || true
  cmake --version | head -1
} >"$results/machine.txt" 2>&1

cmake_args=()
[ -d .deps/googletest ] && cmake_args+=(-DEPCOMM_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
export EPCOMM_BUILD_DIR=${EPCOMM_BUILD_DIR:-build-gpu}
if ! scripts/build.sh "${cmake_args[@]}" >"$results/build.log" 2>&1; then
  note "BUILD FAILED (see build.log)"; tail -30 "$results/build.log"; exit 1
fi
note "build: ok ($(grep -c 'Building' "$results/build.log") steps)"
{ echo; echo "== epcomm-check-env --ranks 8"; "$EPCOMM_BUILD_DIR"/tools/epcomm-check-env --ranks 8; } >>"$results/machine.txt" 2>&1

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
mps_started=0
stop_mps() { [ "$mps_started" = 1 ] && echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; mps_started=0; }
trap stop_mps EXIT
if [ "${gpus:-0}" -lt 8 ]; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/epcomm-mps CUDA_MPS_LOG_DIRECTORY=/tmp/epcomm-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then mps_started=1; sleep 1; note "MPS: started ($gpus GPU(s) for up to 8 ranks)"; else note "MPS: could not start; ranks time-slice"; fi
fi

status=0
exclude=()
[ -n "${EPCOMM_TEST_EXCLUDE:-}" ] && exclude=(-E "$EPCOMM_TEST_EXCLUDE")
ctest --test-dir "$EPCOMM_BUILD_DIR" --output-on-failure --timeout "${EPCOMM_TEST_TIMEOUT:-300}" "${exclude[@]}" \
  >"$results/tests.log" 2>&1 || status=1
note "tests: $(grep -E 'tests passed|tests failed' "$results/tests.log" | tail -1)"
if [ "${EPCOMM_PYTHON:-1}" = 1 ]; then
  # The GPU machine is offline: scikit-build-core, nanobind, pytest and torch must be installed.
  if EPCOMM_PIP_OFFLINE=1 scripts/python_tests.sh >>"$results/tests.log" 2>&1; then
    note "python: $(grep -E '[0-9]+ passed' "$results/tests.log" | tail -1)"
    if timeout 120 "${PYTHON:-python3}" examples/moe_layer.py --ranks 2 >>"$results/tests.log" 2>&1; then
      note "python example (examples/moe_layer.py --ranks 2): ok"
    else
      status=1; note "python example: FAILED (see tests.log)"
    fi
  else
    status=1; note "python: FAILED (see tests.log)"
  fi
fi
grep -E 'Failed|\*\*\*Skipped|Timeout' "$results/tests.log" | tee -a "$summary" || true

: >"$results/bench.jsonl"
for ranks in ${EPCOMM_BENCH_RANKS:-1 2 4 8}; do
  # shellcheck disable=SC2086  # EPCOMM_BENCH_ARGS is a list of options
  if ! "$EPCOMM_BUILD_DIR"/tools/epcomm-bench --ranks "$ranks" ${EPCOMM_BENCH_ARGS:-} --out "$results/bench.jsonl" >>"$results/bench.log" 2>&1; then
    status=1; note "bench --ranks $ranks: FAILED (see bench.log)"
  fi
done
if [ "${EPCOMM_SWEEP:-1}" = 1 ]; then
  if ! "$EPCOMM_BUILD_DIR"/tools/epcomm-bench --ranks 8 --sweep --warmup 2 --iters 10 --out "$results/bench.jsonl" >>"$results/bench.log" 2>&1; then
    status=1; note "bench --ranks 8 --sweep: FAILED (see bench.log)"
  fi
fi
if [ "${EPCOMM_COLD:-1}" = 1 ]; then
  for ranks in 1 8; do
    if ! "$EPCOMM_BUILD_DIR"/tools/epcomm-bench --cold --trials 2 --ranks "$ranks" --out "$results/bench.jsonl" >>"$results/bench.log" 2>&1; then
      status=1; note "bench --cold --ranks $ranks: FAILED (see bench.log)"
    fi
  done
fi
note "bench: $(wc -l <"$results/bench.jsonl") records in bench.jsonl"
stop_mps
exit $status
