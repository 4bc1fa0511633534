"""AWQ's scale search: the "fast" search (the default) against the exhaustive "grid" search
(orkpy.quantization.awq, module doc), on the same model, calibration and scored text ("fast-v2-n192":
the fast search with verify=2 and sample=192).

Per model (--model; the float reference, texts and text split are bench/act_modes.py's: SmolLM2 is
the exact dequantization of the shipped file scored on wikitext-2 and calibrated on TinyStories B;
stories260K is scored on the first half of TinyStories B and calibrated on the second) and per
--methods entry (awq: round to nearest after the scaling, awq+im: with orkpy's imatrix of the
calibration text, gptq+awq: GPTQ after the scaling), each --searches entry runs
``quantize_model(f32, alloc, kind="nf4", awq=True, ...)`` with ``awq_scales(..., search=S)``: the
allocation is every block linear 4-bit (NF4, per output channel) and the embedding / head int8
(the allocation of llama.cpp's Q4_0 file on these models; stories260K: its Q4_0 file's, ffn_down int8).

Printed per run: the CPU and wall seconds of awq_scales, of its Gram passes (the float model over
the calibration text, the same in both searches) and of the rest (the scale search); the cost of
the search in rows quantized (one row of one linear at one alpha) and in multiply-adds of the
error products (``dW G``); the alphas chosen; the exact output error summed over the groups; and
the mean KL of the quantized model (w4a8) against the float model on --chunks x --ctx of the
scored text. The timings depend on the machine's load (CPU seconds less than wall); the counts do not.

    python bench/awq_search.py [--model smollm2 stories260k] [--calib-chunks 4] [--chunks 8] [--ctx 512]
                               [--methods awq] [--searches grid fast fast-v2] [--work DIR]
"""
import argparse
import importlib.util
import os
import pathlib
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("_act_modes", ROOT / "bench" / "act_modes.py")
am = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(am)  # shares its model / text / reference helpers

import orkpy  # noqa: E402
from orkpy.quantization import awq, gptq  # noqa: E402


def allocation(name, f32):
    """The TierMap: every block linear int4, the rest as the model's Q4_0 allocation keeps it."""
    if name == "stories260k":
        return orkpy.tier_map(am.SHARED / "models" / "stories260K" / "stories260K-Q4_0.gguf")
    tm = orkpy.tier_map(f32)
    return orkpy.TierMap({n: orkpy.TierEntry("int4" if (e.tier != "float" and n.startswith("blk.")) else
                                             ("int8" if e.tier != "float" else e.tier), e.ggml_type, e.shape)
                          for n, e in tm.entries.items()}, tied=tm.tied)


class Meter:
    """Times awq_scales and its Gram passes; counts the rows quantized and the dW G multiply-adds."""

    def __init__(self, search):
        parts = search.split("-")  # "fast-v2-n192": verify 2, sample 192
        self.kw = {"search": parts[0]}
        self.kw.update({{"v": "verify", "n": "sample"}[p[0]]: int(p[1:]) for p in parts[1:]})
        self.t = {"awq": [0.0, 0.0], "grams": [0.0, 0.0]}
        self.rows = self.macs = 0
        self.rep = None
        self.inside = False

    def install(self):
        real_scales, real_grams, real_q, real_rows = awq.awq_scales, gptq.collect_grams, awq.quantize, awq._row_errors

        def timed(key, fn):
            def run(*a, **kw):
                if key == "grams" and not self.inside:  # GPTQ's own Gram passes: not awq_scales'
                    return fn(*a, **kw)
                c0, w0 = time.process_time(), time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    self.t[key][0] += time.process_time() - c0
                    self.t[key][1] += time.perf_counter() - w0
            return run

        def scales(*a, **kw):
            self.inside = True
            try:
                out = timed("awq", real_scales)(*a, **dict(kw, **self.kw))
            finally:
                self.inside = False
            self.rep = out[1]
            return out

        def quantize(w, *a, **kw):
            self.rows += int(np.shape(w)[0])
            return real_q(w, *a, **kw)

        def row_errors(w, s, g, *a, **kw):
            self.macs += int(w.shape[0]) * int(g.shape[0]) * int(g.shape[1])
            return real_rows(w, s, g, *a, **kw)
        awq.awq_scales, gptq.collect_grams, awq.quantize, awq._row_errors = \
            scales, timed("grams", real_grams), quantize, row_errors
        return lambda: setattr_all(real_scales, real_grams, real_q, real_rows)


