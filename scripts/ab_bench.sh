#!/usr/bin/env bash
# Compares two versions side by side on this machine: builds OLD and this tree in parallel, then
# runs epcomm-bench on each in turn, ROUNDS times, and prints the median of every record per
# version. Both versions meet the same machine state, as a speed comparison needs.
#   scripts/ab_bench.sh OLD [ROUNDS] [-- epcomm-bench options]
#   scripts/ab_bench.sh 7abc075 2 -- --ranks 2 --warmup 3 --iters 30
# OLD is a git revision, or a directory holding a source tree (for a machine whose copy of the
# repository lacks the revision: `git archive REV | tar -x -C DIR` where git has it, patches applied
# as wished, and the directory carried along). Results (one JSON file per version, every round) go
# to ${EPCOMM_AB_DIR:-ab-results}. The records name each version (EPCOMM_GIT_REVISION: the commit,
# or EPCOMM_AB_OLD_NAME / EPCOMM_AB_NEW_NAME where given). Exits 3 when no GPU is usable.
# EPCOMM_AB_KERNEL=REGEX times one kernel instead (e.g. notify_dispatch, a step too short for the
# bench to time apart): each run goes under ncu (gpu__time_duration of every matching launch; ncu
# serializes kernels at locked clocks; run it without MPS, e.g. at --ranks 1), and
# scripts/ncu_kernel_times.py prints each version's median. ncu flushes the caches before every
# launch by default (code included: a kernel with more code can read slower, docs/PERF.md, twenty-
# first session); EPCOMM_AB_NCU_ARGS adds options, e.g. "--cache-control none --clock-control none".
# EPCOMM_AB_PYTHON=1 compares the Python path instead: each version's package is pip-installed into
# a folder of its own (built in its build folder), and `python -m epcomm.bench` runs with the
# options after --, e.g. -- --ranks 1 --tokens 512,4096 [--back-to-back 50: OLD from 546ddd7 on;
# --combine-layout colocated: OLD from 199ded5 on].
set -euo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
  sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
python_mode=${EPCOMM_AB_PYTHON:-0}
if [ "$python_mode" = 1 ] && [ -n "${EPCOMM_AB_KERNEL:-}" ]; then
  echo "ab_bench.sh: EPCOMM_AB_PYTHON and EPCOMM_AB_KERNEL cannot be combined (ncu times the C++ bench)" >&2
  exit 2
