"""The end-to-end gate (``orkpy gate``): tier map -> imatrix -> quantize ->
save -> reload -> PPL and KL against the source, in one table, and a verdict.

Texts: the imatrix is never collected on the tokens that are scored.
With a separate calibration text (``calib_path``) the evaluation text is
scored from its start (``chunks``) and the calibration text calibrates
(``calib_chunks``, default all). Without one (or with the evaluation text
itself) the evaluation text is split at token level (:func:`holdout_split`):
its last ``calib_chunks`` chunks (default: 10% of its chunks, at least one)
calibrate, and the chunks before them are scored (``chunks``, default all of
them); the two parts never overlap.

Verdict (:func:`verdict`) on the main configuration (``rows[1]``: alloc +
imatrix): ``max_dppl`` bounds PPL - source PPL, ``max_dppl_rel`` bounds
(PPL - source PPL) / source PPL, ``max_kld`` bounds the mean KL divergence
from the source; each is skipped when None.

Files (the quantized models and the source's reference log-probs) go to
``out_dir`` and are kept there; without it to a temporary folder that is
removed when the run ends.
"""
import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import List, Optional, Tuple

from .._io import read_text_like_llama_cpp
from ..quantization.calibrate import collect_imatrix, quantize_model
from ..runtime.model import load_model
from .ppl import PPLResult, perplexity, tokens_for_ppl
from ..formats.source import read_allocation

HOLDOUT_FRACTION = 0.10


@dataclass
class GateRow:
    label: str
    result: PPLResult
    int8_share: Optional[float]   # int8 share of weight storage; None for the source


def holdout_split(n_tokens: int, n_ctx: int, chunks: Optional[int] = None,
                  calib_chunks: Optional[int] = None) -> Tuple[int, int, int]:
    """(calib_start, score_chunks, calib_chunks) for one text of ``n_tokens`` that both scores
    and calibrates: tokens ``[calib_start:]`` (the last ``calib_chunks``
    chunks) calibrate; chunks of tokens ``[:calib_start]`` are scored from the
    start (``score_chunks`` of them). Raises ValueError when they do not fit."""
    total = n_tokens // n_ctx
    cc = calib_chunks if calib_chunks is not None else max(1, int(total * HOLDOUT_FRACTION))
    calib_start = n_tokens - cc * n_ctx
    room = calib_start // n_ctx if calib_start > 0 else 0
    sc = chunks if chunks is not None else room
    if room < 2 or sc > room:
        raise ValueError(f"the text has {total} chunks of {n_ctx} tokens: {cc} held out for calibration "
                         f"(--calib-chunks) leave {max(room, 0)} to score, "
                         f"{'fewer than the 2 perplexity needs' if room < 2 else f'fewer than --chunks {sc}'}; "
                         "lower --chunks / --calib-chunks or give a separate --calib text")
    return calib_start, sc, cc


def _same_file(a, b) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def run_gate(model_path, alloc_path, text_path, calib_path=None, n_ctx: int = 256, chunks: Optional[int] = None,
             calib_chunks: Optional[int] = None, kind: str = "nf4", out_dir=None, threads: Optional[int] = None,
             progress: bool = True, log=print, meta=None) -> Tuple[List[GateRow], Optional[str]]:
    """Run the gate; returns (rows, out_dir): rows[0] the source, rows[1] the main
    configuration (alloc + imatrix), rows[2] the same without imatrix; out_dir
    is None when the files went to a temporary folder (removed). ``meta``: a
    safetensors source's GGUF for hyper-parameters and tokenizer (default: the
    allocation, when it is a GGUF)."""
    with contextlib.ExitStack() as stack:
        work = out_dir if out_dir is not None else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="orkpy-gate-"))
        os.makedirs(work, exist_ok=True)
        return _run(model_path, alloc_path, text_path, calib_path, n_ctx, chunks, calib_chunks, kind, work,
                    threads, progress, log, meta), out_dir


