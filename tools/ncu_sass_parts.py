#!/usr/bin/env python3
"""Where one kernel's warps spend their time, by part of its SASS, from Nsight Compute.

usage:  ncu_sass_parts.py <sass.csv> [--min-share F] [--top N] [--ops N]

<sass.csv> is the source page of a report taken with `--set full` (or any set with the
source counters), printed as SASS, e.g.

    ncu --set full --import-source no -k regex:attend_decode --launch-skip 4200 --launch-count 1 \\
        -o att bench_decode --batch 256 --fp8-kv 1 --fp8-weights 1 --runs 1
    ncu -i att.ncu-rep --page source --csv --print-source sass > att_sass.csv

A part is a run of consecutive instructions that executed the same number of times (a
loop's body, a branch taken by some warps, the code every warp runs once). For each part
that holds at least --min-share of the kernel's executed instructions or of its stall
samples, it prints the instruction range, how many times the part ran, its instructions
per run, its shares of the executed instructions and of the samples, and the stall
reasons that took most of its samples; --ops N adds its N most executed opcodes, per run.
Then the --top N instructions by samples, each with its part (by instruction range) and its
two main reasons.

Samples tell where the warps wait, executed instructions tell where the issue slots go:
a part with many samples and few instructions waits on something (the reasons say what),
one with the opposite is bound by its own instructions.
"""
import argparse
import collections
import csv
import sys


def read_sass(path):
    """The kernel's instructions in order: source, executed, samples, reasons {name: samples}."""
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    # The page starts with a line naming the kernel, then the header.
    start = next((i for i, line in enumerate(lines) if "Source" in line and "Instructions Executed" in line), None)
    if start is None:
        sys.exit(f"{path}: no 'Source' and 'Instructions Executed' columns; print the report's "
                 "source page with --page source --csv --print-source sass")
    header = lines[start]
    column = {name: header.index(name) for name in header}
    samples_column = column.get("Warp Stall Sampling (All Samples)")
    if samples_column is None:
        sys.exit(f"{path}: no stall samples; take the report with --set full")
    reasons = [(name[len("stall_"):], i) for name, i in column.items()
               if name.startswith("stall_") and "Not Issued" not in name]

    def number(text):
        try:
            return int(float(text))
        except ValueError:
            return 0

    rows = []
    for line in lines[start + 1:]:
        if len(line) < len(header):
            continue
        rows.append({
            "source": line[column["Source"]].strip(),
            "executed": number(line[column["Instructions Executed"]]),
            "samples": number(line[samples_column]),
            "reasons": {name: number(line[i]) for name, i in reasons},
        })
    if not rows:
        sys.exit(f"{path}: no instructions")
    return rows


def parts_of(rows):
    """[first, last] index ranges of consecutive rows with the same execution count."""
    parts, first = [], 0
    for i in range(1, len(rows) + 1):
        if i == len(rows) or rows[i]["executed"] != rows[first]["executed"]:
            parts.append((first, i - 1))
            first = i
    return parts


def opcode(source):
    words = source.split()
    if words and words[0].startswith("@"):  # a predicate guard
        words = words[1:]
    return words[0] if words else ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv")
    parser.add_argument("--min-share", type=float, default=0.01,
                        help="list a part holding at least this share of the instructions or samples")
    parser.add_argument("--top", type=int, default=15, help="instructions listed by samples")
    parser.add_argument("--ops", type=int, default=0, help="opcodes listed per part")
    args = parser.parse_args()

    rows = read_sass(args.csv)
    executed = sum(r["executed"] for r in rows)
    samples = sum(r["samples"] for r in rows)
    part_of = {}
    print(f"{len(rows)} instructions, {executed} warp instructions executed, {samples} stall samples")
    print(f"{'part':>11} {'runs':>8} {'instr':>6} {'executed':>9} {'samples':>8}  main reasons")
    for first, last in parts_of(rows):
        for i in range(first, last + 1):
            part_of[i] = f"{first}-{last}"
        part = rows[first:last + 1]
        part_executed = sum(r["executed"] for r in part)
        part_samples = sum(r["samples"] for r in part)
        if part_executed < args.min_share * executed and part_samples < args.min_share * max(samples, 1):
            continue
        reasons = collections.Counter()
        for r in part:
            reasons.update(r["reasons"])
        main_reasons = ", ".join(f"{name} {count / max(part_samples, 1):.0%}"
                                 for name, count in reasons.most_common(3) if count)
        print(f"{first:>5}-{last:<5} {part[0]['executed']:>8} {len(part):>6} {part_executed / max(executed, 1):>9.1%} "
              f"{part_samples / max(samples, 1):>8.1%}  {main_reasons}")
        if args.ops:
            ops = collections.Counter()
            for r in part:
                ops[opcode(r["source"])] += r["executed"]
            runs = max(part[0]["executed"], 1)
            print("              " + "  ".join(f"{name} {count / runs:g}" for name, count in ops.most_common(args.ops)))

    print(f"\nthe {args.top} instructions with the most samples (index, part, samples, executed, reasons):")
    ranked = sorted(range(len(rows)), key=lambda i: -rows[i]["samples"])[:args.top]
    for i in sorted(ranked):
        r = rows[i]
        reasons = ", ".join(f"{name} {count}" for name, count in
                            sorted(r["reasons"].items(), key=lambda item: -item[1])[:2] if count)
        print(f"{i:>5} {part_of[i]:>11} {r['samples']:>5} {r['executed']:>8}  {r['source'][:58]:<58}  {reasons}")


if __name__ == "__main__":
    main()
