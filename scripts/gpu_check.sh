#!/usr/bin/env bash
# The one command for a GPU machine. Run in the repository root:
#   scripts/gpu_check.sh [RESULTS_DIR]        (or set EPCOMM_RESULTS_DIR)
#
# Stages, in order (EPCOMM_STAGES picks some, e.g. "build tests" then "python bench sweep cold"
# in a second call when one call may not outlast a 10-minute limit; the build folder is reused):
#   build   configure and build with every core (always done when a later stage needs binaries)
#   tests   the whole ctest suite: CPU tests and GPU tests at 1, 2, 4 and 8 ranks (some also 16, 32, 48)
#   python  pip install + pytest python/tests, then examples/moe_layer.py --ranks 2
#   bench   epcomm-bench at each of EPCOMM_BENCH_RANKS (default 1 2 4 8)
#   sweep   epcomm-bench --ranks 8 --sweep (config grid)
#   cold    epcomm-bench --cold --trials 2 at 1 and 8 ranks, the calls in rounds and back-to-back,
#           then in rounds after 20 ms host pauses
#   sanitize  compute-sanitizer memcheck, racecheck and synccheck on GPU test cases at 2 ranks
#           (MPS stopped: the sanitizer does not run under it); EPCOMM_SANITIZE_CASES picks the
#           cases (default: layout peer lifecycle normal normal_emulated normal_hierarchical
#           modes_across_nodes low_latency low_latency_emulated)
#   soak    (only when named) gpu.soak.ranks8: 10,000 mixed calls of random sizes, each checked,
#           then device memory, file descriptors and mappings compared (EPCOMM_SOAK_CALLS)
# MPS is started when ranks must share GPUs, and stopped at the end. Knobs: EPCOMM_TEST_EXCLUDE (a
# ctest regex to skip), EPCOMM_TEST_TIMEOUT, EPCOMM_BENCH_RANKS, EPCOMM_BENCH_ARGS (more
# epcomm-bench options); EPCOMM_SWEEP=0, EPCOMM_COLD=0 and EPCOMM_PYTHON=0 drop those stages.
# Leaves in RESULTS_DIR: machine.txt (with epcomm-check-env), build.log, tests.log, bench.jsonl,
# bench.log, report.md (scripts/bench_report.py's tables), sanitize.log, summary.txt. Exits non-zero if the
# build, a test or a benchmark failed.
# The records name the commit: on a copy of the tree whose .git may be older than its files (a lent
# machine), pass the checkout's own, e.g. EPCOMM_GIT_REVISION=$(git rev-parse --short=12 HEAD)
# expanded where the tree was committed, not on the copy.
set -uo pipefail
cd "$(dirname "$0")/.."
results=${1:-${EPCOMM_RESULTS_DIR:-results/$(date -u +%Y%m%d-%H%M%S)}}
mkdir -p "$results"
results=$(cd "$results" && pwd)
summary="$results/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

stages=" ${EPCOMM_STAGES:-build tests python bench sweep cold sanitize} "
[ "${EPCOMM_SWEEP:-1}" = 1 ] || stages=${stages/ sweep / }
[ "${EPCOMM_COLD:-1}" = 1 ] || stages=${stages/ cold / }
[ "${EPCOMM_PYTHON:-1}" = 1 ] || stages=${stages/ python / }
wants() { [[ "$stages" == *" $1 "* ]]; }

# NVLink multicast stays off in every process we start (it can take a shared host's GPUs down).
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

{
  date -u
  echo "stages:${stages}"
  nvidia-smi || true
  nvidia-smi topo -m || true
  nvcc --version || /usr/local/cuda/bin/nvcc --version || true
  cmake --version | head -1
} >"$results/machine.txt" 2>&1

export EPCOMM_BUILD_DIR=${EPCOMM_BUILD_DIR:-build-gpu}
# NVSHMEM for the plugin (the low_latency_nvshmem case): the wheel of a Python environment that
# has it, when NVSHMEM_HOME is not set (CMake also asks the python3 on PATH).
if [ -z "${NVSHMEM_HOME:-}" ]; then
  for candidate in ${VIRTUAL_ENV:+$VIRTUAL_ENV/lib/python3*/site-packages/nvidia/nvshmem} /opt/*/.venv/lib/python3*/site-packages/nvidia/nvshmem; do
    if [ -f "$candidate/include/nvshmem.h" ]; then export NVSHMEM_HOME=$candidate; break; fi
  done
fi
if wants build || wants tests || wants bench || wants sweep || wants cold || wants sanitize || wants soak; then
  cmake_args=()
  [ -d .deps/googletest ] && cmake_args+=(-DEPCOMM_GTEST_SOURCE_DIR="$PWD/.deps/googletest")
  if ! scripts/build.sh "${cmake_args[@]}" >"$results/build.log" 2>&1; then
    note "BUILD FAILED (see build.log)"; tail -30 "$results/build.log"; exit 1
  fi
  note "build: ok ($(grep -c 'Building' "$results/build.log") steps)"
  { echo; echo "== epcomm-check-env --ranks 8"; "$EPCOMM_BUILD_DIR"/tools/epcomm-check-env --ranks 8; } >>"$results/machine.txt" 2>&1