def _run(model_path, alloc_path, text_path, calib_path, n_ctx, chunks, calib_chunks, kind, work, threads,
         progress, log, meta=None):
    name = os.path.basename
    allocation = read_allocation(alloc_path)
    alloc = allocation.tiers
    if meta is None:
        meta = allocation.gguf
    src = load_model(model_path, weights="gguf", threads=threads, meta=meta)
    c, share = alloc.counts_by_tier(), alloc.int8_share()
    log(f"source: {src}")
    has_int4 = alloc.result_bytes()["int4"] > 0
    log(f"allocation {name(alloc_path)}: int8 {c['int8']}, int4 {c['int4']}, float {c['float']} tensors; "
        f"int8 share of weight storage {share:.1%}"
        + ("" if has_int4 else f"; no int4 linears: every linear is int8 (--kind {kind} is unused)"))
    tokens = tokens_for_ppl(src, read_text_like_llama_cpp(text_path))
    if calib_path is None or _same_file(calib_path, text_path):
        try:
            calib_start, score_chunks, calib_chunks = holdout_split(len(tokens), n_ctx, chunks, calib_chunks)
        except ValueError as e:
            raise ValueError(f"{text_path}: {e}") from None
        score, calib = tokens[:calib_start], tokens[calib_start:]
        why = "no --calib given" if calib_path is None else "--calib is the evaluation text"
        log(f"scoring:     {name(text_path)}, its first {score_chunks} chunks of {n_ctx} tokens "
            f"(tokens 0-{score_chunks * n_ctx - 1})")
        log(f"calibration: {name(text_path)}, its last {calib_chunks} chunks (tokens {calib_start}-{len(tokens) - 1}), "
            f"held out: never scored ({why})")
    else:
        score = tokens
        calib = tokens_for_ppl(src, read_text_like_llama_cpp(calib_path))
        score_chunks = min(len(score) // n_ctx, chunks or len(score))
        n_calib = min(len(calib) // n_ctx, calib_chunks or len(calib))
        if len(score) < 2 * n_ctx:
            raise ValueError(f"{text_path}: {len(score)} tokens, fewer than the 2 * {n_ctx} perplexity needs")
        if n_calib < 1:
            raise ValueError(f"{calib_path}: {len(calib)} tokens, shorter than one chunk of {n_ctx}")
        log(f"scoring:     {name(text_path)}, its first {score_chunks} chunks of {n_ctx} tokens")
        log(f"calibration: {name(calib_path)}, its first {n_calib} chunks of {n_ctx} tokens (a separate text)")
    base_lp = os.path.join(work, "source-logprobs.npz")
    kw = dict(n_ctx=n_ctx, chunks=score_chunks, threads=threads, progress=progress)
    what = kind if has_int4 else "all int8"
    rows = [GateRow("source (float)", perplexity(src, score, save_logprobs=base_lp, **kw), None)]
    im = collect_imatrix(src, calib, n_ctx=n_ctx, chunks=calib_chunks, threads=threads, progress=progress)
    for label, imx, sub in ((f"ours: alloc + imatrix + {kind}" if has_int4 else f"ours: alloc + imatrix ({what})",
                             im, "model-imatrix"),
                            (f"ours without imatrix ({what})", None, "model-plain")):
        qm = quantize_model(model_path, alloc, imatrix=imx, kind=kind, threads=threads, progress=progress,
                            log=lambda m, label=label: log(f"[{label}] {m}"), meta=meta)
        saved = qm.save(os.path.join(work, sub), overwrite=True)
        m = load_model(saved)  # the reloaded, checksum-verified model
        rows.append(GateRow(label, perplexity(m, score, kld_base=base_lp, **kw), qm.int8_share()))
    return rows


def verdict(rows: List[GateRow], max_dppl: Optional[float] = None, max_dppl_rel: Optional[float] = None,
            max_kld: Optional[float] = None) -> Tuple[Optional[bool], str]:
    """(passed, one-line verdict) of the main configuration (rows[1]) against the
    thresholds; passed is None when no threshold is given (report only)."""
    if max_dppl is None and max_dppl_rel is None and max_kld is None:
        return None, "GATE: no thresholds given (report only)"
    src, main = rows[0].result, rows[1].result
    dppl = main.ppl - src.ppl
    checks = []
    if max_dppl is not None:
        checks.append((dppl <= max_dppl, f"dPPL {dppl:+.4f} {{}} {max_dppl:g}"))
    if max_dppl_rel is not None:
        rel = dppl / src.ppl
        checks.append((rel <= max_dppl_rel, f"dPPL/PPL {100 * rel:+.2f}% {{}} {100 * max_dppl_rel:g}%"))
    if max_kld is not None:
        assert main.kld is not None  # rows[1] is scored against the source's log-probs (KL mode)
        kld = main.kld["mean"]
        checks.append((kld <= max_kld, f"mean KLD {kld:.6f} {{}} {max_kld:g}"))
    failed = [msg.format(">") for ok, msg in checks if not ok]
    if failed:
        return False, f"GATE FAIL ({rows[1].label}): " + ", ".join(failed)
    return True, f"GATE PASS ({rows[1].label}): " + ", ".join(msg.format("<=") for _, msg in checks)


def format_gate(rows: List[GateRow], synthetic: bool = False) -> str:
    lines = []
    if synthetic:
        lines.append("NOTE: synthetic seeded model with random weights: its PPL means nothing; this run proves the "
                     "pipeline.")
    w = max(36, max(len(r.label) for r in rows) + 2)
    lines.append(f"{'configuration':<{w}}{'PPL':>10}{'+/-':>9}{'dPPL':>9}{'mean KLD':>11}{'same top':>10}"
                 f"{'int8 share':>12}")
    for row in rows:
        r, k = row.result, row.result.kld or {}
        d = f"{k['delta_ppl']:+.4f}" if k else ""
        kl = f"{k['mean']:.6f}" if k else ""
        st = f"{100 * k['same_top']:.2f}%" if k else ""
        sh = f"{100 * row.int8_share:.1f}%" if row.int8_share is not None else ""
        lines.append(f"{row.label:<{w}}{r.ppl:>10.4f}{r.ppl_err:>9.4f}{d:>9}{kl:>11}{st:>10}{sh:>12}".rstrip())
    lines.append("(int8 share: int8 bytes / all bytes of the packed linear weights as stored)")
    return "\n".join(lines)


__all__ = ["GateRow", "format_gate", "holdout_split", "run_gate", "verdict"]
