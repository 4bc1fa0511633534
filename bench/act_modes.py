"""The activation-scale modes of the packed linears (orkpy.actcal) on a real model: mean KL vs the
float model and PPL for w8a8 / w4a8 per mode, with and without the Hadamard rotation.

The float reference is the exact dequantization of the shipped GGUF (orkpy.convert.dequantize_gguf,
written once to --work). Calibration text and scored text differ (default: calibrate on
tinystories-val-B.txt, score wikitext-2-raw-test.txt). Per rotation the activations are
calibrated once on the float (rotated) model: --calib-chunks chunks of --ctx tokens. Rows:

  float             the (rotated) float model (its KL vs the unrotated F32: the rotation's own error)
  weight-only       the quantized weights with float activations (dequantized into float linears):
                    what the weights alone cost, so each mode's excess over it is the activations' cost
  per_token         dynamic, one scale per token (today's default)
  per_tensor_pP     dynamic, one scale per forward call; the first P positions per token
  static_M_pP       one calibrated range per linear (load_model(act="static", act_method=M)), calibrated
                    without and run with the first P positions per token (act_prefix); the "sat" column
                    is the share of the statically quantized inputs beyond the range on the scored text
  outliers_k        per token with the k largest-|x| calibration channels in float

    python bench/act_modes.py [--model smollm2] [--chunks 8] [--calib-chunks 8] [--ctx 512]
                              [--weights int8 nf4] [--imatrix nf4] [--outliers 8]
                              [--rotate none hadamard hadamard+online] [--work DIR] [--json-out FILE]

--rotate: none, hadamard (QuaRot-style, orkpy.rotate, folded into the weights) or hadamard+online (plus
the online Hadamard before ffn_down). --imatrix: the weight kinds quantized with an importance matrix
collected on the calibration text by the float (rotated) model (weights "nf4+im" in the table).

Needs the real models of .ci/install (tests/oracle.py finds them).
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import pytest  # noqa: E402,F401  (tests/oracle.py reports a missing model as a pytest skip)
from oracle import real_model  # noqa: E402

import orkpy  # noqa: E402
from orkpy.actcal import linear_act  # noqa: E402
from orkpy.model import LinearSpec, Model, transformed_source  # noqa: E402
from orkpy.source import open_source  # noqa: E402


def build(src, path, packed, how):
    """A Model of ``src`` whose linears are ``packed`` (name -> PackedWeight) run with the activation
    settings ``how(name, pw)`` (LinearSpec.from_packed keywords), or float linears holding the
    dequantized weights when ``how`` is None (weight-only)."""
    names = orkpy.model.linear_names(src.hp)
    if how is None:
        lin = {n: LinearSpec.f32(n, packed[n].dequantize()) for n in names}
    else:
        lin = {n: LinearSpec.from_packed(n, packed[n], **how(n, packed[n])) for n in names}
    return Model(str(path), src.hp, lin, src.tensor, src.meta, src.tied, {n: packed[n].kind for n in names})


def saturation(m, tokens, ctx, chunks):
    """Share of the static linears' quantized inputs beyond their range on the scored text."""
    n_chunk, it = m.chunks(tokens, ctx, chunks)
    stats = m.collect_act_stats(it)
    clipped = total = 0
    for name, s in stats.items():
        spec = m.linears[name]
        if spec.act_clip is not None:
            clipped += s["n_clipped"]
            total += s["rows"] * spec.K
    return clipped / total if total else 0.0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--sat-chunks", type=int, default=2, help="scored chunks the saturation share is measured on")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--weights", nargs="+", default=["int8", "nf4"])
    ap.add_argument("--rotate", nargs="+", default=["none", "hadamard"])
    ap.add_argument("--outliers", type=int, nargs="+", default=[8])
    ap.add_argument("--prefix", type=int, nargs="+", default=[0, 1],
                    help="leading positions quantized per token by per_tensor / static (static: calibrated so)")
    ap.add_argument("--imatrix", nargs="*", default=["nf4"],
                    help="weight kinds quantized with an imatrix of the calibration text (default: nf4)")
    ap.add_argument("--text", default=str(SHARED / "text" / "wikitext-2-raw-test.txt"))
    ap.add_argument("--calib", default=str(SHARED / "text" / "tinystories-val-B.txt"))
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-act-modes"))
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    q = real_model(a.model)
    f32 = pathlib.Path(a.work) / (q.stem + ".F32.gguf")
    if not f32.exists():
        orkpy.dequantize_gguf(q, f32)
    text = open(a.text, encoding="utf-8").read()
    calib = open(a.calib, encoding="utf-8").read()
    ref = os.path.join(a.work, f"{a.model}-ref-{a.ctx}-{a.chunks}.npz")
    base = orkpy.load_model(f32)
    tokens = base.tokens(text)
    t0 = time.time()
    r = orkpy.perplexity(base, tokens, n_ctx=a.ctx, chunks=a.chunks, save_logprobs=ref, progress=False)
    rows = [{"rotate": "none", "weights": "f32", "act": "float", "ppl": r.ppl, "kld": 0.0, "sat": None}]
    print(f"{a.model}: {f32.name}, scored {os.path.basename(a.text)} ({a.chunks} x {a.ctx}), calibrated on "
          f"{os.path.basename(a.calib)} ({a.calib_chunks} x {a.ctx}); F32 PPL {r.ppl:.4f} ({time.time() - t0:.0f} s)",
          flush=True)
    hdr = f"{'rotate':15} {'weights':7} {'act':16} {'PPL':>8} {'mean KL':>8} {'sat':>9}"
    print(hdr + "\n" + "-" * len(hdr), flush=True)

    def row(rot, w, act, m, sat=None):
        res = orkpy.perplexity(m, tokens, n_ctx=a.ctx, chunks=a.chunks, kld_base=ref, progress=False)
        d = {"rotate": rot, "weights": w, "act": act, "ppl": res.ppl, "kld": res.kld["mean"], "sat": sat}
        rows.append(d)
        s = "" if sat is None else f"{sat:.2e}"
        print(f"{rot:15} {w:7} {act:16} {d['ppl']:8.4f} {d['kld']:8.5f} {s:>9}", flush=True)

    for rot in a.rotate:
        rotate = None if rot == "none" else "hadamard"
        src = transformed_source(open_source(f32), rotate, rotate_online=rot.endswith("+online"))
        names = orkpy.model.linear_names(src.hp)
        fm = Model(str(f32), src.hp, {n: LinearSpec.f32(n, src.linear(n)) for n in names}, src.tensor, src.meta,
                   src.tied, {n: "fp32" for n in names})
        if rot != "none":
            row(rot, "f32", "float", fm)
        cals = {p: orkpy.calibrate_activations(fm, calib, n_ctx=a.ctx, chunks=a.calib_chunks, progress=False, prefix=p)
                for p in a.prefix}
        cal = cals[a.prefix[-1]]
        im = orkpy.collect_imatrix(fm, calib, n_ctx=a.ctx, chunks=a.calib_chunks, progress=False) \
            if set(a.weights) & set(a.imatrix) else None
        del fm
        for w in a.weights:
            packed = {n: orkpy.pack(orkpy.quantize(src.linear(n), w, imatrix=im.values(n) if (
                w in a.imatrix and n in im) else None)) for n in names}
            wl = w + ("+im" if w in a.imatrix else "")
            row(rot, wl, "weight-only", build(src, f32, packed, None))
            modes = [("per_token", "per_token", "mse", 8, 0)]
            modes += [(f"per_tensor_p{p}", "per_tensor", "mse", 8, p) for p in a.prefix]
            modes += [(f"static_{meth}_p{p}", "static", meth, 8, p) for p in a.prefix for meth in ("mse", "max")]
            modes += [(f"outliers_{k}", "per_token_outliers", "mse", k, 0) for k in a.outliers]
            for label, act, method, k, p in modes:
                c = cals[p] if act == "static" else cal
                m = build(src, f32, packed, lambda n, pw: linear_act(act, n, c, method, k, rot, pw.K, p))
                sat = saturation(m, tokens, a.ctx, a.sat_chunks) if act == "static" else None
                row(rot, wl, label, m, sat)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"model": a.model, "chunks": a.chunks, "calib_chunks": a.calib_chunks, "ctx": a.ctx,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