fi

gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
mps_started=0
stop_mps() { [ "$mps_started" = 1 ] && echo quit | nvidia-cuda-mps-control >/dev/null 2>&1; mps_started=0; }
trap stop_mps EXIT
if [ "${gpus:-0}" -lt 48 ]; then  # the suite runs up to 48 ranks
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/epcomm-mps CUDA_MPS_LOG_DIRECTORY=/tmp/epcomm-mps-log
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then mps_started=1; sleep 1; note "MPS: started ($gpus GPU(s) for up to 48 ranks)"; else note "MPS: could not start; ranks time-slice"; fi
fi

status=0
: >"$results/tests.log"
if wants tests; then
  exclude=()
  [ -n "${EPCOMM_TEST_EXCLUDE:-}" ] && exclude=(-E "$EPCOMM_TEST_EXCLUDE")
  ctest --test-dir "$EPCOMM_BUILD_DIR" --output-on-failure --timeout "${EPCOMM_TEST_TIMEOUT:-300}" "${exclude[@]}" \
    >>"$results/tests.log" 2>&1 || status=1
  note "tests: $(grep -E 'tests passed|tests failed' "$results/tests.log" | tail -1)"
fi
if wants python; then
  python=${PYTHON:-python3}
  # The GPU machine is offline: scikit-build-core, nanobind, pytest and torch must be installed.
  if EPCOMM_PIP_OFFLINE=1 scripts/python_tests.sh >>"$results/tests.log" 2>&1; then
    note "python: $(grep -E '[0-9]+ passed' "$results/tests.log" | tail -1)"
    if timeout 120 "$python" examples/moe_layer.py --ranks 2 >>"$results/tests.log" 2>&1; then
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
bench() {  # bench LABEL ARGS...: one epcomm-bench run into bench.jsonl
  local label=$1
  shift
  if ! "$EPCOMM_BUILD_DIR"/tools/epcomm-bench "$@" --out "$results/bench.jsonl" >>"$results/bench.log" 2>&1; then
    status=1; note "bench $label: FAILED (see bench.log)"
  fi
}
if wants bench; then
  for ranks in ${EPCOMM_BENCH_RANKS:-1 2 4 8}; do
    # shellcheck disable=SC2086  # EPCOMM_BENCH_ARGS is a list of options
    bench "--ranks $ranks" --ranks "$ranks" ${EPCOMM_BENCH_ARGS:-}
  done
fi
wants sweep && bench "--ranks 8 --sweep" --ranks 8 --sweep --warmup 2 --iters 10
if wants cold; then
  for ranks in 1 8; do
    bench "--cold --ranks $ranks" --cold --trials 2 --ranks "$ranks"
    bench "--cold --ranks $ranks (pauses)" --cold --trials 2 --ranks "$ranks" --cold-order rounds --cold-pause-ms 20
  done
fi
note "bench: $(wc -l <"$results/bench.jsonl") records in bench.jsonl"
if [ -s "$results/bench.jsonl" ]; then
  "${PYTHON:-python3}" scripts/bench_report.py "$results/bench.jsonl" >"$results/report.md" 2>&1 || true
fi
if wants soak; then
  if EPCOMM_SOAK_CALLS=${EPCOMM_SOAK_CALLS:-10000} ctest --test-dir "$EPCOMM_BUILD_DIR" -L soak --output-on-failure \
      >>"$results/tests.log" 2>&1; then
    note "soak: passed"
  else
    status=1; note "soak: FAILED (see tests.log)"
  fi
fi
if wants sanitize; then
  stop_mps
  : >"$results/sanitize.log"
  for tool in memcheck racecheck synccheck; do
    for case in ${EPCOMM_SANITIZE_CASES:-layout peer lifecycle normal normal_emulated normal_hierarchical modes_across_nodes low_latency low_latency_emulated}; do
      # Each rank under the tool; --error-exitcode makes a finding fail the run.
      if timeout 900 compute-sanitizer --tool "$tool" --target-processes all --error-exitcode 9 \
          "$EPCOMM_BUILD_DIR"/tools/epcomm-launch -n 2 --timeout 880 -- "$EPCOMM_BUILD_DIR"/tests/gpu/epcomm_gpu_tests "$case" \
          >>"$results/sanitize.log" 2>&1; then
        note "sanitize $tool $case: clean"
      else
        status=1; note "sanitize $tool $case: FINDINGS or failure (see sanitize.log)"
      fi
    done
  done
fi
stop_mps
exit $status
