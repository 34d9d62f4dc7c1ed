#!/usr/bin/env python3
"""Summarise an ncu details-page CSV (`ncu --csv --page details` with the
SpeedOfLight, Occupancy, LaunchStats, WarpStateStats and
MemoryWorkloadAnalysis sections): one block per kernel name (its first
profiled launch), the metrics that say what bounds it, and the stall and
occupancy rules ncu printed. Usage: ncu_detail_table.py FILE[.gz] [NAME_RE]"""
import collections, csv, gzip, re, sys

WANT = [
    "Duration", "DRAM Throughput", "Memory Throughput", "Compute (SM) Throughput",
    "Mem Busy", "Max Bandwidth", "L1/TEX Hit Rate", "L2 Hit Rate",
    "Registers Per Thread", "Theoretical Occupancy", "Achieved Occupancy",
    "Block Limit Registers", "Block Limit Shared Mem", "Dynamic Shared Memory Per Block",
    "Static Shared Memory Per Block", "Warp Cycles Per Issued Instruction",
]


def main():
    path = sys.argv[1]
    pat = re.compile(sys.argv[2]) if len(sys.argv) > 2 else None
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        rows = list(csv.DictReader(line for line in f if line.startswith('"')))
    launches = collections.OrderedDict()
    for r in rows:
        key = (r["ID"], r["Kernel Name"], r["Grid Size"], r["Block Size"])
        d = launches.setdefault(key, {"rules": []})
        if r["Metric Name"]:
            d[r["Metric Name"]] = f'{r["Metric Value"]} {r["Metric Unit"]}'.strip()
        if r.get("Rule Name") and r.get("Rule Description"):
            d["rules"].append((r["Rule Name"], r["Rule Description"]))
    seen = set()
    for (lid, name, grid, block), d in launches.items():
        if name in seen or (pat and not pat.search(name)):
            continue
        seen.add(name)
        print(f"== {name} grid={grid} block={block} (launch {lid})")
        for w in WANT:
            if w in d:
                print(f"   {w:36s} {d[w]}")
        for rule, text in d["rules"]:
            if "stall" in text.lower() or "Occupancy" in rule:
                print(f"   * {rule}: {text[:300]}")


if __name__ == "__main__":
    main()
