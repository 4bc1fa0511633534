"""GPTQ: per-channel int8 / NF4 / int4 weights rounded with error compensation (Frantar et al., 2022).

Plain rounding (``quantize(w, "int8")``) makes each weight's error independently; GPTQ quantizes
the input columns one at a time and moves each column's rounding error onto the columns not yet
quantized, weighted by the inverse of the linear's input Gram matrix ``G = sum x^T x`` on
calibration text, so the error of the layer's *output* ``x W^T`` shrinks rather than that of the
weights. The stored format is unchanged: int8 codes in [-127, 127] and the per-row scale of plain
rounding (``absmax / 127``), so a GPTQ tensor packs, saves and runs like any int8 one. The 4-bit
kinds keep their format too: the per-row scale of :func:`orkpy.quantize` with the Gram diagonal as
importance (its imatrix clip search), each column sent to the nearest codebook level (stories260K,
Q4_0 allocation, w4a8 KL: 0.114 RTN + imatrix -> 0.084 GPTQ, ``tests/test_gptq.py``).

:func:`gptq_quantize` ``(w, gram, damp=0.01, block=128)``: one weight. ``G + damp * mean(diag G)
I`` is inverted (float64, NumPy/LAPACK) and its inverse's upper Cholesky factor ``U`` drives the
updates: column ``k`` is rounded exactly as :func:`orkpy.quantize` rounds (``y = float32(w) *
(127 / absmax)`` in float32, half away from zero, clamped to +-127), its error ``e = (w - q s) /
U[k, k]`` is subtracted from the later columns as ``e U[k, j]`` (lazily, ``block`` columns at a
time). Input channels that never fired (``G[k, k] = 0``) are rounded plainly. A diagonal ``G``
with ``damp=0`` moves nothing, so the result is then bit-identical to plain rounding. The float64
updates run through NumPy's BLAS: the codes are deterministic on one machine, not promised
bit-identical across BLAS builds.

:func:`collect_grams` runs a model (float32, every layer per op) over calibration chunks with the
C forward pass accumulating each requested linear's ``G`` (csrc/ork/linear.h, "Input Gram
matrix"); linears that read the same input (``attn_q/k/v``; ``ffn_gate/up``) share one matrix.
:func:`gptq_linears` does both for every linear of a source: the Gram matrices come from the
float model (all in one pass when they fit ``max_bytes``, else a pass per group of layers), not
from the partially quantized one.

Measured (``bench/act_modes.py --gptq int8``; SmolLM2-135M, Hadamard + online rotation,
calibration TinyStories 8 x 512, scored wikitext 8 x 512, mean KL vs F32): int8 weight-only
0.0038 -> 0.0015, w8a8 per-token 0.0055 -> 0.0033 (llama.cpp Q8_0: 0.0040), static mse with a
1-token prefix 0.0086 -> 0.0064. Gram matrices from the partially quantized model instead (a NumPy
prototype): 0.0013 / 0.0031, not worth a pass per layer.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._io import progress_bar
from .quant import QuantizedTensor, quantize

#: relative damping added to the Gram matrix's diagonal (a share of its mean)
DEFAULT_DAMP = 0.01
#: columns updated at once
DEFAULT_BLOCK = 128
#: linears whose input is another's (the same norm output): they share its Gram matrix
SHARED_INPUT = {"attn_k": "attn_q", "attn_v": "attn_q", "ffn_up": "ffn_gate"}


def _round_int8(w: NDArray[np.float64], inv: NDArray[np.float32]) -> NDArray[np.float32]:
    """quant.h's int8 rounding of a column: y = float32(w) * inv in float32, half away from zero, clamped."""
    y = w.astype(np.float32) * inv
    q = np.trunc(y + np.copysign(np.float32(0.5), y))
    return np.clip(q, -127, 127).astype(np.float32)


