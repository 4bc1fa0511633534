"""W4A4 -- the RK3588 NPU's int4 x int4 -> int16 mode -- on the real models: mean KL vs the F32 model
and PPL of pure W4A4, W8A8 and the mixed W4A4/W8A8 allocation at an NPU-bits budget, next to
llama.cpp's Q8_0, Q4_0 and Q4_K_M+imatrix made and scored in the same run (docs/w4a4.md).

Models and texts as bench/act_modes.py (smollm2 / gemma3: the exact dequantization of the shipped
GGUF as F32, wikitext-2 scored, TinyStories B calibrates; stories260k: the halves of TinyStories B).
Rows (every orkpy row on the same rotated source: hadamard + online down rotation where the
architecture takes them, see the "rotation" line; the activations calibrated on the rotated float
model):

  rk-llama recipe   rk-llama.cpp's W4A4_HADAMARD reproduced: one randomized Hadamard per linear input
                    (orkpy's rotation), per-TENSOR int4 weight scales, round to nearest, per-tensor dynamic
                    int4 activations (no search, no int8 sink); ", per-token acts": the same weights with
                    per-token absmax int4 activations (the kinder reading of its recipe: at decode, one
                    token per call, the two agree)
  w4a4 rtn          per-channel int4 weights (absmax), per-token int4 activations with the range search,
                    the first position (attention sink) int8
  w4a4 gptq         the same with GPTQ-rounded weights (Gram matrices of the rotated float model on the
                    calibration text); "static" = one calibrated 4-bit range per linear (mse4), sink int8
  w8a8 gptq         int8 weights (GPTQ), per-token int8 activations: the 8-bit NPU mode
  head w8a8         every block linear W4A4 (as "w4a4 gptq"), the head W8A8: QuaRot and SpinQuant keep the
                    head in 16 bits, llama.cpp's Q4_0 puts it in Q6_K
  w4a8              the w4a4 gptq weights with int8 activations (codes to +-119) run as two int4 digits per
                    activation on the int4 mode: 4 NPU bits per weight, two rows per token
  group G           (--groups) group-wise int4 weight scales, one per G inputs; "acts per group": the
                    activations scaled per token and weight group too; "affine" (--affine): each group a
                    float16 offset beside its scale (csrc/ork/affine.h), the mixes then use those
  mix X (options)   W4A4 / W8A8 (and W4A8) per input group at <= X NPU bits per weight, chosen by measured
                    sensitivity (orkpy.quantization.npu_alloc: one forward per group and option on
                    --sens-chunks chunks of the calibration text), each group's weights as in the rows above

Per layer (after each mix row): qkv, attn_output, gate/up, down as 8 (W8A8), d (W4A8 by digits) or 4
(W4A4), then the head. NPU MB: the weight bytes the NPU reads per token (int8: 1 byte, w4a4: half; llama.cpp's formats as the
NPU would run them today: inflated to int8); file MB: the packed linears as stored.

    python bench/w4a4.py [--model smollm2 gemma3 stories260k] [--chunks 8] [--calib-chunks 8]
                         [--npu-bits [5.0 ...]] [--groups G ...] [--mix-group G] [--affine] [--sens-chunks 1]
                         [--no-llama] [--work DIR] [--json-out F_{model}]
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
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import oracle  # noqa: E402
from act_modes import linear_bytes, model_and_texts, reused_reference  # noqa: E402

import orkpy  # noqa: E402
from orkpy.formats.source import open_source  # noqa: E402
from orkpy.kernels.actspec import ActSpec  # noqa: E402
from orkpy.kernels.quant import QuantizedTensor  # noqa: E402
from orkpy.quantization.gptq import gptq_linears  # noqa: E402
from orkpy.quantization import npu_alloc  # noqa: E402
from orkpy.runtime.actcal import resolve  # noqa: E402
from orkpy.runtime.model import LinearSpec, Model, float_model, linear_names, transformed_source  # noqa: E402


def rotated(f32):
    """(source, label): hadamard + online down rotation, or the most of it the model takes."""
    for rot, online in (("hadamard", True), ("hadamard", False), (None, False)):
        try:
            return transformed_source(open_source(f32), rot, rotate_online=online), \
                (rot or "none") + ("+online" if online else "")
        except (NotImplementedError, ValueError):
            continue
    raise AssertionError("unreachable")


def per_tensor_w4(w):
    """rk-llama.cpp's weights: one int4 scale for the whole tensor (absmax / 7), round to nearest."""
    w = np.asarray(w, np.float32)
    s = np.float32(np.abs(w).max()) / np.float32(7)
    y = w / s
    codes = np.clip(np.where(y >= 0, np.floor(y + 0.5), np.ceil(y - 0.5)), -7, 7).astype(np.int8)
    return QuantizedTensor("w4a4", w.shape, codes, np.full(w.shape[0], s, np.float32), None)