fi
old_rev=$1
shift
rounds=2
if [ $# -gt 0 ] && [ "$1" != "--" ]; then
  rounds=$1
  shift
fi
[ $# -gt 0 ] && [ "$1" = "--" ] && shift
case "$rounds" in '' | *[!0-9]*) echo "ab_bench.sh: ROUNDS '$rounds' must be a positive integer" >&2; exit 2 ;; esac
if [ -d "$old_rev" ]; then
  [ -f "$old_rev/CMakeLists.txt" ] || { echo "ab_bench.sh: $old_rev is a directory but no source tree (no CMakeLists.txt)" >&2; exit 2; }
  old_commit=${EPCOMM_AB_OLD_NAME:-$(basename "$old_rev")}
else
  old_commit=$(git rev-parse --short=12 "$old_rev^{commit}") || { echo "ab_bench.sh: no commit or directory '$old_rev'" >&2; exit 2; }
  old_commit=${EPCOMM_AB_OLD_NAME:-$old_commit}
fi
new_commit=$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && new_commit="$new_commit-dirty"
new_commit=${EPCOMM_AB_NEW_NAME:-$new_commit}

out=${EPCOMM_AB_DIR:-ab-results}
work=${EPCOMM_AB_WORK:-build-ab}
mkdir -p "$out" "$work"
old_src=$old_rev
if [ ! -d "$old_rev" ]; then
  old_src=$work/old-src
  rm -rf "$old_src"
  mkdir -p "$old_src"
  git archive "$old_rev" | tar -x -C "$old_src"
fi

jobs=$(( $(nproc) / 2 > 0 ? $(nproc) / 2 : 1 ))
build() {  # build SOURCE_DIR BUILD_DIR REVISION
  EPCOMM_GIT_REVISION=$3 cmake -S "$1" -B "$2" -G Ninja -DCMAKE_BUILD_TYPE=Release -DEPCOMM_BUILD_TESTS=OFF \
    >"$2.log" 2>&1 && cmake --build "$2" -j "$jobs" >>"$2.log" 2>&1 || return 1
  [ "$python_mode" = 1 ] || return 0
  # A folder of its own, emptied first: pip --target leaves a package that is already there alone.
  rm -rf "$2-site"
  EPCOMM_GIT_REVISION=$3 CMAKE_BUILD_PARALLEL_LEVEL=$jobs "${PYTHON:-python3}" -m pip install --no-build-isolation \
    --target "$2-site" -C "build-dir=$(cd "$2" && pwd)" -C cmake.define.EPCOMM_PIP_BUILD=OFF \
    -C cmake.define.EPCOMM_BUILD_TESTS=OFF -C cmake.build-type=Release "$(cd "$1" && pwd)" >>"$2.log" 2>&1
}
echo "ab_bench: building $old_commit (old) and $new_commit (this tree) with $jobs cores each"
build "$old_src" "$work/old" "$old_commit" & old_pid=$!
build . "$work/new" "$new_commit" & new_pid=$!
wait "$old_pid" || { echo "ab_bench: the old build failed (see $work/old.log)" >&2; exit 1; }
wait "$new_pid" || { echo "ab_bench: the new build failed (see $work/new.log)" >&2; exit 1; }

# NVLink multicast stays off in every process we start.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
kernel=${EPCOMM_AB_KERNEL:-}
status=0
for round in $(seq 1 "$rounds"); do
  for version in old new; do
    set +e
    if [ "$python_mode" = 1 ]; then
      PYTHONPATH="$(cd "$work/$version-site" && pwd)${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -m epcomm.bench \
        "$@" --out "$out/$version.jsonl" >"$out/$version-$round.log" 2>&1
    elif [ -n "$kernel" ]; then
      # shellcheck disable=SC2086  # EPCOMM_AB_NCU_ARGS is a list of options
      ncu --target-processes all -k "regex:$kernel" --metrics gpu__time_duration.sum --csv --print-units base \
        ${EPCOMM_AB_NCU_ARGS:-} "$work/$version/tools/epcomm-bench" "$@" >"$out/$version-$round.kernel.csv" 2>"$out/$version-$round.log"
    else
      "$work/$version/tools/epcomm-bench" "$@" --out "$out/$version.jsonl" >"$out/$version-$round.log" 2>&1
    fi
    code=$?
    set -e
    if [ "$code" -eq 3 ]; then cat "$out/$version-$round.log"; exit 3; fi
    [ "$code" -ne 0 ] && { status=1; echo "ab_bench: $version, round $round: epcomm-bench exited $code (see $out/$version-$round.log)"; }
  done
done
if [ -n "$kernel" ]; then
  files() { local list="" round; for round in $(seq 1 "$rounds"); do list="$list${list:+,}$out/$1-$round.kernel.csv"; done; echo "$list"; }
  echo "ab_bench: kernel time of '$kernel' (ncu), every launch of every round"
  "${PYTHON:-python3}" scripts/ncu_kernel_times.py "$old_commit=$(files old)" "$new_commit=$(files new)" || status=1
  exit $status
fi
"${PYTHON:-python3}" - "$out/old.jsonl" "$out/new.jsonl" <<'PY'
import collections, json, statistics, sys

def medians(path):
    runs = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        key = (r["op"], r.get("timing", ""), r.get("dispatch_dtype") or r.get("dtype", ""),
               "cached" if r.get("cached") else (r.get("phase") or r.get("path") or ""),
               r.get("direction", "both" if r["op"] == "copy" and r.get("path") != "local" else ""),
               r.get("sms"), r.get("ring_tokens"), r.get("tokens"), r.get("send_chunk"),
               # dispatch is the same in both layouts; records from before the choice are split's
               r.get("combine_layout", "split") if r["op"] == "combine" else None)
        runs[key].append((r["median_us"], r.get("correct"), r.get("host_median_us")))
    return runs

old, new = medians(sys.argv[1]), medians(sys.argv[2])
def host(runs, key):  # the Python path's host time inside the call, where records give it
    values = [h for _, _, h in runs.get(key, []) if h is not None]
    return f"{statistics.median(values):.1f}" if values else "-"

print(f"{'op':<12}{'timing':<11}{'dtype':<6}{'variant':<13}{'sms':>4}{'ring':>5}{'tokens':>7}{'old us':>10}{'new us':>10}"
      f"{'new/old':>8}  correct  host us old / new")
for key in new:
    n = statistics.median(v for v, _, _ in new[key])
    o = statistics.median(v for v, _, _ in old[key]) if key in old else None
    ok = "yes" if all(c for _, c, _ in new[key]) else ("-" if all(c is None for _, c, _ in new[key]) else "NO")
    op, timing, dtype, variant, direction, sms, ring, tokens, _, layout = key
    variant = f"{variant} {direction} {layout or ''}".strip()
    print(f"{op:<12}{timing[:10]:<11}{dtype:<6}{variant[:12]:<13}{sms if sms is not None else '':>4}"
          f"{ring if ring is not None else '':>5}{tokens:>7}{(f'{o:.1f}' if o else '-'):>10}{n:>10.1f}"
          f"{(f'{n / o:.3f}' if o else '-'):>8}  {ok:<7}  {host(old, key)} / {host(new, key)}")
PY
exit $status
