#!/usr/bin/env bash
# Builds epcomm and runs the main job: epcomm-bench with its default workload (8 ranks on the
# visible GPUs; several ranks per GPU run concurrently only under MPS, see docs/TESTING.md).
# Extra arguments go to epcomm-bench, e.g. scripts/bench.sh --ranks 4 --out results.jsonl
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
exec "${EPCOMM_BUILD_DIR:-build}"/tools/epcomm-bench "$@"
