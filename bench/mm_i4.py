"""The int4 x int4 matmul (docs/w4a4.md, csrc/ork/i4.h): the fast kernel's speed as a ratio to
the scalar _ref and to the int8 matmul of the same shape (the packed int8 weight's
``_core.matmul_int``, int8 activations), all measured in this run.

    python bench/mm_i4.py [--repeat 5] [--threads 1] [--shapes 1x4096x4096,64x4096x4096]

Shapes are M x K x N. For each it prints the best time of the int4 kernel of this CPU's ISA, of
the scalar _ref (fewer repeats: it is slow), and of the int8 matmul, and the ratios
``_ref / fast`` and ``int8 / fast`` (above 1: the int4 kernel is faster). Every int4 result is
checked against the _ref's before it is timed.
"""
import argparse

import numpy as np

import orkpy
from orkpy import _core
from orkpy.evaluation.testing import best_time
from orkpy.kernels import int4

SHAPES = "1x4096x4096,1x2048x6144,16x4096x4096,64x2048x2048"


def bench_shape(M, K, N, repeat, threads, rng):
    a = rng.integers(-7, 8, (M, K)).astype(np.int8)
    w = rng.integers(-7, 8, (N, K)).astype(np.int8)
    ap, wp = int4.pack_i4(a), int4.pack_i4(w)
    isa = orkpy.capabilities()["isa"]
    fast = _core.mm_i4(ap, wp, K, threads=threads)
    with orkpy.use_isa("scalar"):
        ref = _core.mm_i4(ap, wp, K, threads=threads)
        t_ref = best_time(lambda: _core.mm_i4(ap, wp, K, threads=threads), max(1, repeat // 3))
    assert np.array_equal(fast, ref), "the fast int4 kernel differs from the _ref"
    t_fast = best_time(lambda: _core.mm_i4(ap, wp, K, threads=threads), repeat)
    # the int8 path of the same shape: int8 weight codes in the NPU tile store, int8 activations
    w8 = orkpy.pack(orkpy.quantize(rng.standard_normal((N, K)).astype(np.float32), "int8"))
    x8 = rng.integers(-127, 128, (M, K)).astype(np.int8)
    t_i8 = best_time(lambda: _core.matmul_int(w8.store, "int8", N, K, x8, threads=threads), repeat)
    return isa, t_fast, t_ref, t_i8


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shapes", default=SHAPES, help="comma-separated M x K x N")
    args = ap.parse_args()
    caps = orkpy.capabilities()
    print(f"int4 x int4 matmul, kernels {caps['i4_kernels']} (int8 matmul: {caps['matmul_kernels']}), "
          f"{args.threads} thread(s), best of {args.repeat}")
    hdr = f"{'M x K x N':<18}{'i4 ms':>9}{'_ref ms':>10}{'int8 ms':>10}{'_ref/i4':>9}{'int8/i4':>9}{'i4 GMAC/s':>11}"
    print(hdr)
    print("-" * len(hdr))
    rng = np.random.default_rng(0)
    for s in args.shapes.split(","):
        M, K, N = (int(v) for v in s.lower().split("x"))
        _, t_fast, t_ref, t_i8 = bench_shape(M, K, N, args.repeat, args.threads, rng)
        print(f"{s:<18}{t_fast * 1e3:>9.3f}{t_ref * 1e3:>10.2f}{t_i8 * 1e3:>10.3f}{t_ref / t_fast:>9.1f}"
              f"{t_i8 / t_fast:>9.2f}{M * K * N / t_fast / 1e9:>11.2f}")


if __name__ == "__main__":
    main()
