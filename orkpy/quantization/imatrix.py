"""Importance matrices (llama.cpp imatrix): per weight, the sum of squared input
activations per input channel and the number of tokens it was summed over.

The quantizers use the mean ``E[x_j^2] = sums[j] / count`` per input column j
(:meth:`Imatrix.values`), exactly as llama-quantize does. Two file formats, both
read strictly and written atomically, byte-compatible with llama.cpp:

GGUF imatrix (llama.cpp's default, ``save_imatrix``)
    ``general.type = "imatrix"``, ``imatrix.datasets`` (array of str),
    ``imatrix.chunk_count`` (u32), ``imatrix.chunk_size`` (u32); per weight name,
    sorted, ``<name>.in_sum2`` F32 (the raw sums) and ``<name>.counts`` F32 (the token
    count). llama.cpp's ggml writer drops trailing dimensions of 1, so a dense weight's
    tensors are stored 1-D: ``in_sum2`` ne=[K], ``counts`` ne=[1]; that is what
    :meth:`Imatrix.save` writes. The reader also accepts the 2-D forms (``(1, K)`` and
    ``(1, 1)`` in NumPy order) and ignores the ``<name>.in_sum`` tensors newer
    llama.cpp writes (after checking their size). MoE entries (in_sum2 with more than
    one matrix) raise ``NotImplementedError``.

Legacy ``.dat`` (``save_imatrix_legacy``; little-endian int32/float32)::

    int32 n_entries
    n_entries x { int32 len; char name[len]; int32 ncall; int32 nval; float v[nval] }
    int32 last_chunk; int32 len; char dataset[len]

    where v = (sums / count) * ncall and ncall = ceil(count / chunk_size).

The chunk size is not stored in a ``.dat``, so loading one reconstructs
``sums = v * chunk_size`` and ``count = ncall * chunk_size`` with a given
``chunk_size`` (default 512, llama.cpp's default n_ctx), as llama.cpp does; the
values ``E[x^2] = v / ncall`` do not depend on it.
"""
from __future__ import annotations

import hashlib
import math
import os
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Tuple, Type, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .._core import FormatError
from .._mapped import MappedFile, guarded
from .._io import atomic_write
from .._typing import StrPath
from ..formats.gguf_write import GGUF_MAX_NAME, write_gguf

if TYPE_CHECKING:
    from ..formats.gguf import TensorInfo

__all__ = ["Imatrix", "ImatrixEntry", "ImatrixError", "DEFAULT_CHUNK_SIZE"]

#: llama.cpp's default n_ctx, used as the chunk size of a legacy .dat when none is given
DEFAULT_CHUNK_SIZE = 512
_FORMATS = ("gguf", "dat")
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1
_SUFFIX_SUMS, _SUFFIX_COUNTS, _SUFFIX_SUM = ".in_sum2", ".counts", ".in_sum"
#: the longest weight name the GGUF form can hold ("<name>.in_sum2" must fit a ggml name)
MAX_NAME_BYTES = GGUF_MAX_NAME - 1 - len(_SUFFIX_SUMS)
# a legacy entry is at least: len, 1 name byte, ncall, nval, one float
_MIN_DAT_ENTRY = 4 + 1 + 4 + 4 + 4


class ImatrixError(FormatError):
    """A malformed importance-matrix file (an :class:`orkpy.FormatError`); the message names
    the file, the problem and the byte offset."""


@dataclass(frozen=True, eq=False)
class ImatrixEntry:
    """One weight's statistics: ``sums`` float64 (K,) (read-only; llama.cpp's in_sum2) and
    ``count`` (tokens)."""

    sums: np.ndarray
    count: int

    @property
    def values(self) -> NDArray[np.float32]:
        """E[x^2] per input channel, float32 (K,); all ones when count is 0 (as llama-quantize)."""
        if self.count == 0:
            return np.ones(self.sums.shape, np.float32)
        return (self.sums / float(self.count)).astype(np.float32)

    def __len__(self) -> int:
        return self.sums.shape[0]


def _name_key(name: str) -> bytes:
    """Sort key matching llama.cpp's std::sort of std::string (byte order)."""
    return name.encode("utf-8", "surrogateescape")


def _is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _check_name(name: object) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"imatrix entry name must be str, got {type(name).__name__}")
    try:
        b = name.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"imatrix entry name {name!r} is not valid UTF-8 text") from None
    if not b or b"\0" in b:
        raise ValueError(f"imatrix entry name {name!r} is empty or contains NUL")
    return b


