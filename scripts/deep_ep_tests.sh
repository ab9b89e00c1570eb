#!/usr/bin/env bash
# Runs deep_ep's own tests of its Buffer API against epcomm, the way a deep_ep user runs them, with
# `import deep_ep` answered by epcomm (python/deep_ep_shim on PYTHONPATH):
#   scripts/deep_ep_tests.sh DEEP_EP_SOURCE_DIR [--num-processes N]     (default 2 ranks)
# DEEP_EP_SOURCE_DIR is a checkout of github.com/deepseek-ai/DeepEP: deep_ep 2 keeps these tests
# in tests/legacy (they import deep_ep.utils' envs, math and testing, which epcomm provides), deep_ep
# 1 in tests. It runs test_intranode.py, test_low_latency.py and test_low_latency.py --use-logfmt.
# epcomm must be importable by PYTHON (default python3; scripts/python_tests.sh installs it), and
# no real deep_ep should be installed there. Ranks that share GPUs run under MPS (started here when
# needed) with a gloo process group (epcomm.utils.envs.init_dist picks it; deep_ep 1's own
# tests/utils.py always takes NCCL, which refuses two ranks on one GPU). Each test gets
# EPCOMM_DEEP_EP_TEST_TIMEOUT seconds (default 600; its rank processes share its process group,
# which timeout signals too). Exits non-zero if a test failed. N: deep_ep's tests want it to divide
# 256 and 288, and test_intranode gives each rank 24 SMs: on one 132-SM GPU, 1, 2 or 4.
set -uo pipefail
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
if [ ! -d "$1" ]; then
  echo "deep_ep_tests.sh: no directory $1" >&2
  exit 2
fi
source_dir=$(cd "$1" && pwd)  # before the cd below: a relative path is the caller's
shift
cd "$(dirname "$0")/.." || exit 2
root=$PWD
ranks=2
if [ $# -ge 2 ] && [ "$1" = "--num-processes" ]; then
  ranks=$2
  shift 2
fi
if [ $# -gt 0 ]; then
  echo "deep_ep_tests.sh: unknown arguments: $*" >&2
  exit 2
fi
case "$ranks" in '' | *[!0-9]* | 0*) echo "deep_ep_tests.sh: --num-processes '$ranks' must be a positive integer" >&2; exit 2 ;; esac
tests=""
for candidate in "$source_dir/tests/legacy" "$source_dir/tests"; do
  if [ -f "$candidate/test_intranode.py" ]; then tests=$candidate; break; fi
done
if [ -z "$tests" ]; then
  echo "deep_ep_tests.sh: no test_intranode.py in $source_dir/tests/legacy or $source_dir/tests" >&2
  exit 2
fi
python=${PYTHON:-python3}
if ! PYTHONPATH="$root/python/deep_ep_shim${PYTHONPATH:+:$PYTHONPATH}" "$python" -c \
    'import deep_ep, sys; sys.exit(0 if deep_ep.__name__ == "epcomm" else 1)' 2>/dev/null; then
  echo "deep_ep_tests.sh: 'import deep_ep' does not give epcomm under $python (is epcomm installed? scripts/python_tests.sh)" >&2
  exit 1
fi
if ! "$python" -c 'import torch' 2>/dev/null; then
  echo "deep_ep_tests.sh: deep_ep's tests need torch, which $python cannot import" >&2
  exit 1
fi
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
# shellcheck source=scripts/mps.sh
source scripts/mps.sh
trap mps_stop EXIT
mps_share "$ranks" deep_ep_tests.sh

status=0
run_test() {  # run_test SCRIPT [ARGS...]
  local started=$SECONDS code
  echo "deep_ep_tests.sh: $* --num-processes $ranks (in $tests)"
  (cd "$tests" && PYTHONPATH="$root/python/deep_ep_shim${PYTHONPATH:+:$PYTHONPATH}" \
    timeout --kill-after=10 "${EPCOMM_DEEP_EP_TEST_TIMEOUT:-600}" "$python" "$@" --num-processes "$ranks")
  code=$?
  if [ "$code" -eq 0 ]; then
    echo "deep_ep_tests.sh: PASSED $* ($((SECONDS - started)) s)"
  else
    status=1
    echo "deep_ep_tests.sh: FAILED $* (exit $code$([ "$code" -eq 124 ] && echo ', timed out'), $((SECONDS - started)) s)"
  fi
}
run_test test_intranode.py
run_test test_low_latency.py
run_test test_low_latency.py --use-logfmt
exit $status
