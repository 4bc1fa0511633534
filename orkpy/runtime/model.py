"""Models: a forward pass in C for every architecture of :mod:`orkpy.formats.arch`
(``arch.SUPPORTED``) with a weight path per linear tensor.

``load_model(path, weights="gguf")`` reads a GGUF file (any architecture of the
table; fused tensors are split when it is opened), a Hugging Face safetensors checkpoint (with
``meta=``, a GGUF of the same model for the hyper-parameters and the
tokenizer; see :mod:`orkpy.formats.source`) or a quantized model directory.
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
``output.weight``), for every architecture: phi3's fused ``attn_qkv`` and gate + up
``ffn_up`` are split into them when the file is opened, and a tier map made from a
phi3 GGUF gives each part its fused tensor's tier. The embedding lookup, the norms
and the biases are always float32.

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

import hashlib
import os
from types import MappingProxyType
from typing import (TYPE_CHECKING, Any, Callable, Collection, Dict, Iterable, Iterator, List, Literal, Mapping,
                    Optional, Protocol, Sequence, Tuple, Union, overload)

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from ..formats import arch as _arch
from .._core import FormatError
from .._typing import StrPath
from .actcal import DEFAULT_PREFIX, ActCalibration, as_calibration, calibrate_activations, resolve
from .actcal import FILE_MAX as ACT_FILE_MAX
from ..kernels.actspec import ActSpec
from ..formats.gguf import GGUFFile
from .linear import LinearSpec
from ..formats.modeldir import read_model_dir, save_in_progress
from ..kernels.packed import pack
from ..kernels.quant import FOUR_BIT_KINDS, KINDS, quantize
from .rotate import down_rot_block, rotate_source
from ..formats.source import GGUFSource, Source, is_safetensors, open_source
from ..formats.tiermap import EMBEDDING, OUTPUT, TierMap

if TYPE_CHECKING:
    from .generate import Session
    from .npu import Device
    from .tokenizer import Tokenizer

#: The ``weights`` argument: one path name, {tensor name: path} or a TierMap.
Weights = Union[str, Dict[str, str], TierMap]

PATHS = ("fp32", "gguf") + KINDS  # float32 paths, then one per quantization kind (the C registry)
LINEARS: Tuple[str, ...] = _core.layer_linears()  # a block's linears, in the C forward model's order and keys


def linear_names(hp: Mapping[str, Any]) -> List[str]:
    """Every linear layer's name, in the forward pass's order (the order of the C model's
    per-linear results and settings): block by block ``attn_q, attn_k, attn_v, attn_output,
    ffn_gate, ffn_up, ffn_down``, then the head ``output.weight`` -- named so for a tied model
    too, whose head weight is ``token_embd.weight``."""
    return _core.linear_names({"n_layer": int(hp["n_layer"])})


def tier_path(tier: str, int4_kind: str = "nf4") -> str:
    """The weight path of a tier: an integer tier -> the kind that runs it (:func:`orkpy.formats.tiermap.tier_kind`:
    ``int8`` / ``int6`` / ``int5`` their kinds, ``int4`` -> ``int4_kind``), ``float`` -> ``"gguf"`` (the source's
    float values); a grouped tier (``"int4-g32"``) has its base tier's path (:func:`orkpy.formats.tiermap.split_tier`
    gives the group). One meaning for ``load_model`` and ``quantize_model``."""
    from ..formats.tiermap import tier_kind
    return tier_kind(tier, int4_kind) or "gguf"


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


def build_model(src: Source, linear: Callable[[str], Tuple[LinearSpec, str]], path: Optional[StrPath] = None,
                hp: Optional[Mapping[str, Any]] = None) -> Model:
    """The one "linears -> Model" loop: ``linear(name)`` gives each linear's :class:`LinearSpec`
    and weight path (``"fp32"``, ``"gguf"`` or a kind), called in the forward pass's order
    (:func:`linear_names`), so a caller that releases a linear's float pages after packing it
    holds one float linear at a time. ``path`` (default ``src.path``) names the model; ``hp``
    (default ``src.hp``) its hyper-parameters; the other tensors are ``src``'s."""
    linears: Dict[str, LinearSpec] = {}
    paths: Dict[str, str] = {}
    for n in linear_names(src.hp):
        linears[n], paths[n] = linear(n)
    return Model(src.path if path is None else os.fspath(path), src.hp if hp is None else dict(hp), linears,
                 src.tensor, src.meta, src.tied, paths)


