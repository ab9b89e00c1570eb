#!/usr/bin/env bash
# Builds epcomm and runs the main job: epcomm-bench with its default workload (8 ranks on the
# visible GPUs), then prints its records as tables (scripts/bench_report.py).
# Extra arguments go to epcomm-bench, e.g. scripts/bench.sh --ranks 4 --out results.jsonl
# When ranks must share GPUs, MPS makes them run at once (time-sliced they are ~50x slower):
# this script starts an MPS daemon of its own for the run, unless one is running already, and says
# so; EPCOMM_NO_MPS=1 leaves MPS alone.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
bench="${EPCOMM_BUILD_DIR:-build}"/tools/epcomm-bench
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1

ranks=8
out=""
args=("$@")
for ((i = 0; i < ${#args[@]}; ++i)); do
  case "${args[i]}" in
    --ranks) ranks=${args[i + 1]:-8} ;;
    --out) out=${args[i + 1]:-} ;;
  esac
done
records=$out
if [ -z "$records" ]; then
  records=$(mktemp --suffix=.jsonl)
  trap 'rm -f "$records"' EXIT
  args+=(--out "$records")
fi

# shellcheck source=scripts/mps.sh
source scripts/mps.sh
trap 'mps_stop; [ -z "$out" ] && rm -f "$records"' EXIT
mps_share "$ranks" bench.sh

set +e
"$bench" "${args[@]}"
status=$?
set -e
if [ -s "$records" ] && command -v "${PYTHON:-python3}" >/dev/null 2>&1; then
  echo
  "${PYTHON:-python3}" scripts/bench_report.py "$records" || true
fi
exit $status
