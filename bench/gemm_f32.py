"""GFLOP/s of the F32 linear's GEMM (csrc/ork/gemm_f32.h through ork_linear_apply) at the real
models' shapes, next to this machine's FMA peak measured in the same run (register-only chains
of the ISA's fused multiply-add on every thread: the most any float32 kernel here can do).

    python bench/gemm_f32.py [--threads 1 2] [--isa avx2] [--M 512] [--models smollm2 gemma3]

Shapes (N, K) are the linears of one layer (q, k/v, gate/up, down, attn_output where it differs)
and the tied LM head, at M = 512 rows (one n_ctx 512 chunk; the perplexity head runs on the 256
scored rows). GFLOP/CPU-s divides by the process's CPU time (all threads) instead of the wall
time: on a shared machine it shows the kernel's own rate per core. The C driver (bench/gemm_f32_bench.c) is compiled with the core's own flags
(tests/cbuild.py, buildflags.py) into a temporary folder.
"""
import argparse
import pathlib
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from cbuild import build  # noqa: E402

SHAPES = {  # (N, K) per linear
    "smollm2": [("attn_q/attn_output", 576, 576), ("attn_k/attn_v", 192, 576), ("ffn_gate/ffn_up", 1536, 576),
                ("ffn_down", 576, 1536), ("output (tied)", 49152, 576)],
    "gemma3": [("attn_q", 1024, 640), ("attn_k/attn_v", 256, 640), ("ffn_gate/ffn_up", 2048, 640),
               ("ffn_down", 640, 2048), ("attn_output", 640, 1024), ("output (tied)", 262144, 640)],
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--isa", default="auto", help="scalar, avx2, neon or auto (default)")
    ap.add_argument("--M", type=int, default=512)
    ap.add_argument("--models", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="orkpy-gemm-bench-") as d:
        exe = build(ROOT / "bench" / "gemm_f32_bench.c", d)
        print(f"float32 GEMM y = x W^T, M = {a.M}; GFLOP/s = 2 M N K / best time")
        for nt in a.threads:
            for model in a.models:
                args = [str(exe), a.isa, str(nt), str(a.M)]
                for _, n, k in SHAPES[model]:
                    args += [str(n), str(k)]
                out = subprocess.run(args, capture_output=True, text=True, check=True).stdout.splitlines()
                isa, peak = out[0].split()[1], float(out[1].split()[1])
                print(f"\n{model}, {isa} kernels, {nt} thread{'s' if nt > 1 else ''}: "
                      f"FMA peak measured {peak:.1f} GFLOP/s")
                print(f"  {'linear':<20}{'N':>8}{'K':>6}{'GFLOP/s':>10}{'% peak':>8}{'ms':>9}{'GFLOP/CPU-s':>13}")
                for (name, n, k), line in zip(SHAPES[model], out[2:]):
                    _, _, _, _, gf, ms, gfc = line.split()
                    print(f"  {name:<20}{n:>8}{k:>6}{float(gf):>10.1f}{100 * float(gf) / peak:>8.0f}{float(ms):>9.2f}"
                          f"{float(gfc):>13.1f}")


if __name__ == "__main__":
    main()
