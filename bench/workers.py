"""Paired measurements in fresh processes, shared by the throughput benches (decode.py,
real_ppl.py): each side runs as ``python BENCH --worker SIDE JSON`` so its peak RSS and its
caches are its own; the worker prints its result as the last line of stdout."""

import json
import resource
import subprocess
import sys


def maxrss_mb(who: int) -> float:
    """Peak resident set of this process (resource.RUSAGE_SELF) or of its waited-for children
    (RUSAGE_CHILDREN), in MB. For this process, Linux's VmHWM (the peak of its own address space):
    ru_maxrss also keeps the peak of the process it was spawned from (Linux carries it across
    fork and exec), so a worker spawned by a parent holding 650 MB reported 650 MB whatever it
    used. A child's figure keeps that floor: the spawning worker's own RSS at the time (tens of MB)."""
    if who == resource.RUSAGE_SELF:
        try:
            with open("/proc/self/status", encoding="ascii") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024.0
        except OSError:
            pass
    return resource.getrusage(who).ru_maxrss / 1024.0


def run_worker(script: str, side: str, args: dict) -> dict:
    """One measurement of ``side`` by ``script`` in a fresh process: its stdout's last line is the
    JSON result; a failing worker raises RuntimeError with the tail of its stderr."""
    p = subprocess.run([sys.executable, script, "--worker", side, json.dumps(args)], capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{side} worker failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def serve_worker(worker: list, sides: dict) -> None:
    """The worker side of :func:`run_worker`: ``worker`` = [side, JSON args] from ``--worker``,
    ``sides`` = {side: function(args) -> result dict}."""
    side, args = worker[0], json.loads(worker[1])
    print(json.dumps(sides[side](args)))
