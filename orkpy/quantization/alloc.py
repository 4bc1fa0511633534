"""Allocation to a target size: each linear's tier chosen from its measured sensitivity.

A llama.cpp mixed GGUF remains the default allocation oracle (:func:`orkpy.tier_map`);
:func:`target_allocation` is the alternative when a size is what matters: it picks, for every
linear weight (the tied head included), one tier among ``options`` -- by default ``int4``
(per-channel scales), ``int4-g128``, ``int4-g64``, ``int4-g32``, the 5- and 6-bit uniform tiers
``int5-g128/g64/g32`` and ``int6-g128/g64/g32`` (int8 in memory, 5 / 6 bits per code in a file:
csrc/ork/quant.h) and ``int8`` -- so that the packed
linears take at most ``target_bpw`` bits per weight (:func:`orkpy.formats.tiermap.packed_nbytes`: tile
padding and scales included) at the least estimated loss.

The loss of a choice is estimated per linear. ``method="per_linear"`` (the default ``"auto"``'s
choice up to 1 GiB of float32 weights) measures ``KL_n`` below one linear at a time (the others
float); ``method="passes"`` (above it; :mod:`orkpy.quantization.sensitivity`) estimates it from
1 + 7 streamed forward passes for the whole model (each linear type rounded at once, its KL
shared by the linears' relative output errors), faster and in bounded memory but with worse
choices on SmolLM2 (that module's doc):

1. ``KL_n``: measured. The linear's weight is replaced by its dequantized ``ref`` option (the
   first option: the cheapest) in the float32 model, the mean KL divergence of the next-token
   distributions against the float model is measured on ``chunks`` chunks of ``n_ctx`` tokens of
   calibration text, and the weight is put back (:meth:`orkpy.Model.swap_linear`). Weight error
   only: every option runs the same int8 activations, so they do not separate the options.
2. ``e_n(t)``: the importance-weighted squared error of the weight under option ``t``,
   ``sum_k imatrix[k] * sum_n (w[n, k] - dequant_t[n, k])^2`` -- the diagonal of the output
   error ``tr(dW G dW^T)`` (the imatrix is collected on the same calibration text when none is
   given). The estimate of option ``t`` is ``KL_n * e_n(t) / e_n(ref)``: to second order the KL
   of a small perturbation is a quadratic form in it, which ``e`` tracks within one linear.

The choice is a multiple-choice knapsack: per linear the options on the lower convex hull of
(bytes, estimated KL), then upgrades taken greedily by KL saved per extra byte while the budget
allows (each linear's options in hull order, so the result is the greedy optimum of the convex
relaxation). Deterministic: ties break by linear order.

``target_allocation`` returns the :class:`~orkpy.TierMap` (``save()`` writes the emit-map
``quantize_model`` and ``orkpy quantize --alloc`` read back) and a report with every estimate.
"""
from __future__ import annotations

import heapq
import sys
import time
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._io import progress_bar
from ..kernels.quant import FOUR_BIT_KINDS
from ..formats.tiermap import EMBEDDING, INT_TIERS, NPU_INT4_TIERS, TierEntry, TierMap, packed_nbytes, split_tier
from .sensitivity import SENSITIVITY_METHODS, _dequantized, _error_of, auto_method, sensitivities_passes



def _default_options() -> Tuple[str, ...]:
    """The integer tiers of the kind registry, narrowest first: the 4-bit one per channel and with groups of
    128 / 64 / 32 inputs, the ones between with those groups, int8 per channel."""
    out: List[str] = []
    for t in reversed(INT_TIERS):
        if t in NPU_INT4_TIERS:
            continue  # w4a4 / w4a8 (the NPU's int4 mode): orkpy.quantization.npu_alloc's choice
        if t in ("int4", "int8"):
            out.append(t)
        if t != "int8":
            out += [f"{t}-g{g}" for g in (128, 64, 32)]
    return tuple(out)


DEFAULT_OPTIONS = _default_options()  # int4, int4-g128/64/32, int5-g128/64/32, int6-g128/64/32, int8


def _log_softmax(logits: NDArray[np.float32]) -> NDArray[np.float64]:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


#: positions of one block of :func:`mean_kl` (its float64 temporaries: a few of rows x vocabulary)
KL_ROWS = 64


