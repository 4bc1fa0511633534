"""Weight accuracy at 4 bits (issue 17): orkpy's rounding methods against llama.cpp's 4-bit files on
the same model, text and chunks, every llama.cpp file made and scored by the live llama.cpp in the
same run.

Per model (--model; the float reference, texts and text split are bench/act_modes.py's: SmolLM2 and
Gemma-3 are the exact dequantization of the shipped file scored on wikitext-2 and calibrated on
TinyStories B; stories260K is scored on the first half of TinyStories B and calibrated on the
second), n_ctx --ctx, --chunks scored chunks, --calib-chunks calibration chunks:

  llama.cpp  F32, Q8_0, Q4_0, IQ4_NL, IQ4_NL+imatrix, Q4_K_M, Q4_K_M+imatrix: llama-quantize of the
             F32 GGUF (the imatrix by llama-imatrix on the calibration text), scored by
             llama-perplexity's KL mode against its own F32 run
  orkpy      the allocation of llama.cpp's Q4_0 file made above (the tier map: its Q4_0 tensors
             4-bit, the rest int8), NF4 per output channel, for each method: rtn, rtn+im (orkpy's
             imatrix of the calibration text), awq, awq+im, gptq, gptq+awq (orkpy.quantization.awq, orkpy.quantization.gptq,
             both calibrated on the calibration text; --gptq-sequential: each gptq row again as
             "gptq+seq", its Gram matrices layer by layer on the quantized layers before, as
             quantize_model(gptq_sequential=True); --gptq-float32 likewise "gptq+f32", GPTQ in float32);
             --rotate adds the rows with both rotations
             (hadamard + online before ffn_down) for the methods in --rotate-methods. Each row twice:
             "w4a8" (the packed int8 path, per-token int8 activations) and "w-only" (the same
             weights dequantized, float activations: what the weights alone cost)

             Each method once per --groups entry: 0 = one scale per output channel, 128 / 32 =
             group-wise scales (csrc/ork/pack.h) on every packed linear.
  orkpy      "target@Q4_K_M": the allocation chosen by orkpy.quantization.alloc for llama.cpp Q4_K_M's linear bytes
             (quantize_model(target_bpw=), orkpy.quantization.alloc.DEFAULT_OPTIONS: int4 / int4-g128 / g64 / g32,
             int5-g128 / g64 / g32, int6-g128 / g64 / g32, int8; --target-narrow adds each target row
             again as "target@Q4_K_M/48" with the 4- and 8-bit options only, the same budget;
             --target-at Q4_0/456: Q4_0's bytes with int4 / int5 / int6 at g64 / g32 and int8);
             "target@Q4_0": the same at Q4_0's bytes with group sizes <= 64 only (int4-g64 / g32 /
             int8: the issue's grouped row at Q4_0's bytes), for each of --target-methods and
             --target-at; "int8": every linear
             int8 per channel (the all-int8 row: with the w-only row it separates what the
             int8 activations cost from what the 4-bit weights cost)

Columns: linear bytes (every block linear and the head; a tied head counts the embedding), bits per
weight over those parameters, PPL, mean KL vs the float model. --swap scores the calibration text
and calibrates on the scored one (SmolLM2 / Gemma-3: TinyStories B scored, wikitext-2 calibration).

    python bench/accuracy.py [--model smollm2 [gemma3 stories260k]] [--chunks 8] [--calib-chunks 8]
                             [--ctx 512] [--methods rtn rtn+im awq awq+im gptq gptq+awq]
                             [--groups 0 128 32] [--target-methods rtn+im gptq] [--target-narrow] [--no-int8]
                             [--gptq-sequential] [--gptq-float32]
                             [--rotate] [--rotate-methods gptq gptq+awq] [--no-llama] [--swap]
                             [--work DIR] [--json-out FILE_WITH_{model}]
"""
import argparse
import importlib.util
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_act_modes", ROOT / "bench" / "act_modes.py")
am = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(am)  # shares its model / text / reference helpers (and puts tests/ on sys.path)

