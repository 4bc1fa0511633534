"""GPTQ and AWQ on the Qwen3-1.7B shape: wall time and peak memory of ``quantize_model``.

A random-weight model with Qwen3-1.7B's layout (architecture qwen3: 28 blocks, n_embd 2048, n_ff
6144, 16 query heads and 8 KV heads of dimension 128 with per-head q/k norms, tied embeddings;
the vocabulary cut to 512 tokens to keep the file small) is written once as an F16 GGUF under
--work (never in the repository). Every block linear gets the int4 tier (NF4, per channel: the
Q4_0-like allocation), the tied embedding/head int8. Each run is a fresh process (so its peak RSS,
/proc/self/status VmHWM, is its own) that calls

    gptq   quantize_model(src, alloc, calib=ids, method="gptq")
    awq    quantize_model(src, alloc, calib=ids, awq=True)
    both   quantize_model(src, alloc, calib=ids, method="gptq", awq=True)

with calibration on --calib-chunks x --calib-ctx random token ids (seeded; the weights are random,
so text would mean no more), and prints the wall time, CPU time, peak RSS and the time of each
stage: awq_scales (the Gram passes and the alpha search), gptq_linears (the Gram passes and the
rounding), the activation calibration every calibrated quantize_model does, and the rest
(opening, packing); then the number of Gram passes (orkpy.quantization.gptq.collect_grams calls) and their
time, inside those stages. The "float" run only builds the float32 model the Gram passes run, the floor
of every other run's memory.

Memory is bounded by --max-bytes per group of layers, not by the model: the Gram matrices (float64
K x K per distinct linear input: attn_q/k/v share one, ffn_gate/up one) of as many layers as fit
the budget are collected per pass over the calibration text (orkpy.quantization.gptq.gram_batches), so the
header prints one layer's Gram bytes, the whole model's and the budget, and each run's peak RSS is
to be read against the float model's. A full 28-layer run takes long on a small machine: --layers
N builds an N-block model of the same width, and the per-layer time of each stage is printed so
the 28-layer time can be extrapolated (the Gram passes grow faster: each runs the whole depth).

    python bench/qwen3_shape.py [--layers 28] [--runs float gptq awq both] [--calib-chunks 2]
                                [--calib-ctx 256] [--max-bytes 1073741824] [--threads N] [--work DIR]
"""
import argparse
import json
import os
import pathlib
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import orkpy  # noqa: E402
from orkpy.formats.gguf_write import write_gguf  # noqa: E402
from orkpy.formats.tiermap import TierEntry, TierMap  # noqa: E402
sys.path.insert(0, str(ROOT / "bench"))
from quant_model import qwen3_meta  # noqa: E402

#: Qwen3-1.7B (config.json of Qwen/Qwen3-1.7B): hidden 2048, intermediate 6144, 28 layers, 16 / 8 heads of 128
SHAPE = dict(n_embd=2048, n_ff=6144, n_head=16, n_head_kv=8, head_dim=128, n_layer=28)
VOCAB = 512
MiB = 1 << 20


