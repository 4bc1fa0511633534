"""The model one block at a time: calibration activations that flow through one layer after
another, so that a whole recipe (GPTQ's Gram matrices, the static activation ranges, AWQ's
scales) is calibrated with one layer's float32 weights in memory, never the whole model's
(:mod:`orkpy.quantization.layerwise` runs the recipe on it).

:class:`Stream` holds the hidden rows of every calibration chunk (float32 ``(T, n_embd)`` each:
8 x 512 tokens of a 2048-wide model are 32 MB): :func:`embed` makes the rows entering layer 0
from the tokens, reading only their rows of the embedding table. :class:`Block` is one source
layer as a C model of its own (``_core.ForwardModel`` built by
:func:`orkpy.runtime.model._forward_model` with ``blocks=``: that layer's norms, linears and
settings, no embedding table, a one-row zero head of the output norm);
:meth:`Block.run` advances the stream through it (``forward_hidden``, csrc/ork/model.h: the
layer function of the whole forward pass on the same rows, bit for bit) while the C statistics
hooks of its linears collect -- the Gram matrices, the activation statistics, the imatrix sums
exactly as a whole-model pass collects them. :meth:`Block.head_stats` does the same for the
output head's input (the output norm of the final rows), positions as the whole-model
collectors count them: the Gram matrix and the imatrix from the last position of each chunk,
the activation statistics from the second half.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple

import numpy as np
from numpy.typing import NDArray

from .. import _core
from ..formats import arch as _arch
from ..formats.source import Source
from ..formats.tiermap import EMBEDDING, OUTPUT
from .linear import LinearSpec

#: a block's linears, in the C model's order (model.h ork_layer_linear_names)
STEMS: Tuple[str, ...] = tuple(_core.layer_linears())


def layer_linears(layer: int) -> List[str]:
    """The linear names of source layer ``layer``, in the forward pass's order."""
    return [f"blk.{layer}.{t}.weight" for t in STEMS]


