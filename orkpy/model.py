"""Models: a Llama / Qwen3 forward pass in C with a weight path per linear tensor.

``load_model(path, weights="gguf")`` reads a GGUF file (architectures
``llama`` and ``qwen3``), a Hugging Face safetensors checkpoint (with
``meta=``, a GGUF of the same model for the hyper-parameters and the
tokenizer; see :mod:`orkpy.source`) or a quantized model directory.
``weights`` says which path each linear layer runs on -- one way, three
spellings:

- a path name for every linear tensor: ``"fp32"``, ``"gguf"``, ``"int8"``,
  ``"nf4"`` or ``"int4"``;
- a dict ``{tensor name: path}`` (``"default"`` sets the rest; without it the
  rest is ``"gguf"``);
- a :class:`~orkpy.TierMap`: int8 tier -> ``"int8"``, int4 tier -> ``int4_kind``
  (``"nf4"`` by default), float tier -> ``"gguf"`` (:func:`tier_path`; the
  linear stays float, as it does in ``quantize_model``). The map must fit the
  file: an entry for a tensor the file lacks or with another shape, or a
  linear tensor with no entry, is a ValueError naming it.

Paths: ``fp32`` and ``gguf`` both multiply in float32 with the tensor's
float values (for F32/F16/BF16 files the source values; for quantized files
the values dequantized from the file's own type, i.e. "the GGUF's native
precision"; orkpy does not emulate llama.cpp's activation quantization).
``int8`` / ``nf4`` / ``int4`` quantize those float values with
:func:`orkpy.quantize` (per-channel absmax) and run the packed int8 kernels
(w8a8 / i4a8, int8 activations per token).

The linear tensors (:func:`linear_names`, in the forward pass's order) are
``attn_q, attn_k, attn_v, attn_output, ffn_gate, ffn_up, ffn_down`` of every
block and the head ``output.weight`` (a tied model's head is
``token_embd.weight``; its path is still set under the name
``output.weight``). The embedding lookup and the norms are always float32.

The seam to the C forward pass (``_core.ForwardModel``) is this module: each
linear is a :class:`LinearSpec` (its one conversion to the C argument is
:meth:`LinearSpec.to_core`), the names of :func:`linear_names` index every
per-linear result and setting, and :class:`Model`'s public methods are what
calibration (:meth:`Model.collect_activation_stats`), the FFN chain
(:meth:`Model.collect_ffn_stats`, :meth:`Model.set_ffn`) and the NPU
(:meth:`Model.route_linears`) use.

Memory: F32 tensors are used in place from the memory-mapped file; other
types are dequantized to float32 once (4 bytes per weight) and packed paths
add their packed copy (1 or 0.5 byte per weight) while the float copy of a
packed tensor is dropped. For a 1.7B-parameter model on the "gguf" path of
an F16 file that is about 4 x 1.7e9 = 6.8 GB of float32 weights plus the
mapped 3.4 GB file (pages of which the OS can drop); on all-int8 paths about
1.7 GB of packed weights plus the 0.6 GB float32 embedding table.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType
from typing import (TYPE_CHECKING, Any, Callable, Collection, Dict, Iterable, Iterator, List, Mapping, Optional,
                    Protocol, Sequence, Tuple, Union)

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core
from ._core import FormatError
from ._typing import StrPath
from .gguf import GGUFFile
from .modeldir import read_model_dir
from .packed import PackedWeight, pack
from .quant import FOUR_BIT_KINDS, KINDS, quantize
from .source import GGUFSource, is_safetensors, open_source
from .tiermap import EMBEDDING, OUTPUT, TierMap

if TYPE_CHECKING:
    from .npu import Device
    from .tokenizer import Tokenizer

#: The ``weights`` argument: one path name, {tensor name: path} or a TierMap.
Weights = Union[str, Dict[str, str], TierMap]

PATHS = ("fp32", "gguf") + KINDS  # float32 paths, then one per quantization kind (the C registry)
ACT_MODES = ("per_token", "per_tensor")
LINEARS: Tuple[str, ...] = _core.layer_linears()  # a block's linears, in the C forward model's order and keys


def linear_names(hp: Mapping[str, Any]) -> List[str]:
    """Every linear layer's name, in the forward pass's order (the order of the C model's
    per-linear results and settings): block by block ``attn_q, attn_k, attn_v, attn_output,
    ffn_gate, ffn_up, ffn_down``, then the head ``output.weight`` -- named so for a tied model
    too, whose head weight is ``token_embd.weight``."""
    return _core.linear_names({"n_layer": int(hp["n_layer"])})


def tier_path(tier: str, int4_kind: str = "nf4") -> str:
    """The weight path of a tier: ``int8`` -> ``"int8"``, ``int4`` -> ``int4_kind``, ``float`` ->
    ``"gguf"`` (the source's float values). One meaning for ``load_model`` and ``quantize_model``."""
    return {"int8": "int8", "int4": int4_kind, "float": "gguf"}[tier]


def resolve_paths(weights: Weights, names: Sequence[str], int4_kind: str = "nf4") -> Dict[str, str]:
    """{linear tensor name: path} from the ``weights`` argument (see module doc)."""
    if int4_kind not in FOUR_BIT_KINDS:
        raise ValueError(f"int4_kind must be one of {', '.join(FOUR_BIT_KINDS)}, got {int4_kind!r}")
    if isinstance(weights, str):
        if weights not in PATHS:
            raise ValueError(f"unknown weight path {weights!r} (expected one of {', '.join(PATHS)})")
        return {n: weights for n in names}
    if isinstance(weights, TierMap):
        return {n: tier_path(weights.linear_tier(n), int4_kind) for n in names}
    if isinstance(weights, dict):
        default = weights.get("default", "gguf")
        unknown = set(weights) - set(names) - {"default"}
        if unknown:
            raise ValueError(f"weights names tensors that are not linear layers of this model: {sorted(unknown)[:5]}")
        out = {n: weights.get(n, default) for n in names}
        bad = {p for p in out.values() if p not in PATHS}
        if bad:
            raise ValueError(f"unknown weight path(s) {sorted(bad)} (expected one of {', '.join(PATHS)})")
        return out
    raise TypeError(f"weights must be a path name, a dict or a TierMap, got {type(weights).__name__}")


@dataclass(frozen=True, eq=False)
class LinearSpec:
    """How one linear layer runs in the forward pass: ``path`` ``"f32"`` (``weight``, float32
    ``(N, K)``) or ``"packed"`` (``kind``, the tile ``store``, ``bscale`` float32 ``(N,)``, and
    ``per_tensor_act``: one activation scale per input instead of per token; pack.h's layout)."""

    name: str
    path: str
    N: int
    K: int
    weight: Optional[NDArray[np.float32]] = None
    kind: Optional[str] = None
    store: Optional[NDArray[Any]] = None
    bscale: Optional[NDArray[np.float32]] = None
    per_tensor_act: bool = False

    @classmethod
    def f32(cls, name: str, w: ArrayLike) -> LinearSpec:
        """A float32 linear (C-contiguous float32 copy of ``w`` only when needed)."""
        a = np.ascontiguousarray(w, dtype=np.float32)
        return cls(name, "f32", int(a.shape[0]), int(a.shape[1]), weight=a)

    @classmethod
    def from_packed(cls, name: str, pw: PackedWeight, per_tensor_act: bool = False) -> LinearSpec:
        """A packed linear running ``pw``."""
        return cls(name, "packed", pw.N, pw.K, kind=pw.kind, store=pw.store, bscale=pw.bscale,
                   per_tensor_act=bool(per_tensor_act))

    def to_core(self) -> Tuple[Any, ...]:
        """The argument ``_core.ForwardModel`` takes for this linear (the only place that knows it)."""
        if self.path == "f32":
            return ("f32", self.weight)
        if self.path == "packed":
            return ("packed", self.kind, self.store, self.bscale, self.N, self.K, self.per_tensor_act)
        raise ValueError(f"{self.name}: unknown linear path {self.path!r} (expected 'f32' or 'packed')")

    def packed_weight(self) -> PackedWeight:
        """The PackedWeight of a packed linear (for an NPU upload); ValueError for a float one."""
        if self.path != "packed" or self.kind is None or self.store is None or self.bscale is None:
            raise ValueError(f"{self.name} is a float linear, not a packed one")
        return PackedWeight(self.kind, (self.N, self.K), self.store, self.bscale)


def _linear_spec(name: str, w: NDArray[Any], path: str, threads: Optional[int],
                 per_tensor_act: bool = False) -> LinearSpec:
    if path in ("fp32", "gguf"):
        return LinearSpec.f32(name, w)
    return LinearSpec.from_packed(name, pack(quantize(w, path, threads=threads)), per_tensor_act)


def _forward_model(hp: Mapping[str, Any], float_of: Callable[[str], NDArray[Any]],
                   linears: Mapping[str, LinearSpec]) -> _core.ForwardModel:
    """The C model from the hyper-parameters, float_of(name) -> float tensor (embeddings,
    norms) and a spec for every name of :func:`linear_names`."""
    emb = float_of(EMBEDDING)
    layers = []
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        L: Dict[str, Any] = {"attn_norm": float_of(p + "attn_norm.weight"), "ffn_norm": float_of(p + "ffn_norm.weight")}
        if hp["arch"] == "qwen3":
            L["q_norm"] = float_of(p + "attn_q_norm.weight")
            L["k_norm"] = float_of(p + "attn_k_norm.weight")
        for t in LINEARS:
            L[t] = linears[f"{p}{t}.weight"].to_core()
        layers.append(L)
    return _core.ForwardModel({k: v for k, v in hp.items() if k not in ("arch", "n_ctx_train")}, emb,
                              float_of("output_norm.weight"), linears[OUTPUT].to_core(), layers)


class Model:
    """A loaded model: ``forward(tokens, first=0)`` -> float32 logits for
    positions ``first..T-1``; ``hparams``, ``paths`` (tensor -> weight path),
    ``linears`` (tensor -> :class:`LinearSpec`), ``config`` (a JSON-able
    description), ``tokenizer`` (from the GGUF)."""

    #: the parsed manifest.json of a model loaded from a QuantizedModel directory
    manifest: Dict[str, Any]

    def __init__(self, path: str, hparams: Dict[str, Any], linears: Mapping[str, LinearSpec],
                 float_of: Callable[[str], NDArray[Any]], meta: GGUFFile, tied: bool, paths: Dict[str, str]) -> None:
        self.path = path
        self.hparams = hparams
        self.paths = paths
        self.tied = tied
        self._linears = {n: linears[n] for n in linear_names(hparams)}
        self._fwd = _forward_model(hparams, float_of, self._linears)
        self._gguf = meta
        self._npu: Optional[Device] = None
        self._tokenizer: Optional[Tokenizer] = None

    @property
    def n_vocab(self) -> int:
        return int(self.hparams["n_vocab"])

    @property
    def tokenizer(self) -> Tokenizer:
        if self._tokenizer is None:
            from .tokenizer import Tokenizer
            self._tokenizer = Tokenizer.from_gguf(self._gguf)
        return self._tokenizer

    @property
    def config(self) -> Dict[str, Any]:
        counts: Dict[str, int] = {}
        for p in self.paths.values():
            counts[p] = counts.get(p, 0) + 1
        return {"model": os.path.basename(self.path), "arch": self.hparams["arch"], "weight_paths": counts,
                "tied_output": self.tied}

    @property
    def linears(self) -> Mapping[str, LinearSpec]:
        """{linear name: spec} in the forward pass's order (read-only)."""
        return MappingProxyType(self._linears)

    def linear_names(self) -> List[str]:
        """The linear layers' names in the forward pass's order (:func:`linear_names`)."""
        return list(self._linears)

    def forward(self, tokens: ArrayLike, first: int = 0, threads: Optional[int] = None) -> NDArray[np.float32]:
        return self._fwd.forward(np.asarray(tokens), int(first), 0 if threads is None else int(threads))

    # ------------------------------------------------------------ texts --
    def tokens(self, text_or_tokens: Union[str, ArrayLike], add_bos: Optional[bool] = None) -> NDArray[np.int32]:
        """int32 token ids: a str is tokenized with the model's own tokenizer (BOS as
        the vocabulary says, or as add_bos says); an int array is used as given."""
        if isinstance(text_or_tokens, str):
            special = self.tokenizer.add_bos if add_bos is None else bool(add_bos)
            return np.asarray(self.tokenizer.encode(text_or_tokens, add_special=special), dtype=np.int32)
        t = np.asarray(text_or_tokens)
        if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
            raise TypeError("text_or_tokens must be a str or a 1-D integer array of token ids")
        if t.size and (t.min() < 0 or t.max() >= self.n_vocab):
            bad = int(np.flatnonzero((t < 0) | (t >= self.n_vocab))[0])
            raise ValueError(f"token id {int(t[bad])} at index {bad} is outside the vocabulary ({self.n_vocab})")
        return t.astype(np.int32)

    def chunks(self, tokens: Union[Sequence[int], NDArray[Any]], n_ctx: int, chunks: Optional[int] = None,
               add_bos: Optional[bool] = None) -> Tuple[int, Iterator[NDArray[np.int32]]]:
        """(count, iterator) over the non-overlapping ``n_ctx``-token chunks of ``tokens``
        (at most ``chunks``), the first token of each replaced by BOS when ``add_bos``
        (default: when the vocabulary adds one) -- llama.cpp's convention for perplexity and
        imatrix runs, the one chunking of both. Every token of a chunk is used."""
        if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 2:
            raise ValueError(f"n_ctx must be an int >= 2, got {n_ctx!r}")
        n_chunk = len(tokens) // n_ctx
        if chunks is not None:
            if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
                raise ValueError(f"chunks must be a positive int, got {chunks!r}")
            n_chunk = min(n_chunk, chunks)
        if n_chunk < 1:
            raise ValueError(f"need at least n_ctx = {n_ctx} tokens, got {len(tokens)}")
        use_bos = self.tokenizer.add_bos if add_bos is None else bool(add_bos)
        bos = self.tokenizer.bos_id if use_bos else None

        def it() -> Iterator[NDArray[np.int32]]:
            for c in range(n_chunk):
                chunk = np.array(tokens[c * n_ctx:(c + 1) * n_ctx], dtype=np.int32)
                if bos is not None:
                    chunk[0] = bos
                yield chunk
        return n_chunk, it()

    # ---------------------------------------------- calibration, FFN, NPU --
    def collect_activation_stats(self, chunks: Iterable[ArrayLike],
                                 threads: Optional[int] = None) -> Dict[str, Tuple[NDArray[np.float64], int]]:
        """{linear name: (sum of squared inputs per input channel, float64 (K,), rows)} over
        ``chunks`` (each run as one forward pass, every position counted), accumulated inside
        the C forward pass: llama.cpp's imatrix ``in_sum2`` / ``counts``."""
        self._fwd.imatrix_enable()
        try:
            self._run_chunks(chunks, threads)
        finally:
            stats = self._fwd.imatrix_take()
        return {name: (sums, int(count)) for name, (sums, count) in zip(self._linears, stats)}

    def collect_ffn_stats(self, chunks: Iterable[ArrayLike], threads: Optional[int] = None) -> List[Dict[str, Any]]:
        """Per-layer statistics of the FFN (gmax = max|gate|, max|silu|, max|up|, ... and a
        |silu| histogram; csrc/ork/ffn_chain.h) over ``chunks``. The FFN chain is turned off on
        every layer first: the statistics describe the per-op model."""
        for i in range(self.hparams["n_layer"]):
            self._fwd.set_ffn(i, None)
        self._fwd.ffn_stats_enable()
        try:
            self._run_chunks(chunks, threads)
        finally:
            stats = self._fwd.ffn_stats_take()
        return stats

    def _run_chunks(self, chunks: Iterable[ArrayLike], threads: Optional[int]) -> None:
        """One forward pass per chunk, for what it accumulates (logits of the last position only)."""
        nthreads = 0 if threads is None else int(threads)
        for chunk in chunks:
            c = np.asarray(chunk)
            self._fwd.forward(c, len(c) - 1, nthreads)

    def set_ffn(self, layer: int, params: Optional[Mapping[str, Any]]) -> None:
        """Run layer ``layer``'s FFN on the NPU's fused int8 SwiGLU chain with ``params``
        (:func:`orkpy.ffn.layer_params`), or with None on the per-op path. The layer's
        gate / up / down linears must be packed."""
        self._fwd.set_ffn(int(layer), params)

    def route_linears(self, device: Optional[Device], kinds: Optional[Collection[str]] = None) -> int:
        """Run the int8 matmuls of the packed linears (of ``kinds``; default every packed
        kind) on ``device``, their int8 values uploaded once; ``None`` routes every linear
        back to the CPU. Returns the number of linears routed."""
        routed = 0
        for i, (name, spec) in enumerate(self._linears.items()):
            if device is None or spec.path != "packed" or (kinds is not None and spec.kind not in kinds):
                self._fwd.set_npu(i, None)
                continue
            self._fwd.set_npu(i, device.upload(spec.packed_weight()))
            routed += 1
        self._npu = device
        return routed

    def __repr__(self) -> str:
        return f"Model({os.path.basename(self.path)!r}, arch={self.hparams['arch']!r}, paths={self.config['weight_paths']})"


class ToModel(Protocol):
    """What runs as a model besides a :class:`Model`: an object with ``to_model()``
    (e.g. :class:`~orkpy.QuantizedModel`)."""

    def to_model(self, act: str = ...) -> Model: ...


def as_model(model: Union[Model, ToModel]) -> Model:
    """``model`` itself, or ``model.to_model()`` (a QuantizedModel); TypeError otherwise."""
    if isinstance(model, Model):
        return model
    to_model = getattr(model, "to_model", None)
    if not callable(to_model):
        raise TypeError(f"expected an orkpy.Model or QuantizedModel, got {type(model).__name__}")
    m = to_model()
    if not isinstance(m, Model):
        raise TypeError(f"{type(model).__name__}.to_model() returned {type(m).__name__}, not an orkpy.Model")
    return m


def load_model(path: StrPath, weights: Weights = "gguf", int4_kind: str = "nf4", act: str = "per_token",
               threads: Optional[int] = None, meta: Union[GGUFFile, StrPath, None] = None) -> Model:
    """Load a GGUF model, or a safetensors checkpoint (``meta``: a GGUF of the same model
    for the hyper-parameters and the tokenizer), with a weight path per linear tensor (see
    module doc); or a quantized model directory written by ``QuantizedModel.save``."""
    if act not in ACT_MODES:
        raise ValueError(f"act must be 'per_token' or 'per_tensor', got {act!r}")
    if os.path.isdir(path) and not is_safetensors(path):
        return load_quantized(path, act=act)
    src = open_source(path, meta)
    names = linear_names(src.hp)
    if isinstance(weights, TierMap):
        weights.check_fits(src.shapes(), os.fspath(path), names)
    paths = resolve_paths(weights, names, int4_kind)
    nthreads = None if threads is None else int(threads)
    pt = act == "per_tensor"
    linears = {n: _linear_spec(n, src.linear(n), paths[n], nthreads, pt) for n in names}
    return Model(os.fspath(path), src.hp, linears, src.tensor, src.meta, src.tied, paths)


def load_quantized(path: StrPath, act: str = "per_token") -> Model:
    """A Model from a saved QuantizedModel directory; every checksum is verified
    (:func:`orkpy.modeldir.read_model_dir`)."""
    d = read_model_dir(path)
    src = GGUFSource(d.float_file)
    names = linear_names(src.hp)
    missing = [n for n in names if n not in d.entries]
    if missing:
        d.tier(missing[0])  # raises FormatError naming it
    pt = act == "per_tensor"
    linears: Dict[str, LinearSpec] = {}
    paths: Dict[str, str] = {}
    shapes = src.shapes()
    for n in names:
        if d.tier(n) == "float":
            tensor, shape = d.float_tensor(n)
            if shapes.get(tensor) != shape:
                raise FormatError(f"{d.float_file}: no tensor {tensor!r} of shape {shape} for the float linear {n!r}")
            linears[n], paths[n] = LinearSpec.f32(n, src.tensor(tensor)), "gguf"
        else:
            pw = d.packed(n)
            linears[n], paths[n] = LinearSpec.from_packed(n, pw, pt), pw.kind
    m = Model(os.fspath(path), src.hp, linears, src.tensor, src.meta, src.tied, paths)
    m.manifest = d.manifest
    return m
