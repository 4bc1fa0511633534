"""The end-to-end gate (``orkpy gate``): tier map -> imatrix -> quantize ->
save -> reload -> PPL and KL against the source, in one table."""
import os
import tempfile

from .calibrate import collect_imatrix, quantize_model
from .cli import read_text_like_llama_cpp
from .model import load_model
from .ppl import perplexity
from .tiermap import TierMap, tier_map


def run_gate(model_path, alloc_path, text_path, calib_path=None, n_ctx=256, chunks=None, calib_chunks=None,
             kind="nf4", out_dir=None, threads=None, progress=True, log=print):
    text = read_text_like_llama_cpp(text_path)
    calib = read_text_like_llama_cpp(calib_path) if calib_path else text
    alloc = tier_map(alloc_path) if str(alloc_path).endswith(".gguf") else TierMap.load(alloc_path)
    out_dir = out_dir or tempfile.mkdtemp(prefix="orkpy-gate-")
    base_lp = os.path.join(out_dir, "source-logprobs.npz")
    src = load_model(model_path, weights="gguf", threads=threads)
    log(f"source: {src}")
    log(f"allocation: {alloc}")
    rows = []
    r_src = perplexity(src, text, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress, save_logprobs=base_lp)
    rows.append(("source (float)", r_src, None, 0.0))
    log(f"imatrix on {os.path.basename(calib_path or text_path)} ...")
    im = collect_imatrix(src, calib, n_ctx=n_ctx, chunks=calib_chunks, threads=threads, progress=progress)
    for label, imx in ((f"ours: alloc + imatrix + {kind}", im), (f"ours without imatrix ({kind})", None)):
        qm = quantize_model(model_path, alloc, imatrix=imx, kind=kind, threads=threads, progress=progress, log=log)
        saved = qm.save(os.path.join(out_dir, "model-imatrix" if imx is not None else "model-plain"), overwrite=True)
        m = load_model(saved)  # the reloaded, checksum-verified model
        r = perplexity(m, text, n_ctx=n_ctx, chunks=chunks, threads=threads, progress=progress, kld_base=base_lp)
        rows.append((label, r, qm.int8_share(), None))
    return rows, out_dir


def format_gate(rows, synthetic=False):
    lines = []
    if synthetic:
        lines.append("NOTE: synthetic seeded model with random weights: its PPL means nothing; this run proves the "
                     "pipeline.")
    lines.append(f"{'configuration':<36}{'PPL':>10}{'+/-':>9}{'dPPL':>9}{'mean KLD':>11}{'same top':>10}{'int8 share':>12}")
    for label, r, share, _ in rows:
        k = r.kld or {}
        d = f"{k['delta_ppl']:+.4f}" if k else ""
        kl = f"{k['mean']:.6f}" if k else ""
        st = f"{100 * k['same_top']:.2f}%" if k else ""
        sh = f"{100 * share:.1f}%" if share is not None else ""
        lines.append(f"{label:<36}{r.ppl:>10.4f}{r.ppl_err:>9.4f}{d:>9}{kl:>11}{st:>10}{sh:>12}")
    return "\n".join(lines)
