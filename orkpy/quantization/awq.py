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
calibration token. For ``attn_v`` -> ``attn_output`` the KV channel's magnitude is the largest of
its query heads'. Measuring ``err`` at every alpha (``search="grid"``) costs one quantization
(with its clip search) and one ``(N, K) x (K, K)`` product per linear and alpha. The default
search (``search="fast"``, :func:`search_group`) measures it in full at two alphas only:

1. ``alpha = 0`` (``s = 1``, plain rounding) quantized in full: ``err(0)`` and each row's share
   of it (one scale per row: a row rounds the same alone as in the whole matrix);
2. ``sample`` rows of each linear (128) drawn with probability proportional to their error at
   ``alpha = 0`` (:func:`sample_rows`: systematic, deterministic, Horvitz-Thompson weights, so the
   weighted sum over the sample estimates ``err`` over all rows, exactly at ``alpha = 0``), and the
   other alphas scored on those rows alone (float32), found by a ternary search over the grid
   (6 of the 10 alphas beyond 0; it assumes ``err`` unimodal in alpha);
3. the ``verify`` (1) best estimates quantized in full and measured exactly; the alpha of the
   smallest exact ``err``, ``alpha = 0`` among them, is kept: the chosen scaling is never worse
   than plain rounding on the calibration inputs, with either search.

Per linear the fast search quantizes ``N`` rows about 1.8 times and ``sample`` rows 6 times where
the grid quantizes ``N`` rows 11 times, and multiplies as many rows by ``G``. SmolLM2-135M (every
block linear NF4, 4 x 512 calibration tokens of TinyStories, KL on 8 x 512 of wikitext-2,
``bench/awq_search.py``, one BLAS thread): the search (awq_scales less its Gram pass, 44 s of CPU)
68.7 -> 19.4 s of CPU, 1.71 M -> 0.46 M rows quantized, 953 -> 254 G multiply-adds; the summed
exact error +0.1%; mean KL (w4a8) with round to nearest 0.3019 -> 0.3087 (+2.2%; ``verify=3``:
0.3047, +0.9%, 25.9 s), with GPTQ 0.3242 -> 0.3229. On stories260K the KL moves by 1-4% either
way (docs/results/weight-accuracy.md): about what a few groups' alpha changes move it by.
:func:`search_layer` searches one block's groups from that block's Gram matrices and weights
alone (an engine that runs the model layer by layer calls it per layer).

