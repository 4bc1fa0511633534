"""Accuracy of orkpy's quantized paths on the two real models, next to llama.cpp's own
quantized file, on the same chunks (issue 15's figures).

Each model ships quantized (SmolLM2-135M-Instruct Q4_1, Gemma-3-270M Q4_K_M); its float
reference is its exact dequantization, written as an F32 GGUF (orkpy.formats.convert). Rows, on the
first --chunks chunks of n_ctx --ctx of the scored text (wikitext by default):

  llama.cpp  llama-perplexity (its defaults) on the F32 reference and on the shipped file
  orkpy      the F32 reference; every linear int8 (w8a8, per-channel absmax); the shipped file's
             tier map as allocation oracle (quantize_model) at each --thresholds value, nf4 and
             int4, with orkpy's imatrix (collected on --calib, never the scored text) and
             without; KL and same-top against orkpy's F32 log-probs
  FFN chain  the fused int8 chain (SiLU or GELU-tanh, the model's) on the all-int8 model: the
             per-op baseline, fused, its ablations, the automatic (gmax) sprinkle, and the sprinkle
             chosen by sensitivity (ffn.sensitivity_sprinkle on --sens-chunks chunks of --calib,
             --sens-method, --sens-budget; default 25% of the layers) next to the gmax sprinkle
             with as many exact layers; split_product (the chain with its product handed exactly to the
             down task as two int8 digit planes) alone and with the sensitivity sprinkle over it
             (--sens-base); a summary per model: PPL per-op / fused / gmax / sensitivity, % of the
             fused-vs-per-op PPL gap recovered, layers chosen, search seconds

    python bench/real_quant.py [--models smollm2 gemma3] [--chunks 4] [--ctx 512]
                               [--thresholds 5.0 5.5] [--calib-chunks 8] [--no-ffn] [--ffn-only]
                               [--sens-chunks 4] [--sens-method lazy] [--sens-budget N|KL]
                               [--sens-exact exact_silu unfused] [--sens-base fused split_product]
                               [--json-out F]

Needs the llama.cpp tools and the models of .ci/install (tests/oracle.py finds them).
"""
import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
SHARED = pathlib.Path(os.environ.get("ORKPY_SHARED", ROOT.parent / "shared"))
sys.path.insert(0, str(ROOT / "tests"))

import pytest  # noqa: E402  (tests/oracle.py reports a missing tool or model as a pytest skip)
from oracle import llama_perplexity, real_model  # noqa: E402

