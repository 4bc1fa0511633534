"""The activation-scale modes of the packed linears (orkpy.runtime.actcal) on real models: mean KL vs the
float model and PPL for w8a8 / w4a8 per mode, with and without rotation, next to llama.cpp's
Q8_0 and Q4_K_M+imatrix measured in the same run by the live llama.cpp.

Models (--model, several allowed): smollm2 and gemma3 (their float reference is the exact
dequantization of the shipped GGUF, orkpy.formats.convert.dequantize_gguf, written once to --work; scored
on wikitext-2-raw-test.txt, calibrated on tinystories-val-B.txt) and stories260k (the F32 GGUF of
../shared, used as is; a TinyStories model, so it is scored on TinyStories: the first half of
tinystories-val-B.txt, cut at a line end, and calibrated on the second half -- disjoint text of
the kind it was trained on; whenever --text and --calib name the same file it is split so).
--ctx is capped at stories260K's training context, 512 (llama2.c's max_seq_len; its GGUF says
2048). Per rotation the activations are calibrated once on the float (rotated) model:
--calib-chunks chunks of --ctx tokens. Rows:

  f32 float         the (rotated) float model (its KL vs the unrotated F32: the rotation's own error)
  llama.cpp rows    llama.cpp's own F32, Q8_0 and Q4_K_M+imatrix (llama-quantize of the same F32 GGUF;
                    the imatrix by llama-imatrix on the calibration text, --calib-chunks x --ctx):
                    PPL and mean KL from llama-perplexity's KL mode against its F32 run on the scored
                    text, same n_ctx and chunks (tests/oracle.py llama_kld); files cached in --work
  weight-only       the quantized weights with float activations (dequantized into float linears):
                    what the weights alone cost, so each mode's excess over it is the activations' cost
  per_token         dynamic, one scale per token (today's default)
  per_tensor_pP     dynamic, one scale per forward call; the first P positions per token
  static_M_pP       one calibrated range per linear (load_model(act="static", act_method=M)), calibrated
                    without and run with the first P positions per token (act_prefix); the "sat" column
                    is the share of the statically quantized inputs beyond the range on the scored text
  outliers_k        per token with the k largest-|x| calibration channels in float

"MB": bytes of the linear weights (every block linear and the head; a tied head counts the
embedding), as packed by orkpy or as stored in llama.cpp's GGUF; "file_bytes" in the JSON: the
whole llama.cpp file.

    python bench/act_modes.py [--model smollm2 [gemma3 stories260k]] [--chunks 8] [--calib-chunks 8]
                              [--ctx 512] [--weights int8 nf4] [--imatrix nf4] [--gptq int8] [--outliers 8]
                              [--rotate none hadamard hadamard+online online] [--no-llama]
                              [--work DIR] [--json-out FILE_WITH_{model}]

--rotate: none, hadamard (QuaRot-style, orkpy.runtime.rotate, folded into the weights; on Gemma, whose post-norms
keep it out of the residual stream, the block inputs are rotated online after their norms), hadamard+online
(plus the online Hadamard before ffn_down) or online (only that); a rotation the model cannot take
(stories260K's n_ff = 172 has no Hadamard order) is reported ("skipped" in the JSON) and not run. --imatrix: the weight kinds quantized with an importance matrix
collected on the calibration text by the float (rotated) model (weights "nf4+im" in the table).
--gptq: the weight kinds (int8, nf4, int4) rounded by GPTQ (orkpy.quantization.gptq: error compensation on each linear's input
Gram matrix, collected on the calibration text by the float (rotated) model; weights "int8+gptq").

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
import oracle  # noqa: E402
from oracle import real_model  # noqa: E402

import orkpy  # noqa: E402
from orkpy.runtime.actcal import linear_act  # noqa: E402
from orkpy.formats.gguf import GGUFFile  # noqa: E402
from orkpy.quantization.gptq import gptq_linears  # noqa: E402
from orkpy.runtime.model import LinearSpec, Model, transformed_source  # noqa: E402
from orkpy.formats.source import open_source  # noqa: E402


ROTATES = ["none", "hadamard", "hadamard+online", "online"]


def build(src, path, packed, how):
    """A Model of ``src`` whose linears are ``packed`` (name -> PackedWeight) run with the activation
    settings ``how(name, pw)`` (LinearSpec.from_packed keywords), or float linears holding the
    dequantized weights when ``how`` is None (weight-only)."""
    names = orkpy.runtime.model.linear_names(src.hp)
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


MODELS = {  # name -> (scored text, calibration text); the same file twice: its halves (see the module doc)
    "smollm2": ("wikitext-2-raw-test.txt", "tinystories-val-B.txt"),
    "gemma3": ("wikitext-2-raw-test.txt", "tinystories-val-B.txt"),
    "stories260k": ("tinystories-val-B.txt", "tinystories-val-B.txt"),
}
STORIES = SHARED / "models" / "stories260K" / "stories260K-F32.gguf"
TRAIN_CTX = {"stories260k": 512}  # llama2.c's max_seq_len; its GGUF says 2048


def linear_bytes(path, names):
    """Bytes of the linears ``names`` as stored in the GGUF ``path`` (a tied head: the embedding)."""
    with GGUFFile(path) as g:
        return sum(g.tensor_info(n if n in g else "token_embd.weight").nbytes for n in names)


def reused_reference(ref, tokens, ctx, chunks):
    """The F32 PPL of an earlier run's reference log-probs ``ref`` when it holds exactly these
    scored tokens (the same model file, text, ctx and chunks), else None (it is recomputed)."""
    if not os.path.exists(ref):
        return None
    with np.load(ref) as z:
        n = len(z["tokens"])
        if int(z["n_ctx"]) != ctx or n != ctx * min(chunks, len(tokens) // ctx) or \
                not np.array_equal(z["tokens"], tokens[:n]):
            return None
        return float(np.exp(z["nll"].mean()))


def split_text(path, work):
    """The first and second half of ``path`` (cut at a line end) as two files in ``work``."""
    text = open(path, encoding="utf-8").read()
    cut = text.index("\n", len(text) // 2) + 1
    out = []
    for part, body in (("A", text[:cut]), ("B", text[cut:])):
        p = pathlib.Path(work) / f"{pathlib.Path(path).stem}.{part}.txt"
        if not p.exists() or p.read_text(encoding="utf-8") != body:
            p.write_text(body, encoding="utf-8")
        out.append(str(p))
    return out


def llama_rows(name, f32, text, calib, ctx, chunks, calib_chunks, work, names):
    """llama.cpp's own F32 / Q8_0 / Q4_K_M+imatrix rows: PPL and mean KL vs its F32 run on the scored
    text (llama-perplexity's KL mode); the imatrix from llama-imatrix on the calibration text. The
    quantized files and the imatrix are cached in ``work`` (keyed by model, texts, ctx and chunks)."""
    w = pathlib.Path(work)
    tag = f"{name}-{pathlib.Path(text).stem}-{ctx}-{chunks}"
    ctag = f"{name}-{pathlib.Path(calib).stem}-{ctx}-{calib_chunks}"
    base = w / f"{tag}.llama-base.kld"
    r = oracle.llama_kld(f32, base, text, ctx, chunks)
    rows = [{"rotate": "-", "weights": "F32", "act": "llama.cpp", "ppl": r["ppl"], "kld": 0.0, "sat": None,
             "bytes": linear_bytes(f32, names), "file_bytes": os.path.getsize(f32)}]
    im = w / f"{ctag}.imatrix.gguf"
    if not im.exists():
        oracle.llama_imatrix(f32, calib, ctx, calib_chunks, im)
    for label, qtype, imx, dst in (("Q8_0", "Q8_0", None, w / f"{name}.Q8_0.gguf"),
                                   ("Q4_K_M+im", "Q4_K_M", im, w / f"{ctag}.Q4_K_M-im.gguf")):
        if not dst.exists():
            oracle.llama_quantize(f32, dst, qtype, imatrix=imx)
        r = oracle.llama_kld(dst, base, n_ctx=ctx)
        rows.append({"rotate": "-", "weights": label, "act": "llama.cpp", "ppl": r["ppl"], "kld": r["kld"],
                     "sat": None, "bytes": linear_bytes(dst, names), "file_bytes": os.path.getsize(dst)})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["smollm2"], choices=sorted(MODELS))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--sat-chunks", type=int, default=2, help="scored chunks the saturation share is measured on")
    ap.add_argument("--ctx", type=int, default=512, help="(capped at the model's training context)")
    ap.add_argument("--weights", nargs="+", default=["int8", "nf4"])
    ap.add_argument("--rotate", nargs="+", default=["none", "hadamard"], choices=ROTATES)
    ap.add_argument("--outliers", type=int, nargs="+", default=[8])
    ap.add_argument("--prefix", type=int, nargs="+", default=[0, 1],
                    help="leading positions quantized per token by per_tensor / static (static: calibrated so)")
    ap.add_argument("--imatrix", nargs="*", default=["nf4"],
                    help="weight kinds quantized with an imatrix of the calibration text (default: nf4)")
    ap.add_argument("--gptq", nargs="*", default=[], choices=["int8", "nf4", "int4"],
                    help="weight kinds rounded by GPTQ on Gram matrices of the calibration text (default: none)")
    ap.add_argument("--text", help="scored text (default per model, see the module doc)")
    ap.add_argument("--calib", help="calibration text (default per model)")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp rows")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-act-modes"))
    ap.add_argument("--json-out", help="a JSON file of the rows; with several models it must contain {model}")
    a = ap.parse_args(argv)
    if a.json_out and len(a.model) > 1 and "{model}" not in a.json_out:
        ap.error("--json-out must contain {model} when several models are measured")
    os.makedirs(a.work, exist_ok=True)
    for name in a.model:
        run_model(a, name)


DITHER_BLOCK = {"Q2_K": 16, "Q3_K": 16, "Q6_K": 16}  # a type's sub-block (one step) length; others 32


def dither_gguf(q, f32, dst, seed):
    """Write ``dst``: the F32 GGUF ``f32`` (the exact dequantization of the quantized GGUF ``q``) with
    every tensor that ``q`` stores quantized moved off its grid. The shipped real models are 4-bit files
    (SmolLM2 Q4_1, Gemma-3 Q4_K_M), so their F32 reference sits on a 4-bit grid that a format with the
    same blocks recovers almost exactly (llama.cpp's Q4_1 of the SmolLM2 reference scores below its
    Q8_0): a biased bar for any other quantizer. Each sub-block of ``DITHER_BLOCK`` values along a row
    gets uniform noise of one grid step (its smallest gap between distinct values), the values spread
    over their quantization bins as a float model's would be; seeded by ``seed`` and the tensor's name,
    so the file is reproducible. Returns {type: tensors dithered}."""
    import zlib
    from orkpy.formats.gguf_write import metadata_triples, write_gguf
    done = {}
    with GGUFFile(q) as gq, GGUFFile(f32) as gf:
        types = {t.name: t.type for t in gq.tensors}
        tensors = []
        for t in gf.tensors:
            w = np.array(gf.tensor(t.name), dtype=np.float32)
            qt = types[t.name]
            b = DITHER_BLOCK.get(qt, 32)
            if qt not in ("F32", "F16", "BF16") and w.shape[-1] % b == 0:
                v = w.reshape(-1, b)
                srt = np.sort(v, axis=1)
                gap = np.diff(srt, axis=1)
                step = np.where(gap > 0, gap, np.inf).min(axis=1)
                step[~np.isfinite(step)] = 0.0
                rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
                v += ((rng.random(v.shape, dtype=np.float32) - 0.5) * step[:, None]).astype(np.float32)
                done[qt] = done.get(qt, 0) + 1
            tensors.append((t.name, w))
        write_gguf(dst, metadata_triples(gf), tensors, alignment=gf.alignment)
    return done


def model_and_texts(name, work, ctx, text_f=None, calib_f=None, dither=None):
    """(F32 GGUF, scored text file, calibration text file, n_ctx, split) of model ``name`` (see the
    module doc): the real models' exact dequantization written once to ``work`` (``dither``: a seed, the
    reference moved off the shipped file's grid, dither_gguf); one file named twice is split into its
    halves; ``ctx`` capped at the model's training context."""
    if name == "stories260k":
        f32 = STORIES
        if not f32.is_file():
            oracle._missing(f"stories260K not at {f32}")
    else:
        q = real_model(name)
        f32 = pathlib.Path(work) / (q.stem + ".F32.gguf")
        if not f32.exists():
            orkpy.dequantize_gguf(q, f32)
        if dither is not None:
            d = pathlib.Path(work) / f"{q.stem}.F32.dither{dither}.gguf"
            if not d.exists():
                print(f"# dithered reference {d.name}: {dither_gguf(q, f32, d, dither)}", flush=True)
            f32 = d
    text_f = text_f or str(SHARED / "text" / MODELS[name][0])
    calib_f = calib_f or str(SHARED / "text" / MODELS[name][1])
    split = os.path.realpath(text_f) == os.path.realpath(calib_f)
    if split:
        text_f, calib_f = split_text(text_f, work)
    return f32, text_f, calib_f, min(ctx, TRAIN_CTX.get(name, ctx)), split


def run_model(a, name):
    f32, text_f, calib_f, ctx, split = model_and_texts(name, a.work, a.ctx, a.text, a.calib)
    text = open(text_f, encoding="utf-8").read()
    calib = open(calib_f, encoding="utf-8").read()
    ref = os.path.join(a.work, f"{name}-{pathlib.Path(text_f).stem}-ref-{ctx}-{a.chunks}.npz")
    base = orkpy.load_model(f32)
    tokens = base.tokens(text)
    names = orkpy.runtime.model.linear_names(open_source(f32).hp)
    t0 = time.time()
    ppl = reused_reference(ref, tokens, ctx, a.chunks)
    if ppl is None:
        ppl = orkpy.perplexity(base, tokens, n_ctx=ctx, chunks=a.chunks, save_logprobs=ref, progress=False).ppl
    del base
    rows = [{"rotate": "none", "weights": "f32", "act": "float", "ppl": ppl, "kld": 0.0, "sat": None,
             "bytes": linear_bytes(f32, names)}]
    print(f"{name}: {f32.name}, scored {os.path.basename(text_f)} ({a.chunks} x {ctx}), calibrated on "
          f"{os.path.basename(calib_f)} ({a.calib_chunks} x {ctx}){' (halves of one file)' if split else ''}; "
          f"F32 PPL {ppl:.4f} ({time.time() - t0:.0f} s); MB: bytes of the linears' weights (head included)",
          flush=True)
    hdr = f"{'rotate':15} {'weights':9} {'act':16} {'PPL':>8} {'mean KL':>8} {'sat':>9} {'MB':>7}"
    print(hdr + "\n" + "-" * len(hdr), flush=True)

    def show(d):
        s = "" if d["sat"] is None else f"{d['sat']:.2e}"
        print(f"{d['rotate']:15} {d['weights']:9} {d['act']:16} {d['ppl']:8.4f} {d['kld']:8.5f} {s:>9} "
              f"{d['bytes'] / 1e6:7.2f}", flush=True)

    show(rows[0])
    if not a.no_llama:
        for d in llama_rows(name, f32, text_f, calib_f, ctx, a.chunks, a.calib_chunks, a.work, names):
            rows.append(d)
            show(d)

    def row(rot, w, act, m, nbytes, sat=None):
        res = orkpy.perplexity(m, tokens, n_ctx=ctx, chunks=a.chunks, kld_base=ref, progress=False)
        d = {"rotate": rot, "weights": w, "act": act, "ppl": res.ppl, "kld": res.kld["mean"], "sat": sat,
             "bytes": nbytes}
        rows.append(d)
        show(d)

    skipped = {}
    for rot in a.rotate:
        try:
            src = transformed_source(open_source(f32), None if rot in ("none", "online") else "hadamard",
                                     rotate_online=rot.endswith("online"))
        except (NotImplementedError, ValueError) as e:
            skipped[rot] = str(e)
            print(f"# rotate {rot}: not run: {e}", flush=True)
            continue
        fm = Model(str(f32), src.hp, {n: LinearSpec.f32(n, src.linear(n)) for n in names}, src.tensor, src.meta,
                   src.tied, {n: "fp32" for n in names})
        if rot != "none":
            row(rot, "f32", "float", fm, rows[0]["bytes"])
        cals = {p: orkpy.calibrate_activations(fm, calib, n_ctx=ctx, chunks=a.calib_chunks, progress=False, prefix=p)
                for p in a.prefix}
        cal = cals[a.prefix[-1]]
        im = orkpy.collect_imatrix(fm, calib, n_ctx=ctx, chunks=a.calib_chunks, progress=False) \
            if set(a.weights) & set(a.imatrix) else None
        del fm
        for w in a.weights:
            if w in a.gptq:
                packed = {n: orkpy.pack(qt) for n, qt in gptq_linears(src, calib, w, n_ctx=ctx, chunks=a.calib_chunks,
                                                                       progress=False).items()}
            else:
                packed = {n: orkpy.pack(orkpy.quantize(src.linear(n), w, imatrix=im.values(n) if (
                    w in a.imatrix and n in im) else None)) for n in names}
            nbytes = sum(pw.nbytes for pw in packed.values())
            wl = w + ("+gptq" if w in a.gptq else "+im" if w in a.imatrix else "")
            row(rot, wl, "weight-only", build(src, f32, packed, None), nbytes)
            modes = [("per_token", "per_token", "mse", 8, 0)]
            modes += [(f"per_tensor_p{p}", "per_tensor", "mse", 8, p) for p in a.prefix]
            modes += [(f"static_{meth}_p{p}", "static", meth, 8, p) for p in a.prefix for meth in ("mse", "max")]
            modes += [(f"outliers_{k}", "per_token_outliers", "mse", k, 0) for k in a.outliers]
            for label, act, method, k, p in modes:
                c = cals[p] if act == "static" else cal
                m = build(src, f32, packed, lambda n, pw: linear_act(act, n, c, method, k, rot, pw.K, p))
                sat = saturation(m, tokens, ctx, a.sat_chunks) if act == "static" else None
                row(rot, wl, label, m, nbytes, sat)
    if a.json_out:
        with open(a.json_out.replace("{model}", name), "w") as f:
            json.dump({"model": name, "f32": str(f32), "text": text_f, "calib": calib_f, "chunks": a.chunks,
                       "calib_chunks": a.calib_chunks, "ctx": ctx, "skipped": skipped, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
