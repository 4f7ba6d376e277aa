#!/usr/bin/env python3
"""Where one step's GPU time goes, from Nsight Compute's per-kernel durations.

usage:  ncu_step_breakdown.py <ncu.csv> [--step-end REGEX] [--top N] [--gemm-names]

<ncu.csv> is what `ncu --csv --metrics gpu__time_duration.sum ...` printed, e.g.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv \\
        --launch-skip 3000 --launch-count 2500 bench_train --steps 3 > train.csv

A step ends with the kernel whose name matches --step-end (default: the optimizer's AdamW
kernel; neighbouring launches of it are one step end). For each whole step between two
ends it prints the kernel count, the sum of their durations, and that sum by kernel (all
cuBLASLt GEMMs, nvjet_*, as one line; with --gemm-names each cuBLASLt kernel on a line of
its own, which tells a step's projections apart where their shapes pick different
kernels). Compare the sum with the step's wall time from the benchmark: the difference is
what the kernels one by one do not show (launch gaps, and clocks lowered under load, since
ncu times each kernel alone).
"""
import argparse
import collections
import csv
import re
import sys


def kernel_durations(path):
    """(short kernel name, microseconds) in launch order."""
    header, launches = None, []
    with open(path, newline="") as f:
        for row in csv.reader(f):
            if "Kernel Name" in row and "Metric Value" in row:
                header = row
                continue
            if header is None or len(row) != len(header):
                continue
            record = dict(zip(header, row))
            if record["Metric Name"] != "gpu__time_duration.sum":
                continue
            value = float(record["Metric Value"].replace(",", ""))
            scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[record["Metric Unit"]]
            launches.append((re.sub(r"\(.*", "", record["Kernel Name"]), value * scale))
    if header is None:
        sys.exit(f"{path}: no Nsight Compute CSV header (Kernel Name, Metric Value) found")
    return launches


def step_ends(launches, pattern):
    """The index of each step's last kernel: the last of every run of neighbouring matches."""
    matches = [i for i, (name, _) in enumerate(launches) if re.search(pattern, name)]
    ends = []
    for i in matches:
        if ends and i - ends[-1] <= 3:
            ends[-1] = i
        else:
            ends.append(i)
    return ends


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("csv")
    parser.add_argument("--step-end", default=r"adamw_runs_kernel")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--gemm-names", action="store_true")
    args = parser.parse_args()
    launches = kernel_durations(args.csv)
    ends = step_ends(launches, args.step_end)
    if len(ends) < 2:
        sys.exit(f"{args.csv}: fewer than two step ends ({args.step_end}) among {len(launches)} kernels: "
                 "profile more launches")
    for first, last in zip(ends, ends[1:]):
        step = launches[first + 1:last + 1]
        by_kernel = collections.defaultdict(lambda: [0, 0.0])
        for name, us in step:
            key = "cuBLASLt GEMMs (nvjet_*)" if name.startswith("nvjet") and not args.gemm_names else name
            by_kernel[key][0] += 1
            by_kernel[key][1] += us
        total = sum(us for _, us in step)
        print(f"step: {len(step)} kernels, {total / 1e3:.2f} ms of kernel time")
        for name, (count, us) in sorted(by_kernel.items(), key=lambda item: -item[1][1])[:args.top]:
            print(f"  {us / 1e3:8.3f} ms  {100 * us / total:5.1f}%  {count:5d} x {us / count:8.2f} us  {name[:100]}")


if __name__ == "__main__":
    main()
