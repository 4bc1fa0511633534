"""Calibration and whole-model quantization.

The product's workflow: the fp16 source supplies the weights, a llama.cpp
mixed GGUF supplies only the allocation (its per-tensor types -> int8 / int4
tiers; its quantized bytes are never used), an importance matrix gathered in
the forward pass chooses the scales, and the result is persisted, reloaded and
gated by perplexity.

- ``collect_imatrix(model, text_or_tokens, n_ctx=512, chunks=None)``: sum of
  squared input activations per input channel of every linear, accumulated
  inside the C forward pass (llama.cpp's ``in_sum2`` / ``counts``; every token
  of every chunk counts; the first token of a chunk is BOS when the vocabulary
  adds one; the head is left out, as llama-imatrix does by default).
- ``quantize_model(source, alloc, imatrix=None, kind="nf4", ...)``: the source
  is an F32/F16/BF16 GGUF or a Hugging Face safetensors checkpoint (Llama /
  Qwen3 tensor names; llama's q/k rows are permuted as llama.cpp's converter
  does; the architecture and tokenizer then come from the allocation GGUF,
  whose tensor data is never used). int8-tier
  linears -> per-channel int8, int4-tier linears -> NF4 (or uniform int4), both
  with imatrix-chosen scales; embeddings and norms stay float.
- ``QuantizedModel.save(dir)``: ``manifest.json`` (tensor -> tier, kind, file,
  sha256; source / allocation / imatrix hashes; settings), one O4N1/O8N1 blob
  per linear, and ``float.gguf`` (the source's metadata, embeddings, norms),
  written to a temporary directory and renamed into place.
  ``orkpy.load_model(dir)`` verifies every checksum and refuses a mismatch.
"""
from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import sys
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from ._core import FormatError
from ._io import atomic_write, fsync_dir, progress_bar, temp_sibling
from ._mapped import check as check_maps
from ._mapped import maps_of
from ._typing import StrPath
from .gguf import GGUFFile
from .model import LINEARS, LinearSpec, Model, _assemble, _float_tensor, _hparams, linear_names
from .packed import PackedWeight, load_packed, pack, save_packed
from .quant import quantize
from .tiermap import TierMap, tier_map

if TYPE_CHECKING:
    from .imatrix import Imatrix

MANIFEST = "manifest.json"
FORMAT = "orkpy-quantized-model"
VERSION = 1
_FLOAT_SOURCE = {"F32", "F16", "BF16"}


