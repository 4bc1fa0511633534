"""The PPL table of the product's claims on one model: float reference,
llama.cpp's own quantizations (GGUF-native), all-int8 w8a8, and orkpy's
fp16-source + allocation + imatrix + NF4 with its ablations (no imatrix, SR,
uniform int4, double-quant). Used by bench/ppl_table.py, the notebook and the
gate tests."""
import os
import tempfile
from dataclasses import dataclass

from ..quantization.calibrate import collect_imatrix, quantize_model
from ..runtime.model import load_model
from .ppl import perplexity


@dataclass
class Row:
    config: str
    alloc: str
    ppl: float
    ppl_err: float
    delta: float
    kld: float
    same_top: float
    int8_share: float

    def as_dict(self):
        return dict(self.__dict__)


def ppl_table(model_dir, text, reference="F32", source="F16", native=("Q8_0", "Q4_K_M"), allocs=("Q4_0", "Q4_K_M"),
              name="stories260K", n_ctx=256, chunks=None, calib_text=None, calib_chunks=None, seed=0,
              threads=None, progress=False, log=None):
    """Rows of the table. ``model_dir`` holds ``{name}-{X}.gguf`` files."""
    log = log or (lambda m: None)
    f = lambda tag: os.path.join(model_dir, f"{name}-{tag}.gguf")  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="orkpy-table-") as work:  # the reference log-probs, removed after
        base_lp = os.path.join(work, "ref.npz")
        kw = dict(n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress)
        rows = []

        def add(config, alloc, model, share):
            r = perplexity(model, text, kld_base=base_lp, **kw)
            k = r.kld
            rows.append(Row(config, alloc, r.ppl, r.ppl_err, k["delta_ppl"], k["mean"], k["same_top"], share))
            log(f"{config:<40} {alloc:<8} PPL {r.ppl:.4f}  KLD {r.kld['mean']:.6f}")

        ref = load_model(f(reference))
        r0 = perplexity(ref, text, save_logprobs=base_lp, **kw)
        # the float reference has no integer tiers: no int8 share (blank, as llama.cpp's own files)
        rows.append(Row(f"{reference} (reference)", "-", r0.ppl, r0.ppl_err, 0.0, 0.0, 1.0, float("nan")))
        for tag in native:
            add(f"llama.cpp {tag} (GGUF-native)", "-", load_model(f(tag)), float("nan"))
        add("all-int8 w8a8", "-", load_model(f(source), weights="int8"), 1.0)
        src = load_model(f(source))
        im = collect_imatrix(src, calib_text if calib_text is not None else text, n_ctx=n_ctx, chunks=calib_chunks,
                             threads=threads, progress=progress)
        quiet = lambda m: None  # noqa: E731
        for alloc in allocs:
            variants = [
                ("ours: fp16 + alloc + imatrix + NF4", dict(source=f(source), imatrix=im, kind="nf4")),
                ("ours without imatrix", dict(source=f(source), imatrix=None, kind="nf4")),
                ("ours with SR", dict(source=f(source), imatrix=im, kind="nf4", sr=True, seed=seed)),
                ("uniform int4 instead of NF4", dict(source=f(source), imatrix=im, kind="int4")),
                ("double-quant (re-quantized GGUF bytes)", dict(source=f(alloc), imatrix=im, kind="nf4")),
            ]
            for config, args in variants:
                qm = quantize_model(alloc=f(alloc), threads=threads, progress=False, log=quiet, **args)
                add(config, alloc, qm, qm.int8_share())
        return rows


def format_table(rows):
    head = f"{'configuration':<42}{'alloc':<8}{'PPL':>9}{'+/-':>8}{'dPPL':>9}{'mean KLD':>11}{'same top':>10}{'int8 share':>12}"
    out = [head, "-" * len(head)]
    for r in rows:
        share = "" if r.int8_share != r.int8_share else f"{100 * r.int8_share:.1f}%"
        out.append(f"{r.config:<42}{r.alloc:<8}{r.ppl:>9.4f}{r.ppl_err:>8.4f}{r.delta:>+9.4f}{r.kld:>11.6f}"
                   f"{100 * r.same_top:>9.2f}%{share:>12}")
    return "\n".join(out)
