#!/usr/bin/env python3
"""A noisy neighbour for the calibration loop's benches (issue 63): keeps one core at a time busy
for spells of a few to tens of seconds, with pauses between, the way the shared CI VMs' neighbours
slow one vCPU at a time (docs/CALIBRATION.md). A busy spell runs a spinning process pinned to the
core, so a rank on that core gets about half of it. Seeded: the same spells each time.

Usage: bench/neighbour.py [--seed N] [--busy 5,30] [--idle 5,30] [--cores 0,1] [--duration S]
Stops after --duration seconds (default: runs until killed)."""
import argparse
import os
import random
import signal
import sys
import time


def spin(core, seconds):
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {core})
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            pass
        os._exit(0)
    return pid


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=63)
    p.add_argument("--busy", default="5,30", help="a spell's length in seconds, least,most")
    p.add_argument("--idle", default="5,30", help="the pause between spells, least,most")
    p.add_argument("--cores", default="0,1")
    p.add_argument("--duration", type=float, default=float("inf"))
    a = p.parse_args()
    rng = random.Random(a.seed)
    busy = [float(x) for x in a.busy.split(",")]
    idle = [float(x) for x in a.idle.split(",")]
    cores = [int(c) for c in a.cores.split(",")]
    start = time.monotonic()
    child = 0

    def stop(*_):
        if child:
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while time.monotonic() - start < a.duration:
        core, spell = rng.choice(cores), rng.uniform(*busy)
        print(f"{time.monotonic() - start:7.1f} s: core {core} busy for {spell:.1f} s", flush=True)
        child = spin(core, spell)
        os.waitpid(child, 0)
        child = 0
        time.sleep(rng.uniform(*idle))


if __name__ == "__main__":
    main()
