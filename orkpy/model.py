"""Models: a Llama / Qwen3 forward pass in C with a weight path per linear tensor.

``load_model(path, weights="gguf")`` reads a GGUF file (architectures
``llama`` and ``qwen3``). ``weights`` says which path each linear layer runs
on -- one way, three spellings:

- a path name for every linear tensor: ``"fp32"``, ``"gguf"``, ``"int8"``,
  ``"nf4"`` or ``"int4"``;
- a dict ``{tensor name: path}`` (``"default"`` sets the rest; without it the
  rest is ``"gguf"``);
- a :class:`~orkpy.TierMap`: int8 tier -> ``"int8"``, int4 tier -> ``int4_kind``
  (``"nf4"`` by default), float tier -> ``"gguf"``. The map must fit the file:
  an entry for a tensor the file lacks or with another shape, or a linear tensor
  with no entry, is a ValueError naming it.

Paths: ``fp32`` and ``gguf`` both multiply in float32 with the tensor's
float values (for F32/F16/BF16 files the source values; for quantized files
the values dequantized from the file's own type, i.e. "the GGUF's native
precision"; orkpy does not emulate llama.cpp's activation quantization).
``int8`` / ``nf4`` / ``int4`` quantize those float values with
:func:`orkpy.quantize` (per-channel absmax) and run the packed int8 kernels
(w8a8 / i4a8, int8 activations per token).

The linear tensors are ``attn_q, attn_k, attn_v, attn_output, ffn_gate,
ffn_up, ffn_down`` of every block and the head ``output.weight`` (a tied
model's head is ``token_embd.weight``; its path is still set under the name
``output.weight``). The embedding lookup and the norms are always float32.

Memory: F32 tensors are used in place from the memory-mapped file; other
types are dequantized to float32 once (4 bytes per weight) and packed paths
add their packed copy (1 or 0.5 byte per weight) while the float copy of a
packed tensor is dropped. For a 1.7B-parameter model on the "gguf" path of
an F16 file that is about 4 x 1.7e9 = 6.8 GB of float32 weights plus the
mapped 3.4 GB file (pages of which the OS can drop); on all-int8 paths about
1.7 GB of packed weights plus the 0.6 GB float32 embedding table.
"""
from __future__ import annotations

import functools
import os
from typing import TYPE_CHECKING, Any, Callable, Collection, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from . import _core
from ._typing import StrPath
from .gguf import GGUFFile
from .packed import pack
from .quant import quantize
from .tiermap import TierMap

if TYPE_CHECKING:
    from .npu import Device
    from .tokenizer import Tokenizer

#: What a linear layer gets from the model: ("f32", w) or ("packed", kind, store, bscale, N, K, per_tensor_act).
LinearSpec = Tuple[Any, ...]
#: The ``weights`` argument: one path name, {tensor name: path} or a TierMap.
Weights = Union[str, Dict[str, str], TierMap]

PATHS = ("fp32", "gguf", "int8", "nf4", "int4")
ARCHS = ("llama", "qwen3")
LINEARS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
_ROPE = {"llama": 0, "qwen3": 2}  # NORM, NEOX (llama.cpp's rope types)