def _check_gram(gram: ArrayLike, K: int, where: str) -> NDArray[np.float64]:
    g = np.asarray(gram, dtype=np.float64)
    if g.shape != (K, K):
        raise ValueError(f"{where}: the Gram matrix must be ({K}, {K}) for a weight with K = {K}, got {g.shape}")
    if not np.all(np.isfinite(g)):
        raise ValueError(f"{where}: the Gram matrix has a non-finite value at {tuple(np.argwhere(~np.isfinite(g))[0])}")
    if np.any(np.diag(g) < 0):
        raise ValueError(f"{where}: the Gram matrix has a negative diagonal value at [{int(np.argmax(np.diag(g) < 0))}]")
    return g


def _nearest_level(y: NDArray[np.float64], mids: NDArray[np.float64]) -> NDArray[np.int64]:
    """Index of the nearest codebook level (ascending levels, ``mids`` their midpoints; a tie goes up)."""
    return np.searchsorted(mids, y, side="right")


def _pack_nibbles(codes: NDArray[np.uint8]) -> NDArray[np.uint8]:
    """(N, K) 4-bit codes -> (N, K/2) bytes, element 2j in the low nibble (quant.py's layout)."""
    return np.ascontiguousarray(codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def gptq_quantize(w: ArrayLike, gram: ArrayLike, kind: str = "int8", damp: float = DEFAULT_DAMP,
                  block: int = DEFAULT_BLOCK, where: str = "weight", rows: int = 0,
                  group_size: Optional[int] = None, static_groups: bool = False) -> QuantizedTensor:
    """Quantize a float ``(N, K)`` weight per channel (``kind`` int8, nf4 or int4) with GPTQ's error
    compensation on the input Gram matrix ``gram`` ``(K, K)`` (see module doc). ``where`` names the
    weight in errors. 4-bit kinds: each row's scale is the one :func:`orkpy.quantize` picks with the
    importance ``diag(gram) / rows`` (its imatrix clip search; ``rows`` = the Gram matrix's input
    rows, 0 = no imatrix, plain absmax), then every column goes to the nearest level of the kind's
    codebook times that scale, with the same error feedback as int8. ``group_size``: group-wise
    scales (:func:`orkpy.quantize`'s); each group's scale is chosen when the loop reaches its first
    column, from the columns as the error feedback has left them (``static_groups=True``: all
    chosen up front from ``w``), and each column is rounded with its group's scale."""
    if kind not in ("int8", "nf4", "int4"):
        raise ValueError(f"{where}: GPTQ is implemented for kinds 'int8', 'nf4' and 'int4', got {kind!r}")
    if not (isinstance(damp, (int, float)) and not isinstance(damp, bool) and np.isfinite(damp) and damp >= 0):
        raise ValueError(f"{where}: damp must be a finite number >= 0, got {damp!r}")
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"{where}: block must be a positive int, got {block!r}")
    w32 = np.asarray(w, dtype=np.float32)
    if w32.ndim != 2:
        raise ValueError(f"{where}: w must be a 2-D (N, K) array, got shape {w32.shape}")
    N, K = w32.shape
    g = _check_gram(gram, K, where)
    four = kind != "int8"
    im = np.diag(g) / rows if (four and rows > 0) else None
    # the scales (and the checks of w: shape, finiteness); an all-zero importance means none
    plain = quantize(w32, kind, imatrix=im if (im is not None and np.any(im > 0)) else None, group_size=group_size)
    s = plain.scales.reshape(N, -1)  # (N, G): G = 1 per channel
    gs = plain.group or K             # columns per scale
    amax = np.stack([np.abs(w32[:, i:i + gs]).max(axis=1) for i in range(0, K, gs)], axis=1)
    live = s > 0
    inv = np.zeros(s.shape, np.float32)
    inv[live] = np.float32(127) / amax[live]
    if four:
        # the codebook's distinct int8 levels, ascending, and the first code of each (int4's 16th
        # code repeats 0); value = level * scale
        lv_u, code_of = np.unique(np.asarray(plain.lut, np.float64), return_index=True)
        lv = np.asarray(plain.lut, np.float64)
        mids = (lv_u[1:] + lv_u[:-1]) / 2
        zero = int(code_of[int(np.argmin(np.abs(lv_u)))])
        inv_s = np.zeros(s.shape, np.float64)
        inv_s[live] = 1.0 / s[live].astype(np.float64)
    h = g.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    diag_mean = float(np.mean(np.diag(h)))
    h[np.diag_indices(K)] += damp * diag_mean
    try:
        u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: inv(h) = u^T u
    except np.linalg.LinAlgError:
        raise ValueError(f"{where}: the Gram matrix plus damping is not positive definite (raise damp, now {damp})") \
            from None
    im_any = im if (im is not None and np.any(im > 0)) else None
    W = w32.astype(np.float64)
    Q = np.empty((N, K), np.float32)
    C = np.empty((N, K), np.uint8) if four else None
    s64 = s.astype(np.float64)
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        W1 = W[:, i1:i2]  # a view: updated in place
        err = np.zeros((N, i2 - i1))
        for i in range(i2 - i1):
            k = i1 + i
            gi = k // gs
            if k % gs == 0 and k > 0 and not static_groups:  # this group's scale, from the updated columns
                seg = np.ascontiguousarray(W[:, k:k + gs], dtype=np.float32)  # up to date: gs divides block or
                sq = quantize(seg, kind, imatrix=None if im_any is None else im_any[k:k + gs])  # starts one
                s[:, gi] = sq.scales
                live[:, gi] = sq.scales > 0
                amax_g = np.abs(seg).max(axis=1)
                inv[:, gi] = np.where(live[:, gi], np.float32(127) / np.where(live[:, gi], amax_g, 1), 0)
                s64[:, gi] = sq.scales
                if C is not None:
                    inv_s[:, gi] = np.where(live[:, gi], 1.0 / np.where(live[:, gi], s64[:, gi], 1), 0)
            if C is not None:
                idx = np.where(live[:, gi], code_of[_nearest_level(W1[:, i] * inv_s[:, gi], mids)], zero)
                C[:, k] = idx
                q = lv[idx].astype(np.float32)
            else:
                q = _round_int8(W1[:, i], inv[:, gi])
            Q[:, k] = q
            if dead[k]:
                continue
            e = (W1[:, i] - q.astype(np.float64) * s64[:, gi]) / u[k, k]
            W1[:, i + 1:] -= np.outer(e, u[k, k + 1:i2])
            err[:, i] = e
        if i2 < K:
            W[:, i2:] -= err @ u[i1:i2, i2:]
    scales = np.ascontiguousarray(s.reshape(plain.scales.shape), dtype=np.float32)
    if C is not None:
        if K % 2:
            C = np.concatenate([C, np.full((N, 1), zero, np.uint8)], axis=1)
        return QuantizedTensor(kind=kind, shape=(N, K), codes=_pack_nibbles(C), scales=scales, lut=plain.lut,
                               group=plain.group)
    codes = np.ascontiguousarray(Q.astype(np.int8))
    return QuantizedTensor(kind="int8", shape=(N, K), codes=codes, scales=scales, lut=None, group=plain.group)


