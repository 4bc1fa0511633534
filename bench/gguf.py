"""GGUF dequantization throughput per ggml type: orkpy's C dequantizers against
the `gguf` package's NumPy dequantizers (gguf.quants.dequantize), same data,
same run.

    python bench/gguf.py [--elements 4194304] [--repeat 3]

Prints GB/s of float32 output for orkpy with all threads, orkpy with 1 thread
and gguf-py, and the ratios. Outputs are checked to be bit-identical first.
"""
import argparse
import os
import sys

# this file is named like the `gguf` package it measures against: keep its own folder off the path
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

import numpy as np

import orkpy._core as C
from orkpy.evaluation.testing import DEQUANT_TYPES, best_time, random_blocks


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=1 << 22)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from importlib.metadata import version

    import gguf
    from gguf.quants import dequantize

    rng = np.random.default_rng(0)
    print(f"dequantization throughput, {args.elements:,} elements per type, GB/s of float32 output; "
          f"baseline: gguf-py {version('gguf')} NumPy dequantizers")
    hdr = f"{'type':<8}{'orkpy':>9}{'1 thread':>10}{'gguf-py':>10}{'x gguf-py':>11}{'x (1 thr)':>11}"
    print(hdr)
    print("-" * len(hdr))
    for tid, (name, bs, ts, _) in DEQUANT_TYPES.items():
        n = args.elements // 256 * 256
        raw = random_blocks(rng, tid, n // bs)
        qt = gguf.GGMLQuantizationType(tid)
        ours = C.dequantize_raw(raw, tid, n, 0)
        ref = np.asarray(dequantize(raw, qt), dtype=np.float32).reshape(-1)
        assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), name
        gb = n * 4 / 1e9
        t_all = best_time(lambda: C.dequantize_raw(raw, tid, n, 0), args.repeat)
        t_one = best_time(lambda: C.dequantize_raw(raw, tid, n, 1), args.repeat)
        t_ref = best_time(lambda: dequantize(raw, qt), 1)
        print(f"{name:<8}{gb / t_all:>9.2f}{gb / t_one:>10.2f}{gb / t_ref:>10.3f}"
              f"{t_ref / t_all:>11.1f}{t_ref / t_one:>11.1f}")


if __name__ == "__main__":
    main()