def mean_kl(ref_logp: Sequence[NDArray[np.float64]], logits: Sequence[NDArray[np.float32]]) -> float:
    """Mean over positions of KL(ref || q), ``ref_logp`` log-probabilities, ``logits`` q's logits;
    :data:`KL_ROWS` positions at a time (a 151,936-word vocabulary's float64 temporaries stay small)."""
    tot, n = 0.0, 0
    for lp, lg in zip(ref_logp, logits):
        for r0 in range(0, lp.shape[0], KL_ROWS):
            p = lp[r0:r0 + KL_ROWS]
            tot += float(np.sum(np.exp(p) * (p - _log_softmax(lg[r0:r0 + KL_ROWS]))))
        n += lp.shape[0]
    return tot / max(n, 1)


def weighted_error(w: NDArray[Any], tier: str, kind: str, im: Optional[NDArray[np.float32]],
                   threads: Optional[int] = None) -> float:
    """``sum_k im[k] * sum_n (w - dequant)^2`` of ``w`` quantized at ``tier`` (``im`` None: 1)."""
    return _error_of(w, _dequantized(w, tier, kind, im, threads), im)


def _hull(points: List[Tuple[int, float, str]]) -> List[Tuple[int, float, str]]:
    """The lower convex hull of (bytes, loss, tier), cheapest first, loss strictly falling."""
    pts = sorted(points, key=lambda p: (p[0], p[1]))
    out: List[Tuple[int, float, str]] = []
    for p in pts:
        if out and p[1] >= out[-1][1]:
            continue  # costs more, saves nothing
        while len(out) >= 2:
            (b1, l1, _), (b2, l2, _) = out[-2], out[-1]
            # drop the middle point when it lies on or above the segment out[-2] -> p
            if (l2 - l1) * (p[0] - b1) >= (p[1] - l1) * (b2 - b1):
                out.pop()
            else:
                break
        out.append(p)
    return out


def choose(costs: Dict[str, Dict[str, Tuple[int, float]]], budget: int) -> Dict[str, str]:
    """{linear: tier} minimising the summed loss with summed bytes <= ``budget`` (greedy on each
    linear's convex hull; ``costs``: {linear: {tier: (bytes, loss)}}). ValueError when even the
    cheapest tiers exceed the budget."""
    hulls = {n: _hull([(b, l, t) for t, (b, l) in opts.items()]) for n, opts in costs.items()}
    at = {n: 0 for n in hulls}
    used = sum(h[0][0] for h in hulls.values())
    if used > budget:
        raise ValueError(f"the cheapest tiers take {used:,} bytes, more than the budget of {budget:,} bytes")
    order = {n: i for i, n in enumerate(hulls)}
    heap: List[Tuple[float, int, str]] = []

    def push(n: str) -> None:
        h, i = hulls[n], at[n]
        if i + 1 < len(h):
            gain = (h[i][1] - h[i + 1][1]) / max(h[i + 1][0] - h[i][0], 1)
            heapq.heappush(heap, (-gain, order[n], n))

    for n in hulls:
        push(n)
    while heap:
        _, _, n = heapq.heappop(heap)
        h, i = hulls[n], at[n]
        extra = h[i + 1][0] - h[i][0]
        if used + extra > budget:
            continue  # this linear's next step does not fit; a cheaper step elsewhere may
        used += extra
        at[n] = i + 1
        push(n)
    return {n: hulls[n][at[n]][2] for n in hulls}


def names_of(src: Any) -> List[str]:
    from ..runtime.model import linear_names
    return list(linear_names(src.hp))