def _hparams(g: GGUFFile) -> Dict[str, Any]:
    md = g.metadata
    arch = md.get("general.architecture")
    if arch not in ARCHS:
        raise ValueError(f"{g.path}: architecture {arch!r} is not supported (supported: {', '.join(ARCHS)})")

    def get(key: str, default: Any = None) -> Any:
        v = md.get(f"{arch}.{key}", default)
        if v is None:
            raise ValueError(f"{g.path}: metadata key '{arch}.{key}' is missing")
        return v

    n_embd = int(get("embedding_length"))
    n_head = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", n_embd // n_head))
    scale = 1.0
    scaling = md.get(f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        scale = 1.0 / float(get("rope.scaling.factor"))
    elif scaling != "none":
        raise NotImplementedError(f"{g.path}: RoPE scaling type {scaling!r} is not implemented (none, linear)")
    emb = g.tensor_info("token_embd.weight")
    return {
        "arch": arch,
        "n_layer": int(get("block_count")),
        "n_embd": n_embd,
        "n_head": n_head,
        "n_head_kv": int(get("attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "n_ff": int(get("feed_forward_length")),
        "n_vocab": int(emb.shape[0]),
        "n_rot": int(get("rope.dimension_count", head_dim)),
        "rope_type": _ROPE[arch],
        "rope_base": float(get("rope.freq_base", 10000.0)),
        "rope_freq_scale": scale,
        "norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "n_ctx_train": int(get("context_length", 0)),
    }


def linear_names(hp: Dict[str, Any], tied: bool) -> List[str]:
    names = [f"blk.{i}.{t}.weight" for i in range(hp["n_layer"]) for t in LINEARS]
    return names + ["output.weight"]


def resolve_paths(weights: Weights, names: Sequence[str], int4_kind: str = "nf4") -> Dict[str, str]:
    """{linear tensor name: path} from the ``weights`` argument (see module doc)."""
    if int4_kind not in ("nf4", "int4"):
        raise ValueError(f"int4_kind must be 'nf4' or 'int4', got {int4_kind!r}")
    if isinstance(weights, str):
        if weights not in PATHS:
            raise ValueError(f"unknown weight path {weights!r} (expected one of {', '.join(PATHS)})")
        return {n: weights for n in names}
    if isinstance(weights, TierMap):
        out = {}
        for n in names:
            key = n if n in weights else ("token_embd.weight" if n == "output.weight" else n)
            tier = weights[key] if key in weights else "float"
            out[n] = {"int8": "int8", "int4": int4_kind, "float": "gguf"}[tier]
        return out
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


def _float_tensor(g: GGUFFile, name: str) -> NDArray[np.float32]:
    t = g.tensor_info(name)
    if t.type == "F32":  # used in place, no copy
        return g.raw(name).view(np.float32).reshape(t.shape)
    return g.tensor(name)


def _linear_spec(w: NDArray[Any], path: str, threads: Optional[int], per_tensor_act: bool = False) -> LinearSpec:
    if path in ("fp32", "gguf"):
        return ("f32", np.ascontiguousarray(w, dtype=np.float32))
    pw = pack(quantize(w, path, threads=threads))
    return ("packed", pw.kind, pw.store, pw.bscale, pw.N, pw.K, per_tensor_act)


class Model:
    """A loaded model: ``forward(tokens, first=0)`` -> float32 logits for
    positions ``first..T-1``; ``hparams``, ``paths`` (tensor -> weight path),
    ``config`` (a JSON-able description), ``tokenizer`` (from the GGUF)."""

    #: the parsed manifest.json of a model loaded from a QuantizedModel directory
    manifest: Dict[str, Any]

    def __init__(self, path: str, hparams: Dict[str, Any], paths: Dict[str, str], fwd: _core.ForwardModel,
                 gguf: GGUFFile, tied: bool, specs: Optional[Dict[str, LinearSpec]] = None) -> None:
        self.path = path
        self._specs = specs  # {linear name: spec given to the forward model}
        self._npu: Optional[Device] = None
        self.hparams = hparams
        self.paths = paths
        self._fwd = fwd
        self._gguf = gguf
        self.tied = tied
        self._tokenizer: Optional[Tokenizer] = None

    @property
    def n_vocab(self) -> int:
        return self.hparams["n_vocab"]

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

    def forward(self, tokens: ArrayLike, first: int = 0, threads: Optional[int] = None) -> NDArray[np.float32]:
        return self._fwd.forward(np.asarray(tokens), int(first), 0 if threads is None else int(threads))

    def _use_npu(self, device: Optional[Device], kinds: Collection[str]) -> int:
        if self._specs is None:
            raise ValueError("this model does not record its linear layers; load it with load_model()")
        names = linear_names(self.hparams, self.tied)
        routed = 0
        for i, name in enumerate(names):
            spec = self._specs[name]
            if device is None or spec[0] != "packed" or spec[1] not in kinds:
                self._fwd.set_npu(i, None)
                continue
            _, kind, store, _, N, K, _ = spec
            self._fwd.set_npu(i, device._upload_store(kind, store, N, K))
            routed += 1
        self._npu = device
        return routed

    def __repr__(self) -> str:
        return f"Model({os.path.basename(self.path)!r}, arch={self.hparams['arch']!r}, paths={self.config['weight_paths']})"


def _assemble(g: Optional[GGUFFile], hp: Dict[str, Any], spec_of: Callable[[str], LinearSpec],
              float_of: Optional[Callable[[str], NDArray[Any]]] = None,
              record: Optional[Dict[str, LinearSpec]] = None) -> _core.ForwardModel:
    """A ForwardModel from a GGUF's float tensors (embeddings, norms) and
    spec_of(name) -> linear spec for every linear tensor name (recorded in the
    dict ``record`` when given)."""
    if float_of is None:
        if g is None:
            raise ValueError("_assemble needs the GGUF file or float_of")
        float_of = functools.partial(_float_tensor, g)
    if record is not None:
        inner, rec = spec_of, record

        def recorded(name: str) -> LinearSpec:
            rec[name] = inner(name)
            return rec[name]
        spec_of = recorded

    emb = float_of("token_embd.weight")
    layers = []
    for i in range(hp["n_layer"]):
        p = f"blk.{i}."
        L: Dict[str, Any] = {"attn_norm": float_of(p + "attn_norm.weight"), "ffn_norm": float_of(p + "ffn_norm.weight")}
        if hp["arch"] == "qwen3":
            L["q_norm"] = float_of(p + "attn_q_norm.weight")
            L["k_norm"] = float_of(p + "attn_k_norm.weight")
        for key, t in zip(("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"), LINEARS):
            L[key] = spec_of(f"{p}{t}.weight")
        layers.append(L)
    return _core.ForwardModel({k: v for k, v in hp.items() if k not in ("arch", "n_ctx_train")}, emb,
                              float_of("output_norm.weight"), spec_of("output.weight"), layers)


def load_model(path: StrPath, weights: Weights = "gguf", int4_kind: str = "nf4", act: str = "per_token",
               threads: Optional[int] = None) -> Model:
    """Load a GGUF model with a weight path per linear tensor (see module doc),
    or a quantized model directory written by ``QuantizedModel.save``."""
    if act not in ("per_token", "per_tensor"):
        raise ValueError(f"act must be 'per_token' or 'per_tensor', got {act!r}")
    if os.path.isdir(path):
        from .calibrate import load_quantized
        return load_quantized(path, act=act)
    g = GGUFFile(path)
    hp = _hparams(g)
    tied = "output.weight" not in g
    names = linear_names(hp, tied)
    if isinstance(weights, TierMap):
        weights.check_fits({t.name: t.shape for t in g.tensors}, os.fspath(path), names)
    paths = resolve_paths(weights, names, int4_kind)
    nthreads = None if threads is None else int(threads)
    pt = act == "per_tensor"

    def spec_of(name: str) -> LinearSpec:
        src = "token_embd.weight" if (name == "output.weight" and tied) else name
        return _linear_spec(_float_tensor(g, src), paths[name], nthreads, pt)

    specs: Dict[str, LinearSpec] = {}
    return Model(os.fspath(path), hp, paths, _assemble(g, hp, spec_of, record=specs), g, tied, specs)