def _gram_owner(name: str) -> str:
    parts = name.split(".")
    if len(parts) == 4 and parts[2] in SHARED_INPUT:
        return ".".join(parts[:2] + [SHARED_INPUT[parts[2]]] + parts[3:])
    return name


def collect_grams(model: Any, chunks: Iterable[ArrayLike], names: Sequence[str],
                  threads: Optional[int] = None) -> Dict[str, Tuple[NDArray[np.float64], int]]:
    """{name: (G = sum x^T x over every input row, float64 (K, K), rows)} of the linears ``names`` of
    an :class:`orkpy.Model` run over ``chunks`` (token arrays, one forward pass each); names that
    read the same input (:data:`SHARED_INPUT`) get the same array."""
    order = set(model.linear_names())
    owners = {}
    for n in names:
        if n not in order:
            raise ValueError(f"no linear named {n!r} in the model")
        o = _gram_owner(n)
        owners[n] = o if o in order else n
    got = model.collect_grams(chunks, sorted(set(owners.values())), threads)
    return {n: got[o] for n, o in owners.items()}


def gram_batches(names: Sequence[str], K: Callable[[str], int], max_bytes: int = 1 << 30) -> List[List[str]]:
    """``names`` cut, in order, into runs whose Gram matrices (float64 ``K(name)`` squared, one per
    input: names reading the same input, :data:`SHARED_INPUT`, count once) take at most
    ``max_bytes`` together, a matrix larger than ``max_bytes`` alone in its run: the linears of
    one calibration pass (:func:`gptq_linears`, :func:`orkpy.awq.awq_scales`)."""
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, (int, np.integer)) or max_bytes < 0:
        raise ValueError(f"max_bytes must be an int >= 0, got {max_bytes!r}")
    runs: List[List[str]] = []
    cur: List[str] = []
    seen: Set[str] = set()
    cur_bytes = 0
    for n in names:
        o = _gram_owner(n)
        k = int(K(n))
        extra = 0 if o in seen else k * k * 8
        if cur and extra and cur_bytes + extra > max_bytes:  # a shared input costs nothing more
            runs.append(cur)
            cur, cur_bytes, seen = [], 0, set()
            extra = k * k * 8
        cur.append(n)
        seen.add(o)
        cur_bytes += extra
    if cur:
        runs.append(cur)
    return runs


