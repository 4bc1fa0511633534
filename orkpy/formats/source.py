"""Where a model comes from: its float weights, hyper-parameters and tokenizer
(a *source*), and which tier each weight gets (an *allocation*).

- :func:`open_source` ``(path, meta=None)``: a GGUF file (F32 tensors used in
  place, F16/BF16 widened, quantized types dequantized: "the GGUF's native
  precision") or a Hugging Face safetensors checkpoint (a ``.safetensors``
  file, a sharded ``*.json`` index or a folder holding either; Llama / Qwen2 /
  Qwen3 tensor names, biases included; llama's q/k rows are permuted as
  llama.cpp's converter does; other architectures: NotImplementedError).
  A checkpoint carries no GGUF metadata, so the hyper-parameters and the
  tokenizer come from ``meta``, a GGUF of the same model (e.g. the allocation
  file), whose tensor data is never used. Both kinds have one interface,
  :class:`Source`. ``load_model`` and ``quantize_model`` read sources only
  through it.
- :func:`read_allocation` ``(alloc, threshold=5.0)``: a :class:`~orkpy.TierMap`
  as given, a llama.cpp mixed GGUF (its per-tensor types decide the tiers:
  :func:`~orkpy.tier_map`), or an emit-map file (:meth:`~orkpy.TierMap.load`).
  The one allocation reader of the library and the CLI.
- :func:`hparams`: the forward pass's hyper-parameters from a GGUF's metadata, for
  every architecture of the table in :mod:`orkpy.formats.arch` (``arch.SUPPORTED``; anything
  else is a ValueError listing them).

Fused tensors (``attn_qkv``, phi3's gate + up ``ffn_up``) are split when a GGUF source is
opened: the source lists and returns the parts (``blk.<i>.attn_q.weight``, ...) in place of
the fused tensor, each part with the fused tensor's stored type, so everything downstream
sees one set of linear names for every architecture (:mod:`orkpy.formats.arch`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from .. import _core
from .._core import FormatError
from .._io import sha256_dir, sha256_file
from .._typing import StrPath
from . import arch as _arch
from .gguf import GGUFFile
from .tiermap import EMBEDDING, FLOAT_TYPES, OUTPUT, TierMap, tier_map

ARCHS = _arch.SUPPORTED


def hparams(g: GGUFFile) -> Dict[str, Any]:
    """The forward pass's hyper-parameters from a GGUF's metadata and tensor list
    (:func:`orkpy.formats.arch.hparams`); ValueError naming the file for an unsupported architecture,
    a missing key or tensor."""
    return _arch.hparams(g.metadata, {t.name: t.shape for t in g.tensors}, g.path)


def float_tensor(g: GGUFFile, name: str) -> NDArray[np.float32]:
    """A GGUF tensor as float32 (N, ...): F32 in place from the mapped file, any other type converted."""
    t = g.tensor_info(name)
    if t.type == "F32":  # used in place, no copy
        return g.raw(name).view(np.float32).reshape(t.shape)
    return g.tensor(name)


def check_finite(a: NDArray[Any], where: str, name: str, stored_as: Optional[str] = None, at: Optional[int] = None) -> None:
    """FormatError naming ``where`` (the file) and tensor ``name`` when the float32 / float16 array
    ``a`` holds a NaN or an infinity (one C pass over the values, ``_core.find_nonfinite``);
    ``stored_as``: the tensor's name in the file when it is not ``name`` (a checkpoint's own name);
    ``at``: the flat index of the first non-finite value when it is known already (-1: none; a GGUF
    tensor is checked while it is dequantized, ``_core.dequantize_raw_checked``).

    Every tensor a model uses -- embeddings, norms, biases, RoPE factors, linears -- passes here once
    when a source first reads it (:class:`GGUFSource`, :class:`SafetensorsSource`), so
    ``load_model`` and ``quantize_model`` refuse such a file by name instead of producing NaN
    logits (or failing later in an activation that names no tensor). llama.cpp loads such a file
    unless asked to validate it (``check_tensors``) and then computes NaN; orkpy refuses it
    (docs/security.md)."""
    i = _core.find_nonfinite(a) if at is None else at
    if i < 0:
        return
    idx = np.unravel_index(i, a.shape) if a.ndim else ()
    v = float(a.reshape(-1)[i])
    as_ = f" (stored as {stored_as!r})" if stored_as is not None and stored_as != name else ""
    raise FormatError(f"{where}: tensor {name!r}{as_} has a non-finite value ({v}) at [{', '.join(map(str, idx))}]: "
                      "a model with NaN or infinite weights computes NaN logits")


# ------------------------------------------------------- Hugging Face names --

_HF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_HF_TOP = {"model.embed_tokens.weight": EMBEDDING, "model.norm.weight": "output_norm.weight",
           "lm_head.weight": OUTPUT}


#: the architectures whose Hugging Face tensor names (above) orkpy reads
HF_ARCHS = ("llama", "qwen2", "qwen3")


def hf_to_gguf_name(name: str) -> Optional[str]:
    """Hugging Face Llama/Qwen2/Qwen3 tensor name (weights and biases) -> llama.cpp's GGUF
    name (None if unknown)."""
    if name in _HF_TOP:
        return _HF_TOP[name]
    if name == "lm_head.bias":
        return "output.bias"
    parts = name.split(".")
    if len(parts) >= 5 and parts[0] == "model" and parts[1] == "layers" and parts[-1] in ("weight", "bias"):
        key = ".".join(parts[3:-1])
        if key in _HF_NAMES:
            return f"blk.{parts[2]}.{_HF_NAMES[key]}.{parts[-1]}"
    return None


def llama_permute_qk(w: NDArray[Any], n_head: int) -> NDArray[Any]:
    """llama.cpp's row permutation of a Hugging Face q/k projection for NORM RoPE
    (convert_hf_to_gguf: reshape (n_head, 2, hd/2, K), swap axes 1 and 2)."""
    N = w.shape[0]
    return w.reshape(n_head, 2, N // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# ------------------------------------------------------------------ sources --

class Source:
    """A model's float tensors under their GGUF names, its hyper-parameters (``hp``), whether
    its head is the embedding table (``tied``) and the GGUF whose metadata holds the
    architecture and the tokenizer (``meta``). Open one with :func:`open_source`."""

    path: str
    hp: Dict[str, Any]
    tied: bool
    meta: GGUFFile

    def tensor(self, name: str) -> NDArray[np.float32]:
        """The float32 values of tensor ``name``."""
        raise NotImplementedError

    def type_of(self, name: str) -> str:
        """The stored type of tensor ``name`` (F32, F16, BF16 or a ggml quantized type)."""
        raise NotImplementedError

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        """{tensor name: shape} of every tensor."""
        raise NotImplementedError

    def float_names(self) -> List[str]:
        """The tensors that stay float in every weight path: 1-D ones (norms) and the embedding table."""
        return [n for n, s in self.shapes().items() if len(s) == 1 or n == EMBEDDING]

    def tensor_name(self, linear: str) -> str:
        """The tensor holding the weight of linear layer ``linear``: a tied model's head
        ``output.weight`` is the embedding table."""
        return EMBEDDING if (linear == OUTPUT and self.tied) else linear

    def linear(self, name: str, scratch: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
        """The float32 (N, K) weight of linear layer ``name`` (see :meth:`tensor_name`). ``scratch``: a
        writeable C-contiguous float32 array of N * K elements the weight may be converted into (then
        the result views it, valid until the next use of the scratch); a source that holds the weight
        in place, or converts it otherwise, ignores it."""
        return self.tensor(self.tensor_name(name))

    def rows(self, name: str, ids: Union[slice, NDArray[Any]]) -> NDArray[np.float32]:
        """float32 rows ``ids`` (a slice or an index array) of the 2-D tensor ``name`` (a linear, by
        its linear name, or the embedding table): the values :meth:`linear` / :meth:`tensor` hold
        there, read without the whole tensor's float32 copy where the source can (a file's float
        types): the embedding rows of calibration tokens, a large head in blocks of rows."""
        t = self.linear(name) if name != EMBEDDING else self.tensor(name)
        return np.ascontiguousarray(t[ids], dtype=np.float32)

    def linear_stored(self, name: str) -> Optional[NDArray[np.float16]]:
        """The weight of linear ``name`` as the file stores it, when that is float16: a read-only
        (N, K) view of the mapped file, which :func:`orkpy.quantize` takes as is (each row converted
        on its threads; byte for byte the float32 weight's result, without the float32 copy). None
        when the weight is stored otherwise or this source computes it (then use :meth:`linear`)."""
        return None

    def check_finite(self, names: Iterable[str]) -> None:
        """FormatError naming the file and the tensor when one of ``names`` holds a NaN or an
        infinity (every read checks too: this reads them now, e.g. the float tensors before any
        linear is rounded)."""
        for n in names:
            self.tensor(n)

    def release(self, caches: bool = True) -> None:
        """Drop what reading tensors left in memory -- the resident pages of mapped files and, with
        ``caches``, cached conversions -- so that a tensor-by-tensor reader holds about one tensor
        at a time; later reads still work. Arrays returned before stay valid."""

    def sha256(self) -> str:
        """SHA-256 of the source file (of a checkpoint folder: over its files' names and hashes)."""
        return sha256_file(self.path) if os.path.isfile(self.path) else sha256_dir(self.path)

    def split_tier_map(self, tm: TierMap) -> TierMap:
        """``tm`` with entries for fused tensors (a map made from a GGUF that stores e.g. phi3's
        ``attn_qkv``) replaced by entries for the parts this source presents
        (:func:`orkpy.formats.arch.split_tier_map`: each part gets the fused tensor's tier and type)."""
        return _arch.split_tier_map(tm, self.hp)


class GGUFSource(Source):
    """Float tensors and metadata of a GGUF file."""

    def __init__(self, path: StrPath, g: Optional[GGUFFile] = None) -> None:
        """``g``: the file, already open (``path`` then names it)."""
        self.path = os.fspath(path)
        self.g = GGUFFile(self.path) if g is None else g
        self.hp = hparams(self.g)
        self.tied = OUTPUT not in self.g
        self.meta = self.g
        file_shapes = {t.name: t.shape for t in self.g.tensors}
        self._splits = _arch.splits(self.hp, file_shapes)  # part name -> (fused tensor, row0, row1)
        self._shapes = _arch.split_shapes(file_shapes, self._splits)
        self._emb: Optional[NDArray[np.float32]] = None   # a dequantized embedding table, read once
        self._last: Tuple[str, Optional[NDArray[np.float32]]] = ("", None)  # the last fused tensor read
        self._finite: Set[str] = set()   # the file's tensors found finite (each scanned once)

    def _checked(self, name: str, a: NDArray[Any], at: Optional[int] = None) -> NDArray[Any]:
        """``a``, the values of the file's tensor ``name``, once they are known to be finite
        (:func:`check_finite`, ``at`` as there; on the first read only: the file cannot change
        unnoticed, every read checks it)."""
        if name not in self._finite:
            check_finite(a, self.path, name, at=at)
            self.g.check()   # a mapped tensor was read in place: the file must not have changed meanwhile
            self._finite.add(name)
        return a

    def _dequantized(self, name: str, out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
        """A tensor stored in another type than F32 as float32, its finiteness checked as it is
        written (a separate pass over a dequantized table would cost a third of the dequantization)."""
        if name in self._finite:
            return self.g.tensor(name, out=out)
        a, bad = self.g.tensor_checked(name, out=out)
        return self._checked(name, a, bad)

    def _float(self, name: str) -> NDArray[np.float32]:
        if self.g.tensor_info(name).type == "F32":   # in place: one scan of the mapped values
            return self._checked(name, float_tensor(self.g, name))
        return self._dequantized(name)

    def _file_tensor(self, name: str) -> NDArray[np.float32]:
        """A tensor of the file as float32; a dequantized embedding table is kept (a tied head and
        the lookup share it), and the last fused tensor (its parts are read one after another)."""
        if name == EMBEDDING:
            if self._emb is None:
                a = self._float(name)
                if self.g.tensor_info(name).type == "F32":
                    return a
                self._emb = a
            return self._emb
        if self._last[0] == name and self._last[1] is not None:
            return self._last[1]
        a = self._float(name)
        self._last = (name, a)
        return a

    def type_of(self, name: str) -> str:
        return self.g.tensor_info(self._splits[name][0] if name in self._splits else name).type

    def release(self, caches: bool = True) -> None:
        if caches:
            self._emb = None
            self._last = ("", None)
        self.g.release()

    def linear_stored(self, name: str) -> Optional[NDArray[np.float16]]:
        tn = self.tensor_name(name)
        if tn in self._splits or tn not in self._shapes or len(self._shapes[tn]) != 2:
            return None
        t = self.g.tensor_info(tn)
        if t.type != "F16":
            return None
        return self._checked(tn, self.g.raw(tn).view(np.float16).reshape(t.shape))

    def rows(self, name: str, ids: Union[slice, NDArray[Any]]) -> NDArray[np.float32]:
        tn = self.tensor_name(name) if name != EMBEDDING else name
        t = self.g.tensor_info(tn) if (tn in self._shapes and tn not in self._splits) else None
        if t is None or len(t.shape) != 2 or t.type not in ("F16", "BF16", "F32"):
            return super().rows(name, ids)
        raw = self.g.raw(tn)
        if t.type == "F32":
            a = np.array(raw.view(np.float32).reshape(t.shape)[ids], np.float32)
        elif t.type == "F16":
            a = raw.view(np.float16).reshape(t.shape)[ids].astype(np.float32)
        else:  # BF16: the high half of a float32
            a = (raw.view(np.uint16).reshape(t.shape)[ids].astype(np.uint32) << 16).view(np.float32)
        if tn not in self._finite:
            check_finite(a, self.path, tn)
        self.g.check()  # read in place: the file must not have changed meanwhile
        return np.ascontiguousarray(a)

    def linear(self, name: str, scratch: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
        tn = self.tensor_name(name)
        if (scratch is not None and tn != EMBEDDING and tn not in self._splits and tn in self._shapes
                and self.g.tensor_info(tn).type != "F32"):
            return self._dequantized(tn, out=scratch)
        return self.tensor(tn)

    def tensor(self, name: str) -> NDArray[np.float32]:
        if name in self._splits:
            fused, r0, r1 = self._splits[name]
            return self._file_tensor(fused)[r0:r1]
        if name not in self._shapes:
            raise KeyError(f"{self.path}: no tensor named {name!r}")
        return self._float(name) if name != EMBEDDING else self._file_tensor(name)

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return dict(self._shapes)


class SafetensorsSource(Source):
    """A Hugging Face checkpoint (Llama / Qwen2 / Qwen3 names, :data:`HF_ARCHS`) as a source; the architecture's
    hyper-parameters and the tokenizer come from ``meta``, a GGUF of the same model whose
    tensor data is not used. Every tensor ``meta`` lists must be in the checkpoint, with its shape."""

    def __init__(self, path: StrPath, meta: GGUFFile) -> None:
        from .safetensors import load_safetensors

        self.path = os.fspath(path)
        st = load_safetensors(self.path)
        self.meta = meta
        self.hp = hparams(meta)
        if self.hp["arch"] not in HF_ARCHS:
            raise NotImplementedError(f"{self.path}: safetensors checkpoints of architecture {self.hp['arch']!r} "
                                      f"are not read (only {', '.join(HF_ARCHS)}); convert it with llama.cpp's "
                                      "convert_hf_to_gguf.py and load the GGUF")
        self.arrays: Dict[str, NDArray[Any]] = {}
        self._hf_name: Dict[str, str] = {}
        for k, v in st.items():
            gname = hf_to_gguf_name(k)
            if gname is None:
                raise ValueError(f"{self.path}: tensor {k!r} is not a Llama/Qwen2/Qwen3 tensor orkpy knows")
            if self.hp["arch"] == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight", "attn_q.bias",
                                                               "attn_k.bias")):
                nh = self.hp["n_head"] if ".attn_q." in gname else self.hp["n_head_kv"]
                v = llama_permute_qk(np.asarray(v), nh)
            self.arrays[gname] = v
            self._hf_name[gname] = k
        st.check()  # the permuted copies above read the mapping
        self._finite: Set[str] = set()   # tensors found finite (each scanned once)
        self.tied = OUTPUT not in self.arrays
        for t in meta.tensors:
            if t.name not in self.arrays:
                raise ValueError(f"{self.path}: no tensor for {t.name!r} (the allocation file is for another model?)")
            if tuple(self.arrays[t.name].shape) != t.shape:
                raise ValueError(f"{self.path}: {t.name} has shape {self.arrays[t.name].shape}, the allocation "
                                 f"file says {t.shape}: it is for a different model")

    def release(self, caches: bool = True) -> None:
        from .._mapped import maps_of
        for m in maps_of(*self.arrays.values()):  # the checkpoint's files (permuted q/k are copies)
            m.release()

    def type_of(self, name: str) -> str:
        return {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}.get(self.arrays[name].dtype, "BF16")

    def tensor(self, name: str) -> NDArray[np.float32]:
        a = np.ascontiguousarray(self.arrays[name], dtype=np.float32)
        if name not in self._finite:
            check_finite(a, self.path, name, self._hf_name.get(name))
            from .._mapped import check, maps_of
            check(maps_of(a, self.arrays[name]))   # read in place (F32): the file must not have changed meanwhile
            self._finite.add(name)
        return a

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {n: tuple(a.shape) for n, a in self.arrays.items()}


def is_safetensors(path: StrPath) -> bool:
    """Whether ``path`` names a safetensors checkpoint: a ``.safetensors`` file, a ``*.json``
    shard index, or a folder holding ``model.safetensors`` or ``model.safetensors.index.json``."""
    from .safetensors import INDEX_FILE, MODEL_FILE

    p = os.fspath(path)
    if os.path.isdir(p):
        return os.path.isfile(os.path.join(p, MODEL_FILE)) or os.path.isfile(os.path.join(p, INDEX_FILE))
    return p.endswith((".safetensors", ".json"))


def open_source(path: StrPath, meta: Union[GGUFFile, StrPath, None] = None) -> Source:
    """A :class:`Source`: a safetensors checkpoint (:func:`is_safetensors`; needs ``meta``, a GGUF
    of the same model, for the hyper-parameters and the tokenizer; a folder is read as one) or
    else a GGUF file."""
    if not (os.path.isdir(path) or is_safetensors(path)):
        return GGUFSource(path)
    if meta is None or not (isinstance(meta, GGUFFile) or os.fspath(meta).endswith(".gguf")):
        raise ValueError(f"{os.fspath(path)}: a safetensors source needs a GGUF of the same model (the allocation "
                         "file, or meta= for load_model) for the hyper-parameters and the tokenizer")
    return SafetensorsSource(path, meta if isinstance(meta, GGUFFile) else GGUFFile(meta))


# -------------------------------------------------------------- allocations --

@dataclass(frozen=True)
class Allocation:
    """A tier map and where it came from: ``kind`` "tiermap" (given as an object), "gguf" (a
    llama.cpp mixed GGUF's types) or "emit-map" (a file), ``path`` (None for "tiermap")."""

    tiers: TierMap
    kind: str
    path: Optional[str]
    threshold: float

    @property
    def gguf(self) -> Optional[str]:
        """The allocation GGUF's path (it can supply a safetensors source's metadata), else None."""
        return self.path if self.kind == "gguf" else None

    def info(self) -> Dict[str, Any]:
        """What a model directory's manifest records about the allocation (files are hashed)."""
        if self.path is None:
            return {"kind": "tiermap", "source": self.tiers.source, "threshold": self.tiers.threshold}
        return {"kind": self.kind, "file": os.path.basename(self.path), "sha256": sha256_file(self.path),
                "threshold": self.threshold}


def read_allocation(alloc: Union[TierMap, StrPath], threshold: float = 5.0, fallback: str = "infer") -> Allocation:
    """The tier map of ``alloc``: a TierMap as given, a ``.gguf`` file's types at ``threshold``
    bits per weight (:func:`~orkpy.tier_map`; ``fallback``: llama.cpp's fallback types read as the
    intended types, or ``"literal"``), or any other file as an emit-map
    (:meth:`~orkpy.TierMap.load`, whose own threshold it keeps)."""
    if isinstance(alloc, TierMap):
        return Allocation(alloc, "tiermap", None, alloc.threshold)
    path = os.fspath(alloc)
    if path.endswith(".gguf"):
        return Allocation(tier_map(path, threshold=threshold, fallback=fallback), "gguf", path, threshold)
    tm = TierMap.load(path)
    return Allocation(tm, "emit-map", path, tm.threshold)


__all__ = ["FLOAT_TYPES", "Allocation", "GGUFSource", "SafetensorsSource", "Source", "check_finite", "float_tensor",
           "hf_to_gguf_name",
           "hparams", "is_safetensors", "llama_permute_qk", "open_source", "read_allocation"]