def setattr_all(scales, grams, q, rows):
    awq.awq_scales, gptq.collect_grams, awq.quantize, awq._row_errors = scales, grams, q, rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", nargs="+", default=["smollm2"], choices=["smollm2", "stories260k"])
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--calib-chunks", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--methods", nargs="+", default=["awq"], choices=["awq", "awq+im", "gptq+awq"])
    ap.add_argument("--searches", nargs="+", default=["grid", "fast"],
                    help="grid, fast, or fast-vV-nN: fast with verify=V, sample=N (awq.search_group)")
    ap.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "orkpy-act-modes"))
    a = ap.parse_args(argv)
    os.makedirs(a.work, exist_ok=True)
    for name in a.model:
        f32, text_f, calib_f, ctx, _ = am.model_and_texts(name, a.work, a.ctx)
        text = open(text_f, encoding="utf-8").read()
        calib = open(calib_f, encoding="utf-8").read()
        ref = os.path.join(a.work, f"{name}-{pathlib.Path(text_f).stem}-ref-{ctx}-{a.chunks}.npz")
        base = orkpy.load_model(f32)
        tokens = base.tokens(text)
        if am.reused_reference(ref, tokens, ctx, a.chunks) is None:
            orkpy.perplexity(base, tokens, n_ctx=ctx, chunks=a.chunks, save_logprobs=ref, progress=False)
        im = orkpy.collect_imatrix(base, calib, n_ctx=ctx, chunks=a.calib_chunks, progress=False) \
            if "awq+im" in a.methods else None
        del base
        tm = allocation(name, f32)
        print(f"{name}: calibrated on {os.path.basename(calib_f)} ({a.calib_chunks} x {ctx}), scored "
              f"{os.path.basename(text_f)} ({a.chunks} x {ctx}); seconds: CPU / wall", flush=True)
        print(f"{'method':9} {'search':11} {'awq_scales':>13} {'grams':>13} {'search':>13} {'rows q.':>9} "
              f"{'GMAC':>7} {'sum err':>10} {'mean KL':>9}  alphas", flush=True)
        for method in a.methods:
            for search in a.searches:
                meter = Meter(search)
                undo = meter.install()
                try:
                    qm = orkpy.quantize_model(f32, tm, kind="nf4", method="gptq" if method.startswith("gptq") else "rtn",
                                              awq=True, imatrix=im if method == "awq+im" else None, calib=calib,
                                              calib_ctx=ctx, calib_chunks=a.calib_chunks, progress=False,
                                              log=lambda m: None)
                finally:
                    undo()
                kl = orkpy.perplexity(qm.to_model(), tokens, n_ctx=ctx, chunks=a.chunks, kld_base=ref,
                                      progress=False).kld["mean"]
                rep = meter.rep
                err = sum(rep["error"][k][rep["alpha"][k]] for k in rep["alpha"])
                hist = {}
                for v in rep["alpha"].values():
                    hist[v] = hist.get(v, 0) + 1
                ta, tg = meter.t["awq"], meter.t["grams"]
                print(f"{method:9} {search:11} {ta[0]:6.1f}/{ta[1]:6.1f} {tg[0]:6.1f}/{tg[1]:6.1f} "
                      f"{ta[0] - tg[0]:6.1f}/{ta[1] - tg[1]:6.1f} {meter.rows:9d} {meter.macs / 1e9:7.1f} {err:10.4g} "
                      f"{kl:9.5f}  " + " ".join(f"{k:g}:{c}" for k, c in sorted(hist.items())), flush=True)


if __name__ == "__main__":
    main()
