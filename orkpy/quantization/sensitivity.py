"""Target-size sensitivities in a few streamed forward passes (``allocation.target_sensitivity``
``"passes"``, the default): the same report :func:`orkpy.quantization.alloc.sensitivities`
measures with one forward pass per linear, at the cost of ``1 + len(STEMS)`` passes for the
whole model, layer by layer, one layer's float32 weights in memory.

The calibration chunks flow through the source one layer at a time (:class:`orkpy.runtime.blocks.Stream`):

- the float stream, whose layer inputs give every linear's importance (the mean squared input,
  as the per-linear method collects it) unless an imatrix is given;
- one stream per linear type (``attn_q`` ... ``ffn_down``: :data:`orkpy.runtime.blocks.STEMS`) in
  which every linear of that type runs its ``ref`` option (the cheapest, dequantized), the rest float.

At the end each stream's logits (the head applied in blocks of vocabulary rows, the
log-sum-exp accumulated online, so a 151,936-row head is never held in float32) give
``KL_type``, the mean KL divergence against the float stream's next-token distributions; the
head's own ``KL`` comes from the float stream's final rows through the ``ref``-rounded head.
Each option's error ``e_n(t)`` (the importance-weighted squared error of the rounded weight) is
exact for the cheapest option ``ref``, quantized whole because its stream runs it, and for the
others estimated on :data:`OPTION_ROWS` rows drawn in proportion to their error at ``ref``
(:func:`_options_of`; all rows of a weight with at most twice as many).
A type's KL is shared among its linears in proportion to each one's relative output error at
``ref``, ``e_n(ref) / sum_k im[k] sum_n w[n, k]^2`` (:func:`orkpy.quantization.alloc.weighted_error`'s
importance-weighted squared error over the same weighting of the weight itself, ``"energy"`` in the
report; ``"resid"`` is the mean squared hidden value entering each layer): the estimate of ``KL_n``
that the per-linear method measures. Every option's loss is then ``KL_n * e_n(t) / e_n(ref)``, as there.

How good the estimate is (docs/results/recipe-scale.md): on SmolLM2-135M the 8 passes take 63 s
against 470 s for the per-linear method, but its allocations lose KL at equal bytes (+10 % at 4.5
bits, +26 % at 5.0 with round to nearest and an imatrix): a type's linears differ by up to 3
orders of magnitude in KL per unit of error (the first layer's ``attn_v`` / ``attn_output``), which
no single-pass proxy tracked (relative or absolute error, the residual's energy; per-type bands of
layers measured apart narrow it slowly). Hence ``"auto"``: per linear while the model's float32
copy is at most :data:`PER_LINEAR_MAX_BYTES`, these passes above it, where the per-linear method
would hold the model in float32 and run one pass per linear.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._io import progress_bar
from ..formats.tiermap import OUTPUT, packed_nbytes, split_tier, tier_kind
from ..kernels.quant import quantize
from ..runtime.blocks import STEMS, Block, Stream, head_blocks, layer_linears
from ..runtime.linear import LinearSpec
from ..runtime.model import calib_chunks

#: how target_bpw's sensitivities are measured (allocation.target_sensitivity): "passes" (this
#: module), "per_linear" (one whole-model pass per linear, :func:`orkpy.quantization.alloc.sensitivities`)
#: or "auto" (per linear up to PER_LINEAR_MAX_BYTES of float32 weights, else passes)
SENSITIVITY_METHODS = ("auto", "passes", "per_linear")
#: "auto": the largest model (its float32 weights, bytes) measured per linear
PER_LINEAR_MAX_BYTES = 1 << 30
#: rows of a linear (of a block of head rows) on which the options other than the cheapest are
#: quantized for their errors (drawn in proportion to the cheapest option's error per row, which
#: is quantized whole; all rows up to twice this). Gemma-3-270M's 16 linears of over 512 rows, 11
#: options: within 1.8 % of the errors over every row (median 0.9 %); Qwen3-1.7B: the options'
#: quantizations over every row were most of the stage's 526 s
OPTION_ROWS = 256
#: float32 bytes of head rows applied at once (the logits of a vocabulary block)
HEAD_BLOCK_BYTES = 64 << 20


def _dequantized(w: NDArray[Any], tier: str, kind: str, im: Optional[NDArray[np.float32]],
                 threads: Optional[int] = None) -> NDArray[np.float32]:
    """``w`` quantized at ``tier`` (int4 tiers as ``kind``, int8 / int6 / int5 as themselves) and dequantized."""
    g = split_tier(tier)[1]
    q = quantize(w, tier_kind(tier, kind) or "float", imatrix=im, threads=threads, group_size=g or None)
    return q.dequantize(threads)


def _error_of(w: NDArray[Any], deq: NDArray[np.float32], im: Optional[NDArray[np.float32]]) -> float:
    d2 = ((deq.astype(np.float64) - np.asarray(w, np.float64)) ** 2).sum(axis=0)
    return float(d2 @ (np.ones_like(d2) if im is None else np.asarray(im, np.float64)))


class _OnlineKL:
    """Mean KL(p || q) over positions, p and q given as logits a block of vocabulary columns at a
    time: running maxima, sums of exponentials and sum p (z_p - z_q), in float64."""

    def __init__(self, lengths: Sequence[int]) -> None:
        self.mp = [np.full(T, -np.inf) for T in lengths]
        self.mq = [np.full(T, -np.inf) for T in lengths]
        self.lp = [np.zeros(T) for T in lengths]
        self.lq = [np.zeros(T) for T in lengths]
        self.s = [np.zeros(T) for T in lengths]

    def add(self, zp: Sequence[NDArray[np.float32]], zq: Sequence[NDArray[np.float32]]) -> None:
        for i, (a32, b32) in enumerate(zip(zp, zq)):
            a, b = a32.astype(np.float64), b32.astype(np.float64)
            m = np.maximum(self.mp[i], a.max(axis=1))
            sc = np.exp(self.mp[i] - m)
            e = np.exp(a - m[:, None])
            self.lp[i] = self.lp[i] * sc + e.sum(axis=1)
            self.s[i] = self.s[i] * sc + (e * (a - b)).sum(axis=1)
            self.mp[i] = m
            mq = np.maximum(self.mq[i], b.max(axis=1))
            self.lq[i] = self.lq[i] * np.exp(self.mq[i] - mq) + np.exp(b - mq[:, None]).sum(axis=1)
            self.mq[i] = mq

    def value(self) -> float:
        tot, n = 0.0, 0
        for mp, lp, mq, lq, s in zip(self.mp, self.lp, self.mq, self.lq, self.s):
            tot += float(np.sum(s / lp - (mp + np.log(lp)) + (mq + np.log(lq))))
            n += mp.shape[0]
        return max(tot / max(n, 1), 0.0)


def _means(sums: Any) -> NDArray[np.float32]:
    v, rows = sums
    return (np.asarray(v, np.float64) / max(int(rows), 1)).astype(np.float32)


def _energy(w: NDArray[Any], im: Optional[NDArray[np.float32]]) -> float:
    """``sum_k im[k] * sum_n w[n, k]^2``: the importance-weighted output energy of ``w``."""
    col = (np.asarray(w, np.float64) ** 2).sum(axis=0)
    return float(col @ (np.ones_like(col) if im is None else np.asarray(im, np.float64)))


def _row_errors(w: NDArray[Any], deq: NDArray[np.float32], im: Optional[NDArray[np.float32]]) -> NDArray[np.float64]:
    """Each row's share of :func:`_error_of` (float64)."""
    d2 = (deq.astype(np.float64) - np.asarray(w, np.float64)) ** 2
    return d2 @ (np.ones(d2.shape[1]) if im is None else np.asarray(im, np.float64))