def sha256_file(path: StrPath, bufsize: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(bufsize)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def _dir_hash(path: str) -> str:
    """sha256 over the sorted (name, sha256) of a checkpoint directory's files"""
    h = hashlib.sha256()
    for fn in sorted(os.listdir(path)):
        fp = os.path.join(path, fn)
        if os.path.isfile(fp):
            h.update(fn.encode() + b"\0" + sha256_file(fp).encode())
    return h.hexdigest()


def _as_model(model: Union[Model, QuantizedModel]) -> Model:
    if isinstance(model, QuantizedModel):
        return model.to_model()
    if not isinstance(model, Model):
        raise TypeError(f"expected an orkpy.Model or QuantizedModel, got {type(model).__name__}")
    return model


# ---------------------------------------------------------------- imatrix --

def calibration_chunks(model: Model, tokens: Union[Sequence[int], NDArray[Any]], n_ctx: int,
                       chunks: Optional[int] = None) -> Tuple[int, Iterator[NDArray[np.int32]]]:
    """(count, iterator) over the non-overlapping n_ctx-token chunks of
    ``tokens`` (at most ``chunks``), the first token of each replaced by BOS
    when the vocabulary adds one -- llama.cpp's convention for imatrix and
    perplexity runs. Every token of a chunk is used."""
    if not isinstance(n_ctx, int) or isinstance(n_ctx, bool) or n_ctx < 2:
        raise ValueError(f"n_ctx must be an int >= 2, got {n_ctx!r}")
    n_chunk = len(tokens) // n_ctx
    if chunks is not None:
        if not isinstance(chunks, int) or isinstance(chunks, bool) or chunks < 1:
            raise ValueError(f"chunks must be a positive int, got {chunks!r}")
        n_chunk = min(n_chunk, chunks)
    if n_chunk < 1:
        raise ValueError(f"need at least n_ctx = {n_ctx} tokens, got {len(tokens)}")
    bos = model.tokenizer.bos_id if model.tokenizer.add_bos else None

    def it() -> Iterator[NDArray[np.int32]]:
        for c in range(n_chunk):
            chunk = np.array(tokens[c * n_ctx:(c + 1) * n_ctx], dtype=np.int32)
            if bos is not None:
                chunk[0] = bos
            yield chunk
    return n_chunk, it()


def collect_imatrix(model: Union[Model, QuantizedModel], text_or_tokens: Union[str, ArrayLike], n_ctx: int = 512,
                    chunks: Optional[int] = None, threads: Optional[int] = None, progress: bool = True) -> Imatrix:
    """Importance matrix of every linear weight (except the head) on a text."""
    from .imatrix import Imatrix
    from .ppl import tokens_for_ppl

    model = _as_model(model)
    tokens = tokens_for_ppl(model, text_or_tokens)
    n_chunk, chunk_iter = calibration_chunks(model, tokens, n_ctx, chunks)
    fwd = model._fwd
    fwd.imatrix_enable()
    bar = progress_bar(n_chunk, "imatrix", progress, "chunk")
    try:
        for chunk in chunk_iter:
            fwd.forward(chunk, n_ctx - 1, 0 if threads is None else int(threads))
            if bar is not None:
                bar.update(1)
    finally:
        stats = fwd.imatrix_take()
        if bar is not None:
            bar.close()
    names = [f"blk.{i}.{t}.weight" for i in range(model.hparams["n_layer"]) for t in LINEARS]
    im = Imatrix()
    for name, (sums, count) in zip(names, stats[:-1]):  # the head (last) is left out
        im.add(name, sums, int(count))
    im.chunks = n_chunk
    im.chunk_size = n_ctx
    return im


# ---------------------------------------------------------------- sources --

_HF_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def hf_to_gguf_name(name: str) -> Optional[str]:
    """Hugging Face Llama/Qwen3 tensor name -> llama.cpp's GGUF name (None if unknown)."""
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if name in top:
        return top[name]
    parts = name.split(".")
    if len(parts) >= 5 and parts[0] == "model" and parts[1] == "layers" and parts[-1] == "weight":
        key = ".".join(parts[3:-1])
        if key in _HF_NAMES:
            return f"blk.{parts[2]}.{_HF_NAMES[key]}.weight"
    return None


def llama_permute_qk(w: NDArray[Any], n_head: int) -> NDArray[Any]:
    """llama.cpp's row permutation of a Hugging Face q/k projection for NORM RoPE
    (convert_hf_to_gguf: reshape (n_head, 2, hd/2, K), swap axes 1 and 2)."""
    N = w.shape[0]
    return w.reshape(n_head, 2, N // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class _GGUFSource:
    """Float tensors and metadata of a GGUF source."""

    def __init__(self, path: StrPath) -> None:
        self.path = os.fspath(path)
        self.g = GGUFFile(self.path)
        self.hp = _hparams(self.g)
        self.tied = "output.weight" not in self.g
        self.meta = self.g

    def type_of(self, name: str) -> str:
        return self.g.tensor_info(name).type

    def tensor(self, name: str) -> NDArray[np.float32]:
        return _float_tensor(self.g, name)

    def float_names(self) -> List[str]:
        return [t.name for t in self.g.tensors if len(t.shape) == 1 or t.name == "token_embd.weight"]

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {t.name: t.shape for t in self.g.tensors}


class _SafetensorsSource:
    """A Hugging Face checkpoint (Llama / Qwen3 names) as a source; the
    architecture's hyper-parameters and the tokenizer come from a GGUF of the
    same model (the allocation file), whose tensor data is not used."""

    def __init__(self, path: StrPath, meta_gguf: GGUFFile) -> None:
        from .safetensors import load_safetensors

        self.path = os.fspath(path)
        st = load_safetensors(self.path)
        self.meta = meta_gguf
        self.hp = _hparams(meta_gguf)
        self.arrays: Dict[str, NDArray[Any]] = {}
        for k, v in st.items():
            gname = hf_to_gguf_name(k)
            if gname is None:
                raise ValueError(f"{self.path}: tensor {k!r} is not a Llama/Qwen3 weight orkpy knows")
            if self.hp["arch"] == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
                nh = self.hp["n_head"] if gname.endswith("attn_q.weight") else self.hp["n_head_kv"]
                v = llama_permute_qk(np.asarray(v), nh)
            self.arrays[gname] = v
        st.check()  # the permuted copies above read the mapping
        self.tied = "output.weight" not in self.arrays
        for t in meta_gguf.tensors:
            if t.name not in self.arrays:
                raise ValueError(f"{self.path}: no tensor for {t.name!r} (the allocation file is for another model?)")
            if tuple(self.arrays[t.name].shape) != t.shape:
                raise ValueError(f"{self.path}: {t.name} has shape {self.arrays[t.name].shape}, the allocation "
                                 f"file says {t.shape}: it is for a different model")

    def type_of(self, name: str) -> str:
        return {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}.get(self.arrays[name].dtype, "BF16")

    def tensor(self, name: str) -> NDArray[np.float32]:
        return np.ascontiguousarray(self.arrays[name], dtype=np.float32)

    def float_names(self) -> List[str]:
        return [n for n, a in self.arrays.items() if a.ndim == 1 or n == "token_embd.weight"]

    def shapes(self) -> Dict[str, Tuple[int, ...]]:
        return {n: tuple(a.shape) for n, a in self.arrays.items()}


_Source = Union[_GGUFSource, _SafetensorsSource]


def _open_source(source: StrPath, alloc_path: Optional[StrPath]) -> _Source:
    source = os.fspath(source)
    if source.endswith(".gguf"):
        return _GGUFSource(source)
    if alloc_path is None or not str(alloc_path).endswith(".gguf"):
        raise ValueError("a safetensors source needs a GGUF of the same model as the allocation (it supplies "
                         "the hyper-parameters and the tokenizer)")
    return _SafetensorsSource(source, GGUFFile(alloc_path))


# ------------------------------------------------------ whole-model quant --

class QuantizedModel:
    """Linear weights quantized per tier (``tensors``: name -> PackedWeight), the
    float source they came from, and the settings; ``save``, ``to_model``."""

    def __init__(self, source: str, tensors: Dict[str, PackedWeight], tiers: Dict[str, str], settings: Dict[str, Any],
                 hashes: Dict[str, Any], double_quant: bool, src: Optional[_Source] = None) -> None:
        self.source = source
        self._src = src if src is not None else _GGUFSource(source)
        self.tensors = tensors
        self.tiers = tiers
        self.settings = settings
        self.hashes = hashes
        self.double_quant = double_quant
        self._models: Dict[str, Model] = {}

    def result_bytes(self) -> Dict[str, int]:
        out = {"int8": 0, "int4": 0}
        for name, pw in self.tensors.items():
            out["int8" if pw.kind == "int8" else "int4"] += pw.nbytes
        return out

    def int8_share(self) -> float:
        """The int8 share of weight storage: int8 bytes / (int8 + int4 bytes) of the
        packed linear weights (``PackedWeight.nbytes``); ``TierMap.int8_share()``
        gives the same figure for the allocation."""
        b = self.result_bytes()
        t = b["int8"] + b["int4"]
        return b["int8"] / t if t else 0.0

    def to_model(self, act: str = "per_token") -> Model:
        """A Model running the packed weights (cached per activation mode)."""
        if act not in ("per_token", "per_tensor"):
            raise ValueError(f"act must be 'per_token' or 'per_tensor', got {act!r}")
        if act not in self._models:
            src = self._src
            pt = act == "per_tensor"

            def spec_of(name: str) -> LinearSpec:
                pw = self.tensors[name]
                return ("packed", pw.kind, pw.store, pw.bscale, pw.N, pw.K, pt)
            paths = {n: pw.kind for n, pw in self.tensors.items()}
            specs: Dict[str, LinearSpec] = {}
            self._models[act] = Model(self.source, src.hp, paths,
                                      _assemble(None, src.hp, spec_of, src.tensor, record=specs), src.meta, src.tied,
                                      specs)
        return self._models[act]

    def save(self, path: StrPath, overwrite: bool = False) -> str:
        """Write the model directory atomically (temp dir + rename)."""
        from .gguf_write import metadata_triples, write_gguf

        path = os.path.abspath(os.fspath(path))
        if os.path.lexists(path):
            if not overwrite:
                raise FileExistsError(f"{path} exists (pass overwrite=True to replace it)")
            _check_replaceable(path)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        while True:  # a temp folder of our own: concurrent saves to one path never share one
            tmp = temp_sibling(path)
            try:
                os.mkdir(tmp)
                break
            except FileExistsError:
                continue
        try:
            entries = {}
            for name, pw in self.tensors.items():
                fn = name + (".o8n1" if pw.kind == "int8" else ".o4n1")
                save_packed(pw, os.path.join(tmp, fn))
                entries[name] = {"tier": self.tiers[name], "kind": pw.kind, "file": fn, "shape": list(pw.shape),
                                 "sha256": sha256_file(os.path.join(tmp, fn))}
            src = self._src
            floats, read = [], []
            for name in src.float_names():
                a = src.tensor(name)
                read.append(a)
                floats.append((name, a.astype(np.float16) if src.type_of(name) == "F16" else np.asarray(a, np.float32)))
            write_gguf(os.path.join(tmp, "float.gguf"), metadata_triples(src.meta), floats)
            check_maps(maps_of(*read))  # no float.gguf from a source that changed while it was read
            manifest = {
                "format": FORMAT, "version": VERSION,
                "source": {"file": os.path.basename(self.source), "sha256": self.hashes["source"]},
                "alloc": self.hashes["alloc"],
                "imatrix": self.hashes["imatrix"],
                "double_quant": self.double_quant,
                "settings": self.settings,
                "float_file": {"file": "float.gguf", "sha256": sha256_file(os.path.join(tmp, "float.gguf"))},
                "int8_share": self.int8_share(),
                "tensors": entries,
            }
            atomic_write(os.path.join(tmp, MANIFEST), [json.dumps(manifest, indent=1, sort_keys=True).encode()])
            _install_dir(tmp, path, overwrite)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return path

    def __repr__(self) -> str:
        return (f"QuantizedModel({os.path.basename(self.source)!r}, {len(self.tensors)} linears, "
                f"int8 share {self.int8_share():.1%}{', DOUBLE-QUANT' if self.double_quant else ''})")


def _check_replaceable(path: str) -> None:
    """Refuse, before any work, to replace what is not a model directory: a file, a
    symbolic link, or a non-empty folder without a manifest. (One open folder is
    inspected, so a concurrent saver swapping ``path`` cannot confuse the check.)"""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return  # moved away meanwhile: nothing to replace
    except OSError as e:
        if e.errno not in (errno.ENOTDIR, errno.ELOOP):
            raise
        kind = "a symbolic link" if os.path.islink(path) else "not a directory"
        raise NotADirectoryError(f"{path}: exists and is {kind}; a model is saved as a directory of its own, "
                                 "remove it or choose another path") from None
    try:
        names = os.listdir(fd)
    finally:
        os.close(fd)
    if names and MANIFEST not in names:
        raise FileExistsError(f"{path}: a non-empty directory without {MANIFEST} (not an orkpy model "
                              "directory): refusing to replace it")


def _exchange_dirs(a: str, b: str) -> bool:
    """Swap two existing paths in one atomic step (Linux renameat2 RENAME_EXCHANGE);
    False where the C library, kernel or file system cannot (the caller then moves
    ``b`` aside and renames, leaving a moment in which ``b`` is missing)."""
    global _renameat2
    if _renameat2 is None:
        try:
            import ctypes
            f = ctypes.CDLL(None, use_errno=True).renameat2
            f.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            _renameat2 = f
        except (OSError, AttributeError):
            _renameat2 = False
    if _renameat2 is False:
        return False
    import ctypes
    if _renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:  # AT_FDCWD, RENAME_EXCHANGE
        return True
    e = ctypes.get_errno()
    if e in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOENT):  # ENOENT: b moved away
        return False
    raise OSError(e, os.strerror(e), a, None, b)


_renameat2: Any = None


def _install_dir(tmp: str, path: str, overwrite: bool) -> None:
    """Rename the complete folder ``tmp`` to ``path``, moving an existing ``path``
    aside first (overwrite) and deleting it after; the last of concurrent savers
    wins. On an error the moved-aside original goes back when ``path`` is free,
    and nothing moved aside is left behind."""
    aside: List[str] = []
    try:
        while True:
            try:
                os.rename(tmp, path)
                break
            except OSError as e:
                if e.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                if not overwrite:
                    raise FileExistsError(f"{path} exists (pass overwrite=True to replace it)") from None
            _check_replaceable(path)  # another writer may have put something else there
            if _exchange_dirs(tmp, path):  # atomic: path is never missing, even after a kill -9
                aside.append(tmp)
                break
            old = temp_sibling(path)
            try:
                os.rename(path, old)
            except FileNotFoundError:  # another saver moved it first
                continue
            aside.append(old)
        fsync_dir(os.path.dirname(path))
    except BaseException:
        if aside and not os.path.lexists(path):
            try:
                os.rename(aside.pop(0), path)
            except OSError:
                pass
        raise
    finally:
        for old in aside:
            shutil.rmtree(old, ignore_errors=True)


def _alloc_map(alloc: Union[TierMap, StrPath], threshold: float) -> Tuple[TierMap, Dict[str, Any]]:
    if isinstance(alloc, TierMap):
        return alloc, {"kind": "tiermap", "source": alloc.source, "threshold": alloc.threshold}
    alloc = os.fspath(alloc)
    if alloc.endswith(".gguf"):
        return tier_map(alloc, threshold=threshold), {"kind": "gguf", "file": os.path.basename(alloc),
                                                      "sha256": sha256_file(alloc), "threshold": threshold}
    tm = TierMap.load(alloc)
    return tm, {"kind": "emit-map", "file": os.path.basename(alloc), "sha256": sha256_file(alloc),
                "threshold": tm.threshold}


def quantize_model(source: StrPath, alloc: Union[TierMap, StrPath], imatrix: Union[Imatrix, StrPath, None] = None,
                   kind: str = "nf4", sr: bool = False, seed: int = 0, threshold: float = 5.0,
                   threads: Optional[int] = None, progress: bool = True,
                   clip_grid: Union[Sequence[float], NDArray[Any], None] = None,
                   log: Optional[Callable[[str], None]] = None) -> QuantizedModel:
    """Quantize every linear of ``source`` (a GGUF; F32/F16/BF16 = the intended
    fp16 source, a quantized GGUF = the double-quant comparison) with the tiers
    of ``alloc`` (a TierMap, a mixed GGUF or an emit-map file)."""
    from .imatrix import Imatrix

    if kind not in ("nf4", "int4"):
        raise ValueError(f"kind must be 'nf4' or 'int4' (the int4 tier's codebook), got {kind!r}")
    if not (imatrix is None or isinstance(imatrix, Imatrix)):
        imatrix = Imatrix.load(imatrix)
    log = log if log is not None else (lambda msg: print(msg, file=sys.stderr))
    source = os.fspath(source)
    tm, alloc_info = _alloc_map(alloc, threshold)
    src = _open_source(source, None if isinstance(alloc, TierMap) else alloc)
    hp, tied = src.hp, src.tied
    names = linear_names(hp, tied)
    tm.check_fits(src.shapes(), os.path.basename(source), names, what="allocation")
    quantized_src = sorted({src.type_of("token_embd.weight" if (n == "output.weight" and tied) else n)
                            for n in names} - _FLOAT_SOURCE)
    double_quant = bool(quantized_src)
    if double_quant:
        log("!" * 78 + f"\n!! DOUBLE QUANT: the source {os.path.basename(source)} holds quantized tensors "
            f"({', '.join(quantized_src)}).\n!! They are dequantized and quantized AGAIN. This is the comparison "
            "configuration,\n!! not the product's path (fp16 is the source; a mixed GGUF only allocates).\n" + "!" * 78)
    tensors, tiers = {}, {}
    bar = progress_bar(len(names), "quantize", progress, "tensor")
    for name in names:
        src_name = "token_embd.weight" if (name == "output.weight" and tied) else name
        key = name if name in tm else ("token_embd.weight" if name == "output.weight" else name)
        if key not in tm:
            raise ValueError(f"allocation has no entry for {name!r}: is it for this model?")
        w = src.tensor(src_name)
        if tuple(tm.entries[key].shape) != tuple(w.shape):
            raise ValueError(f"allocation shape {tm.entries[key].shape} of {key!r} differs from the source's "
                             f"{w.shape}: the allocation file is for a different model")
        tier = tm[key]
        qkind = {"int8": "int8", "int4": kind}.get(tier)
        if qkind is None:
            raise ValueError(f"{name!r} has tier {tier!r}; linear layers must be int8 or int4")
        im = imatrix.values(name) if (imatrix is not None and name in imatrix) else None
        if im is not None and im.shape != (w.shape[1],):
            where = f"{imatrix.path}: " if imatrix is not None and imatrix.path else ""
            raise ValueError(f"{where}the imatrix entry for {name!r} has {im.size} values but the tensor has "
                             f"K = {w.shape[1]} input columns: the imatrix is for a different model")
        q = quantize(w, qkind, imatrix=im, sr=sr, seed=seed, clip_grid=clip_grid, threads=threads)
        tensors[name] = pack(q)
        tiers[name] = tier
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    settings = {"kind": kind, "sr": bool(sr), "seed": int(seed), "threshold": float(threshold),
                "clip_grid": None if clip_grid is None else [float(x) for x in clip_grid]}
    hashes = {"source": sha256_file(source) if os.path.isfile(source) else _dir_hash(source), "alloc": alloc_info,
              "imatrix": None if imatrix is None else {"sha256": imatrix.sha256(), "chunks": imatrix.chunks}}
    qm = QuantizedModel(source, tensors, tiers, settings, hashes, double_quant, src)
    log(f"quantized {len(tensors)} linears of {os.path.basename(source)}: int8 share of weight storage "
        f"{qm.int8_share():.1%}")
    return qm


MANIFEST_MAX = 64 << 20


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _check_informational(manifest: Dict[str, Any], mpath: str) -> None:
    """Type-check the fields the loader does not use but reports (``Model.manifest``)."""
    def bad(key: str, want: str) -> FormatError:
        return FormatError(f"{mpath}: {key!r} must be {want}, got {manifest.get(key)!r:.80}")
    for key in ("source", "alloc", "settings"):
        if not isinstance(manifest.get(key), dict):
            raise bad(key, "a JSON object")
    src = manifest["source"]
    if not (isinstance(src.get("file"), str) and isinstance(src.get("sha256"), str)):
        raise bad("source", "{file: string, sha256: string}")
    im = manifest.get("imatrix")
    if im is not None and not (isinstance(im, dict) and isinstance(im.get("sha256"), str)
                               and type(im.get("chunks")) is int):
        raise bad("imatrix", "null or {sha256: string, chunks: int}")
    if not isinstance(manifest.get("double_quant"), bool):
        raise bad("double_quant", "true or false")
    share = manifest.get("int8_share")
    if not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 <= share <= 1:
        raise bad("int8_share", "a number in [0, 1]")
    for name, e in manifest["tensors"].items():
        if e.get("tier") not in ("int8", "int4"):
            raise FormatError(f"{mpath}: tensor {name!r} tier {e.get('tier')!r} is not 'int8' or 'int4'")


def load_quantized(path: StrPath, act: str = "per_token") -> Model:
    """A Model from a saved QuantizedModel directory; every checksum is verified."""
    path = os.fspath(path)
    mpath = os.path.join(path, MANIFEST)
    try:
        st = os.stat(mpath)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MANIFEST_MAX:  # a FIFO would block open()
            raise FormatError(f"{mpath}: not a regular file of at most {MANIFEST_MAX >> 20} MiB")
        with open(mpath, "rb") as f:
            raw = f.read(MANIFEST_MAX + 1)
    except FileNotFoundError:
        raise FormatError(f"{path}: no {MANIFEST}: not an orkpy quantized model directory") from None
    except OSError as e:  # a directory named manifest.json, no permission, path not a directory ...
        raise FormatError(f"{mpath}: cannot read the manifest ({e.strerror or e})") from None
    try:
        manifest = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError) as e:  # bad UTF-8 / JSON, an integer too long, nesting too deep
        raise FormatError(f"{mpath}: not valid JSON ({type(e).__name__}: {str(e)[:200]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise FormatError(f"{mpath}: not an orkpy quantized model manifest")
    version = manifest.get("version")
    if type(version) is not int or version != VERSION:  # not true, not 1.0
        raise FormatError(f"{mpath}: unsupported manifest version {version!r}")

    def field(obj: Any, key: str, typ: type, where: str) -> Any:
        v = obj.get(key)
        if not isinstance(v, typ) or isinstance(v, bool):
            raise FormatError(f"{mpath}: {where}{key!r} is missing or not a JSON {typ.__name__}")
        return v
    entries = field(manifest, "tensors", dict, "")
    float_file = field(manifest, "float_file", dict, "")
    files = [(field(float_file, "file", str, "float_file "), field(float_file, "sha256", str, "float_file "))]
    for name, ent in entries.items():
        where = f"tensor {name!r} "
        if not isinstance(ent, dict):
            raise FormatError(f"{mpath}: {where}entry is not a JSON object")
        shape = field(ent, "shape", list, where)
        if len(shape) != 2 or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise FormatError(f"{mpath}: {where}shape {shape!r} is not two integers")
        field(ent, "kind", str, where)
        files.append((field(ent, "file", str, where), field(ent, "sha256", str, where)))
    _check_informational(manifest, mpath)
    root = os.path.realpath(path)
    for fn, digest in files:
        if not isinstance(fn, str) or os.path.basename(fn) != fn or fn in ("", ".", ".."):
            raise FormatError(f"{mpath}: bad file name {fn!r}")
        fp = os.path.join(path, fn)
        if not os.path.isfile(fp):
            raise FormatError(f"{path}: {fn} is missing or not a regular file")
        if os.path.commonpath([root, os.path.realpath(fp)]) != root:  # links may point only within the folder
            raise FormatError(f"{path}: {fn} is a symbolic link to {os.path.realpath(fp)}, outside the model "
                              "directory")
        if sha256_file(fp) != digest:
            raise FormatError(f"{path}: checksum mismatch for {fn}: the file was changed or damaged")
    g = GGUFFile(os.path.join(path, float_file["file"]))
    hp = _hparams(g)
    names = linear_names(hp, "output.weight" not in g)
    missing = [n for n in names if n not in entries]
    if missing:
        raise FormatError(f"{mpath}: no entry for {missing[0]!r}")
    pt = act == "per_tensor"
    packed = {}
    for n in names:
        pw = load_packed(os.path.join(path, entries[n]["file"]))
        if list(pw.shape) != list(entries[n]["shape"]) or pw.kind != entries[n]["kind"]:
            raise FormatError(f"{path}: {entries[n]['file']} does not match its manifest entry")
        packed[n] = pw

    def spec_of(name: str) -> LinearSpec:
        pw = packed[name]
        return ("packed", pw.kind, pw.store, pw.bscale, pw.N, pw.K, pt)
    paths = {n: packed[n].kind for n in names}
    specs: Dict[str, LinearSpec] = {}
    m = Model(path, hp, paths, _assemble(g, hp, spec_of, record=specs), g, "output.weight" not in g, specs)
    m.manifest = manifest
    return m


__all__ = ["QuantizedModel", "collect_imatrix", "load_quantized", "quantize_model", "sha256_file",
           "PackedWeight"]
