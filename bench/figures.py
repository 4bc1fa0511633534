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
from orkpy.evaluation import ffn

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
CHUNKS = 8
CTX = 256


def _text(name, start=0, stop=None):
    with open(SHARED / "text" / name, encoding="utf-8") as f:
        return f.read()[start:stop]


def _digest(a):
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:24]


def figures(extended=False):
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
        import orkpy.runtime.npu as npu
        mq = orkpy.load_model(st / "stories260K-F16.gguf", weights="int8")
        npu.use_npu(mq, npu.Device("emu"))
        record("npu-emu-int8", mq, kld_base=base)
        q3 = SHARED / "models" / "qwen3-skeleton"
        record("qwen3-skel-gguf", orkpy.load_model(q3 / "qwen3-skel-tied-Q4_K_M.gguf"))
        if extended:
            _extended(out, work, st, text, calib, record)
    return out


def _logits(model, ids):
    return _digest(model.forward(ids, first=len(ids) // 2))


def _extended(out, work, st, text, calib, record):
    """Every activation mode on every packed weight path, every architecture of the table, the
    quantization methods' model directories (weights and logits; the manifest is left out), the
    packed matmul per mode, and the real models where the cache has them."""
    f16 = st / "stories260K-F16.gguf"
    ids = orkpy.load_model(f16).tokenizer.encode(text[:4000])[:CTX]
    modes = [("per_tensor", {}), ("per_tensor-prefix1", dict(act="per_tensor", act_prefix=1)),
             ("static-mse", dict(act="static", act_method="mse")), ("static-max", dict(act="static", act_method="max")),
             ("static-prefix0", dict(act="static", act_prefix=0)),
             ("outliers8", dict(act="per_token_outliers", act_outliers=8)),
             ("outliers2", dict(act="per_token_outliers", act_outliers=2))]
    for w in ("int8", "nf4", "int4", "int6", "int5"):
        for tag, kw in modes:
            kw = dict(kw) or dict(act=tag)
            m = orkpy.load_model(f16, weights=w, calib=calib, calib_ctx=CTX, calib_chunks=2, **kw)
            out[f"act/{w}/{tag}/logits"] = _logits(m, ids)
    # quantize_model's methods: the model directory's weight files and the model's logits
    alloc = st / "stories260K-Q4_0.gguf"
    runs = {"rtn-g32": dict(group_size=32), "gptq": dict(method="gptq", calib=calib, calib_ctx=CTX, calib_chunks=2),
            "awq": dict(awq=True, calib=calib, calib_ctx=CTX, calib_chunks=2),
            "rotate": dict(rotate="hadamard", calib=calib, calib_ctx=CTX, calib_chunks=2),
            "rotate-smooth": dict(rotate="hadamard", smooth=0.5, calib=calib, calib_ctx=CTX,
                                         calib_chunks=2),
            "int4-sr": dict(kind="int4", sr=True, seed=5)}
    for tag, kw in runs.items():
        d = os.path.join(work, "qm-" + tag)
        qm = orkpy.quantize_model(f16, alloc, progress=False, log=lambda m: None, output=d, **kw)
        for name in sorted(os.listdir(d)):
            if name != "manifest.json":
                with open(os.path.join(d, name), "rb") as fh:
                    out[f"qm/{tag}/{name}"] = hashlib.sha256(fh.read()).hexdigest()[:24]
        out[f"qm/{tag}/logits"] = _logits(orkpy.load_model(d), ids)
        if "calib" in kw:
            out[f"qm/{tag}/static-logits"] = _logits(orkpy.load_model(d, act="static"), ids)
    qm = orkpy.quantize_model(f16, None, target_bpw=5.0, calib=calib, calib_ctx=CTX, calib_chunks=2, target_chunks=1,
                              target_ctx=64, progress=False, log=lambda m: None)
    out["qm/target5/tiers"] = _digest(np.frombuffer(repr(sorted(qm.tiers.items())).encode(), np.uint8))
    out["qm/target5/logits"] = _logits(qm.to_model(), ids)
    # the packed matmul per mode
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 256)).astype(np.float32)
    x[:, 7] *= 30
    for kind in ("int8", "nf4"):
        pw = orkpy.pack(orkpy.quantize(rng.standard_normal((64, 256)).astype(np.float32), kind))
        out[f"matmul/{kind}/per_token"] = _digest(pw.matmul(x))
        out[f"matmul/{kind}/per_tensor"] = _digest(pw.matmul(x, act="per_tensor"))
        out[f"matmul/{kind}/static"] = _digest(pw.matmul(x, act="static", clip=3.0))
        out[f"matmul/{kind}/outliers"] = _digest(pw.matmul(x, act="per_token_outliers", outliers=np.array([7], np.int32)))
    # every architecture of the table (tests/archgen.py's synthetic models), float and packed paths
    sys.path.insert(0, str(ROOT / "tests"))
    import archgen
    from test_arch import CASES
    aids = np.arange(1, 40, dtype=np.int32)
    for case, kw in sorted(CASES.items()):
        kw = dict(kw)
        p = os.path.join(work, case + ".gguf")
        archgen.make(kw.pop("arch"), p, **kw)
        for w in ("fp32", "int8", "nf4"):
            out[f"arch/{case}/{w}"] = _logits(orkpy.load_model(p, weights=w), aids)
        out[f"arch/{case}/static"] = _logits(orkpy.load_model(p, weights="int8", act="static", calib=aids,
                                                               calib_ctx=20, calib_chunks=1), aids)
    # the real models, when .ci/fetch-models has put them in the cache
    cache = pathlib.Path(os.environ.get("ORKPY_CACHE", pathlib.Path.home() / ".cache" / "orkpy")) / "models"
    for name in ("SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"):
        if (cache / name).exists():
            m = orkpy.load_model(cache / name)
            rids = m.tokenizer.encode(text[:4000])[:128]
            out[f"real/{name}/gguf"] = _logits(m, rids)
            out[f"real/{name}/int8"] = _logits(orkpy.load_model(cache / name, weights="int8"), rids)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("-o", "--output", help="write the figures as JSON")
    p.add_argument("--extended", action="store_true",
                   help="also every activation mode, architecture, quantization method and the real models (minutes)")
    p.add_argument("--compare", help="compare with a JSON written earlier; exit 1 if any figure differs")
    a = p.parse_args(argv)
    figs = figures(a.extended)
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
