#!/usr/bin/env python3
"""Read a tandem run file and checkpoint with h5py, the way a user would.

usage:  check_h5py.py <run folder>            (run.h5 and the newest ckpt_*.h5 in it)
        check_h5py.py <run.h5> <ckpt_N.h5>

Prints the run's metrics table and every checkpoint tensor (BF16 decoded through
numpy), checks the attributes against the data, and exits non-zero on a mismatch.
Files written by `write_io_sample` also have their known values checked.
"""
import pathlib
import sys

import h5py
import numpy as np


def decode(dataset):
    """The tensor's values as numpy sees them; BF16 bits are widened into float32."""
    values = dataset[()]
    if dataset.attrs["dtype"] == "BF16":
        return (np.asarray(values, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return values  # F16 reads as float16, BOOL as bool, F8_* as their uint8 bits


def datasets_below(group):
    names = []
    group.visititems(lambda name, item: names.append(name) if isinstance(item, h5py.Dataset) else None)
    return sorted(names)


def check_run(path):
    with h5py.File(path, "r") as f:
        print(f"{path}: tandem {f.attrs['version']} ({f.attrs['git_revision']}), "
              f"{f.attrs['ranks']} ranks, started {f.attrs['started_at']}")
        print("  devices:", list(f["devices"].asstr()[:]))
        print("  deck:", f["deck"].asstr()[()].splitlines()[:3], "...")
        steps = f["metrics/step"][:]
        names = [name for name in datasets_below(f["metrics"]) if name != "step"]
        print("  " + "step".rjust(6) + "".join(name.rjust(20) for name in names))
        for row, step in enumerate(steps):
            print("  " + str(step).rjust(6) + "".join(f"{f['metrics/' + name][row]:20.6g}" for name in names))
        for name in names:
            assert len(f["metrics/" + name]) == len(steps), f"metric {name} has a different length than step"
        if "reward_mean" in names and list(steps) == [1, 2, 3] and "kl" in names:  # write_io_sample's run
            assert np.isnan(f["metrics/kl"][:2]).all() and f["metrics/kl"][2] == 0.125, "kl back-fill"
            assert np.isnan(f["metrics/loss"][2]), "loss missing at step 3"


def check_checkpoint(path):
    with h5py.File(path, "r") as f:
        assert f.attrs["complete"] == 1, "checkpoint is not marked complete"
        ranks = f["rng_states"].attrs["ranks"]
        states = [bytes(f[f"rng_states/rank_{rank:05d}"][:]) for rank in range(ranks)]
        print(f"{path}: step {f.attrs['step']}, data cursor {f.attrs['data_cursor']}, "
              f"{ranks} rng states of {[len(s) for s in states]} bytes")
        for name in datasets_below(f["tensors"]):
            dataset = f["tensors/" + name]
            shape_attribute = dataset.attrs["shape"]
            shape = () if isinstance(shape_attribute, h5py.Empty) else tuple(int(n) for n in shape_attribute)
            assert shape == dataset.shape, f"{name}: shape attribute {shape} but dataset {dataset.shape}"
            values = decode(dataset)
            dtype = dataset.attrs["dtype"]
            expected_numpy = {"F16": np.float16, "BOOL": np.bool_, "BF16": np.float32}.get(dtype)
            if expected_numpy is not None:
                assert values.dtype == expected_numpy, f"{name}: {dtype} came back as {values.dtype}"
            print(f"  {name}: {dtype} {list(shape)} -> numpy {values.dtype}, first values {np.ravel(values)[:6]}")
        if "tensors/sample/bf16" in f:  # write_io_sample's checkpoint
            known = [1.0, -2.0, 0.5, 3.140625]
            assert list(decode(f["tensors/sample/bf16"])) == known, "bf16 values"
            assert list(decode(f["tensors/sample/f16"]).astype(np.float32)) == known, "f16 values"
            assert list(decode(f["tensors/sample/mask"])) == [True, False, False, True], "bool values"
            assert states == [b"rank0 state"], "rng state"


def main(arguments):
    if len(arguments) == 1:
        folder = pathlib.Path(arguments[0])
        checkpoints = sorted(folder.glob("ckpt_*.h5"))
        if not checkpoints:
            sys.exit(f"no ckpt_*.h5 in {folder}")
        run_path, checkpoint_path = folder / "run.h5", checkpoints[-1]
    elif len(arguments) == 2:
        run_path, checkpoint_path = map(pathlib.Path, arguments)
    else:
        sys.exit(__doc__)
    check_run(run_path)
    check_checkpoint(checkpoint_path)
    print("h5py read both files; all checks passed")


if __name__ == "__main__":
    main(sys.argv[1:])
