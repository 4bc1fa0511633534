"""What rotations and SmoothQuant buy the int8-activation paths (issue 16 item 1), on a real model,
next to llama.cpp's Q8_0 (and Q4_K_M + imatrix) computed in the same run by the live llama.cpp.

The model's float reference is the exact dequantization of the shipped file (orkpy.formats.convert); the
scored text wikitext (n_ctx --ctx, the first --chunks chunks), the calibration text tinystories
(--calib-chunks chunks: imatrix and SmoothQuant scales; never the scored text). orkpy's KL is
against orkpy's own F32 log-probs; llama.cpp's against llama-perplexity's F32 base (its defaults).

Transforms (orkpy.runtime.rotate): none; rot = randomized Hadamard residual rotation with the norms folded
and per-head V/O rotation; online = ffn_down's input rotated online (a fast Walsh-Hadamard
transform in the forward pass, C); smooth = SmoothQuant alpha 0.5 (with rot: in the rotated basis).
Rows:

  int8 weights, float activations   every linear int8 (per-channel absmax), run as float32 linears
                                    of the dequantized weights (orkpy has no float-activation int8
                                    kernel: emulated here)
  w8a8 per-token                    load_model(weights="int8", act="per_token"): the packed int8 path
  w4 mix, float activations         the shipped file's tier map at --threshold (SmolLM2 5.5: Q4_1 ->
                                    nf4, the head int8) + imatrix of the same transformed model,
                                    dequantized and run in float32
  w4a8 mix                          the same through quantize_model, packed, per-token activations

    python bench/rotate_kl.py [--model smollm2] [--chunks 40] [--ctx 512] [--calib-chunks 8]
                              [--threshold 5.5] [--no-llama] [--no-w4] [--json-out F]

Needs the llama.cpp tools and the models of .ci/install (tests/oracle.py finds them).
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))

import numpy as np  # noqa: E402
import pytest  # noqa: E402  (tests/oracle.py reports a missing tool or model as a pytest skip)
from oracle import llama_bin, real_model  # noqa: E402

import orkpy  # noqa: E402
from orkpy._io import read_text_like_llama_cpp  # noqa: E402
from orkpy.formats.convert import dequantize_gguf  # noqa: E402
from orkpy.runtime.model import LinearSpec, Model, transformed_source  # noqa: E402
from orkpy.formats.source import open_source  # noqa: E402

TRANSFORMS = {
    "none": {},
    "rot": dict(rotate="hadamard"),
    "rot+online": dict(rotate="hadamard", rotate_online=True),
    "online": dict(rotate_online=True),
    "smooth": dict(smooth=0.5),
    "rot+smooth": dict(rotate="hadamard", smooth=0.5),
    "rot+online+smooth": dict(rotate="hadamard", rotate_online=True, smooth=0.5),
}


def _run(args):
    r = subprocess.run([str(x) for x in args], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, args))} failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout + r.stderr


def llama_kl(work, f32, text, ctx, chunks, calib, calib_chunks):
    """{label: (PPL, mean KL)} of llama.cpp's Q8_0 and Q4_K_M + imatrix against its F32 base."""
    base = pathlib.Path(work) / "llama-base.kld"
    common = ["-f", text, "-c", ctx, "--chunks", chunks, "-t", 2, "-tb", 2]
    _run([llama_bin("llama-perplexity"), "-m", f32, *common, "--kl-divergence-base", base])
    im = pathlib.Path(work) / "llama-imatrix.gguf"
    _run([llama_bin("llama-imatrix"), "-m", f32, "-f", calib, "-c", ctx, "--chunks", calib_chunks, "-o", im,
          "-t", 2])
    out = {}
    for label, qtype, extra in (("llama.cpp Q8_0", "Q8_0", []), ("llama.cpp Q4_K_M + imatrix", "Q4_K_M",
                                                                 ["--imatrix", im])):
        q = pathlib.Path(work) / f"llama-{qtype}.gguf"
        _run([llama_bin("llama-quantize"), *extra, f32, q, qtype])
        o = _run([llama_bin("llama-perplexity"), "-m", q, *common, "--kl-divergence-base", base, "--kl-divergence"])
        ppl = float(re.search(r"Mean PPL\(Q\)\s*:\s*([0-9.]+)", o).group(1))
        kl = float(re.search(r"Mean\s+KLD:\s*([0-9.]+)", o).group(1))
        out[label] = (ppl, kl)
    return out