def build(src, f32, packed, spec, cal, where="bench"):
    names = linear_names(src.hp)
    lin = {n: LinearSpec.from_packed(n, packed[n], act_spec=resolve(spec, n, cal, packed[n].K, where, packed[n].kind,
                                                                  packed[n].group))
           for n in names}
    return Model(str(f32), src.hp, lin, src.tensor, src.meta, src.tied, {n: packed[n].kind for n in names})


def llama_rows(name, f32, text_f, calib_f, ctx, chunks, calib_chunks, work, names, more=()):
    w = pathlib.Path(work)
    tag = f"{name}-{pathlib.Path(text_f).stem}-{ctx}-{chunks}"
    ctag = f"{name}-{pathlib.Path(calib_f).stem}-{ctx}-{calib_chunks}"
    base = w / f"{tag}.llama-base.kld"
    r = oracle.llama_kld(f32, base, text_f, ctx, chunks)
    nb = linear_bytes(f32, names) // 4  # F32 -> the int8 the NPU reads per weight
    rows = [{"row": "llama.cpp F32", "ppl": r["ppl"], "kld": 0.0, "npu": None, "file": linear_bytes(f32, names)}]
    im = w / f"{ctag}.imatrix.gguf"
    if not im.exists():
        oracle.llama_imatrix(f32, calib_f, ctx, calib_chunks, im)
    more = [(t, t, None, w / f"{name}.{t}.gguf") for t in more]
    for label, qtype, imx, dst in [("Q8_0", "Q8_0", None, w / f"{name}.Q8_0.gguf"),
                                   ("Q4_0", "Q4_0", None, w / f"{name}.Q4_0.gguf"), *more,
                                   ("Q4_K_M+imatrix", "Q4_K_M", im, w / f"{ctag}.Q4_K_M-im.gguf")]:
        if not dst.exists():
            oracle.llama_quantize(f32, dst, qtype, imatrix=imx)
        r = oracle.llama_kld(dst, base, n_ctx=ctx)
        rows.append({"row": f"llama.cpp {label}", "ppl": r["ppl"], "kld": r["kld"], "npu": nb,
                     "file": linear_bytes(dst, names)})
    return rows


CODE = {"int8": "8", "w4a8": "d", "w4a4": "4"}
PARTS = ("attn_qkv", "attn_output", "ffn_gate_up", "ffn_down")


def per_layer(groups):
    """One token per layer, 'q o g d' as 8 (W8A8), d (W4A8 by digits) or 4 (W4A4), then the head."""
    n = 1 + max((int(g.split(".")[1]) for g in groups if g.startswith("blk.")), default=-1)
    def code(t):  # a group's linears at different tiers: their codes in brackets ("[dd8]": attn_v W8A8)
        return CODE[t] if "/" not in t else "[" + "".join(CODE[x] for x in t.split("/")) + "]"
    cells = ["".join(code(groups.get(f"blk.{i}.{p}.weight", "int8")) for p in PARTS) for i in range(n)]
    return " ".join(f"{i}:{c}" for i, c in enumerate(cells)) + f" head:{code(groups.get('output.weight', 'int8'))}"