def _options_of(w: NDArray[Any], opts: Sequence[str], ref: str, kind: str, im: Optional[NDArray[np.float32]],
                threads: Optional[int]) -> "tuple[Dict[str, float], NDArray[np.float32]]":
    """({tier: e_n(tier)}, the ref option's dequantized weight): ``ref`` quantized whole (its stream
    runs it), its error exact; every other option quantized on :data:`OPTION_ROWS` rows drawn with
    probability proportional to their error at ``ref`` (:func:`orkpy.quantization.awq.sample_rows`:
    systematic, deterministic, Horvitz-Thompson weights; each row is quantized on its own, so they
    are those rows of the whole weight's rounding), its error the weighted sum over them; every row
    when the weight has at most ``2 *`` :data:`OPTION_ROWS`."""
    from .awq import sample_rows
    ref_w = _dequantized(w, ref, kind, im, threads)
    N = int(w.shape[0])
    if N <= 2 * OPTION_ROWS:
        err = {t: (_error_of(w, ref_w, im) if t == ref else _error_of(w, _dequantized(w, t, kind, im, threads), im))
               for t in opts}
        return err, ref_w
    e_ref = _row_errors(w, ref_w, im)
    idx, wt = sample_rows(e_ref, OPTION_ROWS)
    ws = np.ascontiguousarray(w[idx])
    err = {t: (float(e_ref.sum()) if t == ref else float(_row_errors(ws, _dequantized(ws, t, kind, im, threads), im) @ wt))
           for t in opts}
    return err, ref_w