def peak_rss():
    """Peak resident set size of this process in bytes (VmHWM; ru_maxrss where /proc is missing)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def vocab():
    """A byte-level SentencePiece vocabulary (orkpy.evaluation.synthetic's) padded to VOCAB tokens."""
    from orkpy.evaluation.synthetic import _vocab
    toks, scores, types = _vocab()
    n = VOCAB - len(toks)
    return (toks + [f"<pad{i}>" for i in range(len(toks), VOCAB)], np.append(scores, np.full(n, -1e9, np.float32)),
            np.append(types, np.full(n, 5, np.int32)).astype(np.int32))


def shapes(n_layer):
    """{tensor name: shape} of the model (NumPy order: (N, K) for a linear)."""
    D, F, H, HKV, hd = (SHAPE[k] for k in ("n_embd", "n_ff", "n_head", "n_head_kv", "head_dim"))
    out = {"token_embd.weight": (VOCAB, D), "output_norm.weight": (D,)}
    for i in range(n_layer):
        p = f"blk.{i}."
        out.update({p + "attn_norm.weight": (D,), p + "attn_q.weight": (H * hd, D), p + "attn_k.weight": (HKV * hd, D),
                    p + "attn_v.weight": (HKV * hd, D), p + "attn_q_norm.weight": (hd,),
                    p + "attn_k_norm.weight": (hd,), p + "attn_output.weight": (D, H * hd),
                    p + "ffn_norm.weight": (D,), p + "ffn_gate.weight": (F, D), p + "ffn_up.weight": (F, D),
                    p + "ffn_down.weight": (D, F)})
    return out


def make_model(work, n_layer, seed=0):
    """(F16 GGUF, emit-map allocation) of the n_layer-block model under ``work``, written once."""
    path = pathlib.Path(work) / f"qwen3-1.7b-shape-L{n_layer}-s{seed}-F16.gguf"
    amap = path.with_suffix(".map")
    shp = shapes(n_layer)
    if not path.exists():
        rng = np.random.default_rng(seed)
        D, hd = SHAPE["n_embd"], SHAPE["head_dim"]
        meta = qwen3_meta("orkpy qwen3-1.7b shape", D, SHAPE["n_ff"], n_layer, SHAPE["n_head"], SHAPE["n_head_kv"], hd,
                          vocab())
        outlier = rng.random(max(D, SHAPE["n_ff"])) < 0.01  # a few x20 input channels, like real outliers
        tensors = []
        for name, s in shp.items():
            if len(s) == 1:
                tensors.append((name, (1 + 0.1 * rng.standard_normal(s, dtype=np.float32)).astype(np.float32)))
            else:
                w = rng.standard_normal(s, dtype=np.float32) * np.float32(1 / np.sqrt(s[1]))
                w[:, outlier[:s[1]]] *= 20
                tensors.append((name, w.astype(np.float16)))
        write_gguf(path, meta, tensors)
        del tensors
    entries = {n: TierEntry("float", "F32", s) if len(s) == 1 else
               TierEntry("int8" if n == "token_embd.weight" else "int4", "Q8_0" if n == "token_embd.weight" else "Q4_0",
                         s) for n, s in shp.items()}
    TierMap(entries, threshold=5.0, source="all block linears int4 (Q4_0-like), tied embedding int8",
            tied=True).save(amap)
    return path, amap


def child(a):
    """One run in this process: print {"run", "wall", "cpu", "peak", "stages": {stage: [s, peak after]}}."""
    from orkpy.quantization import awq, calibrate, gptq
    from orkpy.runtime.model import float_model
    from orkpy.formats.source import open_source

    path, amap = make_model(a.work, a.layers)
    ids = np.random.default_rng(1).integers(3, VOCAB, a.calib_chunks * a.calib_ctx)
    stages = {}

    def timed(mod, name, stage, **more):  # quantize_model's stage ``name`` timed (and given ``more``)
        f = getattr(mod, name)

        def g(*args, **kw):
            t = time.time()
            try:
                return f(*args, **kw, **more)
            finally:
                stages[stage] = [time.time() - t, peak_rss()]
        setattr(mod, name, g)
    timed(awq, "awq_scales", "awq_scales", max_bytes=a.max_bytes)
    timed(gptq, "gptq_linears", "gptq_linears", max_bytes=a.max_bytes)
    timed(calibrate, "calibrate_source_acts", "act_calib")
    real_grams = gptq.collect_grams

    def grams(*args, **kw):  # the Gram passes inside awq_scales / gptq_linears: count and time
        t = time.time()
        try:
            return real_grams(*args, **kw)
        finally:
            passes.append(time.time() - t)
    passes = []
    gptq.collect_grams = grams
    t, c = time.time(), time.process_time()
    if a.child == "float":
        m = float_model(open_source(path))
        del m
    else:
        kw = {"gptq": dict(method="gptq"), "awq": dict(awq=True), "both": dict(method="gptq", awq=True)}[a.child]
        qm = orkpy.quantize_model(path, amap, calib=ids, calib_ctx=a.calib_ctx, calib_chunks=a.calib_chunks,
                                  threads=a.threads, progress=False, log=lambda m: None, **kw)
        del qm
    print(json.dumps({"run": a.child, "wall": time.time() - t, "cpu": time.process_time() - c, "peak": peak_rss(),
                      "stages": stages, "passes": passes}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=SHAPE["n_layer"])
    ap.add_argument("--runs", nargs="+", default=["float", "gptq", "awq", "both"],
                    choices=["float", "gptq", "awq", "both"])
    ap.add_argument("--calib-chunks", type=int, default=2)
    ap.add_argument("--calib-ctx", type=int, default=256)
    ap.add_argument("--max-bytes", type=int, default=1 << 30)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-qwen3-shape"))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    if a.child:
        return child(a)
    from orkpy.quantization.gptq import gram_batches

    t = time.time()
    path, amap = make_model(a.work, a.layers)
    shp = shapes(a.layers)
    lin = {n: s for n, s in shp.items() if len(s) == 2 and n != "token_embd.weight"}
    params = sum(int(np.prod(s)) for s in shp.values())
    inputs = [n for n in lin if n.split(".")[2] in ("attn_q", "attn_output", "ffn_gate", "ffn_down")]
    layer_gram = sum(lin[n][1] ** 2 * 8 for n in inputs if n.startswith("blk.0."))
    print(f"qwen3-1.7b shape: {a.layers} of 28 layers, n_embd {SHAPE['n_embd']}, n_ff {SHAPE['n_ff']}, "
          f"{SHAPE['n_head']} / {SHAPE['n_head_kv']} heads of {SHAPE['head_dim']}, vocab {VOCAB} (tied); "
          f"{path} ({os.path.getsize(path) / MiB:.0f} MiB F16, ready in {time.time() - t:.0f} s)")
    print(f"model F32 bytes {params * 4 / MiB:.0f} MiB ({params / 1e6:.0f} M parameters; the block linears "
          f"{sum(int(np.prod(s)) for s in lin.values()) * 4 / MiB:.0f} MiB, {sum(int(np.prod(s)) for s in lin.values()) * 4 / a.layers / MiB:.0f} MiB per layer)")
    print(f"Gram matrices (float64 K x K per linear input): one layer {layer_gram / MiB:.0f} MiB, all {a.layers} "
          f"{layer_gram * a.layers / MiB:.0f} MiB, budget --max-bytes {a.max_bytes / MiB:.0f} MiB -> "
          f"{len(gram_batches(inputs, lambda n: lin[n][1], a.max_bytes))} passes over the calibration text for AWQ, "
          f"{len(gram_batches(list(lin), lambda n: lin[n][1], a.max_bytes))} for GPTQ (of the whole depth each)")
    print(f"allocation: every block linear int4 (nf4, per channel), tied embedding int8; calibration "
          f"{a.calib_chunks} x {a.calib_ctx} random token ids (seed 1); threads {a.threads or 'default'}; "
          f"one process per run\n")
    print(f"{'run':<6} {'wall s':>8} {'cpu s':>8} {'peak MiB':>9}  stages (s, per layer s, peak MiB after)")
    for r in a.runs:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", r, "--layers", str(a.layers), "--calib-chunks",
               str(a.calib_chunks), "--calib-ctx", str(a.calib_ctx), "--max-bytes", str(a.max_bytes), "--work", a.work]
        if a.threads:
            cmd += ["--threads", str(a.threads)]
        out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
        d = json.loads(out.strip().splitlines()[-1])
        st = dict(d["stages"])
        rest = d["wall"] - sum(v[0] for v in st.values())
        parts = [f"{k} {v[0]:.1f} ({v[0] / a.layers:.1f}/layer, {v[1] / MiB:.0f})" for k, v in st.items()]
        if d["passes"]:
            parts.append(f"of which {len(d['passes'])} Gram passes {sum(d['passes']):.1f}")
        if r != "float":
            parts.append(f"rest {rest:.1f}")
        print(f"{r:<6} {d['wall']:8.1f} {d['cpu']:8.1f} {d['peak'] / MiB:9.0f}  {'; '.join(parts)}", flush=True)


if __name__ == "__main__":
    main()