import oracle  # noqa: E402
import orkpy  # noqa: E402
import orkpy.quantization.alloc  # noqa: E402
from orkpy.runtime.model import LinearSpec, Model, linear_names  # noqa: E402
from orkpy.formats.source import open_source  # noqa: E402

METHODS = ("rtn", "rtn+im", "awq", "awq+im", "gptq", "gptq+awq")
TARGET_OPTIONS = {"Q4_0": ("int4-g64", "int4-g32", "int8"),  # the grouped (G <= 64) row at Q4_0's bytes
                  "Q4_K_M/48": ("int4", "int4-g128", "int4-g64", "int4-g32", "int8"),  # --target-narrow
                  # grouped G <= 64 at Q4_0's bytes, with the 5- and 6-bit grouped tiers as well
                  "Q4_0/456": ("int4-g64", "int4-g32", "int5-g64", "int5-g32", "int6-g64", "int6-g32", "int8")}
LLAMA = (("Q8_0", "Q8_0", False), ("Q4_0", "Q4_0", False), ("IQ4_NL", "IQ4_NL", False),
         ("IQ4_NL+im", "IQ4_NL", True), ("Q4_K_M", "Q4_K_M", False), ("Q4_K_M+im", "Q4_K_M", True))


def n_params(f32, names):
    src = open_source(f32)
    sh = src.shapes()
    total = 0
    for n in names:
        s = sh.get(n) or sh["token_embd.weight"]
        total += int(s[0]) * int(s[1])
    return total


def weight_only(qm):
    """The model of ``qm`` with its quantized weights dequantized into float linears."""
    m, src = qm.to_model(), qm._src
    lin = {n: (LinearSpec.f32(n, qm.tensors[n].dequantize()) if n in qm.tensors else m.linears[n])
           for n in m.linear_names()}
    return Model(qm.source, src.hp, lin, src.tensor, src.meta, src.tied, {n: "fp32" for n in lin})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["smollm2"], choices=sorted(am.MODELS))
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--methods", nargs="*", default=list(METHODS), choices=METHODS)
    ap.add_argument("--rotate", action="store_true", help="also the rows with both rotations")
    ap.add_argument("--rotate-methods", nargs="+", default=["gptq", "gptq+awq"], choices=METHODS)
    ap.add_argument("--groups", nargs="+", type=int, default=[0, 128, 32],
                    help="group sizes of the method rows (0: per output channel)")
    ap.add_argument("--target-methods", nargs="*", default=["rtn+im", "gptq"], choices=METHODS,
                    help="methods of the target-size rows")
    ap.add_argument("--target-at", nargs="*", default=["Q4_K_M", "Q4_0"], choices=sorted(TARGET_OPTIONS) + ["Q4_K_M"],
                    help="llama.cpp files whose linear bytes the target-size rows take (FILE/OPTS: that budget "
                         "with the options TARGET_OPTIONS names)")
    ap.add_argument("--oracle-methods", nargs="*", default=[], choices=METHODS,
                    help="methods of the oracle rows: llama.cpp's Q4_K_M file as the allocation, read literally "
                         "(fallback types as stored) and with the intended types (issue 19)")
    ap.add_argument("--no-int8", action="store_true", help="skip the all-int8 row")
    ap.add_argument("--gptq-float32", action="store_true",
                    help="each gptq row again as 'gptq+f32': GPTQ's arithmetic in float32 (gptq_precision)")
    ap.add_argument("--gptq-sequential", action="store_true",
                    help="each gptq row again as 'gptq+seq': the Gram matrices layer by layer (gptq_sequential)")
    ap.add_argument("--target-sensitivity", nargs="+", default=["auto"],
                    choices=orkpy.quantization.alloc.SENSITIVITY_METHODS,
                    help="how the target-size rows measure the sensitivities (each a row; allocation.target_sensitivity)")
    ap.add_argument("--target-narrow", action="store_true",
                    help="each Q4_K_M target row again with the 4- and 8-bit options only (no int5 / int6 tiers)")
    ap.add_argument("--target-rotate", action="store_true",
                    help="the target-size rows on the rotated source (hadamard + online before ffn_down)")
    ap.add_argument("--swap", action="store_true", help="score the calibration text, calibrate on the scored one")
    ap.add_argument("--no-llama", action="store_true", help="skip the llama.cpp rows (the allocation and the target "
                    "size still need llama.cpp's Q4_0 and Q4_K_M files: made with llama-quantize, not scored)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-act-modes"))
    ap.add_argument("--json-out")
    a = ap.parse_args(argv)
    if a.json_out and len(a.model) > 1 and "{model}" not in a.json_out:
        ap.error("--json-out must contain {model} when several models are measured")
    os.makedirs(a.work, exist_ok=True)
    for name in a.model:
        run_model(a, name)