def sensitivities(src: Any, calib: Union[str, ArrayLike], options: Sequence[str] = DEFAULT_OPTIONS,
                  kind: str = "nf4", imatrix: Any = None, n_ctx: int = 256, chunks: int = 2,
                  threads: Optional[int] = None, progress: bool = True, method: str = "auto") -> Dict[str, Any]:
    """{"kl_ref": {linear: KL of the ref option}, "err": {linear: {tier: e}},
    "loss": {linear: {tier: estimated KL}}, "bytes": {linear: {tier: bytes}}, "ref": tier,
    "n_ctx", "chunks", "method"} of every linear of ``src``: ``method`` "passes" estimates each
    ``KL_n`` from ``1 + 7`` streamed passes (:mod:`orkpy.quantization.sensitivity`; also
    ``"kl_type"``), "per_linear" measures it with one whole-model pass per linear (module doc),
    "auto" per linear for a model of at most 1 GiB of float32 weights, else by the passes."""
    from ..runtime.model import LinearSpec, float_model

    if kind not in FOUR_BIT_KINDS:
        raise ValueError(f"kind must be one of {', '.join(FOUR_BIT_KINDS)}, got {kind!r}")
    if not options:
        raise ValueError("options must name at least one tier")
    if method not in SENSITIVITY_METHODS:
        raise ValueError(f"method must be one of {', '.join(SENSITIVITY_METHODS)}, got {method!r}")
    for t in options:
        if split_tier(t)[0] == "float":
            raise ValueError(f"option {t!r} is not an integer tier ({', '.join(reversed(INT_TIERS))})")
    if method == "auto":
        method = auto_method(src)
    opts = list(options)
    ref = min(opts, key=lambda t: (packed_nbytes(t, 64, 4096), opts.index(t)))  # the cheapest option
    if method == "passes":
        return sensitivities_passes(src, calib, opts, ref, kind, imatrix, n_ctx, chunks, threads, progress)
    m = float_model(src)
    toks = m.tokens(calib)
    n_chunk, it = m.chunks(toks, n_ctx, chunks)
    batch = list(it)
    t_pass = time.perf_counter()
    if imatrix is None:  # the mean squared input of every linear on the same chunks (collect_imatrix's values)
        stats = m.collect_activation_stats(iter(batch), threads)
        means = {n: (np.asarray(v, np.float64) / max(int(c), 1)).astype(np.float32) for n, (v, c) in stats.items()}
    else:
        means = {n: imatrix.values(n) for n in names_of(src) if n in imatrix}
    ref_logp = [_log_softmax(m.forward(c, threads=threads)) for c in batch]
    names = names_of(src)
    if progress:  # the cost before it is paid: one such pass per linear
        t_pass = time.perf_counter() - t_pass
        print(f"sensitivity: {len(names)} linears measured one at a time, each a forward pass over {n_chunk} x "
              f"{n_ctx} tokens: about {_duration(t_pass * len(names))} here (from the first pass; "
              f"allocation.target_sensitivity='passes' takes 8 passes and chooses less well, docs/recipes.md)",
              file=sys.stderr, flush=True)
    rep: Dict[str, Any] = {"kl_ref": {}, "err": {}, "loss": {}, "bytes": {}, "ref": ref, "n_ctx": int(n_ctx),
                           "chunks": n_chunk, "method": method}
    bar = progress_bar(len(names), "sensitivity", progress, "linear")
    try:
        for n in names:
            w = src.linear(n)
            N, K = w.shape
            im = means.get(n)
            if im is not None and im.shape != (K,):
                raise ValueError(f"the imatrix entry for {n!r} has {im.size} values, the weight has K = {K}")
            err = {}
            for t in opts:  # each option quantized once: its error, and the ref option's weight for the KL
                deq = _dequantized(w, t, kind, im, threads)
                err[t] = _error_of(w, deq, im)
                if t == ref:
                    ref_w = deq
            old = m.swap_linear(n, LinearSpec.f32(n, ref_w))
            try:
                kl = mean_kl(ref_logp, [m.forward(c, threads=threads) for c in batch])
            finally:
                m.swap_linear(n, old)
            kl = max(kl, 0.0)
            rep["kl_ref"][n] = kl
            rep["err"][n] = err
            rep["loss"][n] = {t: (kl * err[t] / err[ref] if err[ref] > 0 else 0.0) for t in opts}
            rep["bytes"][n] = {t: packed_nbytes(t, N, K) for t in opts}
            if bar is not None:
                bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return rep


def _duration(sec: float) -> str:
    return f"{sec:.0f} s" if sec < 120 else f"{sec / 60:.0f} minutes" if sec < 7200 else f"{sec / 3600:.1f} hours"


def cheapest_bytes(src: Any, options: Sequence[str]) -> int:
    """The packed bytes of the linears of ``src`` each at its cheapest tier of ``options``: the
    smallest size a target allocation over those options can reach."""
    shapes = src.shapes()
    total = 0
    for n in names_of(src):
        N, K = (int(d) for d in shapes[src.tensor_name(n)][:2])
        total += min(packed_nbytes(t, N, K) for t in options)
    return total