def _forward_model(hp: Mapping[str, Any], float_of: Callable[[str], NDArray[Any]],
                   linears: Mapping[str, LinearSpec], blocks: Optional[Sequence[int]] = None,
                   head: Optional[Tuple[NDArray[np.float32], Optional[NDArray[Any]]]] = None) -> _core.ForwardModel:
    """The C model from the hyper-parameters (:func:`orkpy.formats.arch.hparams`), float_of(name) ->
    float tensor (embeddings, norms, biases, RoPE factors) and a spec for every name of
    :func:`linear_names`. What each block holds comes from the architecture table. ``blocks``: a
    model of only these blocks (their settings, e.g. a sliding window, as in the whole model),
    run from hidden rows (``forward_hidden``), with no embedding table and a one-row zero head
    of the output norm (:mod:`orkpy.runtime.blocks`); ``linears`` then needs only theirs; ``head``
    (float32 rows of the head weight, their bias or None): those rows as its head instead."""
    a = _arch.get(hp["arch"])
    biases = set(hp.get("biases", ()))
    if blocks is not None:
        return _block_model(hp, float_of, linears, blocks, a, biases, head)
    emb = None if hp.get("packed_lookup") else float_of(EMBEDDING)  # None: the lookup reads the head's rows
    rots = _online_rots(hp)
    layers = [_layer_dict(hp, float_of, linears, i, a, biases, rots) for i in range(hp["n_layer"])]
    rope = hp.get("rope_factors")
    return _core.ForwardModel(_arch.core_hparams(hp), emb, float_of(_arch.OUTPUT_NORM), linears[OUTPUT].to_core(),
                              layers, output_bias=float_of("output.bias") if "output" in biases else None,
                              rope_freqs=float_of(rope) if rope else None)


def _block_model(hp: Mapping[str, Any], float_of: Callable[[str], NDArray[Any]], linears: Mapping[str, LinearSpec],
                 blocks: Sequence[int], a: Any, biases: set,
                 head: Optional[Tuple[NDArray[np.float32], Optional[NDArray[Any]]]] = None) -> _core.ForwardModel:
    """The C model of the blocks ``blocks`` alone (see :func:`_forward_model`): its layer ``j`` is the
    source's layer ``blocks[j]``, its head one zero row (only its input's statistics are read) or
    ``head``'s rows and bias (a block of the vocabulary's logits)."""
    rots = _online_rots(hp)
    layers = [_layer_dict(hp, float_of, linears, i, a, biases, rots) for i in blocks]
    w = np.zeros((1, int(hp["n_embd"])), np.float32) if head is None else head[0]
    chp = dict(_arch.core_hparams(hp), n_layer=len(blocks), n_vocab=int(w.shape[0]))
    rope = hp.get("rope_factors")
    return _core.ForwardModel(chp, None, float_of(_arch.OUTPUT_NORM), ("f32", w), layers,
                              output_bias=None if head is None or head[1] is None else head[1],
                              rope_freqs=float_of(rope) if rope else None)


def _online_rots(hp: Mapping[str, Any]) -> Tuple[Optional[NDArray[Any]], Optional[NDArray[Any]]]:
    """The online rotation blocks every layer applies (ffn_down's input, the block inputs), or None."""
    down_rot = down_rot_block(int(hp["n_ff"])) if hp.get("ffn_down_rot") else None
    norm_rot = (down_rot_block(int(hp["n_embd"]), "n_embd", "the online block-input rotation")
                if hp.get("norm_rot") else None)
    return down_rot, norm_rot


