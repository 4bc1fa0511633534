"""The screened imatrix clip search against the full one on the real models (issue 18, item 2): the
weighted error it reaches, the rows whose scale differs, the time, and the PPL / KL of the model it
makes, both searches in the same run on the same imatrix, text and chunks.

Per model (--models; the float reference is the exact dequantization of the shipped file, as in
bench/act_modes.py): orkpy's imatrix of --calib-chunks chunks of TinyStories B, then

  per linear  every block linear and the head quantized with the --kind 4-bit codebook (NF4) per
              output channel, with the imatrix, search="full" and search="screen": the sum over the
              model of  sum_k im[k] * (w - dequant)^2  (float64), the rows whose scale differs,
              and each search's seconds (the same threads, alternated --repeat times, best kept)
  model       quantize_model(alloc = the shipped file at --threshold, the same imatrix, clip_search =
              full / screen) scored on --chunks chunks of wikitext-2: PPL and mean KL against the float
              model's log-probs, and the w-only row (the same weights dequantized, float
              activations), so the weights' own cost is seen apart from the int8 activations

    python bench/clip_search.py [--models smollm2 gemma3] [--chunks 8] [--calib-chunks 8] [--ctx 512]
                                [--kind nf4] [--repeat 2] [--work DIR]

Needs the models of .ci/install (tests/oracle.py finds them).
"""
import argparse
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import orkpy  # noqa: E402
from orkpy.runtime.model import linear_names  # noqa: E402
from orkpy.formats.source import open_source  # noqa: E402


def weighted_error(w, q, im):
    """sum over rows and k of im[k] * (w - dequant)^2, float64."""
    d = (w.astype(np.float64) - q.dequantize().astype(np.float64)) ** 2
    return float((d * im.astype(np.float64)[None, :]).sum())


def per_linear(src, imatrix, names, kind, repeat):
    """{search: (total weighted error, seconds)}, rows with a different scale, rows in all."""
    tot = {"full": 0.0, "screen": 0.0}
    secs = {"full": 0.0, "screen": 0.0}
    differ = rows = 0
    for n in names:
        if n not in imatrix:
            continue
        w = np.ascontiguousarray(src.linear(n), np.float32)
        im = np.asarray(imatrix.values(n), np.float32)
        out = {}
        for search in ("full", "screen"):
            best = float("inf")
            for _ in range(repeat):
                t0 = time.perf_counter()
                q = orkpy.quantize(w, kind, imatrix=im, search=search)
                best = min(best, time.perf_counter() - t0)
            secs[search] += best
            tot[search] += weighted_error(w, q, im)
            out[search] = q
        differ += int(np.count_nonzero(out["full"].scales != out["screen"].scales))
        rows += w.shape[0]
    return tot, secs, differ, rows


def main():
    from accuracy import weight_only
    from oracle import real_model
    from realmodels import f32_reference

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--kind", default="nf4", choices=["nf4", "int4"])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threshold", type=float, default=5.5,
                    help="allocation threshold (5.5: SmolLM2's Q4_1 tensors, 5.0 bits per weight, are the 4-bit tier)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-clip-search"))
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    text = (SHARED / "text" / "wikitext-2-raw-test.txt").read_text(encoding="utf-8")
    calib = (SHARED / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    for name in a.models:
        f32 = f32_reference(name)
        shipped = real_model(name)
        base = orkpy.load_model(f32)
        tokens = base.tokens(text)
        ref = os.path.join(a.work, f"{name}-ref-{a.ctx}-{a.chunks}.npz")
        fppl = orkpy.perplexity(base, tokens, n_ctx=a.ctx, chunks=a.chunks, save_logprobs=ref, progress=False).ppl
        imatrix = orkpy.collect_imatrix(base, calib, n_ctx=a.ctx, chunks=a.calib_chunks, progress=False)
        del base
        src = open_source(f32)
        names = linear_names(src.hp)
        tot, secs, differ, rows = per_linear(src, imatrix, names, a.kind, a.repeat)
        print(f"{name}: {a.kind} per channel, every linear with an imatrix entry ({rows} rows; orkpy's imatrix of "
              f"{a.calib_chunks} x {a.ctx} TinyStories B); scored wikitext-2 {a.chunks} x {a.ctx}; F32 PPL {fppl:.4f}")
        print(f"  per linear: weighted error full {tot['full']:.6e}, screen {tot['screen']:.6e} "
              f"(screen / full - 1 = {tot['screen'] / tot['full'] - 1:+.2e}); rows whose scale differs: {differ} "
              f"of {rows}; seconds full {secs['full']:.2f}, screen {secs['screen']:.2f} "
              f"({secs['full'] / secs['screen']:.2f}x)", flush=True)
        hdr = f"  {'search':7} {'quantize s':>10} {'PPL w4a8':>9} {'KL w4a8':>9} {'PPL w-only':>10} {'KL w-only':>9}"
        print(hdr + "\n  " + "-" * (len(hdr) - 2), flush=True)
        for search in ("full", "screen"):
            t0 = time.perf_counter()
            qm = orkpy.quantize_model(f32, shipped, imatrix=imatrix, kind=a.kind, threads=a.threads, progress=False,
                                      clip_search=search, threshold=a.threshold,
                                      log=lambda m: None)
            qs = time.perf_counter() - t0
            res = orkpy.perplexity(qm, tokens, n_ctx=a.ctx, chunks=a.chunks, kld_base=ref, progress=False)
            wo = orkpy.perplexity(weight_only(qm), tokens, n_ctx=a.ctx, chunks=a.chunks, kld_base=ref,
                                  progress=False)
            share = qm.int8_share()
            print(f"  {search:7} {qs:10.2f} {res.ppl:9.4f} {res.kld['mean']:9.5f} {wo.ppl:10.4f} "
                  f"{wo.kld['mean']:9.5f}   int8 share of the weight bytes {share:.1%}", flush=True)


if __name__ == "__main__":
    main()