import orkpy  # noqa: E402
from orkpy import ffn  # noqa: E402
from orkpy._io import read_text_like_llama_cpp  # noqa: E402
from orkpy.formats.convert import dequantize_gguf  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=["smollm2", "gemma3"], choices=["smollm2", "gemma3"])
    ap.add_argument("--text", default=str(SHARED / "text" / "wikitext-2-raw-test.txt"))
    ap.add_argument("--calib", default=str(SHARED / "text" / "tinystories-val-B.txt"))
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--calib-chunks", type=int, default=8)
    ap.add_argument("--thresholds", type=float, nargs="+", default=[5.0, 5.5])
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--no-ffn", action="store_true", help="leave out the FFN chain rows")
    ap.add_argument("--ffn-only", action="store_true", help="only the F32 reference, the per-op int8 model and the "
                    "FFN chain's fused / sprinkle rows (no llama.cpp, tier-map or ablation rows)")
    ap.add_argument("--sens-chunks", type=int, default=4, help="calibration chunks of the sensitivity search")
    ap.add_argument("--sens-method", default="lazy", choices=ffn.SENS_METHODS)
    ap.add_argument("--sens-budget", default=None, help="exact layers (int) or a KL target (float); default 25%%")
    ap.add_argument("--sens-exact", nargs="+", default=["exact_silu"], choices=["exact_silu", "unfused"],
                    help="the mode of the chosen layers: one search (and row) each")
    ap.add_argument("--sens-base", nargs="+", default=["fused", "split_product"], choices=["fused", "split_product"],
                    help="the chain mode of the layers the sensitivity sprinkle leaves on the chain: one search each")
    ap.add_argument("--json-out", default=None)
    a = ap.parse_args()
    try:
        srcs = {name: real_model(name) for name in a.models}
    except pytest.skip.Exception as e:
        sys.exit(f"real_quant: {e.msg}")
    budget = None if a.sens_budget is None else (float(a.sens_budget) if any(c in a.sens_budget for c in ".eE")
                                                 else int(a.sens_budget))
    text, calib = read_text_like_llama_cpp(a.text), read_text_like_llama_cpp(a.calib)
    kw = dict(n_ctx=a.ctx, chunks=a.chunks, threads=a.threads, progress=False)
    rows, summary = [], []

    def row(model, what, ppl, kl=None, same=None, share=None, secs=None):
        rows.append(dict(model=model, what=what, ppl=ppl, kl=kl, same_top=same, int8_share=share, seconds=secs))
        extra = "" if kl is None else f"  KL {kl:.5f}  same top {100 * same:.2f}%"
        extra += "" if share is None else f"  int8 share {100 * share:.1f}%"
        extra += "" if secs is None else f"  ({secs:.0f} s)"
        print(f"{model:<9}{what:<52}{ppl:>10.4f}{extra}", flush=True)

    print(f"PPL on the first {a.chunks} chunks of {a.ctx} of {pathlib.Path(a.text).name}; imatrix and FFN prep on "
          f"{a.calib_chunks} chunks of {pathlib.Path(a.calib).name}; F32 = the exact dequantization of the shipped file")
    with tempfile.TemporaryDirectory(prefix="orkpy-real-quant-") as work:
        for name in a.models:
            f32 = pathlib.Path(work) / f"{name}-F32.gguf"
            dequantize_gguf(srcs[name], f32)
            for label, path in () if a.ffn_only else (("llama.cpp F32 reference", f32),
                                                      (f"llama.cpp shipped {srcs[name].name}", srcs[name])):
                t0 = time.perf_counter()
                r = llama_perplexity(path, a.text, a.ctx, a.chunks)
                row(name, label, r["ppl"], secs=time.perf_counter() - t0)
            ref_lp = pathlib.Path(work) / f"{name}-ref.npz"
            m = orkpy.load_model(f32)
            toks = m.tokens(text)
            ctoks = m.tokens(calib)
            if ffn.text_overlap(toks[: a.chunks * a.ctx], ctoks) >= 0.5:
                sys.exit(f"real_quant: --calib {a.calib} holds the scored text {a.text}: calibrate on another text")
            t0 = time.perf_counter()
            r = orkpy.perplexity(m, toks, save_logprobs=ref_lp, **kw)
            row(name, "orkpy F32 reference", r.ppl, secs=time.perf_counter() - t0)
            im = None if a.ffn_only else orkpy.collect_imatrix(m, ctoks, n_ctx=a.ctx, chunks=a.calib_chunks,
                                                               threads=a.threads, progress=False)
            del m

            def scored(label, model, share=None):
                t0 = time.perf_counter()
                r = orkpy.perplexity(model, toks, kld_base=ref_lp, **kw)
                row(name, label, r.ppl, r.kld["mean"], r.kld["same_top"], share, time.perf_counter() - t0)
                return r.ppl

            i8 = orkpy.load_model(f32, weights="int8", threads=a.threads)
            per_op = scored("orkpy int8 w8a8 (every linear, absmax)", i8, 1.0)
            for thr in () if a.ffn_only else a.thresholds:
                tm = orkpy.tier_map(srcs[name], threshold=thr)
                c = tm.counts_by_tier()
                for kind in ("nf4", "int4"):
                    for imx in (im, None):
                        if c["int4"] == 0 and (kind == "int4" or imx is None):
                            continue  # no int4 tier: the kind changes nothing
                        qm = orkpy.quantize_model(f32, srcs[name], imatrix=imx, kind=kind, threshold=thr,
                                                  threads=a.threads, progress=False, log=lambda m: None)
                        what = (f"orkpy tier map @{thr:g} ({c['int8']} int8 / {c['int4']} int4): "
                                f"{kind if c['int4'] else 'int8'}{' + imatrix' if imx is not None else ''}")
                        scored(what, qm, qm.int8_share())
            if a.no_ffn:
                continue
            stats = ffn.prep(i8, ctoks, n_ctx=a.ctx, chunks=a.calib_chunks, threads=a.threads)
            print(f"{name:<9}FFN prep ({i8.hparams['gate_fn']}): gmax per layer "
                  + ", ".join(f"{s['gmax']:.1f}" for s in stats), flush=True)
            gate_fn = i8.hparams["gate_fn"]
            ppl = {}
            for mode in ("fused", "split_product", "auto") if a.ffn_only else (
                    "fused", "fp32_silu_out", "exact_lut_input", "asym_zero_point", "per_channel_out", "split_product",
                    "auto"):
                modes = ffn.sprinkle(stats, "auto") if mode == "auto" else mode
                ffn.configure(i8, stats, modes)
                label = mode if mode != "auto" else ("sprinkle auto, exact layers " + str(
                    [i for i, md in enumerate(modes) if md == "exact_silu"]))
                ppl[mode] = scored(f"FFN chain ({gate_fn}): {label}", i8)
            gap = ppl["fused"] - per_op
            for base, exact in [(b, e) for b in a.sens_base for e in a.sens_exact]:
                modes, rep = ffn.sensitivity_sprinkle(i8, stats, ctoks, n_ctx=a.ctx, chunks=a.sens_chunks,
                                                      budget=budget, method=a.sens_method, exact=exact,
                                                      threads=a.threads, base=base)
                chosen, k = rep["exact_layers"], len(rep["exact_layers"])
                if base != "fused":  # the chosen layers exact over another chain mode, next to gmax's as many
                    p_sens = scored(f"FFN chain ({gate_fn}): {base} + sprinkle sensitivity ({exact}), layers {chosen}", i8)
                    gm = [base if md == "fused" else exact for md in ffn.sprinkle(stats, k)]
                    gm_layers = [i for i, md in enumerate(gm) if md == exact]
                    ffn.configure(i8, stats, gm)
                    p_gmax = scored(f"FFN chain ({gate_fn}): {base} + sprinkle gmax, {k} layers {gm_layers}", i8)
                    summary.append(dict(model=name, exact=f"{exact}@{base}", per_op=per_op, fused=ppl["fused"],
                                        gmax=p_gmax, gmax_layers=gm_layers, gmax_recovered=(ppl["fused"] - p_gmax) / gap,
                                        sens=p_sens, sens_layers=chosen, sens_recovered=(ppl["fused"] - p_sens) / gap,
                                        base_ppl=ppl[base], base_recovered=(ppl["fused"] - ppl[base]) / gap,
                                        calib_s=rep["seconds"], evaluations=rep["evaluations"]))
                    continue
                print(f"{name:<9}sensitivity search ({exact}, {rep['method']}, {rep['chunks']} chunks of "
                      f"{pathlib.Path(a.calib).name}): {rep['seconds']:.0f} s, {rep['evaluations']} evaluations; "
                      "KL gain alone " + ", ".join(f"{i}: {g:.4f}" for i, g in enumerate(rep["gain"])), flush=True)
                p_sens = scored(f"FFN chain ({gate_fn}): sprinkle sensitivity ({exact}), layers {chosen}", i8)
                if exact != "exact_silu":
                    summary.append(dict(model=name, exact=exact, per_op=per_op, fused=ppl["fused"], sens=p_sens,
                                        sens_layers=chosen, sens_recovered=(ppl["fused"] - p_sens) / gap,
                                        calib_s=rep["seconds"], evaluations=rep["evaluations"]))
                    continue
                gm = ffn.sprinkle(stats, k)
                gm_layers = [i for i, md in enumerate(gm) if md == "exact_silu"]
                ffn.configure(i8, stats, gm)
                p_gmax = scored(f"FFN chain ({gate_fn}): sprinkle gmax, {k} layers {gm_layers}", i8)
                summary.append(dict(model=name, exact=exact, n_layer=len(stats), per_op=per_op, fused=ppl["fused"],
                                    gmax=p_gmax, gmax_layers=gm_layers, sens=p_sens, sens_layers=chosen,
                                    gmax_recovered=(ppl["fused"] - p_gmax) / gap,
                                    sens_recovered=(ppl["fused"] - p_sens) / gap,
                                    calib_s=rep["seconds"], evaluations=rep["evaluations"]))
            ffn.configure(i8, stats, "baseline")
    if summary:
        print(f"\nFFN chain, sprinkle by sensitivity vs gmax at the same number of exact layers (PPL, "
              f"{a.chunks} chunks of {a.ctx} of {pathlib.Path(a.text).name}; recovered = share of the fused-vs-per-op "
              "gap):")
        print(f"{'model':<9}{'exact':<26}{'per-op':>9}{'fused':>9}{'gmax':>9}{'sens':>9}{'gmax rec':>10}{'sens rec':>10}"
              f"  {'k':>2}  sensitivity layers / gmax layers, search seconds")
        for r in summary:
            g = r.get("gmax", float("nan"))
            print(f"{r['model']:<9}{r['exact']:<26}{r['per_op']:>9.4f}{r['fused']:>9.4f}{g:>9.4f}{r['sens']:>9.4f}"
                  f"{100 * r.get('gmax_recovered', float('nan')):>9.1f}%{100 * r['sens_recovered']:>9.1f}%"
                  f"  {len(r['sens_layers']):>2}  {r['sens_layers']} / {r.get('gmax_layers', '-')}, "
                  f"{r['calib_s']:.0f} s ({r['evaluations']} evaluations)"
                  + (f"; {r['exact'].split('@')[1]} alone {r['base_ppl']:.4f} ({100 * r['base_recovered']:.1f}%)"
                     if "base_ppl" in r else ""))
    if a.json_out:
        pathlib.Path(a.json_out).write_text("\n".join(json.dumps(r) for r in rows + summary) + "\n")


if __name__ == "__main__":
    main()