def check_target(src: Any, target_bpw: float, options: Sequence[str]) -> Tuple[int, int]:
    """(budget bytes, weights) of ``target_bpw``, checked before any measurement: a ValueError
    giving the smallest reachable bits per weight when the cheapest tiers do not fit."""
    budget, n_w = bpw_budget(src, target_bpw)
    low = cheapest_bytes(src, options)
    if low > budget:
        least = math.ceil(800.0 * low / n_w) / 100.0  # rounded up to 0.01 bit: a target that fits
        raise ValueError(f"target_bpw={target_bpw:g} is below the smallest size these tiers reach on this model: "
                         f"{8.0 * low / n_w:.3f} bits per weight ({low:,} bytes for {n_w:,} linear weights, each "
                         f"linear at its cheapest of {', '.join(options)}); give a target of at least {least:.2f}")
    return budget, n_w


def bpw_budget(src: Any, target_bpw: float) -> Tuple[int, int]:
    """(bytes, weights) of the packed linears of ``src`` at ``target_bpw`` bits per weight."""
    if isinstance(target_bpw, bool) or not isinstance(target_bpw, (int, float)) or not math.isfinite(target_bpw) \
            or not 0 < target_bpw <= 32:
        raise ValueError(f"target_bpw must be a number of bits per weight in (0, 32], got {target_bpw!r}")
    shapes = src.shapes()
    n_w = sum(int(np.prod(shapes[src.tensor_name(n)])) for n in names_of(src))
    return int(n_w * float(target_bpw) / 8), n_w


def target_allocation(src: Any, calib: Union[str, ArrayLike], target_bpw: float,
                      options: Sequence[str] = DEFAULT_OPTIONS, kind: str = "nf4", imatrix: Any = None,
                      n_ctx: int = 256, chunks: int = 2, threads: Optional[int] = None,
                      progress: bool = True, report: Optional[Dict[str, Any]] = None,
                      method: str = "auto") -> Tuple[TierMap, Dict[str, Any]]:
    """(TierMap, report): the tiers of every linear of ``src`` (a :class:`~orkpy.formats.source.Source`)
    at ``target_bpw`` bits per packed linear weight (module doc); ``report`` from an earlier
    :func:`sensitivities` call (same options) skips the measurement (``method``: how it measures).
    The map names the source's
    tensors (a tied head's entry is ``token_embd.weight``; an untied embedding table stays
    float); its ggml types are the source's."""
    budget, n_w = check_target(src, target_bpw, options)  # before the measurement: an impossible size fails at once
    rep = report if report is not None else sensitivities(src, calib, options, kind, imatrix, n_ctx, chunks,
                                                          threads, progress, method)
    names = names_of(src)
    missing = [n for n in names if n not in rep["loss"]]
    if missing:
        raise ValueError(f"the sensitivity report has no entry for {missing[0]!r}: it is for another model")
    costs = {n: {t: (rep["bytes"][n][t], rep["loss"][n][t]) for t in options} for n in names}
    try:
        tiers = choose(costs, budget)
    except ValueError as e:
        raise ValueError(f"target_bpw={target_bpw}: {e} ({n_w:,} weights)") from None
    shapes = src.shapes()
    entries: Dict[str, TierEntry] = {}
    for n in names:
        t = src.tensor_name(n)
        entries[t] = TierEntry(tiers[n], src.type_of(t), tuple(int(d) for d in shapes[t]))
    if EMBEDDING in shapes and EMBEDDING not in entries:
        entries[EMBEDDING] = TierEntry("float", src.type_of(EMBEDDING), tuple(int(d) for d in shapes[EMBEDDING]))
    tm = TierMap(entries, source=f"target_bpw={float(target_bpw):g}", tied=bool(src.tied))
    used = sum(costs[n][tiers[n]][0] for n in names)
    out = dict(rep)
    out.update({"target_bpw": float(target_bpw), "budget_bytes": budget, "total_bytes": used,
                "bpw": 8.0 * used / n_w, "weights": n_w, "tiers": tiers,
                "est_kl": sum(costs[n][tiers[n]][1] for n in names)})
    return tm, out


__all__ = ["DEFAULT_OPTIONS", "bpw_budget", "cheapest_bytes", "check_target", "choose", "mean_kl", "sensitivities", "target_allocation",
           "weighted_error"]