def run_model(a, name):
    f32, text_f, calib_f, ctx, split = model_and_texts(name, a.work, a.ctx, a.text, a.calib, a.dither)
    if a.dither is not None:
        name = f"{name}-dither{a.dither}"  # its own cached reference and llama.cpp files in --work
    text = open(text_f, encoding="utf-8").read()
    calib = open(calib_f, encoding="utf-8").read()
    ref = os.path.join(a.work, f"{name}-{pathlib.Path(text_f).stem}-ref-{ctx}-{a.chunks}.npz")
    base = orkpy.load_model(f32)
    tokens = base.tokens(text)
    src0 = open_source(f32)
    names = linear_names(src0.hp)
    shapes = {n: tuple(int(d) for d in src0.linear(n).shape) for n in names}
    if reused_reference(ref, tokens, ctx, a.chunks) is None:
        orkpy.perplexity(base, tokens, n_ctx=ctx, chunks=a.chunks, save_logprobs=ref, progress=False)
    del base
    rows = []
    w8_npu = sum(npu_alloc.npu_nbytes("int8", *s) for s in shapes.values())

    def show(d):
        npu = "" if d["npu"] is None else f"{d['npu'] / 1e6:8.2f}"
        bits = "" if d["npu"] is None else f"{8 * d['npu'] / w8_npu:5.2f}"
        print(f"{d['row']:34} {d['ppl']:9.4f} {d['kld']:9.5f} {npu:>8} {bits:>5} {d['file'] / 1e6:8.2f}", flush=True)

    print(f"{name}: {f32.name}, scored {os.path.basename(text_f)} ({a.chunks} x {ctx}), calibrated on "
          f"{os.path.basename(calib_f)} ({a.calib_chunks} x {ctx})", flush=True)
    hdr = f"{'row':34} {'PPL':>9} {'mean KL':>9} {'NPU MB':>8} {'bits':>5} {'file MB':>8}"
    print(hdr + "\n" + "-" * len(hdr), flush=True)
    if not a.no_llama:
        for d in llama_rows(name, f32, text_f, calib_f, ctx, a.chunks, a.calib_chunks, a.work, names,
                            a.llama_more):
            rows.append(d)
            show(d)
    src, rot = rotated(f32)
    print(f"# rotation: {rot}", flush=True)
    fm = float_model(src)
    cal = orkpy.calibrate_activations(fm, calib, n_ctx=ctx, chunks=a.calib_chunks, progress=False, prefix=1)

    def row(label, packed, spec):
        t = time.time()
        m = build(src, f32, packed, spec, cal)
        r = orkpy.perplexity(m, tokens, n_ctx=ctx, chunks=a.chunks, kld_base=ref, progress=False)
        d = {"row": label, "ppl": r.ppl, "kld": r.kld["mean"], "secs": time.time() - t,
             "npu": sum(npu_alloc.npu_nbytes(pw.kind, pw.N, pw.K) for pw in packed.values()),
             "file": sum(pw.nbytes for pw in packed.values())}
        rows.append(d)
        show(d)
        return m

    if "baseline" in a.rows:
        base4 = {n: orkpy.pack(per_tensor_w4(src.linear(n))) for n in names}
        row("rk-llama recipe (w4a4)", base4, ActSpec("per_tensor", prefix=0))
        row("rk-llama recipe, per-token acts", base4, ActSpec(method="max", prefix=0))
    if "rtn" in a.rows:
        row("w4a4 rtn, per-token", {n: orkpy.pack(orkpy.quantize(src.linear(n), "w4a4")) for n in names}, ActSpec())
    q4t = gptq_linears(src, calib, "w4a4", n_ctx=ctx, chunks=a.calib_chunks, progress=False)
    q4 = {n: orkpy.pack(q) for n, q in q4t.items()}
    row("w4a4 gptq, per-token", q4, ActSpec())
    if "static" in a.rows:
        row("w4a4 gptq, static", q4, ActSpec("static"))
    q4d = {n: orkpy.pack(QuantizedTensor("w4a8", q.shape, q.codes, q.scales, None)) for n, q in q4t.items()}
    row("w4a8 gptq (int8 acts as 2 digits)", q4d, ActSpec())
    mixed4 = (q4, q4d)  # the 4-bit stores the mixes choose from: per channel, or --mix-group's
    for g in sorted(set(a.groups) | ({a.mix_group} if a.mix_group else set())):
        # group-wise int4 weight scales (one per g of K): on the NPU, one K tile per group
        for sym in ((True, False) if a.affine else (True,)):
            qg = gptq_linears(src, calib, "w4a4", n_ctx=ctx, chunks=a.calib_chunks, progress=False, group_size=g,
                              symmetric=sym)
            g4 = {n: orkpy.pack(q) for n, q in qg.items()}
            g4d = {n: orkpy.pack(QuantizedTensor("w4a8", q.shape, q.codes, q.scales, None, group=q.group,
                                                 offsets=q.offsets)) for n, q in qg.items()}
            tag = "" if sym else ", affine"
            if g in a.groups:
                if sym:
                    row(f"w4a4 gptq, group {g}", g4, ActSpec())
                row(f"w4a4 gptq, group {g}{tag}, acts per group", g4, ActSpec(groups=True))
                if sym:
                    row(f"w4a8 gptq, group {g}", g4d, ActSpec())
                row(f"w4a8 gptq, group {g}{tag}, acts per group", g4d, ActSpec(groups=True))
            if g == a.mix_group and sym != a.affine:
                mixed4 = (g4, g4d)
            del qg, g4, g4d
    q8 = {n: orkpy.pack(q) for n, q in gptq_linears(src, calib, "int8", n_ctx=ctx, chunks=a.calib_chunks,
                                                      progress=False).items()}
    m8 = row("w8a8 gptq, per-token", q8, ActSpec())
    head = "output.weight"
    row("w4a4 gptq, head w8a8", {n: (q8[n] if n == head else q4[n]) for n in names}, ActSpec())
    if not a.npu_bits:
        return rows
    # the mixed allocation: sensitivities on the calibration text (not the scored one)
    t = time.time()
    toks = fm.tokens(calib)
    _, it = fm.chunks(toks, ctx, a.sens_chunks)
    batch = list(it)
    ref_lp = npu_alloc.reference_logprobs(fm, batch)
    packs = {"w4a4": mixed4[0], "w4a8": mixed4[1], "int8": q8}
    gtag = (f", group {a.mix_group}" + (", affine" if a.affine else "")) if a.mix_group else ""
    atag = ", acts per group" if a.act_groups and a.mix_group else ""
    mspec = ActSpec(groups=True) if a.act_groups else ActSpec()  # the mixes' activations
    lo = {t: {n: LinearSpec.from_packed(n, packs[t][n], act_spec=resolve(mspec, n, cal, packs[t][n].K, "bench", t,
                                                                         packs[t][n].group))
              for n in names} for t in ("w4a4", "w4a8")}
    sens = npu_alloc.group_sensitivities(m8, lo, batch, ref_lp, progress=False)
    print(f"# sensitivities: {len(sens['kl']['w4a4'])} groups x 2 options in {time.time() - t:.0f} s (W8A8 base KL "
          f"{sens['base']:.5f})", flush=True)
    runs = [("", sens["kl"], options) for options in (("w4a4", "int8"), ("w4a4", "w4a8", "int8"))]
    if a.per_linear:  # w4a8 measured on each linear alone: a group's linears may mix w4a8 and int8
        t = time.time()
        pl = npu_alloc.group_sensitivities(m8, {"w4a8": lo["w4a8"]}, batch, ref_lp, progress=False, per_linear=True)
        print(f"# per-linear w4a8 sensitivities: {len(pl['kl']['w4a8'])} linears in {time.time() - t:.0f} s", flush=True)
        sens["kl_w4a8_per_linear"] = pl["kl"]["w4a8"]
        runs.append((", per linear", {"w4a4": sens["kl"]["w4a4"], "w4a8": pl["kl"]["w4a8"]}, ("w4a4", "w4a8", "int8")))
    for how, kl, options in runs:
        for bits in a.npu_bits:
            tiers, rep = npu_alloc.choose_npu(shapes, kl, bits, options)
            row(f"mix <= {bits:g} NPU bits ({'/'.join(options)}{gtag}{how}{atag})",
                {n: packs[tiers[n]][n] for n in names}, mspec)
            rows[-1]["alloc"] = rep
            cnt = {t: [n for n, tt in tiers.items() if tt == t] for t in options}
            print("#   " + "; ".join(f"{t}: {len(v)}" for t, v in cnt.items()) + " of " + str(len(tiers))
                  + " linears; per layer (qkv, o, gate/up, down): " + per_layer(rep["groups"]), flush=True)
    if a.json_out:
        with open(a.json_out.replace("{model}", name), "w") as f:
            json.dump({"model": name, "rotation": rot, "text": text_f, "calib": calib_f, "chunks": a.chunks,
                       "calib_chunks": a.calib_chunks, "sens_chunks": a.sens_chunks, "ctx": ctx, "rows": rows,
                       "sensitivity": sens}, f, indent=1)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["smollm2"], choices=["smollm2", "gemma3", "stories260k"])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--sens-chunks", type=int, default=1, help="calibration chunks the sensitivities are measured on")
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--npu-bits", type=float, nargs="*", default=[5.0], help="the mixes' budgets (none: no mix rows)")
    ap.add_argument("--groups", type=int, nargs="*", default=[],
                    help="rows with group-wise int4 weight scales, one per this many inputs (GPTQ, w4a4 and w4a8)")
    ap.add_argument("--mix-group", type=int, default=0,
                    help="the mixes' 4-bit options with group-wise scales, one per this many inputs (0: per channel)")
    ap.add_argument("--rows", nargs="*", default=["baseline", "rtn", "static"],
                    help="optional rows: baseline rtn static (the gptq, w8a8 and mix rows always run)")
    ap.add_argument("--act-groups", action="store_true",
                    help="the mixes' grouped int4 options scale their activations per weight group too")
    ap.add_argument("--affine", action="store_true",
                    help="also group rows with affine int4 groups (a scale and an offset each); the mixes use them")
    ap.add_argument("--text")
    ap.add_argument("--calib")
    ap.add_argument("--no-llama", action="store_true")
    ap.add_argument("--per-linear", action="store_true",
                    help="also mixes with w4a8 measured and chosen per linear inside an input group")
    ap.add_argument("--llama-more", nargs="*", default=[], metavar="TYPE",
                    help="more llama.cpp rows without an imatrix (e.g. Q4_1 Q5_0 Q4_K_M)")
    ap.add_argument("--dither", type=int, metavar="SEED",
                    help="score against the real model moved off its shipped 4-bit grid (act_modes.dither_gguf)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-w4a4"))
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    for name in a.model:
        run_model(a, name)


if __name__ == "__main__":
    main()
