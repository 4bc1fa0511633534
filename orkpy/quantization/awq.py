"""AWQ-style activation-aware weight scaling, folded into the model (Lin et al., 2023).

A weight column that meets large activations matters more to the layer's output than one that
meets small ones, but per-row rounding treats every column alike. AWQ scales input channel ``j``
of a group of linears up by ``s_j`` before rounding and the activation down by ``s_j``, where the
division is free: folded into the producer of the activation. The scaled weights round with a
smaller relative error on the salient columns; the function computed in float is unchanged.

Groups (the folds of :mod:`orkpy.runtime.rotate`'s SmoothQuant, same keys, same exactness):

- ``attn_norm`` -> ``attn_q/k/v`` and ``ffn_norm`` -> ``ffn_gate/up``: the norm weight ``g / s``,
  the linears ``W diag(s)`` (not when the block inputs are rotated online after the norm,
  placement "online": there is no weight to fold ``1 / s`` into);
- ``attn_v`` -> ``attn_output``: ``attn_v`` rows ``/ s`` per KV channel, ``attn_output``
  columns ``* s`` (each query head takes its KV head's scales);
- ``ffn_up`` -> ``ffn_down``: ``ffn_up`` rows ``/ s``, ``ffn_down`` columns ``* s`` (not when
  ``ffn_down``'s input is rotated online).

The head (fed by ``output_norm``; tied to the embedding on most small models) is left alone.

Scale search, per group, from each linear's input Gram matrix ``G = sum x^T x`` on calibration
text (:func:`orkpy.quantization.gptq.collect_grams`, the float model): ``m_j = sqrt(G_jj / rows)`` (the RMS of
input channel j; AWQ uses the mean ``|x_j|``, which the Gram matrix does not hold), and for each
``alpha`` of a grid (default 0, 0.1, ..., 1): ``s = m^alpha / sqrt(max(m^alpha) min(m^alpha))``,
each linear of the group quantized as it will be stored (``quantize(W diag(s), kind)``; the 4-bit
kinds with the Gram diagonal of the scaled input, ``G_jj / s_j^2``, as their imatrix) and its
output error measured exactly on the calibration inputs:

    err(alpha) = sum over the group's linears of  tr(dW G dW^T),  dW = deq(Q(W diag(s))) diag(1/s) - W

which is ``sum_rows ||x dW^T||^2``, the squared error of the group's outputs over every
calibration token. The ``alpha`` with the smallest error is kept; ``alpha = 0`` (``s = 1``, plain
rounding) is on the grid, so the chosen scaling is never worse than plain rounding on the
calibration inputs. For ``attn_v`` -> ``attn_output`` the KV channel's magnitude is the largest of
its query heads'. Cost: one quantization and one ``(N, K) x (K, K)`` product per linear and
``alpha`` (the exact objective needs both per alpha); the Gram matrices of as many layers as fit
``max_bytes`` (1 GiB) per pass of the float model over the calibration text, all of them in one
pass on small models (SmolLM2-135M, 8 x 512 tokens: the 30 layers' 0.8 GB in 1 pass instead of 30;
awq_scales 687 -> 217 s of CPU time, the same scales).

:func:`awq_scales` ``(src, calib, kinds, ...)`` -> ``(scales, report)``; :func:`apply_awq` returns the
source with the scales folded in (a :class:`~orkpy.runtime.rotate.TransformedSource`; a rotated source
keeps its rotation); ``quantize_model(..., awq=True, calib=...)`` and ``orkpy quantize --awq`` run
both (with ``method="gptq"``, GPTQ's Gram matrices come from the scaled model).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..kernels.quant import quantize

#: the alpha grid of the scale search (0: no scaling)
DEFAULT_ALPHAS: Tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))


def _pair(i: int, producer: str) -> str:
    from ..runtime.rotate import _pair as p
    return p(i, producer)


def groups(hp: Mapping[str, Any]) -> List[Tuple[str, List[str], str]]:
    """[(scale key, the linears scaled by it, the linear whose input it is)] of a model's
    hyper-parameters, in layer order (module doc)."""
    out = []
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        if not hp.get("norm_rot"):
            out.append((f"{p}attn_norm.weight", [f"{p}attn_q.weight", f"{p}attn_k.weight", f"{p}attn_v.weight"],
                        f"{p}attn_q.weight"))
            out.append((f"{p}ffn_norm.weight", [f"{p}ffn_gate.weight", f"{p}ffn_up.weight"], f"{p}ffn_gate.weight"))
        out.append((_pair(i, "attn_v"), [f"{p}attn_output.weight"], f"{p}attn_output.weight"))
        if not hp.get("ffn_down_rot"):
            out.append((_pair(i, "ffn_up"), [f"{p}ffn_down.weight"], f"{p}ffn_down.weight"))
    return out


def _expand(s: NDArray[np.float64], hp: Mapping[str, Any], key: str) -> NDArray[np.float64]:
    """The per-input-column scale of the consumer: a KV channel's scale repeated for its query heads."""
    if not key.endswith("attn_v>"):
        return s
    nh, nkv, hd = hp["n_head"], hp["n_head_kv"], hp["head_dim"]
    return np.repeat(s.reshape(nkv, 1, hd), nh // nkv, axis=1).reshape(-1)


def _magnitude(g: NDArray[np.float64], rows: int, hp: Mapping[str, Any], key: str) -> NDArray[np.float64]:
    m = np.sqrt(np.maximum(np.diag(g), 0.0) / max(int(rows), 1))
    if key.endswith("attn_v>"):  # per KV channel: the largest of its query heads'
        nh, nkv, hd = hp["n_head"], hp["n_head_kv"], hp["head_dim"]
        m = m.reshape(nkv, nh // nkv, hd).max(axis=1).reshape(-1)
    return m


def scale_of(m: NDArray[np.float64], alpha: float) -> NDArray[np.float64]:
    """AWQ's ``s = m^alpha / sqrt(max * min)`` (channels with m = 0 get the smallest positive m)."""
    pos = m[m > 0]
    base = np.where(m > 0, m, pos.min() if pos.size else 1.0)
    s = base ** float(alpha)
    return s / np.sqrt(s.max() * s.min())


def _error(w64: NDArray[np.float64], s: NDArray[np.float64], g: NDArray[np.float64], gdiag: NDArray[np.float64],
           kind: str, threads: Optional[int]) -> float:
    """:func:`output_error` of the float64 weight ``w64`` and ``gdiag = diag(g)`` (computed once per group)."""
    ws = (w64 * s[None, :]).astype(np.float32)
    im = None if kind == "int8" else np.maximum(gdiag / (s * s), 0.0).astype(np.float32)
    q = quantize(ws, kind, imatrix=im, threads=threads)
    dw = q.dequantize(threads).astype(np.float64)
    dw /= s  # in place: the same values as deq / s - w, one (N, K) temporary fewer
    dw -= w64
    return float(np.einsum("nk,nk->", dw @ g, dw))


def output_error(w: NDArray[Any], s: NDArray[np.float64], g: NDArray[np.float64], kind: str,
                 threads: Optional[int] = None) -> float:
    """``tr(dW G dW^T)`` of ``w`` (N, K) quantized as ``kind`` after scaling its columns by ``s``
    (the module doc's ``err`` for one linear)."""
    return _error(np.asarray(w, np.float64), s, g, np.diag(g), kind, threads)


def search_group(ws: Sequence[NDArray[Any]], kinds: Sequence[str], g: NDArray[np.float64], m: NDArray[np.float64],
                 expand: Callable[[NDArray[np.float64]], NDArray[np.float64]],
                 alphas: Sequence[float] = DEFAULT_ALPHAS, threads: Optional[int] = None
                 ) -> Tuple[float, NDArray[np.float64], Dict[float, float]]:
    """(best alpha, its scales, {alpha: error}) of one group: linears ``ws`` (stored as ``kinds``)
    reading one input with Gram matrix ``g`` and channel magnitudes ``m`` (``expand`` maps a
    scale to the linears' input columns)."""
    errs: Dict[float, float] = {}
    best: Optional[Tuple[float, float]] = None
    w64 = [np.asarray(w, np.float64) for w in ws]  # once per group, not per alpha
    gdiag = np.diag(g)
    for a in alphas:
        s = scale_of(m, a)
        e = sum(_error(w, expand(s), g, gdiag, k, threads) for w, k in zip(w64, kinds))
        errs[float(a)] = e
        if best is None or e < best[1]:
            best = (float(a), e)
    assert best is not None
    return best[0], scale_of(m, best[0]), errs


def awq_scales(src: Any, calib: Union[str, ArrayLike], kinds: Union[str, Mapping[str, str]] = "nf4",
               n_ctx: int = 512, chunks: Optional[int] = 8, alphas: Sequence[float] = DEFAULT_ALPHAS,
               max_bytes: int = 1 << 30, threads: Optional[int] = None, progress: bool = True
               ) -> Tuple[Dict[str, NDArray[np.float64]], Dict[str, Any]]:
    """({scale key: s}, report) of every group of ``src`` (module doc) whose linears are all
    quantized (``kinds``: one kind, or {linear name: kind}; a linear missing from the mapping
    stays float and its group is skipped). The Gram matrices come from ``src`` run in float32 on
    ``chunks`` chunks of ``n_ctx`` tokens of ``calib``: one pass over the text collects as many
    as fit ``max_bytes`` together (:func:`orkpy.quantization.gptq.gram_batches`; every one in one pass when they
    fit); the result does not depend on ``max_bytes``. The report:
    {"alpha": {key: alpha}, "error": {key: {alpha: err}}, "n_ctx", "chunks"}."""
    from .._io import progress_bar
    from .gptq import collect_grams, gram_batches
    from ..runtime.model import float_model

    if not alphas or any(not (0.0 <= float(a) <= 1.0) for a in alphas) or 0.0 not in [float(a) for a in alphas]:
        raise ValueError(f"alphas must be values in [0, 1] including 0 (no scaling), got {list(alphas)!r}")
    hp = src.hp
    def kind_of(n: str) -> Optional[str]:
        return kinds if isinstance(kinds, str) else kinds.get(n)

    todo = [(key, lins, inp) for key, lins, inp in groups(hp) if all(kind_of(n) not in (None, "gguf") for n in lins)]
    m = float_model(src)
    tokens = m.tokens(calib)
    out: Dict[str, NDArray[np.float64]] = {}
    rep: Dict[str, Any] = {"alpha": {}, "error": {}, "n_ctx": int(n_ctx), "chunks": None}
    by_input: Dict[str, List[Tuple[str, List[str], str]]] = {}
    for key, lins, inp in todo:
        by_input.setdefault(inp, []).append((key, lins, inp))
    bar = progress_bar(len(todo), "awq", progress, "group")
    try:
        for run in gram_batches(list(by_input), lambda n: m.linears[n].K, max_bytes):  # one pass each
            n_chunk, it = m.chunks(tokens, n_ctx, chunks)
            rep["chunks"] = n_chunk
            grams = collect_grams(m, it, run, threads)
            for key, lins, inp in (grp for n in run for grp in by_input[n]):
                g, rows = grams[inp]

                def expand(v: NDArray[np.float64], k: str = key) -> NDArray[np.float64]:
                    return _expand(v, hp, k)
                alpha, s, errs = search_group([src.linear(n) for n in lins], [str(kind_of(n)) for n in lins], g,
                                              _magnitude(g, rows, hp, key), expand, alphas, threads)
                out[key] = s
                rep["alpha"][key] = alpha
                rep["error"][key] = errs
                if bar is not None:
                    bar.update(1)
            del grams
    finally:
        if bar is not None:
            bar.close()
    return out, rep


def column_scales(hp: Mapping[str, Any], scales: Mapping[str, NDArray[np.float64]]) -> Dict[str, NDArray[np.float64]]:
    """{linear name: the scale of each of its input columns} of the linears ``scales`` scale up."""
    out = {}
    for key, lins, _ in groups(hp):
        if key in scales:
            for n in lins:
                out[n] = _expand(np.asarray(scales[key], np.float64), hp, key)
    return out


def apply_awq(src: Any, scales: Mapping[str, NDArray[np.float64]], info: Optional[Mapping[str, Any]] = None) -> Any:
    """``src`` with AWQ's scales folded in (:class:`~orkpy.runtime.rotate.TransformedSource`; a rotated
    source keeps its rotation; a smoothed one is refused: both would fold into the same places)."""
    from ..runtime.rotate import TransformedSource

    if isinstance(src, TransformedSource):
        return src.with_scales(scales, {"awq": dict(info or {})})
    return TransformedSource(src, None, None, scales, {"rotate": None, "seed": None, "heads": None, "smooth": None,
                                                       "online": False, "awq": dict(info or {})})


__all__ = ["DEFAULT_ALPHAS", "apply_awq", "awq_scales", "column_scales", "groups", "output_error", "scale_of", "search_group"]
