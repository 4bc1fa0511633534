"""Accuracy gates as assertions: a quantized model's paired mean KL divergence, perplexity and
same-top-token share against its float reference on a text, checked against thresholds, with a
report a person can read when it fails (the pytest plugin :mod:`orkpy.evaluation.pytest_plugin` builds on it;
``tests/test_pytest_plugin.py``).

:class:`Reference` is the float model's log-probs on the text, made once
(:func:`make_reference`, :func:`orkpy.perplexity` with ``save_logprobs``); :func:`check_gate`
scores a model against it (``perplexity(..., kld_base=...)``) and raises
:class:`AccuracyGateFailure` (an ``AssertionError``) when a threshold is exceeded. The report
names the model, the reference, the text and its chunks, each figure beside its limit, and the
chunks with the largest mean KL (where to look first).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, List, Optional

from .._typing import StrPath

#: how many of the worst chunks the report lists
WORST_CHUNKS = 3


@dataclass(frozen=True)
class Reference:
    """The float reference's log-probs on a text (:func:`make_reference`)."""
    model: str        #: the float model's path
    text: str         #: the scored text's path
    logprobs: str     #: the saved log-prob file (``orkpy.perplexity(save_logprobs=...)``)
    n_ctx: int
    chunks: int
    ppl: float


@dataclass(frozen=True)
class GateResult:
    """A gate that passed: the :class:`orkpy.PPLResult` against the reference and the report."""
    result: Any
    report: str

    @property
    def kl(self) -> float:
        return float(self.result.kld["mean"])

    @property
    def delta_ppl(self) -> float:
        return float(self.result.kld["delta_ppl"])

    @property
    def same_top(self) -> float:
        return float(self.result.kld["same_top"])


class AccuracyGateFailure(AssertionError):
    """A model outside a gate's thresholds; ``report`` is the text, ``result`` the PPLResult."""

    def __init__(self, report: str, result: Any) -> None:
        super().__init__(report)
        self.report, self.result = report, result


def _text(path: StrPath) -> str:
    from .._io import read_text_like_llama_cpp
    return read_text_like_llama_cpp(os.fspath(path))


def make_reference(model: StrPath, text: StrPath, logprobs: StrPath, n_ctx: int = 512, chunks: Optional[int] = 8,
                   threads: Optional[int] = None) -> Reference:
    """The float ``model``'s log-probs on ``text`` (``chunks`` chunks of ``n_ctx`` tokens; None:
    the whole text), saved to ``logprobs``."""
    from ..runtime.model import load_model
    from .ppl import perplexity
    r = perplexity(load_model(model, threads=threads), _text(text), n_ctx=n_ctx, chunks=chunks, threads=threads,
                   progress=False, save_logprobs=logprobs)
    return Reference(os.fspath(model), os.fspath(text), os.fspath(logprobs), int(n_ctx), int(r.chunks), float(r.ppl))


def _limit(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:g}"


def gate_report(result: Any, ref: Reference, model: str, failures: List[str], max_kl: Optional[float],
                max_dppl: Optional[float], max_dppl_rel: Optional[float], min_same_top: Optional[float]) -> str:
    """The gate's report (module doc)."""
    k = result.kld
    head = "FAILED" if failures else "passed"
    lines = [f"orkpy accuracy gate {head}: {model}",
             f"  against {ref.model} on {ref.text} ({result.chunks} chunks of {result.n_ctx} tokens, "
             f"{result.scored} scored)",
             f"  mean KL    {k['mean']:.6f} +/- {k['mean_err']:.6f}   limit {_limit(max_kl)}",
             f"  delta PPL  {k['delta_ppl']:+.4f} (PPL {result.ppl:.4f} vs {k['ppl_base']:.4f}, "
             f"{100 * (k['ppl_ratio'] - 1):+.2f} %)   limit {_limit(max_dppl)}"
             + (f" / {100 * max_dppl_rel:g} %" if max_dppl_rel is not None else ""),
             f"  same top   {100 * k['same_top']:.2f} %   limit {'-' if min_same_top is None else f'{100 * min_same_top:g} %'}"]
    order = sorted(range(len(result.chunk_kld)), key=lambda i: -result.chunk_kld[i])[:WORST_CHUNKS]
    if order:
        lines.append("  worst chunks by mean KL: " + ", ".join(
            f"#{i} {result.chunk_kld[i]:.6f} (same top {100 * result.chunk_same_top[i]:.1f} %)" for i in order))
    lines += [f"  FAIL: {f}" for f in failures]
    return "\n".join(lines)


def check_gate(model: Any, ref: Reference, max_kl: Optional[float] = None, max_dppl: Optional[float] = None,
               max_dppl_rel: Optional[float] = None, min_same_top: Optional[float] = None,
               threads: Optional[int] = None, name: Optional[str] = None) -> GateResult:
    """Score ``model`` (a path, or a loaded :class:`orkpy.Model` / QuantizedModel) against ``ref``
    and check: mean KL <= ``max_kl``, PPL - PPL(ref) <= ``max_dppl``, PPL / PPL(ref) - 1 <=
    ``max_dppl_rel``, same-top share >= ``min_same_top`` (a threshold left None is reported, not
    checked). Returns a :class:`GateResult` (the :class:`orkpy.PPLResult` and the report);
    :class:`AccuracyGateFailure` with the report when a check fails."""
    from ..runtime.model import load_model
    from .ppl import perplexity
    for key, v in (("max_kl", max_kl), ("max_dppl", max_dppl), ("max_dppl_rel", max_dppl_rel),
                   ("min_same_top", min_same_top)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            raise ValueError(f"{key} must be a finite number or None, got {v!r}")
    label = name or (os.fspath(model) if isinstance(model, (str, os.PathLike)) else str(model))
    m = load_model(model, threads=threads) if isinstance(model, (str, os.PathLike)) else model
    r = perplexity(m, _text(ref.text), n_ctx=ref.n_ctx, chunks=ref.chunks, threads=threads, progress=False,
                   kld_base=ref.logprobs)
    k = r.kld
    assert k is not None
    fails = []
    if max_kl is not None and not k["mean"] <= max_kl:
        fails.append(f"mean KL {k['mean']:.6f} > {max_kl:g}")
    if max_dppl is not None and not k["delta_ppl"] <= max_dppl:
        fails.append(f"delta PPL {k['delta_ppl']:+.4f} > {max_dppl:g}")
    if max_dppl_rel is not None and not k["ppl_ratio"] - 1 <= max_dppl_rel:
        fails.append(f"relative delta PPL {100 * (k['ppl_ratio'] - 1):+.2f} % > {100 * max_dppl_rel:g} %")
    if min_same_top is not None and not k["same_top"] >= min_same_top:
        fails.append(f"same top {100 * k['same_top']:.2f} % < {100 * min_same_top:g} %")
    report = gate_report(r, ref, label, fails, max_kl, max_dppl, max_dppl_rel, min_same_top)
    if fails:
        raise AccuracyGateFailure(report, r)
    return GateResult(r, report)


__all__ = ["AccuracyGateFailure", "GateResult", "Reference", "WORST_CHUNKS", "check_gate", "gate_report", "make_reference"]
