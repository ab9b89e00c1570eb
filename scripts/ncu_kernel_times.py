#!/usr/bin/env python3
"""Kernel times from ncu's CSV: ``scripts/ncu_kernel_times.py NAME=FILE.csv[,FILE.csv...] ...``.

Each FILE is the output of ``ncu --csv --print-units base --metrics gpu__time_duration.sum ...``
(other lines in it, such as the program's own output or ``==PROF==`` notes, are skipped). Prints one
line per NAME: its kernels' launches, median and range in us, and the median over the first NAME's.
scripts/ab_bench.sh runs it when EPCOMM_AB_KERNEL is set. Exits 1 when a NAME has no launches.
"""

import csv
import statistics
import sys
from typing import Dict, List

METRIC = "gpu__time_duration.sum"
SCALE_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}


def launch_times_us(path: str) -> List[float]:
    """Every launch's gpu__time_duration in this CSV, in us."""
    times: List[float] = []
    with open(path, newline="") as handle:
        header: List[str] = []
        for row in csv.reader(handle):
            if "Metric Name" in row:
                header = row
                continue
            if not header or len(row) != len(header):
                continue
            fields = dict(zip(header, row))
            if fields.get("Metric Name") != METRIC:
                continue
            unit = fields.get("Metric Unit", "ns")
            if unit not in SCALE_TO_US:
                raise SystemExit(f"ncu_kernel_times.py: {path}: unknown unit '{unit}' for {METRIC}")
            times.append(float(fields["Metric Value"].replace(",", "")) * SCALE_TO_US[unit])
    return times


def main(argv: List[str]) -> int:
    if not argv or any("=" not in arg for arg in argv):
        print(__doc__.strip().split("\n\n")[0], file=sys.stderr)
        return 2
    versions: Dict[str, List[float]] = {}
    for arg in argv:
        name, files = arg.split("=", 1)
        versions[name] = [t for path in files.split(",") if path for t in launch_times_us(path)]
    status = 0
    first = None
    print(f"{'version':<24}{'launches':>9}{'median us':>11}{'min':>9}{'max':>9}{'/first':>8}")
    for name, times in versions.items():
        if not times:
            print(f"{name:<24}{0:>9}  no launches of the kernel (wrong -k regex, or the program failed?)")
            status = 1
            continue
        median = statistics.median(times)
        first = median if first is None else first
        print(f"{name:<24}{len(times):>9}{median:>11.2f}{min(times):>9.2f}{max(times):>9.2f}{median / first:>8.3f}")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
