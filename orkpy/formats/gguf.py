"""GGUF files: a strict, memory-mapped reader.

``GGUFFile(path)`` validates the whole file in C (csrc/ork/gguf.c) before any
of it is used; a malformed file raises :class:`orkpy.GGUFError` (a
``ValueError``) naming the problem and the byte offset. Tensor data is never
copied until you ask for floats: ``raw(name)`` is a read-only uint8 view of the
mapping, ``tensor(name)`` dequantizes to float32 in C. The mapping is guarded
(docs/security.md): if the file changes size or is modified while open,
``raw``, ``tensor`` and ``check`` raise :class:`orkpy.FormatError` naming it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from .. import _core
from .._core import GGUFError
from .._mapped import MappedFile, guarded
from .._typing import StrPath

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "ggml_type_info", "GGML_TYPES"]


def _type_table() -> Dict[int, Dict[str, Any]]:
    table = {}
    for tid in range(_core.ggml_type_count()):
        info = _core.ggml_type_info(tid)
        if info is not None:
            table[tid] = info
    return table


#: {type_id: {"name", "block_size", "type_size", "bits_per_weight", "quantized"}} for every
#: valid ggml type id (K-quants, IQ types, BF16, TQ, MXFP4, NVFP4, ...).
GGML_TYPES = _type_table()
_BY_NAME = {v["name"]: k for k, v in GGML_TYPES.items()}


def ggml_type_info(type_: Union[int, str]) -> Dict[str, Any]:
    """Type facts by id (int) or name ("Q4_K"); KeyError for an unknown type."""
    if isinstance(type_, str):
        if type_ not in _BY_NAME:
            raise KeyError(f"unknown ggml type name {type_!r}")
        type_ = _BY_NAME[type_]
    if type_ not in GGML_TYPES:
        raise KeyError(f"unknown ggml type id {type_!r}")
    return dict(GGML_TYPES[type_], id=type_)


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a GGUF file. ``shape`` is in NumPy order (``(N, K)`` for a
    matrix: ggml's ``ne`` reversed); ``offset`` is relative to the data section
    as stored, ``data_offset`` absolute in the file."""

    name: str
    type: str
    type_id: int
    shape: Tuple[int, ...]
    offset: int
    data_offset: int
    nbytes: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def bits_per_weight(self) -> float:
        return GGML_TYPES[self.type_id]["bits_per_weight"]

    @property
    def ndim(self) -> int:
        return len(self.shape)


class GGUFFile:
    """A validated, memory-mapped GGUF file (versions 2 and 3).

    Attributes: ``path``, ``version``, ``alignment``, ``data_offset``,
    ``metadata`` (dict; numeric arrays as NumPy arrays, string arrays as
    lists), ``metadata_types`` (key -> GGUF value type name), ``tensors``
    (list of :class:`TensorInfo` in file order).
    """

    def __init__(self, path: StrPath, mapping: Optional[MappedFile] = None) -> None:
        """``mapping``: a :class:`orkpy._core.MappedFile` of the file, already open (the GGUFFile takes
        it over; ``path`` then only names the file): what a loader that verified those very bytes
        passes (orkpy.formats.modeldir)."""
        self.path = os.fspath(path)
        self._map: Optional[MappedFile] = None
        self._map = MappedFile(self.path) if mapping is None else mapping
        try:
            try:
                parsed = _core.gguf_parse(self._map)
            except GGUFError as e:
                self._map.check()  # a file that changed under the parse says so
                raise GGUFError(f"{self.path}: {e}") from None
            self._map.check()
        except BaseException:
            self.close()
            raise
        self.version = parsed["version"]
        self.alignment = parsed["alignment"]
        self.data_offset = parsed["data_offset"]
        self.metadata: Dict[str, Any] = {k: v for k, _, v in parsed["metadata"]}
        self.metadata_types: Dict[str, str] = {k: t for k, t, _ in parsed["metadata"]}
        self.tensors: List[TensorInfo] = [
            TensorInfo(name=name, type=GGML_TYPES[tid]["name"], type_id=tid, shape=tuple(reversed(ne)),
                       offset=off, data_offset=doff, nbytes=nbytes)
            for name, tid, ne, off, doff, nbytes, _info in parsed["tensors"]
        ]
        self._by_name = {t.name: t for t in self.tensors}

    # -- access -------------------------------------------------------------
    def tensor_info(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def raw(self, name: str) -> NDArray[np.uint8]:
        """The tensor's stored bytes: a read-only uint8 view of the mapping (no copy).
        FormatError if the file changed since it was opened; reads of the view itself
        are yours (docs/security.md: a page lost to truncation reads as zeros)."""
        t = self.tensor_info(name)
        self.check()
        a = np.frombuffer(memoryview(self._mapping()), dtype=np.uint8, count=t.nbytes, offset=t.data_offset)
        return a

    def tensor(self, name: str, threads: Optional[int] = None,
               out: Optional[NDArray[np.float32]] = None) -> NDArray[np.float32]:
        """The tensor as float32 in NumPy shape, dequantized from its ggml type; ``out`` (a writeable
        C-contiguous float32 array of the tensor's size) is written and returned in that shape
        instead of a new array (a streaming reader reuses one buffer)."""
        t = self.tensor_info(name)
        with guarded((self._mapping(),)):
            res = _core.dequantize_raw(self.raw(name), t.type_id, t.n_elements, 0 if threads is None else threads,
                                       out=out)
        return res.reshape(t.shape)

    def tensor_checked(self, name: str, threads: Optional[int] = None,
                       out: Optional[NDArray[np.float32]] = None) -> Tuple[NDArray[np.float32], int]:
        """:meth:`tensor` and the flat index of its first NaN / Inf (-1: all finite), found while the
        dequantization writes it (orkpy.formats.source's finiteness check)."""
        t = self.tensor_info(name)
        with guarded((self._mapping(),)):
            res, bad = _core.dequantize_raw_checked(self.raw(name), t.type_id, t.n_elements,
                                                    0 if threads is None else threads, out=out)
        return res.reshape(t.shape), bad

    def check(self) -> None:
        """orkpy.FormatError naming the file if it changed size, was modified or lost
        pages while open (every read of tensor data through this object checks)."""
        self._mapping().check()

    def release(self) -> None:
        """Drop the file's pages this process holds resident (a streaming reader calls it after
        each tensor, so its memory does not grow with the file); arrays read before stay valid
        and later reads page the data in again (:meth:`orkpy._core.MappedFile.release`)."""
        self._mapping().release()

    def _mapping(self) -> MappedFile:
        if self._map is None or self._map.closed:
            raise ValueError(f"{self.path}: GGUFFile is closed")
        return self._map

    @property
    def architecture(self) -> Optional[str]:
        return self.metadata.get("general.architecture")

    # -- lifetime -----------------------------------------------------------
    def close(self) -> None:
        m = getattr(self, "_map", None)
        if isinstance(m, MappedFile):
            try:
                m.close()
            except BufferError:
                pass  # arrays still view the mapping; it is released with them

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({self.path!r}, version={self.version}, tensors={len(self.tensors)}, "
                f"metadata={len(self.metadata)}, architecture={self.architecture!r})")
