"""GPTQ rounding of one linear: the C core (orkpy.gptq_quantize, csrc/ork/gptq.h) against the NumPy
implementation it replaced (tests/gptq_ref.py: LAPACK's cholesky(inv(H)), BLAS's lazy block
updates, a Python loop over the columns), on real models' linear shapes (N outputs x K inputs):

    smollm2   576 x 1536 (ffn_down), 1536 x 576 (ffn_gate / ffn_up)
    qwen3     2048 x 6144 (ffn_down), 6144 x 2048 (ffn_gate / ffn_up)  -- Qwen3-1.7B

Random weights (N(0, 1)) and a Gram matrix H = X^T X of --rows random input rows with correlated
channels and a few outliers (the NumPy time does not depend on the values; the C core's neither).
Per shape and --kind: the time of the C core with 1 thread and with all (--threads; the codes
must be byte-identical), its factorization alone (_core.gptq_factor: ~2/3 K^3 flops), the NumPy
time (--no-numpy skips it), the share of codes the two agree on and the ratio of their output
errors tr(dW H dW^T). Memory of the C core: two K x K float64 matrices plus 16 rows of K doubles
per thread (printed).

    python bench/gptq_time.py [--shapes smollm2 qwen3] [--kind nf4] [--rows 2048] [--threads 2]
                              [--no-numpy] [--json-out FILE]
"""
import argparse
import json
import os
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import orkpy  # noqa: E402
from orkpy import _core  # noqa: E402
from orkpy.quantization.gptq import gptq_quantize  # noqa: E402
from orkpy.kernels.quant import QuantizedTensor  # noqa: E402

from gptq_ref import gptq_ref  # noqa: E402

SHAPES = {"smollm2": [(576, 1536), (1536, 576)], "qwen3": [(2048, 6144), (6144, 2048)]}


def gram(rng, K, rows):
    mix = rng.standard_normal((K, K)).astype(np.float32) / np.sqrt(K)
    x = (rng.standard_normal((rows, K)).astype(np.float32) @ mix + rng.standard_normal((rows, K)).astype(np.float32))
    x[:, :4] *= 20  # outlier channels
    x = x.astype(np.float64)
    return x.T @ x


def out_err(w, q, g):
    d = w.astype(np.float64) - orkpy.dequantize(q).astype(np.float64)
    return float(np.einsum("nk,nk->", d @ g, d))


def agreement(kind, a, b):
    if kind != "int8":
        a = np.stack([a & 15, a >> 4], -1)
        b = np.stack([b & 15, b >> 4], -1)
    return float(np.mean(a == b))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["smollm2", "qwen3"], choices=sorted(SHAPES))
    ap.add_argument("--kind", default="nf4", choices=["int8", "nf4", "int4"])
    ap.add_argument("--rows", type=int, default=2048, help="calibration rows summed into the Gram matrix")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-numpy", action="store_true", help="skip the NumPy reference")
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    rows = []
    print(f"GPTQ {a.kind}, per channel, Gram of {a.rows} random correlated rows; C core threads 1 / {a.threads}")
    print(f"{'N x K':>12} {'factor s':>9} {'C 1 thr s':>10} {f'C {a.threads} thr s':>10} {'NumPy s':>9} "
          f"{'agree':>8} {'err C/NumPy':>11} {'C MB':>7}")
    for name in a.shapes:
        for N, K in SHAPES[name]:
            w = rng.standard_normal((N, K)).astype(np.float32)
            g = gram(rng, K, a.rows)
            t = time.perf_counter()
            _core.gptq_factor(g + 0.01 * np.mean(np.diag(g)) * np.eye(K), a.threads)
            tf = time.perf_counter() - t
            times = {}
            out = {}
            for th in (1, a.threads):
                t = time.perf_counter()
                out[th] = gptq_quantize(w, g, a.kind, rows=a.rows, threads=th)
                times[th] = time.perf_counter() - t
            same = (np.array_equal(out[1].codes, out[a.threads].codes)
                    and np.array_equal(out[1].scales, out[a.threads].scales))
            if not same:
                raise SystemExit(f"{N} x {K}: the codes depend on the thread count")
            tn = agree = ratio = None
            if not a.no_numpy:
                t = time.perf_counter()
                rc, rs = gptq_ref(w, g, a.kind, rows=a.rows)
                tn = time.perf_counter() - t
                q = out[1]
                r = QuantizedTensor(kind=a.kind, shape=q.shape, codes=rc, scales=rs, lut=q.lut, group=q.group)
                agree, ratio = agreement(a.kind, q.codes, rc), out_err(w, q, g) / out_err(w, r, g)
            mb = (2 * K * K * 8 + a.threads * 16 * K * 8) / 1e6
            d = {"N": N, "K": K, "kind": a.kind, "factor_s": tf, "c_1_s": times[1], "c_n_s": times[a.threads],
                 "threads": a.threads, "numpy_s": tn, "agree": agree, "err_ratio": ratio, "c_mb": mb}
            rows.append(d)
            fmt = (lambda v, f: "-" if v is None else format(v, f))
            print(f"{f'{N} x {K}':>12} {tf:9.2f} {times[1]:10.2f} {times[a.threads]:10.2f} {fmt(tn, '9.2f')} "
                  f"{fmt(agree, '8.5f')} {fmt(ratio, '11.6f')} {mb:7.0f}", flush=True)
    if a.json_out:
        pathlib.Path(a.json_out).write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    main()
