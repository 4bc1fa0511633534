"""Packed-weight matmul throughput: GEMV (M=1, the decode case) and M=64 (the
prefill case) for i4a8 (NF4 codes) and i8 weights.

    python bench/matmul.py [--repeat 5] [--threads 1] [--footprint-mb 512]

For each K x N it prints the GB/s of packed weight streamed (store bytes /
time), next to two baselines measured in the same run:
  - a plain memory copy (numpy.copyto of a --footprint-mb buffer: bytes copied
    per second, one thread), and
  - NumPy float32 matmul of the same shape (x @ W.T with W resident as float32).
To measure streaming rather than cache hits, each call uses the next of
several copies of the weight whose total exceeds --footprint-mb.
"""
import argparse

import numpy as np

import orkpy
from orkpy.evaluation.testing import best_time

SHAPES = [(4096, 4096), (2048, 6144), (6144, 2048)]  # (K, N)


def copy_bandwidth(mb, repeat):
    src = np.ones(mb * 1_000_000 // 8, np.float64)
    dst = np.empty_like(src)
    t = best_time(lambda: np.copyto(dst, src), repeat)
    return src.nbytes / t / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--footprint-mb", type=int, default=512)
    args = ap.parse_args()
    caps = orkpy.capabilities()
    bw = copy_bandwidth(args.footprint_mb, args.repeat)
    print(f"packed matmul, kernels {caps['isa']}, {args.threads} thread(s); baseline memory copy "
          f"{bw:.2f} GB/s (numpy.copyto, {args.footprint_mb} MB)")
    hdr = (f"{'K x N':<12}{'kind':<6}{'M':>4}{'store MB':>10}{'ms':>9}{'GB/s':>8}{'/copy':>8}"
           f"{'numpy f32 ms':>14}{'x numpy':>9}")
    print(hdr)
    print("-" * len(hdr))
    rng = np.random.default_rng(0)
    for K, N in SHAPES:
        w = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
        for kind, label in (("nf4", "i4a8"), ("int8", "i8")):
            pw = orkpy.pack(orkpy.quantize(w, kind))
            copies = max(2, int(args.footprint_mb * 1e6 // pw.store.nbytes) + 1)
            pws = [orkpy.PackedWeight(kind, pw.shape, pw.store.copy(), pw.bscale) for _ in range(copies)]
            for M in (1, 64):
                x = rng.standard_normal((M, K)).astype(np.float32)
                it = iter(range(10**9))

                def run():
                    pws[next(it) % copies].matmul(x, threads=args.threads)
                run()
                t = best_time(run, args.repeat * 2)
                t_np = best_time(lambda: x @ w.T, args.repeat)
                gbs = pw.store.nbytes / t / 1e9
                print(f"{K}x{N:<7}{label:<6}{M:>4}{pw.store.nbytes / 1e6:>10.1f}{t * 1e3:>9.3f}{gbs:>8.2f}"
                      f"{gbs / bw:>8.2f}{t_np * 1e3:>14.3f}{t_np / t:>9.2f}")


if __name__ == "__main__":
    main()