def _layer_dict(hp: Mapping[str, Any], float_of: Callable[[str], NDArray[Any]], linears: Mapping[str, LinearSpec],
                i: int, a: Any, biases: set, rots: Tuple[Optional[NDArray[Any]], Optional[NDArray[Any]]]
                ) -> Dict[str, Any]:
    """Layer ``i`` of the source as the C model takes it (norms, linears, biases, settings)."""
    down_rot, norm_rot = rots
    p = f"blk.{i}."
    L: Dict[str, Any] = {role: float_of(f"{p}{_arch.NORM_STEMS[role]}.weight") for role in a.norms}
    for t in LINEARS:
        L[t] = linears[f"{p}{t}.weight"].to_core()
        if t in biases:
            L[t + ".bias"] = float_of(f"{p}{t}.bias")
    L.update(_arch.layer_settings(hp, i))
    if down_rot is not None:  # ffn_down's input rotated online (orkpy.runtime.rotate)
        L["ffn_down.rot"] = down_rot
    if norm_rot is not None:  # attn_norm / ffn_norm outputs rotated online (orkpy.runtime.rotate, placement "online")
        L["norm.rot"] = norm_rot
    return L


def text_tokens(tokenizer: Tokenizer, n_vocab: int, text_or_tokens: Union[str, ArrayLike],
                add_bos: Optional[bool] = None) -> NDArray[np.int32]:
    """:meth:`Model.tokens` for a tokenizer and a vocabulary size (no model needed)."""
    if isinstance(text_or_tokens, str):
        special = tokenizer.add_bos if add_bos is None else bool(add_bos)
        return np.asarray(tokenizer.encode(text_or_tokens, add_special=special), dtype=np.int32)
    t = np.asarray(text_or_tokens)
    if t.ndim != 1 or not np.issubdtype(t.dtype, np.integer):
        raise TypeError("text_or_tokens must be a str or a 1-D integer array of token ids")
    if t.size and (t.min() < 0 or t.max() >= n_vocab):
        bad = int(np.flatnonzero((t < 0) | (t >= n_vocab))[0])
        raise ValueError(f"token id {int(t[bad])} at index {bad} is outside the vocabulary ({n_vocab})")
    return t.astype(np.int32)


def calib_chunks(src: Source, calib: Union[str, ArrayLike], n_ctx: int, chunks: Optional[int]
                 ) -> "Tuple[List[NDArray[np.int32]], NDArray[np.int32]]":
    """The calibration chunks of ``calib`` (a text or token ids) for the source ``src`` as
    :meth:`orkpy.Model.chunks` cuts them, and the tokens."""
    from .tokenizer import Tokenizer
    tok = Tokenizer.from_gguf(src.meta)
    tokens = text_tokens(tok, int(src.hp["n_vocab"]), calib)
    return list(token_chunks(tok, tokens, n_ctx, chunks)[1]), tokens


