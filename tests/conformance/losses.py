"""What the training-equivalence scripts share: running a command quietly, reading a program's
per-step loss file, and comparing two runs' losses bit for bit.

A loss file has one line a step, `STEP HEXBITS REST`; a step's last line wins (a program
restarted from a checkpoint writes the steps after it again).
"""

import os
import subprocess

QUIET = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}


def run(cmd, timeout=600, env=None, check=True):
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or QUIET)
    if check and done.returncode != 0:
        raise AssertionError(f"{cmd} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def losses(path):
    """step -> hex bits, the last line of each step winning."""
    out = {}
    with open(path) as f:
        for line in f:
            step, bits, _ = line.split(" ", 2)
            out[int(step)] = bits
    return out


def compare(label, expected, got, minimum):
    """[] when `got` has every step of `expected` with the same bits (and the plain run made at
    least `minimum` steps), else one line saying where they first differ."""
    if len(expected) < minimum:
        return [f"{label}: the plain run made {len(expected)} steps, fewer than {minimum}"]
    if expected != got:
        diff = [s for s in sorted(expected) if expected.get(s) != got.get(s)]
        first = diff[0] if diff else None
        return [f"{label}: {len(diff)} of {len(expected)} steps differ (or are missing), first at step {first}"
                f" ({expected.get(first)} vs {got.get(first)})"]
    print(f"ok    {label}: {len(expected)} losses equal bit for bit")
    return []