def run_model(a, name):
    w = pathlib.Path(a.work)
    f32, text_f, calib_f, ctx, _ = am.model_and_texts(name, a.work, a.ctx)
    if a.swap:
        text_f, calib_f = calib_f, text_f
    text = open(text_f, encoding="utf-8").read()
    calib = open(calib_f, encoding="utf-8").read()
    names = linear_names(open_source(f32).hp)
    params = n_params(f32, names)
    ref = os.path.join(a.work, f"{name}-{pathlib.Path(text_f).stem}-ref-{ctx}-{a.chunks}.npz")
    base = orkpy.load_model(f32)
    tokens = base.tokens(text)
    ppl = am.reused_reference(ref, tokens, ctx, a.chunks)
    if ppl is None:
        ppl = orkpy.perplexity(base, tokens, n_ctx=ctx, chunks=a.chunks, save_logprobs=ref, progress=False).ppl
    im = orkpy.collect_imatrix(base, calib, n_ctx=ctx, chunks=a.calib_chunks, progress=False)
    del base
    rows = []

    def show(d):
        print(f"{d['source']:9} {d['what']:34} {d['bytes'] / 1e6:8.2f} {d['bpw']:6.3f} {d['ppl']:9.4f} "
              f"{d['kld']:9.5f}" + ("" if d.get("seconds") is None else f"  ({d['seconds']:.0f} s)"), flush=True)

    def add(source, what, nbytes, p, kld, secs=None):
        d = {"source": source, "what": what, "bytes": nbytes, "bpw": 8 * nbytes / params, "ppl": p, "kld": kld,
             "seconds": secs}
        rows.append(d)
        show(d)

    print(f"{name}: {f32.name}, scored {os.path.basename(text_f)} ({a.chunks} x {ctx}), calibrated on "
          f"{os.path.basename(calib_f)} ({a.calib_chunks} x {ctx}); {params / 1e6:.2f}M linear parameters; "
          f"orkpy F32 PPL {ppl:.4f}", flush=True)
    print(f"{'source':9} {'what':34} {'MB':>8} {'bpw':>6} {'PPL':>9} {'mean KL':>9}\n" + "-" * 80, flush=True)
    tag = f"{name}-{pathlib.Path(text_f).stem}-{ctx}-{a.chunks}"
    ctag = f"{name}-{pathlib.Path(calib_f).stem}-{ctx}-{a.calib_chunks}"
    imf = w / f"{ctag}.imatrix.gguf"
    if not a.no_llama:
        base_kld = w / f"{tag}.llama-base.kld"
        r = oracle.llama_kld(f32, base_kld, text_f, ctx, a.chunks)
        add("llama.cpp", "F32", am.linear_bytes(f32, names), r["ppl"], 0.0)
        if not imf.exists():
            oracle.llama_imatrix(f32, calib_f, ctx, a.calib_chunks, imf)
    q4_0 = q4km = None
    budget = {}
    for label, qtype, with_im in LLAMA:
        if a.no_llama and label not in ("Q4_0", "Q4_K_M"):
            continue  # only the files the orkpy rows need (the allocation, the target size)
        dst = w / (f"{ctag}.{qtype}-im.gguf" if with_im else f"{name}.{qtype}.gguf")
        if not dst.exists():
            oracle.llama_quantize(f32, dst, qtype, imatrix=imf if with_im else None)
        if label == "Q4_0":
            q4_0 = dst
        if label == "Q4_K_M":
            q4km = dst
        budget[label] = am.linear_bytes(dst, names)
        if not a.no_llama:
            r = oracle.llama_kld(dst, base_kld, n_ctx=ctx)
            add("llama.cpp", label, am.linear_bytes(dst, names), r["ppl"], r["kld"])
    plan = [(m, False, g, None, None) for m in a.methods for g in a.groups]
    plan += [(m, True, g, None, None) for m in a.rotate_methods for g in a.groups] if a.rotate else []
    plan += [(m, a.target_rotate, 0, at, s) for at in a.target_at for m in a.target_methods
             for s in a.target_sensitivity]
    if a.target_narrow and "Q4_K_M" in a.target_at:
        plan += [(m, a.target_rotate, 0, "Q4_K_M/48", s) for m in a.target_methods for s in a.target_sensitivity]

    plan += [(m, False, 0, f"oracle-{fb}", None) for m in a.oracle_methods for fb in ("literal", "infer")]
    plan += [] if a.no_int8 else [("rtn", False, 0, "int8", None)]
    if a.gptq_sequential:
        plan = [r for p in plan for r in ([p, (p[0] + "+seq",) + p[1:]] if p[0].startswith("gptq") else [p])]
    if a.gptq_float32:
        plan = [r for p in plan for r in ([p, (p[0] + "+f32",) + p[1:]] if p[0].startswith("gptq") else [p])]
    for method, rot, group, alloc, sens in plan:
        t0 = time.perf_counter()
        kw = dict(imatrix=im if method.endswith("+im") else None, kind="nf4",
                  method="gptq" if method.startswith("gptq") else "rtn", awq="awq" in method,
                  calib=calib, calib_ctx=ctx, calib_chunks=a.calib_chunks, progress=False, log=lambda m: None,
                  group_size=group or None, gptq_sequential="+seq" in method,
                  gptq_precision="float32" if "+f32" in method else "float64")
        if rot:
            if kw["imatrix"] is not None:
                continue  # an imatrix must come from the rotated model; not a row of this table
            kw.update(rotate="hadamard", rotate_online=True)
        where = q4_0
        if alloc == "int8":
            tm = orkpy.tier_map(q4_0)
            where = orkpy.TierMap({n: orkpy.TierEntry("int8" if e.tier == "int4" else e.tier, e.ggml_type, e.shape)
                                   for n, e in tm.entries.items()}, tied=tm.tied)
        elif alloc is not None and alloc.startswith("oracle-"):
            where = orkpy.tier_map(q4km, fallback=alloc[len("oracle-"):])
        elif alloc is not None:
            where = None
            kw.update(target_bpw=8 * budget[alloc.split("/")[0]] / params,
                      target_options=TARGET_OPTIONS.get(alloc, orkpy.quantization.alloc.DEFAULT_OPTIONS),
                      target_sensitivity=sens)
        try:
            qm = orkpy.quantize_model(f32, where, **kw)
        except (NotImplementedError, ValueError) as e:
            print(f"# orkpy {method}{' rotated' if rot else ''}: not run: {e}", flush=True)
            continue
        nbytes = sum(pw.nbytes for pw in qm.tensors.values())
        label = (f"int8 all" if alloc == "int8" else f"nf4 {method}" + (f" g{group}" if group else "")
                 + (" +rot" if rot else "")
                 + (f" Q4_K_M-map {alloc[7:]} ({where.int8_share():.0%} int8)" if alloc and alloc.startswith("oracle-")
                    else f" target@{alloc}" if alloc and alloc != "int8" else "")
                 + (f" [{sens}]" if sens and len(a.target_sensitivity) > 1 else ""))
        secs = time.perf_counter() - t0
        for mode, m in (("w4a8", qm.to_model()), ("w-only", weight_only(qm))):
            r = orkpy.perplexity(m, tokens, n_ctx=ctx, chunks=a.chunks, kld_base=ref, progress=False)
            add("orkpy", f"{label} {mode}", nbytes, r.ppl, r.kld["mean"], secs)
            secs = None
    if a.json_out:
        with open(a.json_out.replace("{model}", name), "w") as f:
            json.dump({"model": name, "f32": str(f32), "text": text_f, "calib": calib_f, "chunks": a.chunks,
                       "calib_chunks": a.calib_chunks, "ctx": ctx, "params": params, "rows": rows}, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