def token_chunks(tokenizer: Tokenizer, tokens: Union[Sequence[int], NDArray[Any]], n_ctx: int,
                 chunks: Optional[int] = None, add_bos: Optional[bool] = None
                 ) -> Tuple[int, Iterator[NDArray[np.int32]]]:
    """:meth:`Model.chunks` for a tokenizer (no model needed)."""
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 2:
        raise ValueError(f"n_ctx must be an int >= 2, got {n_ctx!r}")
    n_chunk = len(tokens) // n_ctx
    if chunks is not None:
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        n_chunk = min(n_chunk, chunks)
    if n_chunk < 1:
        raise ValueError(f"need at least n_ctx = {n_ctx} tokens, got {len(tokens)}")
    use_bos = tokenizer.add_bos if add_bos is None else bool(add_bos)
    bos = tokenizer.bos_id if use_bos else None

    def it() -> Iterator[NDArray[np.int32]]:
        for c in range(n_chunk):
            chunk = np.array(tokens[c * n_ctx:(c + 1) * n_ctx], dtype=np.int32)
            if bos is not None:
                chunk[0] = bos
            yield chunk
    return n_chunk, it()


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

    def forward(self, tokens: ArrayLike, first: int = 0, threads: Optional[int] = None,
                out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
        """float32 logits of positions ``first .. T-1`` of one chunk (T = len(tokens)), shape
        (T - first, n_vocab). ``out``: a writeable C-contiguous float32 array of that shape to
        write them into (and return), so a loop over chunks reuses one buffer instead of a fresh
        one per chunk (perplexity does); its contents are unspecified after an error."""
        return self._fwd.forward(np.asarray(tokens), int(first), 0 if threads is None else int(threads), out)

    # ------------------------------------------------------- generation --
    def session(self, n_ctx: int, n_batch: int = 512) -> Session:
        """A KV-cached decode session with ``n_ctx`` positions, prompts evaluated in steps of at
        most ``n_batch`` tokens (:class:`orkpy.runtime.generate.Session`): ``eval(tokens)`` appends
        tokens and returns the last one's logits."""
        from .generate import Session, check_session_args
        check_session_args(n_ctx, n_batch)
        return Session(self._fwd.session(int(n_ctx), int(n_batch)))

    @property
    def chat_template(self) -> Optional[str]:
        """The GGUF's ``tokenizer.chat_template`` (None when it has none)."""
        t = self._gguf.metadata.get("tokenizer.chat_template")
        return t if isinstance(t, str) else None

    @overload
    def generate(self, prompt: Union[str, ArrayLike], max_tokens: int = ..., temperature: float = ...,
                 top_k: int = ..., top_p: float = ..., seed: int = ..., stream: Literal[False] = ...,
                 **kw: Any) -> str: ...

    @overload
    def generate(self, prompt: Union[str, ArrayLike], max_tokens: int = ..., temperature: float = ...,
                 top_k: int = ..., top_p: float = ..., seed: int = ..., *, stream: Literal[True],
                 **kw: Any) -> Iterator[str]: ...

    def generate(self, prompt: Union[str, ArrayLike], max_tokens: int = 128, temperature: float = 0.8,
                 top_k: int = 40, top_p: float = 0.95, seed: int = 0, stream: bool = False,
                 **kw: Any) -> Union[str, Iterator[str]]:
        """The continuation of ``prompt`` (a str or token ids) as a str, or with ``stream`` an
        iterator of its text pieces as they come; ``temperature=0`` is greedy; stops at an
        end-of-generation token. Keywords ``chat``, ``threads``, ``n_ctx``, ``n_batch``,
        ``stats``: :func:`orkpy.runtime.generate.generate`, which documents the sampling."""
        from .generate import generate
        return generate(self, prompt, max_tokens, temperature, top_k, top_p, seed, stream, **kw)

    # ------------------------------------------------------------ texts --
    def tokens(self, text_or_tokens: Union[str, ArrayLike], add_bos: Optional[bool] = None) -> NDArray[np.int32]:
        """int32 token ids: a str is tokenized with the model's own tokenizer (BOS as
        the vocabulary says, or as add_bos says); an int array is used as given."""
        return text_tokens(self.tokenizer, self.n_vocab, text_or_tokens, add_bos)

    def chunks(self, tokens: Union[Sequence[int], NDArray[Any]], n_ctx: int, chunks: Optional[int] = None,
               add_bos: Optional[bool] = None) -> Tuple[int, Iterator[NDArray[np.int32]]]:
        """(count, iterator) over the non-overlapping ``n_ctx``-token chunks of ``tokens``
        (at most ``chunks``), the first token of each replaced by BOS when ``add_bos``
        (default: when the vocabulary adds one) -- llama.cpp's convention for perplexity and
        imatrix runs, the one chunking of both. Every token of a chunk is used."""
        return token_chunks(self.tokenizer, tokens, n_ctx, chunks, add_bos)

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

    def collect_grams(self, chunks: Iterable[ArrayLike], names: Sequence[str],
                      threads: Optional[int] = None) -> Dict[str, Tuple[NDArray[np.float64], int]]:
        """{name: (sum of x^T x over every input row, float64 (K, K), rows)} of the linears ``names``
        over ``chunks`` (each run as one forward pass, every position counted), accumulated inside the
        C forward pass (csrc/ork/linear.h, "Input Gram matrix"): GPTQ's Hessian (:mod:`orkpy.quantization.gptq`)."""
        idx = {n: i for i, n in enumerate(self._linears)}
        bad = [n for n in names if n not in idx]
        if bad:
            raise ValueError(f"no linear named {bad[0]!r} in {self.path}")
        self._fwd.gram_enable([idx[n] for n in names])
        try:
            self._run_chunks(chunks, threads)
        finally:
            got = self._fwd.gram_take()
        return {n: (got[idx[n]][0], int(got[idx[n]][1])) for n in names}

    def collect_act_stats(self, chunks: Iterable[ArrayLike], threads: Optional[int] = None,
                          prefix: int = 0) -> Dict[str, Dict[str, Any]]:
        """{linear name: statistics of its input} over ``chunks`` (one forward pass each), taken in
        the C forward pass before any quantization (csrc/ork/linear.h ``ork_act_stats``): ``rows``,
        ``absmax``, ``ch_absmax`` (float32 (K,), max |x| per input channel), the |x| histogram
        ``count`` / ``sum`` / ``sum2`` over :func:`orkpy.runtime.actcal.hist_edges`, and ``n_clipped``
        (inputs beyond a static linear's range). What :func:`orkpy.calibrate_activations` uses.
        The head sees the second half of each chunk's positions (the ones perplexity scores),
        every other linear every position but the first ``prefix`` (which the per-tensor and
        static modes can quantize per token: ``LinearSpec.act_prefix``); ``ch_absmax`` counts
        every position (it chooses the per-token mode's outlier channels)."""
        self._fwd.act_stats_enable(int(prefix))
        try:
            nthreads = 0 if threads is None else int(threads)
            for chunk in chunks:
                c = np.asarray(chunk)
                self._fwd.forward(c, len(c) // 2, nthreads)
        finally:
            stats = self._fwd.act_stats_take()
        return dict(zip(self._linears, stats))

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
        (:func:`orkpy.evaluation.ffn.layer_params`), or with None on the per-op path. The layer's
        gate / up / down linears must be packed (and carry no bias: the chain has none)."""
        if params is not None:
            with_bias = [t for t in ("ffn_gate", "ffn_up", "ffn_down") if t in self.hparams.get("biases", ())]
            if with_bias:
                raise ValueError(f"{os.path.basename(self.path)}: the FFN linears {', '.join(with_bias)} have biases, "
                                 "which the fused FFN chain does not model")
            if self.hparams.get("ffn_down_rot"):
                raise ValueError(f"{os.path.basename(self.path)}: ffn_down's input is rotated online "
                                 "(rotate_online), which the fused FFN chain does not model")
            outl = [t for t in ("ffn_gate", "ffn_up", "ffn_down")
                    if self._linears[f"blk.{int(layer)}.{t}.weight"].outliers is not None]  # the spec's channels
            if outl:
                raise ValueError(f"{os.path.basename(self.path)}: the FFN linears {', '.join(outl)} keep outlier "
                                 "channels in float (act='per_token_outliers'), which the fused FFN chain does not model")
            grp = [t for t in ("ffn_gate", "ffn_up", "ffn_down") if self._linears[f"blk.{int(layer)}.{t}.weight"].group]
            if grp:
                raise ValueError(f"{os.path.basename(self.path)}: the FFN linears {', '.join(grp)} have group-wise "
                                 "scales (one int32 sum per group), which the fused FFN chain does not model")
        self._fwd.set_ffn(int(layer), params)

    def swap_linear(self, name: str, spec: LinearSpec) -> LinearSpec:
        """Run linear ``name`` as ``spec`` (same shape) from now on; returns the spec it replaces
        (swap it back with that). For sensitivity scans (:mod:`orkpy.quantization.alloc`): one model, one
        linear changed at a time. An NPU route of that linear is dropped."""
        old = self._linears[name]
        if (spec.N, spec.K) != (old.N, old.K):
            raise ValueError(f"{name} is ({old.N}, {old.K}), the new spec is ({spec.N}, {spec.K})")
        self._fwd.set_linear(list(self._linears).index(name), spec.to_core())
        self._linears[name] = spec
        self.paths[name] = spec.kind if spec.path == "packed" and spec.kind else "gguf"
        return old

    def route_linears(self, device: Optional[Device], kinds: Optional[Collection[str]] = None) -> int:
        """Run the integer matmuls of the packed linears (of ``kinds``; default every packed
        kind) on ``device``, each weight uploaded once (:meth:`orkpy.runtime.npu.Device.upload`:
        w4a4 / w4a8 in the int4 mode; a grouped weight returns its per-group partial sums,
        scaled on the host); ``None`` routes every linear back to the CPU. Returns the number of
        linears routed."""
        routed = 0
        for i, (name, spec) in enumerate(self._linears.items()):
            if device is None or spec.path != "packed" or (kinds is not None and spec.kind not in kinds):
                self._fwd.set_npu(i, None)
                continue
            self._fwd.set_npu(i, device.upload(spec.packed_weight()))  # grouped: per-group partial sums
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


def transformed_source(src: Source, rotate: Optional[str] = None, rotate_seed: int = 0, smooth: Optional[float] = None,
                       calib: Union[str, ArrayLike, None] = None, calib_ctx: int = 512, calib_chunks: Optional[int] = 8,
                       threads: Optional[int] = None, rotate_online: bool = False,
                       rotate_placement: Optional[str] = None) -> Source:
    """``src`` rotated (``rotate``, placed by ``rotate_placement``: "fold", "online" or None for
    the architecture's default; ``rotate_online``: ``ffn_down``'s input rotated online too)
    and/or smoothed (:func:`orkpy.runtime.rotate.rotate_source`; itself when none is asked for).
    Smoothing calibrates its scales on ``calib`` (a text or token ids; ``calib_chunks`` chunks
    of ``calib_ctx`` tokens) with the rotated model run in float32; the calibration is
    recorded in the source's ``info()``."""
    if rotate_placement is not None and rotate is None:
        raise ValueError(f"rotate_placement={rotate_placement!r} places a rotation: it needs rotate= (e.g. 'hadamard')")
    if rotate is None and smooth is None and not rotate_online:
        return src
    rotated = rotate_source(src, rotate, rotate_seed, online=rotate_online, placement=rotate_placement)
    if smooth is None:
        return rotated
    if calib is None:
        raise ValueError("smooth= needs calib= (a calibration text or token ids, not the scored text)")
    m = float_model(rotated)
    tokens = m.tokens(calib)
    n_chunk, chunks = m.chunks(tokens, calib_ctx, calib_chunks)
    stats = m.collect_activation_stats(chunks, threads)
    note = {"n_ctx": calib_ctx, "chunks": n_chunk,
            "tokens_sha256": hashlib.sha256(tokens[: n_chunk * calib_ctx].tobytes()).hexdigest()}
    return rotate_source(src, rotate, rotate_seed, smooth=smooth, stats=stats, calib_info=note, online=rotate_online,
                         placement=rotate_placement)


def _names_model_dir(p: str) -> bool:
    """Whether load_model reads ``p`` as a quantized model directory: a folder that is not a safetensors
    checkpoint, also one missing for a moment while an orkpy save replaces it (where the kernel cannot
    swap two folders in one step the old one is moved aside first: read_model_dir waits for the new one,
    else FormatError, never FileNotFoundError / IsADirectoryError)."""
    if os.path.isdir(p):
        return not is_safetensors(p)
    if os.path.lexists(p) and not os.path.isdir(p):
        return False  # a file (a GGUF, a safetensors file or index)
    return os.path.isdir(p) or save_in_progress(p)  # back in place meanwhile, or being replaced


def load_model(path: StrPath, weights: Weights = "gguf", int4_kind: str = "nf4", act: Union[str, ActSpec, None] = None,
               threads: Optional[int] = None, meta: Union[GGUFFile, StrPath, None] = None,
               rotate: Optional[str] = None, rotate_seed: int = 0, smooth: Optional[float] = None,
               calib: Union[str, ArrayLike, None] = None, calib_ctx: int = 512,
               calib_chunks: Optional[int] = 8, rotate_online: bool = False,
               act_calib: Union[ActCalibration, StrPath, None] = None, act_method: Optional[str] = None,
               act_outliers: Optional[int] = None, act_prefix: Optional[int] = None,
               rotate_placement: Optional[str] = None) -> Model:
    """Load a GGUF model, or a safetensors checkpoint (``meta``: a GGUF of the same model
    for the hyper-parameters and the tokenizer), with a weight path per linear tensor (see
    module doc); or a quantized model directory written by ``QuantizedModel.save``.
    ``rotate`` (placed by ``rotate_placement``) / ``rotate_online`` / ``smooth``: run the
    source rotated and/or smoothed
    (:func:`transformed_source`, :mod:`orkpy.runtime.rotate`; a model directory is saved already
    transformed). ``act``: the packed linears' activation spec, an :class:`orkpy.ActSpec` or a
    mode name (:data:`orkpy.ACT_MODES`; None: a model directory's recipe's spec, the one it was
    made for, else ``"per_token"``) with the legacy ``act_method`` / ``act_outliers`` /
    ``act_prefix`` (:meth:`orkpy.ActSpec.parse`; :mod:`orkpy.runtime.actcal`). A static mode (range
    ``method``, ``"mse"`` or ``"max"``) and a mode with outlier channels (``n_outliers`` of them)
    use ``act_calib`` (an ActCalibration or an act_scales.json), else a model directory's saved
    calibration, else one run now on ``calib`` (:func:`calibrate_source_acts`, leaving out
    ``prefix`` positions, default :data:`orkpy.runtime.actcal.DEFAULT_PREFIX`). ``prefix``: the sequence
    positions the per-tensor and static modes quantize per token (default: 0 for per_tensor,
    the calibration's for static)."""
    spec = ActSpec.parse("per_token" if act is None else act, act_method, act_outliers, act_prefix)
    if _names_model_dir(os.fspath(path)):
        if rotate is not None or smooth is not None or rotate_online or rotate_placement is not None:
            raise ValueError(f"{os.fspath(path)}: a quantized model directory holds its tensors as they were "
                             "quantized (rotated or not, as its manifest records); rotate= / smooth= apply to a source")
        given = act is not None or act_method is not None or act_outliers is not None or act_prefix is not None
        return load_quantized(path, act=spec if given else None, act_calib=act_calib)
    src = transformed_source(open_source(path, meta), rotate, rotate_seed, smooth, calib, calib_ctx, calib_chunks,
                             threads, rotate_online, rotate_placement)
    names = linear_names(src.hp)
    if isinstance(weights, TierMap):
        weights = src.split_tier_map(weights)  # a map naming fused tensors (phi3) -> their parts
        weights.check_fits(src.shapes(), os.fspath(path), names)
    paths = resolve_paths(weights, names, int4_kind)
    nthreads = None if threads is None else int(threads)
    cal = as_calibration(act_calib)
    if cal is None and spec.info.calibrated and calib is not None:
        cal = calibrate_source_acts(src, calib, calib_ctx, calib_chunks, threads,
                                    DEFAULT_PREFIX if spec.prefix is None else spec.prefix)
    where = os.fspath(path)

    def linear(n: str) -> Tuple[LinearSpec, str]:
        w = src.linear(n)
        if paths[n] in ("fp32", "gguf"):
            return LinearSpec.f32(n, w), paths[n]
        how = resolve(spec, n, cal, w.shape[1], where, paths[n])
        packed = pack(quantize(w, paths[n], threads=nthreads))
        del w
        src.release(caches=False)  # packed: the float pages it was read from go back (the values stay the file's)
        return LinearSpec.from_packed(n, packed, act_spec=how), paths[n]
    return build_model(src, linear, path)


def float_model(src: Source) -> Model:
    """``src`` as a Model with every linear in float32 (the reference calibration passes run on it:
    activation ranges, Gram matrices)."""
    return build_model(src, lambda n: (LinearSpec.f32(n, src.linear(n)), "fp32"))


def calibrate_source_acts(src: Source, calib: Union[str, ArrayLike], calib_ctx: int = 512,
                          calib_chunks: Optional[int] = 8, threads: Optional[int] = None,
                          prefix: int = DEFAULT_PREFIX) -> ActCalibration:
    """The activation calibration (:func:`orkpy.runtime.actcal.calibrate_activations`) of ``src`` run in
    float32: every linear's input as the float model sees it, so one calibration serves every
    weight path (w8a8, w4a8) of that source."""
    m = float_model(src)
    return calibrate_activations(m, calib, calib_ctx, calib_chunks, threads, progress=False, prefix=prefix)


def made_for(manifest: Mapping[str, Any], where: str) -> ActSpec:
    """The activation spec a model directory was made for: its manifest's ``recipe.activation``
    (:class:`orkpy.Recipe`), or per token for a directory written before recipes were recorded;
    a FormatError naming the field for one that is not a valid spec."""
    recipe = manifest.get("recipe")
    act = recipe.get("activation") if isinstance(recipe, Mapping) else None
    if act is None:
        return ActSpec()
    try:
        return ActSpec.from_dict(act)
    except (TypeError, ValueError) as e:
        raise FormatError(f"{where}: manifest.json recipe.activation: {e}") from None


def load_quantized(path: StrPath, act: Union[str, ActSpec, None] = None,
                   act_calib: Union[ActCalibration, StrPath, None] = None, act_method: Optional[str] = None,
                   act_outliers: Optional[int] = None, act_prefix: Optional[int] = None) -> Model:
    """A Model from a saved QuantizedModel directory; every checksum is verified
    (:func:`orkpy.formats.modeldir.read_model_dir`). ``act`` (and the legacy ``act_method`` /
    ``act_outliers`` / ``act_prefix``) as in :func:`load_model` (None and no legacy argument: the
    spec the manifest's recipe was made for, :func:`made_for`); the calibrated modes use
    ``act_calib`` or the directory's saved ``act_scales.json``."""
    given = act is not None or act_method is not None or act_outliers is not None or act_prefix is not None
    spec = ActSpec.parse("per_token" if act is None else act, act_method, act_outliers, act_prefix)
    d = read_model_dir(path)
    if not given:
        spec = made_for(d.manifest, os.fspath(path))
    cal = as_calibration(act_calib)
    if cal is None and d.act_scales_file is not None:  # the verified bytes, never the path again
        raw = d.act_scales_bytes() or b""
        if len(raw) > ACT_FILE_MAX:
            raise FormatError(f"{d.act_scales_file}: larger than {ACT_FILE_MAX >> 20} MiB")
        cal = ActCalibration.from_bytes(raw, d.act_scales_file)
    src = GGUFSource(d.float_file, d.float_gguf())
    hp = src.hp
    transform = d.manifest["settings"].get("transform")
    if isinstance(transform, dict) and transform.get("online"):  # ffn_down's weights expect a rotated input
        hp = dict(hp, ffn_down_rot=True)
    if isinstance(transform, dict) and transform.get("rotate") and transform.get("placement") == "online":
        hp = dict(hp, norm_rot=True)  # the input linears expect the block inputs rotated online
    if d.manifest["settings"].get("tied_lookup") == "packed":
        hp = dict(hp, packed_lookup=True)  # the embedding rows are the packed head's
    names = linear_names(src.hp)
    missing = [n for n in names if n not in d.entries]
    if missing:
        d.tier(missing[0])  # raises FormatError naming it
    shapes = src.shapes()
    where = os.fspath(path)

    def linear(n: str) -> Tuple[LinearSpec, str]:
        if d.tier(n) == "float":
            tensor, shape = d.float_tensor(n)
            if shapes.get(tensor) != shape:
                raise FormatError(f"{d.float_file}: no tensor {tensor!r} of shape {shape} for the float linear {n!r}")
            return LinearSpec.f32(n, src.tensor(tensor)), "gguf"
        pw = d.packed(n)
        return LinearSpec.from_packed(n, pw, act_spec=resolve(spec, n, cal, pw.K, where, pw.kind, pw.group)), pw.kind
    m = build_model(src, linear, path, hp)
    m.manifest = d.manifest
    return m