Arithmetic: the scaled weight ``W diag(s)`` computed in float64 and rounded to float32, as the
source computes it, so the codes measured are the codes stored; ``dW`` and its product with ``G``
in float32 (sgemm over ``G``'s upper block triangle: about half the multiply-adds of the full
product, which dominates the search; a relative error near 1e-6, far below what separates two
alphas), a block of :data:`ERROR_ROWS` rows at a time (no copy of a group's weights: an 8B
model's ``ffn_gate`` + ``ffn_up`` in float64 would be 805 MB).

Inside a quantization (``quantize_model(..., awq=True, calib=...)``) the search runs in the
layer-by-layer run itself (:class:`LayerAwq`): each block's scales from the Gram matrices that
run collects for GPTQ anyway, scaled exactly afterwards, so AWQ costs no pass of its own
(SmolLM2-135M, gptq+awq, 8 x 512 calibration, wikitext-2 8 x 512: mean KL 0.2946 / 0.2759 (w4a8 /
weight-only) against 0.3007 / 0.2760 with its own pass; stories260K 0.0513 / 0.0504 against
0.0510 / 0.0504). :func:`awq_scales` below is the standalone search:
the Gram matrices come from the float model run a layer at a time (:mod:`orkpy.runtime.blocks`:
the calibration rows through one layer, then the next), one layer's float32 weights and its
matrices in memory (at most ``max_bytes`` of them per pass over the layer's rows): the same
matrices, hence the same scales, as a whole-model pass (SmolLM2-135M's 120 and stories260K's 20
groups: equal, 2026-12-06), without the model's float32 copy the whole-model pass held.

:func:`awq_scales` ``(src, calib, kinds, ...)`` -> ``(scales, report)``; :func:`apply_awq` returns the
source with the scales folded in (a :class:`~orkpy.runtime.rotate.TransformedSource`; a rotated source
keeps its rotation); ``quantize_model(..., awq=True, calib=...)`` and ``orkpy quantize --awq`` search
inside the layer-by-layer run instead (:class:`LayerAwq`, above).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ..kernels.quant import quantize

#: the alpha grid of the scale search (0: no scaling)
DEFAULT_ALPHAS: Tuple[float, ...] = tuple(round(0.1 * i, 1) for i in range(11))
#: rows of each linear the "fast" search scores its candidates on (a linear with fewer: all of them)
DEFAULT_SAMPLE_ROWS = 128
#: how many of the "fast" search's best estimates (alpha = 0 among them) are quantized in full
DEFAULT_VERIFY = 1
#: rows of a weight whose errors are computed at once (a (rows, K) float64 temporary, float32 ones)
ERROR_ROWS = 1024
#: columns of G converted to float32 at once for the search's products (the upper block triangle:
#: smaller blocks skip more of G's lower half, 512: 56 % of the full product at K = 2048)
GRAM_COLUMNS = 512
#: the scale searches: "fast" (the default, module doc) and "grid" (every alpha quantized in full)
SEARCHES = ("fast", "grid")


def _pair(i: int, producer: str) -> str:
    from ..runtime.rotate import _pair as p
    return p(i, producer)


def groups(hp: Mapping[str, Any]) -> List[Tuple[str, List[str], str]]:
    """[(scale key, the linears scaled by it, the linear whose input it is)] of a model's
    hyper-parameters, in layer order (module doc)."""
    out = []
    for i in range(hp["n_layer"]):
        out.extend(layer_groups(hp, i))
    return out


def layer_groups(hp: Mapping[str, Any], i: int) -> List[Tuple[str, List[str], str]]:
    """The :func:`groups` of block ``i``."""
    p = f"blk.{i}."
    out = []
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


def _dw(w: NDArray[Any], s: NDArray[Any], gdiag: NDArray[np.float64], kind: str,
        threads: Optional[int]) -> NDArray[np.float32]:
    """``deq(Q(w diag(s))) diag(1/s) - w`` in float32, ``w`` quantized as stored (module doc): the
    scaled weight ``w diag(s)`` computed in ``s``'s dtype (float64 for the exact errors: as the
    source scales it; float32 for the estimates) and rounded to float32 before it is quantized."""
    ws = np.multiply(w, s[None, :], dtype=s.dtype).astype(np.float32, copy=False)
    im = None if kind == "int8" else np.maximum(gdiag / (s * s), 0.0).astype(np.float32)
    q = quantize(ws, kind, imatrix=im, threads=threads)
    del ws
    dw = np.asarray(q.dequantize(threads), np.float32)
    dw /= s.astype(np.float32)  # in place: the same values as deq / s - w, one (N, K) temporary fewer
    dw -= w
    return dw


def _row_errors(w: NDArray[Any], s: NDArray[Any], g: NDArray[Any], gdiag: NDArray[np.float64],
                kind: str, threads: Optional[int]) -> NDArray[Any]:
    """Each row's ``dw G dw^T`` (float32): ``dw`` (:func:`_dw`), the product in
    float32 over G's upper block triangle only (``G`` symmetric: a block of :data:`GRAM_COLUMNS`
    columns ``B`` adds ``dw_B G_BB dw_B`` plus twice ``dw_B G_{B,after} dw_after``, about half
    the multiply-adds of the full product), ``w`` a block of :data:`ERROR_ROWS` rows and ``G``
    (float64 or float32) a block of columns at a time (converting a block costs 1 / ERROR_ROWS
    of its product): a few temporaries, no copy of the whole weight or of ``G``. Every kind AWQ
    searches quantizes each row on its own, so a subset of the rows gives the same values as
    the whole."""
    N, K = w.shape
    out = np.zeros(N, np.float32)
    for r in range(0, N, ERROR_ROWS):
        dw = _dw(np.asarray(w[r:r + ERROR_ROWS], np.float32), s, gdiag, kind, threads)
        acc = out[r:r + ERROR_ROWS]
        for c in range(0, K, GRAM_COLUMNS):  # G's columns in float32 a block at a time: no float32 copy of G
            e = min(K, c + GRAM_COLUMNS)
            gb = np.asarray(g[c:, c:e], np.float32)  # the block's rows from its diagonal down
            acc += np.einsum("nk,nk->n", dw[:, c:e] @ gb[:e - c], dw[:, c:e])
            if e < K:
                acc += 2.0 * np.einsum("nk,nk->n", dw[:, e:] @ gb[e - c:], dw[:, c:e])
            del gb
        del dw
    return out


def _error(w64: NDArray[Any], s: NDArray[np.float64], g: NDArray[Any], gdiag: NDArray[np.float64],
           kind: str, threads: Optional[int]) -> float:
    """:func:`output_error` of the weight ``w64`` and ``gdiag = diag(g)`` (once per group)."""
    return float(_row_errors(w64, s, g, gdiag, kind, threads).sum())


def output_error(w: NDArray[Any], s: NDArray[np.float64], g: NDArray[np.float64], kind: str,
                 threads: Optional[int] = None) -> float:
    """``tr(dW G dW^T)`` of ``w`` (N, K) quantized as ``kind`` after scaling its columns by ``s``
    (the module doc's ``err`` for one linear): the weight scaled in float64 as the source scales
    it, ``dW`` and the product with ``G`` in float32 (sgemm; a relative error near 1e-6, far
    below what separates two alphas)."""
    g = np.asarray(g, np.float64)
    return _error(w, np.asarray(s, np.float64), g, np.diag(g), kind, threads)


def sample_rows(err0: ArrayLike, n: int) -> Tuple[NDArray[np.intp], NDArray[np.float64]]:
    """(rows, weights): ``n`` rows of a linear drawn with probability proportional to their error
    at ``alpha = 0`` (``err0``), deterministically (systematic sampling: the rows under ``n``
    evenly spaced points of the cumulative error), with Horvitz-Thompson weights, so that
    ``sum(weights * e[rows])`` estimates ``sum(e)`` of any per-row error ``e`` and is exactly
    ``sum(err0)`` for ``err0`` itself. A row holding at least ``1/n`` of the error (of the rows
    not yet taken) is taken for sure with weight 1. Every row, weight 1, when ``n >= len(err0)``;
    evenly spaced rows when the errors are all 0. Rows with no error at ``alpha = 0`` are never drawn."""
    e = np.asarray(err0, np.float64)
    N = e.size
    if n >= N:
        return np.arange(N), np.ones(N)
    if not (e > 0).any():
        idx = np.unique(np.linspace(0, N - 1, n).round().astype(np.intp))
        return idx, np.full(idx.size, N / idx.size)
    e = np.maximum(e, 0.0)
    sure = np.zeros(N, bool)
    while True:
        k = n - int(sure.sum())
        tot = float(e[~sure].sum())
        new = ~sure & (e * k >= tot) & (e > 0)
        if k <= 0 or tot <= 0 or not new.any():
            break
        sure |= new
    rows, wts = [np.flatnonzero(sure)], [np.ones(int(sure.sum()))]
    k = n - int(sure.sum())
    rest = np.flatnonzero(~sure & (e > 0))
    if k > 0 and rest.size:
        c = np.cumsum(e[rest])
        pick = rest[np.minimum(np.searchsorted(c, (np.arange(k) + 0.5) * (c[-1] / k)), rest.size - 1)]
        pick, cnt = np.unique(pick, return_counts=True)
        rows.append(pick)
        wts.append(cnt * (c[-1] / k) / e[pick])
    idx, wt = np.concatenate(rows), np.concatenate(wts)
    order = np.argsort(idx, kind="stable")
    return idx[order], wt[order]


class GroupSearch(NamedTuple):
    """What :func:`search_group` found for one group."""
    alpha: float                      #: the alpha kept
    scales: NDArray[np.float64]       #: its scales (``scale_of(m, alpha)``)
    errors: Dict[float, float]        #: {alpha: the exact output error} of the alphas quantized in full
    estimates: Dict[float, float]     #: {alpha: its estimated error} of the alphas scored on the sampled rows ("fast")


def _check_search(search: str, sample: int, verify: int) -> None:
    if search not in SEARCHES:
        raise ValueError(f"search must be one of {', '.join(map(repr, SEARCHES))}, got {search!r}")
    for name, v in (("sample", sample), ("verify", verify)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


def _ternary(f: Callable[[int], float], n: int) -> None:
    """Ternary search for the smallest ``f`` over indices ``0 .. n-1`` (``f`` memoizes)."""
    lo, hi = 0, n - 1
    while hi - lo > 2:
        m1, m2 = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        if f(m1) <= f(m2):
            hi = m2
        else:
            lo = m1
    for i in range(lo, hi + 1):
        f(i)


def search_group(ws: Sequence[NDArray[Any]], kinds: Sequence[str], g: NDArray[np.float64], m: NDArray[np.float64],
                 expand: Callable[[NDArray[np.float64]], NDArray[np.float64]],
                 alphas: Sequence[float] = DEFAULT_ALPHAS, threads: Optional[int] = None, search: str = "fast",
                 sample: int = DEFAULT_SAMPLE_ROWS, verify: int = DEFAULT_VERIFY) -> GroupSearch:
    """The scale search (module doc) of one group: linears ``ws`` (stored as ``kinds``) reading one
    input with Gram matrix ``g`` and channel magnitudes ``m`` (``expand`` maps a scale to the
    linears' input columns). ``search="grid"``: every alpha quantized in full and the exact
    error's minimum kept; ``"fast"``: the candidates scored on ``sample`` rows per linear, only
    ``alpha = 0`` and the ``verify`` best estimates quantized in full."""
    _check_search(search, sample, verify)
    w64 = list(ws)  # each read a block of rows at a time (_row_errors)
    gdiag = np.diag(g)
    if search == "grid":
        errs: Dict[float, float] = {}
        best: Optional[Tuple[float, float]] = None
        for a in alphas:
            s = scale_of(m, a)
            e = sum(_error(w, expand(s), g, gdiag, k, threads) for w, k in zip(w64, kinds))
            errs[float(a)] = e
            if best is None or e < best[1]:
                best = (float(a), e)
        assert best is not None
        return GroupSearch(best[0], scale_of(m, best[0]), errs, {})
    grid = sorted({float(a) for a in alphas})
    if grid[0] != 0.0:
        raise ValueError(f"alphas must include 0 (no scaling), got {list(alphas)!r}")
    s0 = expand(scale_of(m, 0.0))
    err0 = [_row_errors(w, s0, g, gdiag, k, threads) for w, k in zip(w64, kinds)]  # alpha 0 in full
    errs = {0.0: float(sum(float(e.sum()) for e in err0))}
    picks = [sample_rows(e, int(sample)) for e in err0]
    sub = [np.asarray(w[idx], np.float32) for w, (idx, _) in zip(w64, picks)]  # estimates in float32
    est: Dict[int, float] = {0: errs[0.0]}  # sum(weights * err0[rows]) is exactly the error at alpha 0

    def f(i: int) -> float:
        if i not in est:
            s = expand(scale_of(m, grid[i])).astype(np.float32)
            est[i] = float(sum(float((_row_errors(w, s, g, gdiag, k, threads) * wt).sum())
                               for w, k, (_, wt) in zip(sub, kinds, picks)))
        return est[i]
    _ternary(f, len(grid))
    for b in sorted(est, key=lambda i: (est[i], i))[:verify]:  # the best estimates quantized in full
        if b:
            s = expand(scale_of(m, grid[b]))
            errs[grid[b]] = float(sum(_error(w, s, g, gdiag, k, threads) for w, k in zip(w64, kinds)))
    a = min(errs, key=lambda x: (errs[x], x))  # never worse than alpha = 0 on the exact error
    return GroupSearch(a, scale_of(m, a), errs, {grid[i]: v for i, v in sorted(est.items())})


def search_layer(weights: Mapping[str, NDArray[Any]], grams: Mapping[str, Tuple[NDArray[np.float64], int]],
                 kinds: Union[str, Mapping[str, str]], hp: Mapping[str, Any], layer: int,
                 alphas: Sequence[float] = DEFAULT_ALPHAS, threads: Optional[int] = None, search: str = "fast",
                 sample: int = DEFAULT_SAMPLE_ROWS, verify: int = DEFAULT_VERIFY,
                 report: Optional[Dict[str, Any]] = None) -> Dict[str, NDArray[np.float64]]:
    """{scale key: s} of the groups of block ``layer`` (:func:`layer_groups`) whose linears all have
    a kind in ``kinds`` (one kind, or {linear name: kind}; None or "gguf": stays as stored, the
    group is skipped) and whose input's Gram matrix is in ``grams`` ({linear name: (G, rows)},
    :func:`orkpy.quantization.gptq.collect_grams`; any one linear of the group names its input):
    the search of one layer from that layer's inputs alone, for an engine that runs the model
    layer by layer. ``weights``: {linear name: (N, K) float weight} of those groups' linears.
    ``report`` (a dict): filled with {"alpha": {key: alpha}, "error": {key: {alpha: exact error}},
    "estimate": {key: {alpha: estimate}}}."""
    if not alphas or any(not (0.0 <= float(a) <= 1.0) for a in alphas) or 0.0 not in [float(a) for a in alphas]:
        raise ValueError(f"alphas must be values in [0, 1] including 0 (no scaling), got {list(alphas)!r}")

    def kind_of(n: str) -> Optional[str]:
        return kinds if isinstance(kinds, str) else kinds.get(n)
    out: Dict[str, NDArray[np.float64]] = {}
    for key, lins, inp in layer_groups(hp, int(layer)):
        if any(kind_of(n) in (None, "gguf") for n in lins):
            continue
        gram = next((grams[n] for n in [inp] + lins if n in grams), None)
        if gram is None:
            continue
        g, rows = gram

        def expand(v: NDArray[np.float64], k: str = key) -> NDArray[np.float64]:
            return _expand(v, hp, k)
        r = search_group([weights[n] for n in lins], [str(kind_of(n)) for n in lins], g, _magnitude(g, rows, hp, key),
                         expand, alphas, threads, search, sample, verify)
        out[key] = r.scales
        if report is not None:
            report.setdefault("alpha", {})[key] = r.alpha
            report.setdefault("error", {})[key] = r.errors
            report.setdefault("estimate", {})[key] = r.estimates
    return out


def awq_scales(src: Any, calib: Union[str, ArrayLike], kinds: Union[str, Mapping[str, str]] = "nf4",
               n_ctx: int = 512, chunks: Optional[int] = 8, alphas: Sequence[float] = DEFAULT_ALPHAS,
               max_bytes: int = 1 << 30, threads: Optional[int] = None, progress: bool = True,
               search: str = "fast", sample: int = DEFAULT_SAMPLE_ROWS, verify: int = DEFAULT_VERIFY
               ) -> Tuple[Dict[str, NDArray[np.float64]], Dict[str, Any]]:
    """({scale key: s}, report) of every group of ``src`` (module doc) whose linears are all
    quantized (``kinds``: one kind, or {linear name: kind}; a linear missing from the mapping
    stays float and its group is skipped). The Gram matrices come from ``src`` run in float32 on
    ``chunks`` chunks of ``n_ctx`` tokens of ``calib``, layer by layer (:mod:`orkpy.runtime.blocks`:
    one layer's float32 weights in memory, the same matrices as a whole-model pass), a pass over
    the layer's rows per run of inputs whose matrices fit ``max_bytes`` together
    (:func:`orkpy.quantization.gptq.gram_batches`); the result does not depend on ``max_bytes``. Each layer's groups are searched by
    :func:`search_layer` (``search``, ``sample``, ``verify``: :func:`search_group`). The report:
    {"alpha": {key: alpha}, "error": {key: {alpha: exact err}}, "estimate": {key: {alpha: estimate}},
    "search", "sample", "verify", "n_ctx", "chunks"}."""
    from .._io import progress_bar
    from ..runtime.blocks import Block, Stream
    from .gptq import _layer_of, gram_batches
    from ..runtime.model import calib_chunks

    if not alphas or any(not (0.0 <= float(a) <= 1.0) for a in alphas) or 0.0 not in [float(a) for a in alphas]:
        raise ValueError(f"alphas must be values in [0, 1] including 0 (no scaling), got {list(alphas)!r}")
    _check_search(search, sample, verify)
    hp = src.hp
    def kind_of(n: str) -> Optional[str]:
        return kinds if isinstance(kinds, str) else kinds.get(n)

    todo = [(key, lins, inp) for key, lins, inp in groups(hp) if all(kind_of(n) not in (None, "gguf") for n in lins)]
    chunk_list, _ = calib_chunks(src, calib, n_ctx, chunks)
    out: Dict[str, NDArray[np.float64]] = {}
    rep: Dict[str, Any] = {"alpha": {}, "error": {}, "estimate": {}, "search": search, "sample": int(sample),
                           "verify": int(verify), "n_ctx": int(n_ctx), "chunks": len(chunk_list)}
    by_input: Dict[str, List[Tuple[str, List[str], str]]] = {}
    for key, lins, inp in todo:
        by_input.setdefault(inp, []).append((key, lins, inp))
    stream = Stream(src, chunk_list)  # the float rows, a layer at a time (orkpy.runtime.blocks)
    bar = progress_bar(len(todo), "awq", progress, "group")
    try:
        for layer in range(int(hp["n_layer"])):
            inputs = [n for n in by_input if _layer_of(n) == layer]
            if not inputs:
                if layer < int(hp["n_layer"]) - 1 and any(_layer_of(n) > layer for n in by_input):
                    Block(src, layer, _float_specs(src, layer)).run(stream, threads)
                continue
            specs = _float_specs(src, layer)
            blk = Block(src, layer, specs)
            ks = {n: specs[n].K for n in inputs}
            runs = gram_batches(inputs, ks.__getitem__, max_bytes)
            for ri, run in enumerate(runs):  # one pass each; the last one moves the rows on
                grams = blk.run(stream, threads, grams=run, advance=ri == len(runs) - 1)["grams"]
                lins = [n for inp in run for _, ls, _ in by_input[inp] for n in ls]
                out.update(search_layer({n: specs[n].weight for n in lins}, grams, kinds, hp, layer, alphas, threads,
                                        search, sample, verify, rep))
                if bar is not None:
                    bar.update(sum(len(by_input[n]) for n in run))
                del grams
            del blk, specs  # this layer's float copies go before the next one's are read
            src.release()
    finally:
        if bar is not None:
            bar.close()
    return out, rep


class LayerAwq:
    """AWQ inside the layer-by-layer run (:class:`orkpy.quantization.layerwise.LayerwiseRun`):
    for each block, :meth:`search` takes the Gram matrices of that block's inputs -- collected
    by the run's own pass over the rows, the scales of the blocks before already folded in -- and
    searches the block's groups (:func:`search_layer`); :meth:`source` is ``base`` with every
    scale found so far folded in (:func:`apply_awq`), from which the run reads the block's
    scaled weights; :meth:`scale_grams` turns the block's input Gram matrices into those of the
    scaled inputs exactly (``x / s``: ``diag(1/s) G diag(1/s)``), so GPTQ needs no second
    pass for them. The model's float function is unchanged by every scale, so the rows flowing
    to the next block are the same function of the text as without AWQ. ``kinds``: {linear:
    kind} of the packed linears (a group with a float linear is skipped)."""

    def __init__(self, base: Any, kinds: Mapping[str, str], n_ctx: int, chunks: int,
                 alphas: Sequence[float] = DEFAULT_ALPHAS, search: str = "fast", sample: int = DEFAULT_SAMPLE_ROWS,
                 verify: int = DEFAULT_VERIFY) -> None:
        _check_search(search, sample, verify)
        self.base, self.hp = base, base.hp
        self.kinds = {n: k for n, k in kinds.items() if k not in (None, "gguf")}
        self.alphas, self.search_kind, self.sample, self.verify = tuple(alphas), search, int(sample), int(verify)
        self.n_ctx, self.chunks = int(n_ctx), int(chunks)
        self.scales: Dict[str, NDArray[np.float64]] = {}
        self.report: Dict[str, Any] = {"alpha": {}, "error": {}, "estimate": {}}

    def groups(self, layer: int) -> List[Tuple[str, List[str], str]]:
        """The groups of block ``layer`` searched (every linear packed)."""
        return [(k, lins, inp) for k, lins, inp in layer_groups(self.hp, int(layer))
                if all(n in self.kinds for n in lins)]

    def inputs(self, layer: int) -> List[str]:
        """The linears (in forward order) whose input Gram matrices block ``layer``'s search reads."""
        return [inp for _, _, inp in self.groups(layer)]

    def search(self, layer: int, weights: Mapping[str, NDArray[Any]],
               grams: Mapping[str, Tuple[NDArray[np.float64], int]], threads: Optional[int]) -> None:
        """Search the groups of block ``layer`` whose input is in ``grams`` (unscaled inputs and
        ``weights``) and keep their scales."""
        self.scales.update(search_layer(weights, grams, self.kinds, self.hp, layer, self.alphas, threads,
                                        self.search_kind, self.sample, self.verify, self.report))

    def scale_grams(self, layer: int, grams: Dict[str, Tuple[NDArray[np.float64], int]]) -> None:
        """Block ``layer``'s Gram matrices (unscaled inputs) made those of the scaled inputs, in place."""
        for key, lins, inp in self.groups(layer):
            if key in self.scales and inp in grams:
                s = _expand(np.asarray(self.scales[key], np.float64), self.hp, key)
                g = grams[inp][0]
                g /= s[:, None]
                g /= s[None, :]

    def info(self) -> Dict[str, Any]:
        """What a model directory's manifest records of the search."""
        return {"n_ctx": self.n_ctx, "chunks": self.chunks, "alpha": dict(self.report["alpha"])}

    def source(self) -> Any:
        """``base`` with the scales found so far folded in."""
        return apply_awq(self.base, self.scales, self.info())

    def columns(self, layer: int) -> Dict[str, NDArray[np.float64]]:
        """{linear: its input columns' scales} of block ``layer``'s scaled linears (an imatrix's columns divide by them)."""
        return {n: v for n, v in column_scales(self.hp, {k: self.scales[k] for k, _, _ in self.groups(layer)
                                                         if k in self.scales}).items()}

    def summary(self) -> str:
        """The log line of the whole search."""
        al = self.report["alpha"]
        return (f"awq: scales of {len(self.scales)} groups folded in (alpha per group: "
                + ", ".join(f"{a:g}: {sum(1 for v in al.values() if v == a)}" for a in sorted(set(al.values()))) + ")")


def _float_specs(src: Any, layer: int) -> Dict[str, Any]:
    """{name: float32 LinearSpec} of block ``layer``'s linears (one layer's weights in memory)."""
    from ..runtime.blocks import layer_linears
    from ..runtime.linear import LinearSpec
    return {n: LinearSpec.f32(n, src.linear(n)) for n in layer_linears(layer)}


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


__all__ = ["DEFAULT_ALPHAS", "DEFAULT_SAMPLE_ROWS", "DEFAULT_VERIFY", "GroupSearch", "LayerAwq", "SEARCHES", "apply_awq", "awq_scales", "column_scales",
           "groups", "layer_groups", "output_error", "sample_rows", "scale_of", "search_group", "search_layer"]
