"""Quantization throughput: orkpy's C kernels against a plain NumPy
implementation of the same algorithm (orkpy.kernels.reference), measured in the same
run on the same data.

    python bench/quant.py [--rows 6144 --cols 2048 --repeat 3 --baseline-rows 768]

Throughput is input MB/s (float32 weight bytes / seconds). The NumPy baseline
is timed on the first --baseline-rows rows (it is slow and memory-hungry;
a rate does not depend on the row count) and checked to give the same bytes.
Columns: orkpy with all threads (SIMD), orkpy 1 thread (SIMD), orkpy 1 thread
scalar _ref, NumPy; ratios: vs NumPy, and SIMD vs scalar.
"""
import argparse
import time

import numpy as np

import orkpy
from orkpy.evaluation.testing import best_time
import orkpy.kernels.reference as R


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=6144)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--baseline-rows", type=int, default=768)
    args = ap.parse_args()

    rng = np.random.default_rng(0)
    w = (rng.standard_normal((args.rows, args.cols)) * 0.02).astype(np.float32)
    im = rng.random(args.cols).astype(np.float32) + 0.01
    wb = w[: args.baseline_rows]
    mb_full, mb_base = w.nbytes / 1e6, wb.nbytes / 1e6
    caps = orkpy.capabilities()
    simd = caps["isa"]
    print(f"orkpy quantization throughput, weight {w.shape} float32 ({mb_full:.1f} MB), "
          f"kernels {simd}, {caps['default_threads']} threads; baseline: NumPy (orkpy.kernels.reference) "
          f"on {wb.shape[0]} rows")
    hdr = (f"{'config':<16}{'orkpy MB/s':>12}{'1 thread':>10}{'scalar 1t':>11}{'numpy MB/s':>12}"
           f"{'x numpy':>9}{'simd/scalar':>12}")
    print(hdr)
    print("-" * len(hdr))
    for kind in orkpy.KINDS:
        for imx in (None, im):
            name = f"{kind}{'+imatrix' if imx is not None else ''}"
            t_all = best_time(lambda: orkpy.quantize(w, kind, imatrix=imx), args.repeat)
            t_one = best_time(lambda: orkpy.quantize(w, kind, imatrix=imx, threads=1), args.repeat)
            with orkpy.use_isa("scalar"):
                t_sc = best_time(lambda: orkpy.quantize(w, kind, imatrix=imx, threads=1), 1)
            t0 = time.perf_counter()
            c, s = R.quantize(wb, kind, imatrix=imx)
            t_np = time.perf_counter() - t0
            q = orkpy.quantize(wb, kind, imatrix=imx)
            assert np.array_equal(c, q.codes) and np.array_equal(s, q.scales), "baseline disagrees"
            r_all, r_one, r_sc, r_np = mb_full / t_all, mb_full / t_one, mb_full / t_sc, mb_base / t_np
            print(f"{name:<16}{r_all:>12.1f}{r_one:>10.1f}{r_sc:>11.1f}{r_np:>12.1f}"
                  f"{r_all / r_np:>9.1f}{r_one / r_sc:>12.2f}")


if __name__ == "__main__":
    main()
