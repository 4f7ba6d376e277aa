#!/usr/bin/env python3
"""Compare the per-step metrics of two tandem runs, e.g. N ranks against 1 rank.

usage:  compare_runs.py <run_a.h5> <run_b.h5> [--metrics loss,reward_mean,grad_norm] [--rtol 1e-3] [--atol 1e-6]

Prints both runs' values step by step and the largest difference per metric; exits 1
when a difference exceeds atol + rtol * |b| (the stated tolerance of the comparison).
"""
import argparse
import sys

import h5py
import numpy as np


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("run_a")
    parser.add_argument("run_b")
    parser.add_argument("--metrics", default="loss,reward_mean,grad_norm")
    parser.add_argument("--rtol", type=float, default=1e-3)
    parser.add_argument("--atol", type=float, default=1e-6)
    args = parser.parse_args()
    names = args.metrics.split(",")
    with h5py.File(args.run_a, "r") as a, h5py.File(args.run_b, "r") as b:
        print(f"a: {args.run_a} ({a.attrs['ranks']} ranks)   b: {args.run_b} ({b.attrs['ranks']} ranks)")
        steps = a["metrics/step"][:]
        if not np.array_equal(steps, b["metrics/step"][:]):
            sys.exit("the runs have different steps")
        failed = False
        for name in names:
            va, vb = a["metrics"][name][:], b["metrics"][name][:]
            diff = np.abs(va - vb)
            bad = diff > args.atol + args.rtol * np.abs(vb)
            print(f"{name}: max |a - b| = {diff.max():.3g}" + ("  EXCEEDS the tolerance" if bad.any() else ""))
            for step, x, y in zip(steps, va, vb):
                print(f"  step {step:4d}  a {x: .8g}  b {y: .8g}")
            failed = failed or bad.any()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