def sensitivities_passes(src: Any, calib: Union[str, ArrayLike], opts: List[str], ref: str, kind: str,
                         imatrix: Any, n_ctx: int, chunks: int, threads: Optional[int],
                         progress: bool) -> Dict[str, Any]:
    """The report of :func:`orkpy.quantization.alloc.sensitivities` by the streamed passes (module doc)."""
    toks, _ = calib_chunks(src, calib, n_ctx, chunks)
    n_layer = int(src.hp["n_layer"])
    base = Stream(src, toks)
    streams = {t: base.copy() for t in STEMS}
    rep: Dict[str, Any] = {"kl_ref": {}, "err": {}, "loss": {}, "bytes": {}, "ref": ref, "n_ctx": int(n_ctx),
                           "chunks": len(toks), "method": "passes", "kl_type": {}, "energy": {}, "resid": []}
    rho: Dict[str, float] = {}

    def importance(n: str, got: Dict[str, Any], K: int) -> Optional[NDArray[np.float32]]:
        im = _means(got["imatrix"][n]) if imatrix is None else (imatrix.values(n) if n in imatrix else None)
        if im is not None and im.shape != (K,):
            raise ValueError(f"the imatrix entry for {n!r} has {im.size} values, the weight has K = {K}")
        return im

    bar = progress_bar(n_layer + 1, "sensitivity", progress, "layer")
    blk: Optional[Block] = None
    try:
        for layer in range(n_layer):
            names = layer_linears(layer)
            specs = {n: LinearSpec.f32(n, src.linear(n)) for n in names}
            blk = Block(src, layer, specs)
            rep["resid"].append(float(np.mean([np.mean(np.square(x, dtype=np.float64)) for x in base.xs])))
            got = blk.run(base, threads, imatrix=imatrix is None)
            for t, n in zip(STEMS, names):
                w = specs[n].weight
                assert w is not None
                im = importance(n, got, w.shape[1])
                err, ref_w = _options_of(w, opts, ref, kind, im, threads)
                e = _energy(w, im)
                rho[n] = err[ref] / e if e > 0 else 0.0
                rep["energy"][n] = e
                rep["err"][n] = err
                rep["bytes"][n] = {o: packed_nbytes(o, w.shape[0], w.shape[1]) for o in opts}
                old = blk.swap(n, LinearSpec.f32(n, ref_w))  # this type's stream: its linear rounded
                del ref_w
                blk.run(streams[t], threads)
                blk.swap(n, old)
            src.release()
            if bar is not None:
                bar.update(1)
        assert blk is not None
        _head(src, blk, base, streams, opts, ref, kind, imatrix, threads, rep)
        if bar is not None:
            bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    for t in STEMS:  # each type's KL shared by its linears' relative output errors
        names = [layer_linears(layer)[STEMS.index(t)] for layer in range(n_layer)]
        tot = sum(rho[n] for n in names)
        for n in names:
            rep["kl_ref"][n] = rep["kl_type"][t] * (rho[n] / tot if tot > 0 else 1.0 / len(names))
    for n, err in rep["err"].items():
        kl = rep["kl_ref"][n]
        rep["loss"][n] = {t: (kl * err[t] / err[ref] if err[ref] > 0 else 0.0) for t in opts}
    return rep


def _head(src: Any, last: Block, base: Stream, streams: Dict[str, Stream], opts: List[str], ref: str, kind: str,
          imatrix: Any, threads: Optional[int], rep: Dict[str, Any]) -> None:
    """The types' KL from every stream's logits and the head's own options and KL, the head's
    weight and the logits a block of vocabulary rows at a time."""
    lengths = [x.shape[0] for x in base.xs]
    kls = {t: _OnlineKL(lengths) for t in streams}
    head_kl = _OnlineKL(lengths)
    if imatrix is None:
        im: Optional[NDArray[np.float32]] = _means(last.head_stats(base, threads, imatrix=True)["imatrix"][OUTPUT])
    else:
        im = imatrix.values(OUTPUT) if OUTPUT in imatrix else None
    N, K = src.shapes()[src.tensor_name(OUTPUT)][:2]
    if im is not None and im.shape != (K,):
        raise ValueError(f"the imatrix entry for {OUTPUT!r} has {im.size} values, the weight has K = {K}")
    err = {t: 0.0 for t in opts}
    for _, w, b in head_blocks(src, HEAD_BLOCK_BYTES):
        zp = last.head_logits(base, w, b, threads)
        for t, s in streams.items():
            kls[t].add(zp, last.head_logits(s, w, b, threads))
        e, ref_w = _options_of(w, opts, ref, kind, im, threads)
        for t in opts:
            err[t] += e[t]
        head_kl.add(zp, last.head_logits(base, ref_w, b, threads))
        del w, ref_w, zp
    rep["kl_type"] = {t: k.value() for t, k in kls.items()}
    kl = head_kl.value()
    rep["kl_ref"][OUTPUT] = kl
    rep["err"][OUTPUT] = err
    rep["loss"][OUTPUT] = {t: (kl * err[t] / err[ref] if err[ref] > 0 else 0.0) for t in opts}
    rep["bytes"][OUTPUT] = {o: packed_nbytes(o, N, K) for o in opts}


def auto_method(src: Any) -> str:
    """``"auto"``'s choice for ``src``: "per_linear" up to :data:`PER_LINEAR_MAX_BYTES` of float32 weights."""
    n = sum(int(np.prod(s)) for s in src.shapes().values())
    return "per_linear" if 4 * n <= PER_LINEAR_MAX_BYTES else "passes"


__all__ = ["HEAD_BLOCK_BYTES", "OPTION_ROWS", "PER_LINEAR_MAX_BYTES", "SENSITIVITY_METHODS", "auto_method",
           "sensitivities_passes"]