def dequantized_model(src, qm):
    """A float32 Model of ``src`` whose linears are ``qm``'s quantized weights, dequantized."""
    lin = {}
    for n in orkpy.runtime.model.linear_names(src.hp):
        if n in qm.tensors:
            pw = qm.tensors[n]
            lin[n] = LinearSpec.f32(n, pw.int8_weight().astype(np.float32) * pw.bscale[:, None])
        else:
            lin[n] = LinearSpec.f32(n, src.linear(n))
    return Model(src.path, src.hp, lin, src.tensor, src.meta, src.tied, {n: "dequantized" for n in lin})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", choices=["smollm2", "gemma3"])
    ap.add_argument("--text", default=str(SHARED / "text" / "wikitext-2-raw-test.txt"))
    ap.add_argument("--calib", default=str(SHARED / "text" / "tinystories-val-B.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=40)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--threshold", type=float, default=5.5)
    ap.add_argument("--transforms", nargs="+", default=list(TRANSFORMS), choices=list(TRANSFORMS))
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--no-w4", action="store_true")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    try:
        shipped = real_model(a.model)
        if not a.no_llama:
            llama_bin("llama-perplexity")
    except pytest.skip.Exception as e:
        sys.exit(f"rotate_kl: {e.msg}")
    text, calib = read_text_like_llama_cpp(a.text), read_text_like_llama_cpp(a.calib)
    kw = dict(n_ctx=a.ctx, chunks=a.chunks, progress=False)
    rows = []

    def row(what, transform, ppl, kl=None, secs=None):
        rows.append(dict(model=a.model, what=what, transform=transform, ppl=ppl, kl=kl, seconds=secs))
        k = "" if kl is None else f"{kl:10.5f}"
        print(f"{what:<40}{transform:<20}{ppl:>10.4f}{k:>11}" + ("" if secs is None else f"   ({secs:.0f} s)"),
              flush=True)

    print(f"{a.model}: mean KL vs F32 on the first {a.chunks} chunks of {a.ctx} of {pathlib.Path(a.text).name}; "
          f"calibration {a.calib_chunks} chunks of {pathlib.Path(a.calib).name}")
    print(f"{'row':<40}{'transform':<20}{'PPL':>10}{'mean KL':>11}")
    with tempfile.TemporaryDirectory(prefix="orkpy-rotate-kl-") as work:
        f32 = pathlib.Path(work) / f"{a.model}-F32.gguf"
        dequantize_gguf(shipped, f32)
        if not a.no_llama:
            for label, (ppl, kl) in llama_kl(work, f32, a.text, a.ctx, a.chunks, a.calib, a.calib_chunks).items():
                row(label, "-", ppl, kl)
        ref = pathlib.Path(work) / "ref.npz"
        m = orkpy.load_model(f32)
        toks = m.tokens(text)
        t0 = time.perf_counter()
        row("orkpy F32", "none", orkpy.perplexity(m, toks, save_logprobs=ref, **kw).ppl,
            secs=time.perf_counter() - t0)
        del m

        def scored(what, name, model):
            t0 = time.perf_counter()
            r = orkpy.perplexity(model, toks, kld_base=ref, **kw)
            row(what, name, r.ppl, r.kld["mean"], time.perf_counter() - t0)

        for name in a.transforms:
            tf = dict(TRANSFORMS[name])
            if "smooth" in tf:
                tf.update(calib=calib, calib_ctx=a.ctx, calib_chunks=a.calib_chunks)
            try:
                src = transformed_source(open_source(f32), **tf)
            except NotImplementedError as e:
                print(f"{'(refused)':<40}{name:<20}{str(e)[:60]}")
                continue
            if name in ("none", "rot+online"):
                w8 = {n: orkpy.dequantize(orkpy.quantize(src.linear(n), "int8"))
                      for n in orkpy.runtime.model.linear_names(src.hp)}
                scored("int8 weights, float activations", name, Model(
                    src.path, src.hp, {n: LinearSpec.f32(n, w) for n, w in w8.items()}, src.tensor, src.meta,
                    src.tied, {n: "dequantized" for n in w8}))
                del w8
            scored("w8a8 per-token", name, orkpy.load_model(f32, weights="int8", **tf))
            if a.no_w4 or name not in ("none", "rot", "rot+online", "online"):
                continue
            im = orkpy.collect_imatrix(orkpy.load_model(f32, **tf), calib, n_ctx=a.ctx, chunks=a.calib_chunks,
                                       progress=False)
            qm = orkpy.quantize_model(f32, shipped, imatrix=im, threshold=a.threshold, progress=False,
                                      log=lambda msg: None, **tf)
            if name in ("none", "rot+online", "online"):
                scored(f"w4 mix @{a.threshold:g} + imatrix, float act.", name, dequantized_model(src, qm))
            scored(f"w4a8 mix @{a.threshold:g} + imatrix, per-token", name, qm)
    if a.json_out:
        pathlib.Path(a.json_out).write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