def _check_sums(name: str, sums: ArrayLike) -> NDArray[np.float64]:
    a = np.asarray(sums)
    if a.dtype.kind not in "fiu" or a.dtype.kind == "b":
        raise TypeError(f"{name!r}: sums must be real numbers, got dtype {a.dtype}")
    a = np.array(a, dtype=np.float64)  # always a private copy
    if a.ndim != 1 or a.shape[0] == 0:
        raise ValueError(f"{name!r}: sums must be a non-empty 1-D array, got shape {a.shape}")
    bad = ~np.isfinite(a)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{name!r}: sums[{i}] is {a[i]} (must be finite)")
    if (a < 0).any():
        i = int(np.flatnonzero(a < 0)[0])
        raise ValueError(f"{name!r}: sums[{i}] is {a[i]} (a sum of squares must be >= 0)")
    return a


def _check_count(name: str, count: int) -> int:
    if not _is_int(count):
        raise TypeError(f"{name!r}: count must be an int, got {type(count).__name__} {count!r}")
    count = int(count)
    if count < 0:
        raise ValueError(f"{name!r}: count {count} is negative")
    return count


def _frozen(a: NDArray[Any]) -> NDArray[Any]:
    a.setflags(write=False)
    return a


class Imatrix:
    """Per-weight importance statistics (see the module docstring).

    ``Imatrix(chunk_size=512, chunks=0, datasets=())`` is empty; fill it with :meth:`add`
    or :meth:`merge`, or read a file with :meth:`Imatrix.load`. Attributes: ``chunks``
    (int, chunks processed; llama.cpp's chunk_count / last_chunk), ``chunk_size`` (int,
    tokens per chunk), ``datasets`` (list of str), and after :meth:`load` ``path`` and
    ``format`` (``"gguf"`` or ``"dat"``).
    """

    def __init__(self, chunk_size: int = DEFAULT_CHUNK_SIZE, chunks: int = 0, datasets: Iterable[str] = ()) -> None:
        if not _is_int(chunk_size) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        if not _is_int(chunks) or chunks < 0:
            raise ValueError(f"chunks must be a non-negative int, got {chunks!r}")
        if isinstance(datasets, str) or not all(isinstance(d, str) for d in datasets):
            raise TypeError("datasets must be a list of str")
        self.chunk_size = int(chunk_size)
        self.chunks = int(chunks)
        self.datasets = list(datasets)
        self.path: Optional[str] = None
        self.format: Optional[str] = None
        self._entries: Dict[str, ImatrixEntry] = {}

    # -- access -------------------------------------------------------------
    def names(self) -> List[str]:
        """The weight names, sorted (byte order, as llama.cpp writes them)."""
        return sorted(self._entries, key=_name_key)

    def entry(self, name: str) -> ImatrixEntry:
        """The :class:`ImatrixEntry` (sums, count) of a weight; KeyError if absent."""
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(f"no imatrix entry for {name!r}") from None

    @property
    def entries(self) -> Dict[str, ImatrixEntry]:
        """{name: ImatrixEntry} in sorted name order (a new dict; the entries are read-only)."""
        return {n: self._entries[n] for n in self.names()}

    def values(self, name: str) -> NDArray[np.float32]:
        """E[x^2] = sums/count per input channel, float32 (K,); ones when count is 0."""
        return self.entry(name).values

    def __getitem__(self, name: str) -> NDArray[np.float32]:
        return self.values(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    # -- building -----------------------------------------------------------
    def add(self, name: str, sums: ArrayLike, count: int) -> Imatrix:
        """Accumulate ``sums`` (per-channel sum of x^2 over ``count`` tokens) into ``name``.
        A new name starts at zero; an existing one must have the same length K."""
        _check_name(name)
        a = _check_sums(name, sums)
        count = _check_count(name, count)
        if count == 0 and a.any():
            raise ValueError(f"{name!r}: count is 0 but the sums are not all zero")
        old = self._entries.get(name)
        if old is not None:
            if old.sums.shape != a.shape:
                raise ValueError(f"{name!r}: sums have length {a.shape[0]}, the entry has {old.sums.shape[0]}")
            a = old.sums + a
            count += old.count
            if not np.isfinite(a).all():
                raise ValueError(f"{name!r}: accumulated sums overflow")
        self._entries[name] = ImatrixEntry(_frozen(a), count)
        return self

    def merge(self, other: Imatrix) -> Imatrix:
        """Add every entry of ``other`` (in place; returns self); ``chunks`` add up and
        ``other.datasets`` are appended. The chunk sizes must agree. All-or-nothing: a
        length mismatch raises ValueError before anything changes."""
        if not isinstance(other, Imatrix):
            raise TypeError(f"can only merge an Imatrix, got {type(other).__name__}")
        if other.chunk_size != self.chunk_size:
            raise ValueError(f"chunk sizes differ: {self.chunk_size} vs {other.chunk_size}")
        for n, e in other._entries.items():
            mine = self._entries.get(n)
            if mine is not None and mine.sums.shape != e.sums.shape:
                raise ValueError(f"{n!r}: length {e.sums.shape[0]} vs {mine.sums.shape[0]}")
        for n in other.names():
            e = other._entries[n]
            self.add(n, e.sums, e.count)
        self.chunks += other.chunks
        self.datasets.extend(other.datasets)
        return self

    # -- identity -----------------------------------------------------------
    def sha256(self) -> str:
        """A stable hex digest of the statistics: names (sorted), counts, lengths and the
        sums as float64. Metadata (chunks, chunk_size, datasets, file format) is not hashed,
        so a .dat and its GGUF conversion hash the same when their sums agree."""
        h = hashlib.sha256(b"orkpy-imatrix-v1\0")
        for n in self.names():
            e = self._entries[n]
            nb = _name_key(n)
            h.update(struct.pack("<Q", len(nb)) + nb)
            h.update(struct.pack("<QQ", e.count, e.sums.shape[0]))
            h.update(np.ascontiguousarray(e.sums, dtype="<f8").tobytes())
        return h.hexdigest()

    def to_dict(self, include_sums: bool = False) -> Dict[str, Any]:
        """A JSON-serialisable summary: metadata, sha256 and per entry K, count and the
        min/mean/max of the values (plus ``sums`` as a list when ``include_sums``)."""
        out: Dict[str, Any] = {"chunks": self.chunks, "chunk_size": self.chunk_size, "datasets": list(self.datasets),
               "n_entries": len(self), "format": self.format,
               "path": None if self.path is None else str(self.path), "sha256": self.sha256(), "entries": {}}
        for n in self.names():
            e = self._entries[n]
            v = e.values
            d: Dict[str, Any] = {"k": len(e), "count": e.count, "min": float(v.min()), "mean": float(v.mean()),
                 "max": float(v.max())}
            if include_sums:
                d["sums"] = e.sums.tolist()
            out["entries"][n] = d
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Imatrix):
            return NotImplemented
        if (self.chunks, self.chunk_size, self.datasets) != (other.chunks, other.chunk_size, other.datasets):
            return False
        if self._entries.keys() != other._entries.keys():
            return False
        return all(a.count == other._entries[n].count and np.array_equal(a.sums, other._entries[n].sums)
                   for n, a in self._entries.items())

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable

    def __repr__(self) -> str:
        src = "" if self.path is None else f", path={str(self.path)!r}, format={self.format!r}"
        return (f"Imatrix(entries={len(self)}, chunks={self.chunks}, chunk_size={self.chunk_size}, "
                f"datasets={self.datasets!r}{src})")

    # -- files --------------------------------------------------------------
    @classmethod
    def load(cls, path: StrPath, chunk_size: Optional[int] = None) -> Imatrix:
        """Read a GGUF imatrix or a legacy .dat (detected from the first bytes).

        ``chunk_size`` applies to a .dat only (None: 512); for a GGUF imatrix it is read from
        the file and a different explicit value raises ValueError. A malformed file raises
        :class:`ImatrixError` (an ``orkpy.FormatError``; ``orkpy.GGUFError`` for a broken
        GGUF container) naming the problem and byte offset; MoE entries NotImplementedError.
        """
        if chunk_size is not None and (not _is_int(chunk_size) or chunk_size < 1):
            raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
        path = os.fspath(path)
        # mapped, not read: a wrong (huge) file fails on its first bytes without being loaded; the
        # mapping is guarded, so a file truncated under the parse raises FormatError (docs/security.md)
        data = MappedFile(path)
        try:
            if data[:4] == b"GGUF":
                im = _load_gguf(cls, path, chunk_size)
                im.format = "gguf"
            else:
                with guarded((data,)):
                    im = _load_dat(cls, path, data, DEFAULT_CHUNK_SIZE if chunk_size is None else int(chunk_size))
                im.format = "dat"
        finally:
            try:
                data.close()
            except BufferError:  # pragma: no cover - the parse copies what it keeps
                pass
        im.path = path
        return im

    def save(self, path: StrPath, format: Optional[str] = None) -> None:
        """Write the GGUF imatrix (``format="gguf"``, every entry, names sorted) or the legacy
        .dat (``format="dat"``; entries with count 0 are skipped, as llama.cpp does),
        atomically. ``format=None`` (the default, and ``orkpy imatrix -o``'s rule) picks it
        from the extension: ``.dat`` (any case) is legacy, any other name GGUF."""
        if format is None:
            format = "dat" if os.fsdecode(path).lower().endswith(".dat") else "gguf"
        if format not in _FORMATS:
            raise ValueError(f"format must be one of {_FORMATS}, got {format!r}")
        if not _is_int(self.chunk_size) or not 1 <= self.chunk_size <= _UINT32_MAX:
            raise ValueError(f"chunk_size {self.chunk_size!r} must be an int in 1..{_UINT32_MAX}")
        if not isinstance(self.datasets, (list, tuple)) or not all(isinstance(d, str) for d in self.datasets):
            raise TypeError("datasets must be a list of str")
        if format == "gguf":
            self._save_gguf(path)
        else:
            self._save_dat(path)

    def _save_gguf(self, path: StrPath) -> None:
        if not _is_int(self.chunks) or not 0 <= self.chunks <= _UINT32_MAX:
            raise ValueError(f"chunks {self.chunks!r} does not fit imatrix.chunk_count (u32)")
        names = self.names()
        if not names:
            raise ValueError("the imatrix has no entries to save")
        meta = [("general.type", "STRING", "imatrix"),
                ("imatrix.datasets", "ARRAY", list(self.datasets)),
                ("imatrix.chunk_count", "UINT32", int(self.chunks)),
                ("imatrix.chunk_size", "UINT32", int(self.chunk_size))]
        tensors: List[Tuple[str, NDArray[Any]]] = []
        for n in names:
            if len(_name_key(n)) > MAX_NAME_BYTES:
                raise ValueError(f"{n!r}: names longer than {MAX_NAME_BYTES} bytes do not fit a GGUF imatrix")
            e = self._entries[n]
            with np.errstate(over="ignore"):
                s = e.sums.astype(np.float32)
                c = np.array([e.count], dtype=np.float32)
            if not np.isfinite(s).all() or not np.isfinite(c).all():
                raise ValueError(f"{n!r}: sums or count overflow float32")
            tensors.append((n + _SUFFIX_SUMS, s))
            tensors.append((n + _SUFFIX_COUNTS, c))
        write_gguf(path, meta, tensors)

    def _save_dat(self, path: StrPath) -> None:
        if not _is_int(self.chunks) or not 0 <= self.chunks <= _INT32_MAX:
            raise ValueError(f"chunks {self.chunks!r} does not fit the .dat's int32 last_chunk")
        names = [n for n in self.names() if self._entries[n].count > 0]
        if not names:
            raise ValueError("the imatrix has no entries with data (count > 0) to save")
        dataset = self.datasets[-1] if self.datasets else ""
        db = dataset.encode("utf-8", "surrogateescape")
        if len(db) > _INT32_MAX:
            raise ValueError("dataset name too long for a .dat")
        blocks = []
        for n in names:
            e = self._entries[n]
            nb = _name_key(n)
            ncall = -(-e.count // self.chunk_size)
            if ncall > _INT32_MAX or len(e) > _INT32_MAX:
                raise ValueError(f"{n!r}: ncall {ncall} or length {len(e)} does not fit a .dat int32")
            with np.errstate(over="ignore"):
                v = ((e.sums / float(e.count)) * float(ncall)).astype("<f4")
            if not np.isfinite(v).all():
                raise ValueError(f"{n!r}: stored values overflow float32")
            blocks.append(struct.pack("<i", len(nb)) + nb + struct.pack("<ii", ncall, len(e)) + v.tobytes())

        def chunks() -> Iterator[bytes]:
            yield struct.pack("<i", len(names))
            yield from blocks
            yield struct.pack("<ii", self.chunks, len(db)) + db

        atomic_write(path, chunks())


# ------------------------------------------------------------------ readers --

class _Dat:
    """A bounds-checked cursor over a legacy .dat's bytes."""

    def __init__(self, path: str, buf: Union[bytes, MappedFile]) -> None:
        self.path, self.buf, self.pos = path, buf, 0

    def fail(self, problem: str, at: Optional[int] = None) -> ImatrixError:
        return ImatrixError(f"{self.path}: {problem} (at byte offset {self.pos if at is None else at})")

    def left(self) -> int:
        return len(self.buf) - self.pos

    def need(self, n: int, what: str) -> None:
        if n > self.left():
            raise self.fail(f"truncated file: {what} needs {n} bytes, only {self.left()} left")

    def i32(self, what: str) -> int:
        self.need(4, what)
        v = struct.unpack_from("<i", self.buf, self.pos)[0]
        self.pos += 4
        return v

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b


def _load_dat(cls: Type[Imatrix], path: str, buf: Union[bytes, MappedFile], chunk_size: int) -> Imatrix:
    r = _Dat(path, buf)
    n = r.i32("the entry count")
    if n < 1:
        raise r.fail(f"entry count {n} (a .dat holds at least one entry)", 0)
    if n > r.left() // _MIN_DAT_ENTRY:
        raise r.fail(f"entry count {n} cannot fit in the {r.left()} bytes that follow", 0)
    im = cls(chunk_size=chunk_size)
    for i in range(n):
        at = r.pos
        ln = r.i32(f"entry {i} name length")
        if not 1 <= ln <= GGUF_MAX_NAME - 1:
            raise r.fail(f"entry {i} name length {ln} is outside 1..{GGUF_MAX_NAME - 1}", at)
        nat = r.pos
        nb = r.take(ln, f"entry {i} name")
        try:
            name = nb.decode("utf-8")
        except UnicodeDecodeError:
            raise r.fail(f"entry {i} name {nb!r} is not valid UTF-8", nat) from None
        if "\0" in name:
            raise r.fail(f"entry {i} name {nb!r} contains a NUL byte", nat)
        if name in im._entries:
            raise r.fail(f"duplicate entry {name!r}", at)
        cat = r.pos
        ncall = r.i32(f"entry {name!r} ncall")
        if ncall < 1:
            raise r.fail(f"entry {name!r} ncall {ncall} must be >= 1", cat)
        vat = r.pos
        nval = r.i32(f"entry {name!r} nval")
        if nval < 1:
            raise r.fail(f"entry {name!r} nval {nval} must be >= 1", vat)
        if nval > r.left() // 4:
            raise r.fail(f"entry {name!r} nval {nval} needs {4 * nval} bytes of values, only {r.left()} left", vat)
        dat = r.pos
        v = np.frombuffer(r.take(4 * nval, f"entry {name!r} values"), dtype="<f4")
        bad = ~np.isfinite(v)
        if bad.any():
            j = int(np.flatnonzero(bad)[0])
            raise r.fail(f"entry {name!r} value {j} is {v[j]} (non-finite)", dat + 4 * j)
        if (v < 0).any():
            j = int(np.flatnonzero(v < 0)[0])
            raise r.fail(f"entry {name!r} value {j} is {v[j]} (negative; a mean square must be >= 0)", dat + 4 * j)
        sums = v.astype(np.float64) * float(chunk_size)
        im._entries[name] = ImatrixEntry(_frozen(sums), ncall * chunk_size)
    at = r.pos
    last_chunk = r.i32("the chunk count (last_chunk)")
    if last_chunk < 0:
        raise r.fail(f"chunk count {last_chunk} is negative", at)
    at = r.pos
    ln = r.i32("the dataset name length")
    if ln < 0 or ln > r.left():
        raise r.fail(f"dataset name length {ln} is outside 0..{r.left()} (the bytes left)", at)
    dataset = r.take(ln, "the dataset name").decode("utf-8", "surrogateescape")
    if r.left():
        raise r.fail(f"{r.left()} bytes of trailing garbage after the dataset name")
    im.chunks = last_chunk
    im.datasets = [dataset]
    return im


def _load_gguf(cls: Type[Imatrix], path: str, chunk_size: Optional[int]) -> Imatrix:
    from ..formats.gguf import GGUFFile

    with GGUFFile(path) as g:
        def fail(problem: str, at: Optional[int] = None) -> ImatrixError:
            where = "" if at is None else f" (at byte offset {at})"
            return ImatrixError(f"{path}: {problem}{where}")

        md, mt = g.metadata, g.metadata_types
        if "general.type" not in md:
            raise fail("no general.type key: not a GGUF imatrix")
        if mt["general.type"] != "STRING" or md["general.type"] != "imatrix":
            raise fail(f"general.type is {md['general.type']!r}, not 'imatrix' (a model file, not an imatrix?)")
        for key in ("imatrix.chunk_count", "imatrix.chunk_size"):
            if key not in md:
                raise fail(f"missing metadata key {key}")
            if mt[key] != "UINT32":
                raise fail(f"{key} must be UINT32, got {mt[key]}")
        if "imatrix.datasets" not in md:
            raise fail("missing metadata key imatrix.datasets")
        ds = md["imatrix.datasets"]
        if mt["imatrix.datasets"] != "ARRAY" or not isinstance(ds, list) or not all(isinstance(d, str) for d in ds):
            raise fail("imatrix.datasets must be an array of strings")
        file_cs = md["imatrix.chunk_size"]
        if file_cs < 1:
            raise fail(f"imatrix.chunk_size is {file_cs}")
        if chunk_size is not None and chunk_size != file_cs:
            raise ValueError(f"{path}: chunk_size={chunk_size} given, but the GGUF imatrix records {file_cs}")

        groups: Dict[str, List[Optional[TensorInfo]]] = {}
        for t in g.tensors:
            for suffix, slot in ((_SUFFIX_SUMS, 0), (_SUFFIX_COUNTS, 1), (_SUFFIX_SUM, 2)):
                if t.name.endswith(suffix) and len(t.name) > len(suffix):
                    groups.setdefault(t.name[:-len(suffix)], [None, None, None])[slot] = t
                    break
            else:
                raise fail(f"unexpected tensor {t.name!r} (expected <name>.in_sum2 / .counts / .in_sum)",
                           t.data_offset)
            if t.type != "F32":
                raise fail(f"tensor {t.name!r} is {t.type}, expected F32", t.data_offset)
        if not groups:
            raise fail("no imatrix entries (no tensors)")

        im = cls(chunk_size=file_cs, chunks=md["imatrix.chunk_count"], datasets=ds)
        for name, (ts, tc, tsum) in groups.items():
            if ts is None or tc is None:
                raise fail(f"entry {name!r} has {'counts' if ts is None else 'in_sum2'} "
                           f"but no {'in_sum2' if ts is None else 'counts'}")
            if ts.ndim == 1:
                nmat, k = 1, ts.shape[0]
            elif ts.ndim == 2:
                nmat, k = ts.shape
            else:
                raise fail(f"{ts.name!r} has shape {ts.shape}, expected (K,) or (n_mat, K)", ts.data_offset)
            if nmat > 1:
                raise NotImplementedError(f"{path}: {name!r} holds {nmat} matrices (a MoE expert tensor); "
                                          f"only dense weights are supported")
            if tc.shape not in ((1,), (1, 1)):
                raise fail(f"{tc.name!r} has shape {tc.shape}, expected (1,) for a dense weight", tc.data_offset)
            if tsum is not None and tsum.n_elements != ts.n_elements:
                raise fail(f"{tsum.name!r} has {tsum.n_elements} elements, {ts.name!r} {ts.n_elements}",
                           tsum.data_offset)
            s = g.tensor(ts.name).reshape(k)
            bad = ~np.isfinite(s) | (s < 0)
            if bad.any():
                j = int(np.flatnonzero(bad)[0])
                raise fail(f"{ts.name!r}[{j}] is {s[j]} (must be finite and >= 0)", ts.data_offset + 4 * j)
            c = float(g.tensor(tc.name).reshape(-1)[0])
            if not math.isfinite(c) or c < 0 or c != math.floor(c) or c >= 2.0**64:
                raise fail(f"{tc.name!r} is {c} (a token count must be an integer in 0 .. 2**64-1)", tc.data_offset)
            if c == 0 and s.any():
                raise fail(f"{tc.name!r} is 0 but {ts.name!r} is not all zero", tc.data_offset)
            if len(_name_key(name)) > MAX_NAME_BYTES or "\0" in name:
                raise fail(f"bad entry name {name!r}")
            im._entries[name] = ImatrixEntry(_frozen(s.astype(np.float64)), int(c))
    return im