def gptq_linears(src: Any, calib: Union[str, ArrayLike], kind: Union[str, Dict[str, str]] = "int8", n_ctx: int = 512,
                 chunks: Optional[int] = 8, damp: float = DEFAULT_DAMP, block: int = DEFAULT_BLOCK,
                 names: Optional[Sequence[str]] = None, max_bytes: int = 1 << 30, threads: Optional[int] = None,
                 progress: bool = True, group_size: Union[int, None, Dict[str, int]] = None
                 ) -> Dict[str, QuantizedTensor]:
    """{linear name: QuantizedTensor} of every linear of the :class:`~orkpy.source.Source` ``src``
    (or ``names``) quantized by :func:`gptq_quantize`, the Gram matrices collected on ``chunks``
    chunks of ``n_ctx`` tokens of ``calib`` by ``src`` run in float32 (see module doc). ``kind``: one
    kind for all, or {name: kind}; ``group_size`` likewise (None or 0: per channel)."""
    from .model import float_model, linear_names

    names = list(linear_names(src.hp) if names is None else names)
    m = float_model(src)
    tokens = m.tokens(calib)
    groups = gram_batches(names, lambda n: m.linears[n].K, max_bytes)
    out: Dict[str, QuantizedTensor] = {}
    bar = progress_bar(len(names), "gptq", progress, "linear")
    try:
        for grp in groups:
            _, it = m.chunks(tokens, n_ctx, chunks)
            grams = collect_grams(m, it, grp, threads)
            for n in grp:
                k = kind if isinstance(kind, str) else kind[n]
                gsz = group_size.get(n) if isinstance(group_size, dict) else group_size
                out[n] = gptq_quantize(src.linear(n), grams[n][0], k, damp, block, where=n, rows=grams[n][1],
                                       group_size=gsz)
                if bar is not None:
                    bar.update(1)
            del grams
    finally:
        if bar is not None:
            bar.close()
    return out


__all__ = ["DEFAULT_BLOCK", "DEFAULT_DAMP", "SHARED_INPUT", "collect_grams", "gptq_linears", "gptq_quantize",
           "gram_batches"]
