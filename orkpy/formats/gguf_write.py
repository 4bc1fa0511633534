"""GGUF v3 writer (pure Python/NumPy) for float tensors.

``write_gguf(path, metadata, tensors, alignment=32)`` writes a little-endian
GGUF v3 file that orkpy's strict reader, llama.cpp and gguf-py accept:

- ``metadata``: a list of ``(key, type_name, value)`` triples, in file order;
  type names are the ones :attr:`orkpy.GGUFFile.metadata_types` gives
  (``"UINT8" "INT8" "UINT16" "INT16" "UINT32" "INT32" "FLOAT32" "BOOL"
  "STRING" "ARRAY" "UINT64" "INT64" "FLOAT64"``). An ``"ARRAY"`` value is a
  1-D NumPy array (element type from its dtype), a list of ``str`` (STRING
  elements; an empty list is written as an empty STRING array) or a list of
  such arrays/lists (a nested ARRAY).
- ``tensors``: a list of ``(name, ndarray)``; float32 -> ggml F32, float16 ->
  F16; NumPy shape order (ggml ``ne`` is the shape reversed).

Tensor data is aligned and padded to ``alignment`` (the file ends padded too,
as ggml's writer does). If ``alignment`` is not 32 the file records it as
``general.alignment`` (UINT32, appended unless the metadata already has it,
in which case it must agree). The file is written atomically, tensors streamed
chunk by chunk. Bad input raises ``TypeError`` (wrong Python/NumPy type) or
``ValueError`` (bad value, duplicate, out of range) naming the problem.

``metadata_triples(gguf_file)`` returns an existing file's metadata as such
triples (file order), so a writer can copy a source model's metadata.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from .._io import atomic_write
from .._typing import StrPath

if TYPE_CHECKING:
    from .gguf import GGUFFile

__all__ = ["LazyTensor", "write_gguf", "metadata_triples", "VALUE_TYPES", "GGUF_MAX_NAME", "GGUF_DEFAULT_ALIGNMENT"]

#: GGUF metadata value type names, indexed by their type id.
VALUE_TYPES = ("UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
               "UINT64", "INT64", "FLOAT64")
_TYPE_ID = {n: i for i, n in enumerate(VALUE_TYPES)}

GGUF_MAGIC = b"GGUF"
GGUF_VERSION = 3
GGUF_DEFAULT_ALIGNMENT = 32
#: tensor names must be shorter than this many bytes (ggml GGML_MAX_NAME)
GGUF_MAX_NAME = 64
_MAX_KEY_BYTES = 65535
_MAX_ARRAY_DEPTH = 4  # orkpy's reader: arrays nest at most this deep (ORK_GGUF_MAX_DEPTH)

_INT_RANGES = {
    "UINT8": (0, 2**8 - 1), "INT8": (-2**7, 2**7 - 1),
    "UINT16": (0, 2**16 - 1), "INT16": (-2**15, 2**15 - 1),
    "UINT32": (0, 2**32 - 1), "INT32": (-2**31, 2**31 - 1),
    "UINT64": (0, 2**64 - 1), "INT64": (-2**63, 2**63 - 1),
}
_STRUCT = {"UINT8": "<B", "INT8": "<b", "UINT16": "<H", "INT16": "<h", "UINT32": "<I", "INT32": "<i",
           "FLOAT32": "<f", "BOOL": "<B", "UINT64": "<Q", "INT64": "<q", "FLOAT64": "<d"}
# (dtype kind, itemsize) -> GGUF element type, for ARRAY values given as NumPy arrays
_DTYPE_TYPES = {("u", 1): "UINT8", ("i", 1): "INT8", ("u", 2): "UINT16", ("i", 2): "INT16",
                ("u", 4): "UINT32", ("i", 4): "INT32", ("f", 4): "FLOAT32", ("b", 1): "BOOL",
                ("u", 8): "UINT64", ("i", 8): "INT64", ("f", 8): "FLOAT64"}
# tensor dtype -> (ggml type id, name)
_TENSOR_TYPES = {("f", 4): (0, "F32"), ("f", 2): (1, "F16")}


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def _gstr(s: object, what: str) -> bytes:
    """A GGUF string: uint64 length + UTF-8 bytes (lone surrogates from a surrogateescape
    decode round-trip to the original bytes)."""
    if not isinstance(s, str):
        raise TypeError(f"{what}: expected str, got {type(s).__name__}")
    b = s.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(b)) + b


def _le(a: NDArray[Any]) -> NDArray[Any]:
    """a as a C-contiguous little-endian array (no copy when it already is one)."""
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def _array_elem_type(a: NDArray[Any], what: str) -> str:
    key = (a.dtype.kind, a.dtype.itemsize)
    if key not in _DTYPE_TYPES:
        raise TypeError(f"{what}: NumPy array dtype {a.dtype} has no GGUF element type "
                        f"(use uint8/int8/uint16/int16/uint32/int32/float32/bool/uint64/int64/float64)")
    return _DTYPE_TYPES[key]


def _encode_array(out: bytearray, value: Any, what: str, depth: int) -> None:
    if depth > _MAX_ARRAY_DEPTH:
        raise ValueError(f"{what}: arrays nested deeper than {_MAX_ARRAY_DEPTH} levels")
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise ValueError(f"{what}: ARRAY values must be 1-D, got shape {value.shape}")
        et = _array_elem_type(value, what)
        out += struct.pack("<IQ", _TYPE_ID[et], value.shape[0])
        if et == "BOOL":
            out += value.astype(np.uint8).tobytes()
        else:
            out += _le(value).tobytes()
        return
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{what}: an ARRAY value must be a 1-D NumPy array or a list of str / of arrays, "
                        f"got {type(value).__name__}")
    if all(isinstance(x, str) for x in value):  # also the empty list
        out += struct.pack("<IQ", _TYPE_ID["STRING"], len(value))
        for i, s in enumerate(value):
            out += _gstr(s, f"{what}[{i}]")
        return
    if all(isinstance(x, (np.ndarray, list, tuple)) for x in value):
        out += struct.pack("<IQ", _TYPE_ID["ARRAY"], len(value))
        for i, x in enumerate(value):
            _encode_array(out, x, f"{what}[{i}]", depth + 1)
        return
    bad = next(x for x in value if not isinstance(x, (str, np.ndarray, list, tuple)))
    raise TypeError(f"{what}: list elements must all be str or all be arrays/lists, found "
                    f"{type(bad).__name__} {bad!r} (for numbers pass a NumPy array with an explicit dtype)")


def _encode_value(out: bytearray, type_name: str, value: Any, what: str) -> None:
    if not isinstance(type_name, str) or type_name not in _TYPE_ID:
        raise ValueError(f"{what}: unknown GGUF value type {type_name!r} (expected one of {', '.join(VALUE_TYPES)})")
    out += struct.pack("<I", _TYPE_ID[type_name])
    if type_name == "STRING":
        out += _gstr(value, what)
    elif type_name == "ARRAY":
        _encode_array(out, value, what, 1)
    elif type_name == "BOOL":
        if not isinstance(value, (bool, np.bool_)):
            raise TypeError(f"{what}: BOOL value must be bool, got {type(value).__name__} {value!r}")
        out += struct.pack("<B", 1 if value else 0)
    elif type_name in ("FLOAT32", "FLOAT64"):
        if not _is_real(value):
            raise TypeError(f"{what}: {type_name} value must be a real number, got {type(value).__name__} {value!r}")
        v = float(value)
        if type_name == "FLOAT32" and math.isfinite(v) and abs(v) > float(np.finfo(np.float32).max):
            raise ValueError(f"{what}: {v!r} overflows FLOAT32")
        out += struct.pack(_STRUCT[type_name], v)
    else:
        if not _is_int(value):
            raise TypeError(f"{what}: {type_name} value must be an int, got {type(value).__name__} {value!r}")
        lo, hi = _INT_RANGES[type_name]
        v = int(value)
        if not lo <= v <= hi:
            raise ValueError(f"{what}: {v} is out of range for {type_name} [{lo}, {hi}]")
        out += struct.pack(_STRUCT[type_name], v)


def _pad(n: int, a: int) -> int:
    return (a - n % a) % a


class LazyTensor:
    """A tensor :func:`write_gguf` makes only when it writes it: ``shape`` and ``dtype``
    (float32 or float16) declared for the header, ``make()`` called once, as the file is
    written, returning that array (a ValueError naming the tensor if it does not match), so a
    file of many large tensors is written holding one at a time; with ``blocks=True`` ``make()``
    yields the tensor's blocks of rows in order instead (each of ``dtype``, the rows adding up
    to ``shape``), so not even one tensor is held whole."""

    __slots__ = ("shape", "dtype", "make", "blocks")

    def __init__(self, shape: Sequence[int], dtype: Any, make: Callable[[], Any], blocks: bool = False) -> None:
        self.shape = tuple(int(d) for d in shape)
        self.dtype = np.dtype(dtype)
        self.make = make
        self.blocks = bool(blocks)  # make() yields the tensor's row blocks in order (a large table, never whole)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize

    def array(self, name: str) -> NDArray[Any]:
        a = self.make()
        if not isinstance(a, np.ndarray) or a.dtype != self.dtype or tuple(a.shape) != self.shape:
            got = f"{a.dtype} {tuple(a.shape)}" if isinstance(a, np.ndarray) else type(a).__name__
            raise ValueError(f"tensor {name!r}: make() gave {got}, declared {self.dtype} {self.shape}")
        return a


def _check_tensor(i: int, item: Any) -> Tuple[str, bytes, Any, int]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        raise TypeError(f"tensors[{i}]: expected a (name, ndarray) pair, got {type(item).__name__}")
    name, arr = item
    if not isinstance(name, str):
        raise TypeError(f"tensors[{i}]: name must be str, got {type(name).__name__}")
    try:
        nb = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"tensors[{i}]: name {name!r} is not valid UTF-8 text") from None
    if not 1 <= len(nb) < GGUF_MAX_NAME:
        raise ValueError(f"tensor {name!r}: name is {len(nb)} bytes; GGUF tensor names are 1..{GGUF_MAX_NAME - 1}")
    if not isinstance(arr, (np.ndarray, LazyTensor)):
        raise TypeError(f"tensor {name!r}: expected a NumPy array or a LazyTensor, got {type(arr).__name__}")
    key = (arr.dtype.kind, arr.dtype.itemsize)
    if key not in _TENSOR_TYPES:
        raise TypeError(f"tensor {name!r}: dtype {arr.dtype} is not supported (float32 -> F32, float16 -> F16)")
    if not 1 <= arr.ndim <= 4:
        raise ValueError(f"tensor {name!r}: {arr.ndim} dimensions, GGUF allows 1..4")
    if 0 in arr.shape:
        raise ValueError(f"tensor {name!r}: shape {arr.shape} has a zero dimension")
    return name, nb, arr, _TENSOR_TYPES[key][0]


def write_gguf(path: StrPath, metadata: Iterable[Tuple[str, str, Any]], tensors: Iterable[Tuple[str, Any]],
               alignment: int = GGUF_DEFAULT_ALIGNMENT, direct: bool = False, digest: bool = False) -> Optional[str]:
    """Write a GGUF v3 file atomically (see the module docstring); ``tensors``: (name, array or
    :class:`LazyTensor`) pairs; ``direct``: the tensor data past the page cache where the file system
    allows (:func:`orkpy._io.atomic_write`; the header goes through it). Returns None, or with
    ``digest`` the hex SHA-256 of the bytes written (hashed from memory: no read-back)."""
    if not _is_int(alignment) or alignment < 8 or alignment & (alignment - 1):
        raise ValueError(f"alignment must be a power of two >= 8, got {alignment!r}")
    alignment = int(alignment)
    if isinstance(metadata, (str, bytes, dict)) or not hasattr(metadata, "__iter__"):
        raise TypeError(f"metadata must be a list of (key, type_name, value) triples, got {type(metadata).__name__}")
    metadata = list(metadata)
    tensors = list(tensors)

    kv = bytearray()
    seen = set()
    has_alignment = False
    for i, item in enumerate(metadata):
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise TypeError(f"metadata[{i}]: expected a (key, type_name, value) triple, got {item!r:.80}")
        key, tname, value = item
        if not isinstance(key, str):
            raise TypeError(f"metadata[{i}]: key must be str, got {type(key).__name__}")
        try:
            kb = key.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"metadata[{i}]: key {key!r} is not valid UTF-8 text") from None
        if not kb:
            raise ValueError(f"metadata[{i}]: empty key")
        if len(kb) > _MAX_KEY_BYTES:
            raise ValueError(f"metadata[{i}]: key is {len(kb)} bytes (at most {_MAX_KEY_BYTES})")
        if key in seen:
            raise ValueError(f"duplicate metadata key {key!r}")
        seen.add(key)
        if key == "general.alignment":
            if tname != "UINT32":
                raise ValueError(f"general.alignment must be UINT32, got {tname!r}")
            if not _is_int(value) or int(value) != alignment:
                raise ValueError(f"metadata general.alignment = {value!r} disagrees with alignment={alignment} "
                                 f"(pass alignment={value!r} or drop the key)")
            has_alignment = True
        kv += struct.pack("<Q", len(kb)) + kb
        _encode_value(kv, tname, value, f"metadata {key!r}")
    n_kv = len(metadata)
    if alignment != GGUF_DEFAULT_ALIGNMENT and not has_alignment:
        kb = b"general.alignment"
        kv += struct.pack("<Q", len(kb)) + kb + struct.pack("<II", _TYPE_ID["UINT32"], alignment)
        n_kv += 1

    checked = []
    names = set()
    infos = bytearray()
    offset = 0
    for i, pair in enumerate(tensors):
        name, nb, arr, tid = _check_tensor(i, pair)
        if name in names:
            raise ValueError(f"duplicate tensor name {name!r}")
        names.add(name)
        infos += struct.pack("<Q", len(nb)) + nb + struct.pack("<I", arr.ndim)
        infos += b"".join(struct.pack("<Q", d) for d in reversed(arr.shape))
        infos += struct.pack("<IQ", tid, offset)
        checked.append((name, arr))
        offset += arr.nbytes + _pad(arr.nbytes, alignment)

    header = bytearray(GGUF_MAGIC + struct.pack("<IQQ", GGUF_VERSION, len(checked), n_kv))
    header += kv
    header += infos
    header += bytes(_pad(len(header), alignment))

    h = hashlib.sha256() if digest else None

    def chunks() -> Iterator[Union[bytes, memoryview]]:
        yield bytes(header)
        for name, arr in checked:
            if isinstance(arr, LazyTensor) and arr.blocks:
                nbytes = 0
                for blk in arr.make():
                    b = _le(np.ascontiguousarray(blk))
                    if b.dtype != arr.dtype or b.shape[1:] != arr.shape[1:]:
                        raise ValueError(f"tensor {name!r}: a block of {b.dtype} {b.shape}, declared {arr.dtype} "
                                         f"rows of {arr.shape[1:]}")
                    nbytes += b.nbytes
                    if nbytes > arr.nbytes:
                        break
                    yield b.reshape(-1).view(np.uint8).data
                if nbytes != arr.nbytes:
                    raise ValueError(f"tensor {name!r}: make() gave {nbytes} bytes of blocks, declared {arr.nbytes}")
            else:
                a = _le(arr.array(name) if isinstance(arr, LazyTensor) else arr)
                yield a.reshape(-1).view(np.uint8).data
                nbytes = a.nbytes
            p = _pad(nbytes, alignment)
            if p:
                yield bytes(p)

    atomic_write(path, chunks(), direct=direct, head=len(header), hasher=h)
    return None if h is None else h.hexdigest()


def metadata_triples(gguf_file: Union[GGUFFile, StrPath]) -> List[Tuple[str, str, Any]]:
    """The metadata of a GGUF file as ``[(key, type_name, value), ...]`` in file order,
    ready for :func:`write_gguf`. ``gguf_file`` is an open :class:`orkpy.GGUFFile` or a path."""
    from .gguf import GGUFFile

    if isinstance(gguf_file, GGUFFile):
        return [(k, gguf_file.metadata_types[k], v) for k, v in gguf_file.metadata.items()]
    if isinstance(gguf_file, (str, bytes, os.PathLike)):
        with GGUFFile(gguf_file) as g:
            return [(k, g.metadata_types[k], v) for k, v in g.metadata.items()]
    raise TypeError(f"expected a GGUFFile or a path, got {type(gguf_file).__name__}")
