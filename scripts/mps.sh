# shellcheck shell=bash
# Sourced by the scripts that start rank processes: MPS for ranks that share GPUs.
#   mps_share RANKS WHO   when RANKS processes share the visible GPUs, starts an MPS daemon for
#                         this run (unless one runs already, or EPCOMM_NO_MPS=1) and says so
#                         (time-sliced, ranks are ~50x slower)
#   mps_stop              stops the daemon mps_share started, if it did
mps_started=0

mps_stop() {
  if [ "$mps_started" = 1 ]; then
    echo quit | nvidia-cuda-mps-control >/dev/null 2>&1 || true
    mps_started=0
  fi
}

mps_share() {
  local ranks=$1 who=$2 gpus
  case "$ranks" in '' | *[!0-9]*) return 0 ;; esac  # not a count: the program itself will say so
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  if [ "${gpus:-0}" -eq 0 ] || [ "$ranks" -le "$gpus" ] || [ "${EPCOMM_NO_MPS:-0}" = 1 ]; then return 0; fi
  if ! command -v nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "$who: $ranks ranks share $gpus GPU(s) and MPS is not installed: they will time-slice (much slower)"
  elif pgrep -x nvidia-cuda-mps >/dev/null 2>&1 || pgrep -f nvidia-cuda-mps-control >/dev/null 2>&1; then
    echo "$who: $ranks ranks share $gpus GPU(s); using the MPS daemon that is already running"
  else
    export CUDA_MPS_PIPE_DIRECTORY=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/epcomm-mps} CUDA_MPS_LOG_DIRECTORY=${CUDA_MPS_LOG_DIRECTORY:-/tmp/epcomm-mps-log}
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    if nvidia-cuda-mps-control -d; then
      mps_started=1
      sleep 1
      echo "$who: $ranks ranks share $gpus GPU(s): started MPS for this run (stopped at the end)"
    else
      echo "$who: $ranks ranks share $gpus GPU(s) and MPS did not start: they will time-slice (much slower)"
    fi
  fi
}
