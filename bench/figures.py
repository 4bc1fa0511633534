"""Every accuracy figure orkpy's tests and benchmarks rest on, at full precision, for bit-identity checks.

    python bench/figures.py -o before.json            # on one commit
    python bench/figures.py --compare before.json     # on another: exit 1 naming every figure that moved

Figures: PPL (repr of the float, so equal means bit-equal) and a SHA-256 of the float32 logits of the first
chunk for every weight path on stories260K (F32/F16 GGUF, int8, nf4, int4, a Q4_0 allocation with and without
an imatrix), the KL mode, the imatrix values, the fused SwiGLU chain modes and sprinkles, the NPU emulator
path, and the Qwen3 skeleton (qwen3 layout, BPE tokenizer). Small chunk counts: about a minute.
"""
import argparse
import hashlib
import json
import os
import pathlib
import sys
import tempfile

import numpy as np

import orkpy
from orkpy import ffn

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
CHUNKS = 8
CTX = 256


def _text(name, start=0, stop=None):
    with open(SHARED / "text" / name, encoding="utf-8") as f:
        return f.read()[start:stop]


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:24]


def figures():
    st = SHARED / "models" / "stories260K"
    text = _text("tinystories-val-B.txt", 0, 200_000)
    calib = _text("tinystories-val-B.txt", 200_000, 400_000)
    out = {}
    with tempfile.TemporaryDirectory(prefix="orkpy-figures-") as work:
        base = os.path.join(work, "ref.npz")

        def record(tag, model, **kw):
            ids = model.tokenizer.encode(text[:4000])[:CTX]
            out[f"{tag}/logits"] = _digest(model.forward(ids, first=CTX // 2))
            r = orkpy.perplexity(model, text, n_ctx=CTX, chunks=CHUNKS, progress=False, **kw)
            out[f"{tag}/ppl"] = repr(r.ppl)
            if r.kld:
                out[f"{tag}/kld"] = repr(r.kld["mean"])
                out[f"{tag}/same_top"] = repr(r.kld["same_top"])

        f32 = orkpy.load_model(st / "stories260K-F32.gguf")
        record("F32", f32, save_logprobs=base)
        for w in ("fp32", "int8", "nf4", "int4"):
            record(f"F16-{w}", orkpy.load_model(st / "stories260K-F16.gguf", weights=w), kld_base=base)
        record("Q4_K_M-gguf", orkpy.load_model(st / "stories260K-Q4_K_M.gguf"), kld_base=base)
        src = orkpy.load_model(st / "stories260K-F16.gguf")
        im = orkpy.collect_imatrix(src, calib, n_ctx=CTX, chunks=CHUNKS, progress=False)
        out["imatrix"] = _digest(np.concatenate([im.values(n) for n in im.names()]))
        for tag, imx in (("alloc-imatrix-nf4", im), ("alloc-nf4", None)):
            qm = orkpy.quantize_model(st / "stories260K-F16.gguf", st / "stories260K-Q4_0.gguf", imatrix=imx,
                                      progress=False, log=lambda m: None)
            out[f"{tag}/int8_share"] = repr(qm.int8_share())
            record(tag, qm.to_model(), kld_base=base)
        m8 = orkpy.load_model(st / "stories260K-F16.gguf", weights="int8")
        stats = ffn.prep(m8, calib, n_ctx=CTX, chunks=CHUNKS)
        for mode in ffn.MODES:
            ffn.configure(m8, stats, mode)
            record(f"ffn-{mode}", m8, kld_base=base)
        ffn.configure(m8, stats, ffn.sprinkle(stats, "auto"))
        record("ffn-sprinkle-auto", m8, kld_base=base)
        import orkpy.npu as npu
        mq = orkpy.load_model(st / "stories260K-F16.gguf", weights="int8")
        npu.use_npu(mq, npu.Device("emu"))
        record("npu-emu-int8", mq, kld_base=base)
        q3 = SHARED / "models" / "qwen3-skeleton"
        record("qwen3-skel-gguf", orkpy.load_model(q3 / "qwen3-skel-tied-Q4_K_M.gguf"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", help="write the figures as JSON")
    p.add_argument("--compare", help="compare with a JSON written earlier; exit 1 if any figure differs")
    a = p.parse_args(argv)
    figs = figures()
    if a.output:
        pathlib.Path(a.output).write_text(json.dumps(figs, indent=1, sort_keys=True) + "\n")
    if a.compare:
        old = json.loads(pathlib.Path(a.compare).read_text())
        moved = sorted(k for k in set(old) | set(figs) if old.get(k) != figs.get(k))
        for k in moved:
            print(f"DIFFERS {k}: {old.get(k)} -> {figs.get(k)}")
        print(f"{len(figs) - len(moved)} of {len(set(old) | set(figs))} figures bit-identical")
        return 1 if moved else 0
    if not a.output:
        print(json.dumps(figs, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
