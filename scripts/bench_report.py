#!/usr/bin/env python3
"""Markdown tables from epcomm-bench records, for docs/PERF.md.

    scripts/bench_report.py results/run/bench.jsonl [more.jsonl ...]

Steady-state records (one per op and config) become one table per setup and rank count; cold-start
records (--cold) a table of first / second / steady calls and one of init phases. Numbers are
printed as the bench wrote them; nothing is averaged away.
"""

import argparse
import json
import sys
from collections import defaultdict
from typing import Dict, Iterable, List


def load(paths: Iterable[str]) -> List[dict]:
    records = []
    for path in paths:
        with open(path, encoding="utf-8") as lines:
            for number, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as error:
                    sys.exit(f"bench_report: {path}:{number}: not JSON ({error})")
    return records


def number(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def table(header: List[str], rows: List[List[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def variant(record: dict) -> str:
    """What distinguishes records of one op: phase, cached, path, config."""
    parts = []
    if record.get("timing") == "kernel":
        parts.append("kernel time")
    for key in ("phase", "path"):
        if record.get(key):
            parts.append(str(record[key]))
    if record.get("cached"):
        parts.append("cached")
    if record.get("op") == "combine" and record.get("dispatch_dtype"):
        parts.append(f"after {record['dispatch_dtype']} dispatch")
    if "send_chunk" in record:
        parts.append(f"chunk {record['send_chunk']}, ring {record['ring_tokens']}")
    if record.get("op") == "combine" and record.get("combine_layout"):
        parts.append(f"{record['combine_layout']} layout")
    return ", ".join(parts)


def steady_tables(records: List[dict]) -> List[str]:
    groups: Dict[tuple, List[dict]] = defaultdict(list)
    for record in records:
        groups[(record.get("setup"), record.get("ranks"), record.get("git"))].append(record)
    out = []
    for (setup, ranks, git), group in sorted(groups.items(), key=lambda item: (str(item[0][0]), item[0][1])):
        rows = [[r["op"], str(r.get("dtype", "")), variant(r), number(r.get("sms")), number(r.get("median_us")),
                 number(r.get("p99_us")), number(r.get("gbps")), number(r.get("roofline_ratio")),
                 "yes" if r.get("correct") else "-"] for r in group]
        out.append(f"**{setup}, {ranks} rank(s), {group[0].get('gpu', '?')}, git {git}**\n\n" +
                   table(["op", "dtype", "variant", "SMs", "median us", "p99 us", "GB/s", "x copy", "checked"], rows))
    return out


def cold_order(record: dict) -> str:
    # Records written before --cold-order timed each op's calls in a row.
    order = record.get("order", "back-to-back")
    return f"{order}, {record['pause_ms']} ms pauses" if record.get("pause_ms") else order


def cold_tables(records: List[dict]) -> List[str]:
    if not records:
        return []
    trials = sorted({r.get("trial", 0) for r in records})
    by_op: Dict[tuple, Dict[int, dict]] = defaultdict(dict)
    for r in records:
        by_op[(r["ranks"], bool(r.get("preinitialize")), cold_order(r), r["op"])][r.get("trial", 0)] = r
    rows = []
    for (ranks, preinitialize, order, op), per_trial in sorted(
            by_op.items(), key=lambda item: (item[0][0], item[0][1], item[0][2])):
        cells = []
        for trial in trials:
            r = per_trial.get(trial)
            cells.append("-" if r is None else
                         f"{number(r.get('first_us'))} / {number(r.get('second_us'))} / {number(r.get('steady_us'))}"
                         f" (**{number(r.get('first_over_steady'))}**)")
        rows.append([number(ranks), "yes" if preinitialize else "no", order, op] + cells)
    header = ["ranks", "preinitialize", "order", "op"] + [f"trial {t}: first / second / steady (first / steady)"
                                                          for t in trials]
    out = ["**Cold start: first / second / steady call (us)**\n\n" + table(header, rows)]
    phases = []
    seen = set()
    for r in records:
        key = (r["ranks"], bool(r.get("preinitialize")), cold_order(r), r.get("trial"))
        if key in seen:
            continue
        seen.add(key)
        named = "; ".join(f"{name} {number(ms)}" for name, ms in (r.get("init_phases") or {}).items())
        phases.append([number(r["ranks"]), "yes" if key[1] else "no", key[2], number(key[3]),
                       number(r.get("cuda_context_ms")), number(r.get("init_ms")), named])
    out.append("**Init by phase (ms)**\n\n" +
               table(["ranks", "preinitialize", "order", "trial", "CUDA context", "Buffer init", "phases"], phases))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="bench.jsonl files")
    arguments = parser.parse_args()
    records = load(arguments.files)
    if not records:
        sys.exit("bench_report: no records")
    cold = [r for r in records if "first_us" in r]
    steady = [r for r in records if "first_us" not in r]
    print("\n\n".join(steady_tables(steady) + cold_tables(cold)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
