"""The resident thread pool (csrc/ork/pool.c): workers left over from a call with many threads must
not cost anything to later, smaller calls (they stay asleep: no wake-up, no spinning)."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(r"""
    import os, sys
    import numpy as np
    import orkpy

    def cpu_ns():
        # CPU time of every thread of this process, from the scheduler (nanoseconds)
        out = {}
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    out[tid] = int(f.read().split()[0])
            except OSError:
                pass
        return out

    rng = np.random.default_rng(0)
    big = orkpy.pack(orkpy.quantize(rng.standard_normal((2048, 1024)).astype(np.float32), "int8"))
    small = orkpy.pack(orkpy.quantize(rng.standard_normal((1024, 512)).astype(np.float32), "int8"))
    x_big = rng.standard_normal((1, 1024)).astype(np.float32)
    x = rng.standard_normal((1, 512)).astype(np.float32)
    want = small.matmul(x, threads=1)
    big.matmul(x_big, threads=int(sys.argv[1]))  # starts that many resident workers
    small.matmul(x, threads=2)
    before = cpu_ns()
    for _ in range(int(sys.argv[2])):
        assert np.array_equal(small.matmul(x, threads=2), want)
    after = cpu_ns()
    busy = sorted((after[t] - before.get(t, 0)) / 1e6 for t in after)
    print(len(after), " ".join(f"{ms:.2f}" for ms in busy))
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux's /proc/<pid>/task/<tid>/schedstat")
def test_idle_workers_stay_asleep_for_smaller_jobs():
    """After a call on 24 threads starts 23 resident workers, 400 two-thread calls use the caller
    and one worker: the 22 others gain no measurable CPU time. Before the per-worker wake-ups every
    job woke all the workers and each spun ~20000 pauses, so on 2 cores a threads=100000 call made
    every later parallel region of the process slower."""
    r = subprocess.run([sys.executable, "-c", SCRIPT, "24", "400"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    n, *ms = r.stdout.split()
    busy = [float(v) for v in ms]
    assert int(n) >= 24, r.stdout  # the workers exist
    # the caller and the one wanted worker do the work; every other thread stays (nearly) idle
    idle = busy[:-2]
    assert max(idle) < 2.0, f"threads that should sleep used CPU (ms): {busy}"
