"""GPTQ: int8 / NF4 / int4 weights rounded with error compensation (Frantar et al., 2022).

Plain rounding (``quantize(w, "int8")``) makes each weight's error independently; GPTQ quantizes
the input columns one at a time and moves each column's rounding error onto the columns not yet
quantized, weighted by the inverse of the linear's input Gram matrix ``G = sum x^T x`` on
calibration text, so the error of the layer's *output* ``x W^T`` shrinks rather than that of the
weights. The stored format is unchanged: int8 codes in [-127, 127] and the scale of plain
rounding (``absmax / 127``), so a GPTQ tensor packs, saves and runs like any int8 one. The 4-bit
kinds keep their format too: the scale of :func:`orkpy.quantize` with the Gram diagonal as
importance (its imatrix clip search), each column sent to the nearest codebook level (stories260K,
Q4_0 allocation, w4a8 KL: 0.114 RTN + imatrix -> 0.084 GPTQ, ``tests/test_gptq.py``). Per-channel or
group-wise scales (``group_size``; float16, as :func:`orkpy.quantize` stores them).

:func:`gptq_quantize` ``(w, gram, damp=0.01, block=128)``: one weight, in the C core
(csrc/ork/gptq.h, the contract in full; the GIL is released). ``G + damp * mean(diag G) I``
(input channels that never fired, ``G[k, k] = 0``, get 1 first and are rounded plainly) gives the
upper Cholesky factor ``U`` of its inverse, computed in double without LAPACK; column ``k`` is
rounded as :func:`orkpy.quantize` rounds, its error ``e = (w - q s) / U[k, k]`` is subtracted from
the later columns as ``e U[k, j]`` (lazily, ``block`` columns at a time, in the same order as the
eager loop). Every operation has a fixed order, so the bytes never depend on ``block`` nor on
the thread count. A diagonal ``G`` with ``damp=0`` moves nothing: the result is then plain
rounding, byte for byte. ``tests/gptq_ref.py`` is the NumPy reference of the algorithm (the
implementation before the C core: LAPACK + BLAS); on SmolLM2's real Gram matrices both give the
same codes, the C core 3-20x faster on its shapes (``bench/gptq_time.py``; Qwen3-1.7B's 2048 x 6144 ffn_down:
26 s against 40 s, most of it the ``2/3 K^3`` factorization).

:func:`collect_grams` runs a model (float32, every layer per op) over calibration chunks with the
C forward pass accumulating each requested linear's ``G`` (csrc/ork/linear.h, "Input Gram
matrix": the float32 GEMM over blocks of 256 rows, the blocks added in float64; the double
loop it replaced was the largest stage of a calibrated quantization); linears that read the same input (``attn_q/k/v``; ``ffn_gate/up``) share one matrix.
:func:`gptq_linears` does both for every linear of a source: by default the Gram matrices come
from the float model (all in one pass when they fit ``max_bytes``, else a pass per group of
layers; quantize_model runs it layer by layer instead, :mod:`orkpy.quantization.layerwise`, to
the same bytes); ``sequential=True`` calibrates layer by layer, each layer on a pass of the model cut
after it whose earlier layers hold their GPTQ weights, one layer's matrices at a time.

Measured (``bench/act_modes.py --gptq int8``; SmolLM2-135M, Hadamard + online rotation,
calibration TinyStories 8 x 512, scored wikitext 8 x 512, mean KL vs F32): int8 weight-only
0.0038 -> 0.0015, w8a8 per-token 0.0055 -> 0.0033 (llama.cpp Q8_0: 0.0040), static mse with a
1-token prefix 0.0086 -> 0.0064. Sequential calibration (``bench/accuracy.py --gptq-sequential``,
NF4 per channel, Q4_0 allocation, 4 x 512 calibration and scoring): w4a8 0.388 -> 0.371,
weight-only 0.350 -> 0.333, for 3x the time; on stories260K it is worse (NF4 weight-only 0.0995 ->
0.1069), so it is an option, not the default.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._io import progress_bar
from .._mapped import check as check_maps
from .._mapped import maps_of
from ..kernels.quant import KIND_INFO, KINDS, QuantizedTensor, _check_threads, check_group

#: relative damping added to the Gram matrix's diagonal (a share of its mean)
DEFAULT_DAMP = 0.01
#: columns updated at once (memory order only: the result does not depend on it)
DEFAULT_BLOCK = 128
#: GPTQ's arithmetic (csrc/ork/gptq.h "Precision"): the factor and the error feedback in float64
#: (the default) or float32; the Gram matrix is float64 in both
PRECISIONS = ("float64", "float32")
#: linears whose input is another's (the same norm output): they share its Gram matrix
SHARED_INPUT = {"attn_k": "attn_q", "attn_v": "attn_q", "ffn_up": "ffn_gate"}


def gptq_quantize(w: ArrayLike, gram: ArrayLike, kind: str = "int8", damp: float = DEFAULT_DAMP,
                  block: int = DEFAULT_BLOCK, where: str = "weight", rows: int = 0,
                  group_size: Optional[int] = None, static_groups: bool = False,
                  threads: Optional[int] = None, overwrite_gram: bool = False,
                  precision: str = "float64", symmetric: bool = True) -> QuantizedTensor:
    """Quantize a float ``(N, K)`` weight (``kind`` int8, nf4 or int4) with GPTQ's error
    compensation on the input Gram matrix ``gram`` ``(K, K)`` (see module doc; the C core,
    csrc/ork/gptq.h, with the GIL released). ``where`` names the weight in errors. 4-bit kinds,
    int6 and int5: each scale is the one :func:`orkpy.quantize` picks with the importance ``diag(gram) / rows``
    (its imatrix clip search; ``rows`` = the Gram matrix's input rows, 0 = no imatrix, plain
    absmax), then every column goes to the nearest level of the kind's codebook times that
    scale, with the same error feedback as int8. ``group_size``: group-wise scales
    (:func:`orkpy.quantize`'s, float16); each group's scale is chosen when the loop reaches its
    first column, from the columns as the error feedback has left them (``static_groups=True``:
    all chosen up front from ``w``), and each column is rounded with its group's scale.
    ``threads``: worker threads (None = all cores); the result never depends on it, nor on
    ``block``. ``overwrite_gram=True``: a writeable float64 ``gram`` is the C core's workspace
    (its contents destroyed, the result the same): one ``(K, K)`` float64 matrix less in memory,
    for a Gram matrix with no later reader. ``precision`` (:data:`PRECISIONS`): the arithmetic of
    the factor and the error feedback, ``"float64"`` or ``"float32"`` (about twice as fast, half
    the memory; gptq.h "Precision": the Gram matrix stays float64). ``symmetric=False``: affine
    groups (w4a4 / w4a8 with a ``group_size`` below K; :func:`orkpy.quantize`'s ``symmetric``):
    each group's float16 scale and offset are searched when the loop reaches it, and each column
    goes to the nearest of its group's 16 levels ``code * scale + offset``."""
    if precision not in PRECISIONS:
        raise ValueError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if kind not in KINDS:
        raise ValueError(f"{where}: unknown kind {kind!r} (GPTQ runs every kind: {', '.join(KINDS)})")
    if not (isinstance(damp, (int, float)) and not isinstance(damp, bool) and np.isfinite(damp) and damp >= 0):
        raise ValueError(f"{where}: damp must be a finite number >= 0, got {damp!r}")
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"{where}: block must be a positive int, got {block!r}")
    if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
        raise ValueError(f"{where}: rows must be an int >= 0, got {rows!r}")
    nthreads = _check_threads(threads)
    w32 = np.asarray(w, dtype=np.float32)
    if w32.ndim != 2:
        raise ValueError(f"{where}: w must be a 2-D (N, K) array, got shape {w32.shape}")
    N, K = w32.shape
    g = np.asarray(gram, dtype=np.float64)
    if g.shape != (K, K):
        raise ValueError(f"{where}: the Gram matrix must be ({K}, {K}) for a weight with K = {K}, got {g.shape}")
    group = check_group(group_size, K)
    maps = maps_of(w32)  # a view of a mapped file is checked around the read (as quantize does)
    check_maps(maps)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"{where}: symmetric must be a bool, got {type(symmetric).__name__}")
    offsets = None
    try:
        got = _core.gptq(w32, g, kind, float(damp), int(block), int(rows), group, bool(static_groups),
                         nthreads, bool(overwrite_gram), precision, not symmetric)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if symmetric:
        codes, scales = got
    else:
        codes, scales, offsets = got
    check_maps(maps)
    return QuantizedTensor(kind=kind, shape=(int(N), int(K)), codes=codes, scales=scales, lut=KIND_INFO[kind].lut,
                           group=group, offsets=offsets)


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
    one calibration pass (:func:`gptq_linears`, :func:`orkpy.quantization.awq.awq_scales`)."""
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


def _layer_of(name: str) -> int:
    """The block index of a linear (``blk.3.attn_q.weight`` -> 3); -1 for the head."""
    parts = name.split(".")
    return int(parts[1]) if len(parts) == 4 and parts[0] == "blk" else -1


def gptq_linears(src: Any, calib: Union[str, ArrayLike], kind: Union[str, Dict[str, str]] = "int8", n_ctx: int = 512,
                 chunks: Optional[int] = 8, damp: float = DEFAULT_DAMP, block: int = DEFAULT_BLOCK,
                 names: Optional[Sequence[str]] = None, max_bytes: int = 1 << 30, threads: Optional[int] = None,
                 progress: bool = True, group_size: Union[int, None, Dict[str, int]] = None,
                 sequential: bool = False, symmetric: bool = True) -> Dict[str, QuantizedTensor]:
    """{linear name: QuantizedTensor} of every linear of the :class:`~orkpy.formats.source.Source` ``src``
    (or ``names``) quantized by :func:`gptq_quantize`, the Gram matrices collected on ``chunks``
    chunks of ``n_ctx`` tokens of ``calib`` (see module doc). ``kind``: one kind for all, or
    {name: kind}; ``group_size`` likewise (None or 0: per channel). ``sequential=False``: the
    Gram matrices come from ``src`` run in float32, as many at once as fit ``max_bytes`` (one
    pass per run of :func:`gram_batches`). ``sequential=True``: layer by layer, each layer's
    from a pass of the layers before it as already quantized (their GPTQ weights dequantized)
    and the model cut after that layer (the head's from the whole quantized model), one
    layer's matrices in memory at a time. ``symmetric=False``: affine groups
    (:func:`gptq_quantize`)."""
    from ..runtime.model import LinearSpec, Model, float_model, linear_names

    names = list(linear_names(src.hp) if names is None else names)
    m = float_model(src)
    tokens = m.tokens(calib)
    Ks = {n: m.linears[n].K for n in names}
    out: Dict[str, QuantizedTensor] = {}

    def run(model: Any, grp: Sequence[str], it: Iterable[ArrayLike]) -> None:
        grams = collect_grams(model, it, grp, threads)
        for n in grp:
            k = kind if isinstance(kind, str) else kind[n]
            gsz = group_size.get(n) if isinstance(group_size, dict) else group_size
            out[n] = gptq_quantize(src.linear(n), grams[n][0], k, damp, block, where=n, rows=grams[n][1],
                                   group_size=gsz, threads=threads, symmetric=symmetric)
            if bar is not None:
                bar.update(1)
        del grams

    bar = progress_bar(len(names), "gptq", progress, "linear")
    try:
        if not sequential:
            for grp in gram_batches(names, lambda n: Ks[n], max_bytes):
                run(m, grp, m.chunks(tokens, n_ctx, chunks)[1])
            return out
        chunk_list = list(m.chunks(tokens, n_ctx, chunks)[1])
        specs = dict(m.linears)  # float32 now; a layer's GPTQ weights (dequantized) once it is done
        paths = dict(m.paths)
        del m
        cache: Dict[str, NDArray[np.float32]] = {}

        def float_of(name: str) -> NDArray[np.float32]:  # norms, embeddings: read once for every cut model
            if name not in cache:
                cache[name] = src.tensor(name)
            return cache[name]

        n_layer = int(src.hp["n_layer"])
        layers: Dict[int, List[str]] = {}
        for n in names:
            layers.setdefault(_layer_of(n), []).append(n)
        for li in sorted(layers, key=lambda i: n_layer if i < 0 else i):
            hp = dict(src.hp, n_layer=n_layer if li < 0 else li + 1)
            cut = Model(src.path, hp, specs, float_of, src.meta, src.tied, paths)
            for grp in gram_batches(layers[li], lambda n: Ks[n], max_bytes):
                run(cut, grp, chunk_list)
            del cut
            for n in layers[li]:
                specs[n] = LinearSpec.f32(n, out[n].dequantize())
    finally:
        if bar is not None:
            bar.close()
    return out


__all__ = ["DEFAULT_BLOCK", "DEFAULT_DAMP", "PRECISIONS", "SHARED_INPUT", "collect_grams", "gptq_linears", "gptq_quantize",
           "gram_batches"]