def row_blocks(N: int, K: int, block_bytes: int) -> List[slice]:
    """Blocks of rows of an (N, K) weight, each at most ``block_bytes`` in float32 (at least one row)."""
    rows = max(1, min(N, block_bytes // max(1, 4 * K)))
    return [slice(r, min(N, r + rows)) for r in range(0, N, rows)]


def head_blocks(src: Source, block_bytes: int) -> Iterator[Tuple[slice, NDArray[np.float32], Optional[NDArray[Any]]]]:
    """The head a block of vocabulary rows at a time (:func:`row_blocks`): (rows, its float32 weight
    rows, its bias rows or None); the source's mapped pages are released after each block, so a
    vocabulary-sized head is never held whole."""
    N, K = (int(d) for d in src.shapes()[src.tensor_name(OUTPUT)][:2])
    bias = src.tensor("output.bias") if "output" in set(src.hp.get("biases", ())) else None
    for rows in row_blocks(N, K, block_bytes):
        yield rows, src.rows(OUTPUT, rows), (None if bias is None else np.ascontiguousarray(bias[rows]))
        src.release(caches=False)


def embed(src: Source, tokens: NDArray[np.int32]) -> NDArray[np.float32]:
    """The hidden rows entering layer 0 for ``tokens``: their embedding rows (only those read)
    times the architecture's embedding scale, as the C forward pass computes them."""
    ids = np.asarray(tokens, np.int64)
    uniq, inv = np.unique(ids, return_inverse=True)
    x = np.ascontiguousarray(src.rows(EMBEDDING, uniq)[inv], dtype=np.float32)
    scale = float(_arch.core_hparams(src.hp)["embd_scale"])
    if scale > 0.0:
        x *= np.float32(scale)
    return x


class Stream:
    """The hidden rows of every calibration chunk, as they leave the last layer run."""

    def __init__(self, src: Source, chunks: Sequence[NDArray[np.int32]]) -> None:
        self.xs: List[NDArray[np.float32]] = [embed(src, c) for c in chunks]
        self.layer = 0  # the next layer these rows enter

    def copy(self) -> "Stream":
        s = Stream.__new__(Stream)
        s.xs = [x.copy() for x in self.xs]
        s.layer = self.layer
        return s


class Block:
    """Source layer ``layer`` as a C model of its own, its linears ``specs`` ({name: LinearSpec},
    the layer's names as in the source; :func:`layer_linears`)."""

    def __init__(self, src: Source, layer: int, specs: Mapping[str, LinearSpec]) -> None:
        from .model import _forward_model
        self.layer = int(layer)
        self.names = layer_linears(self.layer)
        self.n_layer = int(src.hp["n_layer"])
        self._src, self._specs = src, {n: specs[n] for n in self.names}
        self._fwd = _forward_model(src.hp, src.tensor, self._specs, blocks=[self.layer])

    def swap(self, name: str, spec: LinearSpec) -> LinearSpec:
        """Put ``spec`` in place of linear ``name`` of this layer; the spec it replaces."""
        i = self.names.index(name)
        old = self._specs[name]
        self._fwd.set_linear(i, spec.to_core())
        self._specs[name] = spec
        return old

    def head_logits(self, stream: Stream, w: NDArray[np.float32], bias: Optional[NDArray[Any]] = None,
                    threads: Optional[int] = None) -> List[NDArray[np.float32]]:
        """The logits of the vocabulary rows whose head weight rows are ``w`` (float32 ``(V', n_embd)``,
        ``bias`` theirs) at every position of the stream's final rows (after every layer), one
        ``(T, V')`` array per chunk: the whole model's logits, a block of columns at a time."""
        from .model import _forward_model
        if stream.layer != self.n_layer:
            raise ValueError(f"the stream's rows enter layer {stream.layer}: the head needs them after every layer")
        fwd = _forward_model(self._src.hp, self._src.tensor, self._specs, blocks=[self.layer],
                             head=(np.ascontiguousarray(w, np.float32), bias))
        nthreads = 0 if threads is None else int(threads)
        out = []
        for x in stream.xs:
            z = fwd.forward_hidden(x.copy(), layers=0, logits=True, threads=nthreads)
            assert z is not None
            out.append(z)
        return out

    def run(self, stream: Stream, threads: Optional[int] = None, grams: Sequence[str] = (),
            act_prefix: Optional[int] = None, imatrix: bool = False, advance: bool = True,
            capture: Sequence[str] = ()) -> Dict[str, Any]:
        """Run this layer on the stream's rows (in place with ``advance``, else on copies),
        collecting the Gram matrices of the linears ``grams`` ({name: (G, rows)} under
        ``"grams"``), with ``act_prefix`` not None the activation statistics ({name: stats},
        ``"acts"``) and with ``imatrix`` the squared-input sums ({name: (sums, rows)},
        ``"imatrix"``), as :class:`orkpy.Model`'s collectors give them; the inputs of the linears
        ``capture`` ({name: float32 (rows, K)}, every chunk's rows in order, ``"inputs"``: what
        :func:`input_stats` turns into the activation statistics later)."""
        if stream.layer != self.layer:
            raise ValueError(f"the stream's rows enter layer {stream.layer}, not layer {self.layer}")
        idx = {n: i for i, n in enumerate(self.names)}
        bad = [n for n in list(grams) + list(capture) if n not in idx]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a linear of layer {self.layer}")
        got = self._collect(stream.xs, [idx[n] for n in grams], act_prefix, imatrix, advance, threads, None,
                            [idx[n] for n in capture])
        if advance:
            stream.layer += 1
        return got

    def head_stats(self, stream: Stream, threads: Optional[int] = None, gram: bool = False,
                   act_prefix: Optional[int] = None, imatrix: bool = False) -> Dict[str, Any]:
        """The output head's input statistics from the stream's final rows (after every layer):
        its Gram matrix and imatrix sums over the last position of each chunk, its activation
        statistics over the second half, as the whole-model collectors count them (``"grams"``,
        ``"imatrix"``, ``"acts"``, each {"output.weight": ...})."""
        if stream.layer != self.n_layer:
            raise ValueError(f"the stream's rows enter layer {stream.layer}: the head needs them after every layer")
        out: Dict[str, Any] = {}
        if gram or imatrix:
            out.update(self._collect(stream.xs, [HEAD] if gram else [], None, imatrix, False, threads, "last"))
        if act_prefix is not None:
            out.update(self._collect(stream.xs, [], act_prefix, False, False, threads, "half"))
        return out

    def _collect(self, xs: List[NDArray[np.float32]], gram_idx: List[int], act_prefix: Optional[int], imatrix: bool,
                 advance: bool, threads: Optional[int], head: Optional[str],
                 capture: Sequence[int] = ()) -> Dict[str, Any]:
        """One pass over ``xs`` with the requested hooks on: this layer (``head`` None) or only the
        head from positions ``"last"`` / ``"half"``; the statistics of the part that ran."""
        fwd = self._fwd
        nthreads = 0 if threads is None else int(threads)
        if gram_idx:
            fwd.gram_enable(gram_idx)
        if act_prefix is not None:
            fwd.act_stats_enable(int(act_prefix))
        if imatrix:
            fwd.imatrix_enable()
        if capture:
            fwd.capture_enable(list(capture), sum(int(x.shape[0]) for x in xs))
        try:
            for x in xs:
                T = x.shape[0]
                if head is None:
                    fwd.forward_hidden(x if advance else x.copy(), layers=1, threads=nthreads)
                else:
                    fwd.forward_hidden(x.copy(), layers=0, first=T - 1 if head == "last" else T // 2, logits=True,
                                       threads=nthreads)
        finally:
            g = fwd.gram_take() if gram_idx else None
            a = fwd.act_stats_take() if act_prefix is not None else None
            im = fwd.imatrix_take() if imatrix else None
            cap = fwd.capture_take() if capture else None
        keys = self.names + [OUTPUT]
        sel = range(len(self.names)) if head is None else [HEAD]
        out: Dict[str, Any] = {}
        if g is not None:
            out["grams"] = {keys[i]: (g[i][0], int(g[i][1])) for i in gram_idx}
        if a is not None:
            out["acts"] = {keys[i]: a[i] for i in sel}
        if im is not None:
            out["imatrix"] = {keys[i]: (im[i][0], int(im[i][1])) for i in sel}
        if cap is not None:
            out["inputs"] = {keys[i]: cap[i] for i in capture}
        return out


def input_stats(x: NDArray[np.float32], calls: Sequence[int], prefix: int,
                divisor: Optional[NDArray[Any]] = None) -> Dict[str, Any]:
    """The activation statistics a block pass with ``act_prefix=prefix`` collects of a linear's
    input, from that input's rows captured by :meth:`Block.run` (``calls``: each chunk's row
    count), each value divided by ``divisor`` (per column) first: a scaled input's statistics
    from the unscaled rows (the layer-by-layer AWQ run, :mod:`orkpy.quantization.layerwise`)."""
    return _core.act_stats_rows(x, [int(c) for c in calls], int(prefix),
                                None if divisor is None else np.asarray(divisor, np.float32))


#: the head's linear index in a block's C model (after the layer's linears)
HEAD = len(STEMS)


__all__ = ["Block", "STEMS", "Stream", "embed", "head_blocks", "input_stats", "layer_linears", "row_blocks"]
