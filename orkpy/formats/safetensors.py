"""A strict, safe safetensors reader in pure Python + NumPy.

:func:`load_safetensors` reads a ``.safetensors`` file, a directory holding
``model.safetensors`` (or ``model.safetensors.index.json``), or a sharded
checkpoint's ``model.safetensors.index.json``. Files are treated as
untrusted: every structural problem raises :class:`SafetensorsError` (a
``ValueError``) naming the file, the tensor if any, and the problem; nothing
is read outside the file's data section and no header value is trusted to fit
a machine integer.

The format (https://github.com/huggingface/safetensors): an unsigned 64-bit
little-endian header length ``N``, ``N`` bytes of UTF-8 JSON (an object
mapping tensor names to ``{"dtype", "shape", "data_offsets": [begin, end]}``,
plus an optional ``"__metadata__"`` object of strings), then the data
section. Offsets are relative to the data section, which the tensors must
cover exactly: no overlap, no hole, no trailing byte (what the official
``safetensors`` library enforces too). All data is little-endian.

Returned arrays (all read-only, shapes in numpy order as stored):

- F32, F16, F64, I8..I64, U8..U64, C64: views of a ``numpy.memmap`` of the
  file, no copy. The mapping underneath is orkpy's guarded one
  (docs/security.md): a file truncated while mapped reads as zeros past its
  new end instead of killing the process, and :meth:`SafetensorsModel.check`
  (and orkpy's own readers of these arrays) raise :class:`FormatError`.
- BOOL: a view too, after checking every byte is 0 or 1.
- BF16: converted exactly to float32 (the 16 bits become the high half).
- F8_*, F6_*, F4: known to the format but numpy has no such type, so they
  raise; any other dtype string raises as unknown.
"""
from __future__ import annotations

import json
import os
import struct
from typing import Any, Dict, Iterable, List, NoReturn, Optional, Tuple, Union

import numpy as np
from numpy.typing import NDArray

from .._core import FormatError
from .._mapped import MappedFile, guarded, maps_of
from .._mapped import check as check_maps
from .._typing import StrPath

#: Largest header accepted, in bytes (the official library's limit).
MAX_HEADER_BYTES = 100_000_000
#: Largest ``*.index.json`` / ``config.json`` accepted, in bytes.
MAX_JSON_BYTES = 100_000_000

MODEL_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
CONFIG_FILE = "config.json"

_U64_MAX = 2**64 - 1
_MAX_INT_DIGITS = 100  # longest integer literal parsed (2**64 has 20 digits)
_MAX_NDIM = 32  # numpy 1.x's limit (numpy 2 allows 64); no real tensor comes close

# safetensors dtype -> (numpy dtype of the stored bits, bytes per element)
_DTYPES = {
    "BOOL": (np.dtype("?"), 1),
    "U8": (np.dtype("u1"), 1),
    "I8": (np.dtype("i1"), 1),
    "U16": (np.dtype("<u2"), 2),
    "I16": (np.dtype("<i2"), 2),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),  # converted to float32 after the view
    "U32": (np.dtype("<u4"), 4),
    "I32": (np.dtype("<i4"), 4),
    "F32": (np.dtype("<f4"), 4),
    "U64": (np.dtype("<u8"), 8),
    "I64": (np.dtype("<i8"), 8),
    "F64": (np.dtype("<f8"), 8),
    "C64": (np.dtype("<c8"), 8),  # two float32
}
_UNSUPPORTED_DTYPES = frozenset({
    "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ",
    "F6_E2M3", "F6_E3M2", "F4",
})
_TENSOR_FIELDS = ("dtype", "shape", "data_offsets")


class SafetensorsError(FormatError):
    """A safetensors file, index or config is malformed or inconsistent."""


class SafetensorsModel(dict[str, NDArray[Any]]):
    """The tensors of a checkpoint, name -> read-only ``numpy.ndarray``.

    A plain dict (in header order; for a sharded checkpoint, shard by shard
    in order of first mention in the index, each in its header order) with:

    - ``config``: the parsed ``config.json`` beside the checkpoint when
      loading a directory or an index and the file exists, else None.
    - ``metadata``: the ``"__metadata__"`` strings (``{}`` if absent). For a
      sharded checkpoint, the shards' metadata combined (the first shard
      giving a key wins; see ``shard_metadata`` for each one's own).
    - ``shard_metadata``: ``{file name: __metadata__}`` per file read.
    - ``index_metadata``: the index's ``"metadata"`` object (sharded only,
      ``{}`` if absent), else None.
    - ``files``: the absolute paths of the safetensors files read.
    """

    def __init__(self, tensors: Union[Dict[str, NDArray[Any]], Iterable[Tuple[str, NDArray[Any]]]] = (), *,
                 config: Optional[Dict[str, Any]] = None, metadata: Optional[Dict[str, str]] = None,
                 shard_metadata: Optional[Dict[str, Dict[str, str]]] = None,
                 index_metadata: Optional[Dict[str, Any]] = None, files: Iterable[str] = ()) -> None:
        super().__init__(tensors)
        self.config = config
        self.metadata = {} if metadata is None else metadata
        self.shard_metadata = {} if shard_metadata is None else shard_metadata
        self.index_metadata = index_metadata
        self.files = tuple(files)

    def check(self) -> None:
        """:class:`FormatError` naming the first file whose mapping the arrays view that
        changed size, was modified or lost pages since it was loaded (docs/security.md)."""
        check_maps(maps_of(*self.values()))

    def __repr__(self) -> str:
        return (f"SafetensorsModel({len(self)} tensors, files={len(self.files)}, "
                f"config={'yes' if self.config is not None else 'no'})")


# ------------------------------------------------------------------ helpers --

def _fail(path: StrPath, problem: str, tensor: Optional[str] = None) -> SafetensorsError:
    where = str(path) if tensor is None else f"{path}: tensor {tensor!r}"
    return SafetensorsError(f"{where}: {problem}")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_text(path: StrPath, s: str, what: str) -> None:
    # json accepts lone surrogates in \u escapes; they are not valid UTF-8 text
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(path, f"{what} {s!r} is not valid Unicode (lone surrogate)") from None


def _parse_json(path: StrPath, raw: bytes, what: str) -> Dict[str, Any]:
    """Strict JSON: UTF-8, no duplicate keys, no NaN/Infinity; returns an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _fail(path, f"{what} is not valid UTF-8 ({e})") from None

    def pairs(items: List[Tuple[str, Any]]) -> Dict[str, Any]:
        obj: Dict[str, Any] = {}
        for k, v in items:
            if k in obj:
                raise _fail(path, f"{what} has duplicate key {k!r}")
            _check_text(path, k, f"{what} key")
            obj[k] = v
        return obj

    def bad_constant(name: str) -> NoReturn:
        raise _fail(path, f"{what} is not valid JSON ({name} is not a JSON value)")

    def parse_int(literal: str) -> int:  # don't let a 100 MB digit string become one int
        if len(literal) > _MAX_INT_DIGITS:
            raise _fail(path, f"{what} is not valid JSON (integer literal of {len(literal)} "
                              f"characters, more than {_MAX_INT_DIGITS})")
        return int(literal)

    try:
        value = json.loads(text, object_pairs_hook=pairs, parse_constant=bad_constant,
                           parse_int=parse_int)
    except SafetensorsError:
        raise
    except ValueError as e:  # JSONDecodeError
        raise _fail(path, f"{what} is not valid JSON ({e})") from None
    except RecursionError:
        raise _fail(path, f"{what} is not valid JSON (nested too deeply)") from None
    if not isinstance(value, dict):
        raise _fail(path, f"{what} is not a JSON object (got {type(value).__name__})")
    return value


def _read_json_file(path: StrPath, what: str) -> Dict[str, Any]:
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_JSON_BYTES:
                raise _fail(path, f"{what} is {size} bytes, more than the {MAX_JSON_BYTES} allowed")
            raw = f.read(MAX_JSON_BYTES + 1)
    except OSError as e:
        raise _fail(path, f"cannot read {what}: {e.strerror or e}") from e
    if len(raw) > MAX_JSON_BYTES:
        raise _fail(path, f"{what} is more than the {MAX_JSON_BYTES} bytes allowed")
    return _parse_json(path, raw, what)


# -------------------------------------------------------------- one file --

#: a validated header entry: (dtype, shape, begin, end)
_Entry = Tuple[str, Tuple[int, ...], int, int]


def _parse_entry(path: StrPath, name: str, entry: Any) -> _Entry:
    """Validate one header entry; returns (dtype, shape, begin, end)."""
    if not isinstance(entry, dict):
        raise _fail(path, f"header entry is a {type(entry).__name__}, not an object", name)
    missing = [k for k in _TENSOR_FIELDS if k not in entry]
    if missing:
        raise _fail(path, f"header entry is missing {', '.join(missing)}", name)
    extra = sorted(set(entry) - set(_TENSOR_FIELDS))
    if extra:
        raise _fail(path, f"header entry has unexpected field(s) {', '.join(map(repr, extra))}", name)

    dtype = entry["dtype"]
    if not isinstance(dtype, str):
        raise _fail(path, f"dtype must be a string, got {dtype!r}", name)
    if dtype in _UNSUPPORTED_DTYPES:
        raise _fail(path, f"dtype {dtype} is not supported (numpy has no such type)", name)
    if dtype not in _DTYPES:
        raise _fail(path, f"unknown dtype {dtype!r}", name)

    shape = entry["shape"]
    if not isinstance(shape, list):
        raise _fail(path, f"shape must be a list of integers, got {shape!r}", name)
    if len(shape) > _MAX_NDIM:
        raise _fail(path, f"shape has {len(shape)} dimensions, more than {_MAX_NDIM}", name)
    for d in shape:
        if not _is_int(d):
            raise _fail(path, f"shape {shape!r} has a non-integer dimension {d!r}", name)
        if d < 0:
            raise _fail(path, f"shape {shape!r} has a negative dimension {d}", name)
        if d > _U64_MAX:
            raise _fail(path, f"shape {shape!r} has a dimension larger than 2**64-1", name)

    offs = entry["data_offsets"]
    if not (isinstance(offs, list) and len(offs) == 2 and all(_is_int(o) for o in offs)):
        raise _fail(path, f"data_offsets must be [begin, end] integers, got {offs!r}", name)
    begin, end = offs
    if begin < 0 or end < 0 or begin > _U64_MAX or end > _U64_MAX:
        raise _fail(path, f"data_offsets {offs!r} out of range (0 .. 2**64-1)", name)
    if begin > end:
        raise _fail(path, f"data_offsets {offs!r} has begin > end", name)

    count = 1
    for d in shape:  # Python ints: no overflow
        count *= d
    nbytes = count * _DTYPES[dtype][1]
    if end - begin != nbytes:
        raise _fail(path, f"data_offsets {offs!r} span {end - begin} bytes but {dtype} "
                          f"shape {shape!r} needs {nbytes}", name)
    return dtype, tuple(shape), begin, end


def _parse_metadata(path: StrPath, meta: Any) -> Dict[str, str]:
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _fail(path, f"__metadata__ must be an object of strings, got {type(meta).__name__}")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise _fail(path, f"__metadata__[{k!r}] must be a string, got {v!r}")
        _check_text(path, v, f"__metadata__[{k!r}]")
    return dict(meta)


def _check_coverage(path: StrPath, entries: Dict[str, _Entry], data_len: int) -> None:
    """The tensors must tile [0, data_len) exactly (as the official library requires)."""
    pos, prev = 0, None
    for name, (_, _, begin, end) in sorted(entries.items(), key=lambda kv: (kv[1][2], kv[1][3])):
        if end > data_len:
            raise _fail(path, f"data_offsets [{begin}, {end}] run past the end of the "
                              f"{data_len}-byte data section", name)
        if begin < pos:
            raise _fail(path, f"data_offsets [{begin}, {end}] overlap tensor {prev!r} "
                              f"(which ends at {pos})", name)
        if begin > pos:
            after = f"after tensor {prev!r}" if prev is not None else "at the start of the data section"
            raise _fail(path, f"data_offsets [{begin}, {end}] leave a hole of {begin - pos} "
                              f"unused bytes {after}", name)
        pos, prev = end, name
    if pos != data_len:
        raise _fail(path, f"{data_len - pos} trailing bytes after the last tensor "
                          f"(data section is {data_len} bytes, tensors cover {pos})")


def _tensor(path: StrPath, mm: NDArray[np.uint8], base: int, name: str, dtype: str, shape: Tuple[int, ...],
            begin: int, end: int) -> NDArray[Any]:
    storage, _ = _DTYPES[dtype]
    raw = mm[base + begin: base + end]
    try:
        arr = raw.view(np.uint8 if dtype == "BOOL" else storage).reshape(shape)
    except (ValueError, OverflowError) as e:
        raise _fail(path, f"shape {list(shape)!r} cannot be represented by numpy ({e})", name) from None
    arr = arr.view(np.ndarray)  # plain ndarray whose .base chain reaches the memmap
    if dtype == "BOOL":
        if arr.size and arr.max() > 1:
            raise _fail(path, "BOOL data holds a byte other than 0 or 1", name)
        arr = arr.view(np.bool_)
    elif dtype == "BF16":
        wide = arr.astype(np.uint32)
        wide <<= np.uint32(16)  # in place: a 0-d tensor stays an array (a shift would give a scalar)
        arr = wide.view(np.float32)
    arr.setflags(write=False)
    return arr


def _load_file(path: str) -> Tuple[Dict[str, NDArray[Any]], Dict[str, str]]:
    """Read one safetensors file; returns (ordered dict of arrays, metadata). The file
    is mapped once (guarded, docs/security.md) and the header is read from the mapping."""
    try:
        mf = MappedFile(path)
    except OSError as e:
        raise _fail(path, f"cannot open: {e.strerror or e}") from e
    size = mf.size
    with guarded((mf,)):
        if size < 8:
            raise _fail(path, f"file is {size} bytes, too short for the 8-byte header length")
        (n,) = struct.unpack("<Q", mf[:8])
        if n == 0:
            raise _fail(path, "header length is zero")
        if n > MAX_HEADER_BYTES:
            raise _fail(path, f"header length {n} is larger than the {MAX_HEADER_BYTES}-byte limit")
        if n > size - 8:
            raise _fail(path, f"header length {n} is larger than the {size - 8} bytes after it")
        raw = mf[8:8 + n]

    header = _parse_json(path, raw, "header")
    metadata = _parse_metadata(path, header.get("__metadata__"))
    entries: Dict[str, _Entry] = {}
    for name, entry in header.items():
        if name != "__metadata__":
            entries[name] = _parse_entry(path, name, entry)
    data_len = size - 8 - n
    _check_coverage(path, entries, data_len)

    # a numpy.memmap (what np.memmap(path, mode="r") gives) over the guarded mapping
    mm = np.frombuffer(memoryview(mf), dtype=np.uint8).view(np.memmap)
    mm.filename, mm.offset, mm.mode = os.path.abspath(path), 0, "r"
    base = 8 + n
    with guarded((mf,)):
        tensors = {name: _tensor(path, mm, base, name, *info) for name, info in entries.items()}
    return tensors, metadata


# ------------------------------------------------------------- sharded --

def _shard_path(index_path: str, directory: str, shard: object, tensor: str) -> str:
    if not isinstance(shard, str):
        raise _fail(index_path, f"weight_map value must be a file name, got {shard!r}", tensor)
    if (shard in ("", ".", "..") or "/" in shard or "\\" in shard or "\0" in shard
            or os.path.isabs(shard)):
        raise _fail(index_path, f"shard {shard!r} must be a plain file name in the index's directory",
                    tensor)
    return os.path.join(directory, shard)


def _load_index(index_path: str, config: Optional[Dict[str, Any]]) -> SafetensorsModel:
    index = _read_json_file(index_path, "index")
    if "weight_map" not in index:
        raise _fail(index_path, "index has no weight_map")
    weight_map = index["weight_map"]
    if not isinstance(weight_map, dict):
        raise _fail(index_path, f"weight_map must be an object, got {type(weight_map).__name__}")
    if not weight_map:
        raise _fail(index_path, "weight_map is empty")
    index_meta = index.get("metadata")
    if index_meta is None:
        index_meta = {}
    elif not isinstance(index_meta, dict):
        raise _fail(index_path, f"index metadata must be an object, got {type(index_meta).__name__}")

    directory = os.path.dirname(os.path.abspath(index_path))
    shards: Dict[str, str] = {}  # shard file name -> path, in order of first mention
    for tensor, shard in weight_map.items():
        if shard not in shards:
            shards[shard] = _shard_path(index_path, directory, shard, tensor)
    for shard, spath in shards.items():
        if not os.path.isfile(spath):
            first = next(t for t, s in weight_map.items() if s == shard)
            raise _fail(index_path, f"shard file {shard!r} (holding tensor {first!r}) does not exist")

    out: Dict[str, NDArray[Any]] = {}
    owner: Dict[str, str] = {}
    metadata: Dict[str, str] = {}
    shard_meta: Dict[str, Dict[str, str]] = {}
    for shard, spath in shards.items():
        tensors, meta = _load_file(spath)
        shard_meta[shard] = meta
        for k, v in meta.items():
            metadata.setdefault(k, v)
        for name, arr in tensors.items():
            if name in owner:
                raise _fail(index_path, f"duplicate tensor name: in shard {owner[name]!r} "
                                        f"and in shard {shard!r}", name)
            owner[name] = shard
            mapped = weight_map.get(name)
            if mapped is None:
                raise _fail(index_path, f"tensor in shard {shard!r} is not listed in the weight_map", name)
            if mapped != shard:
                raise _fail(index_path, f"tensor is in shard {shard!r} but the weight_map "
                                        f"maps it to {mapped!r}", name)
            out[name] = arr
    for name, shard in weight_map.items():
        if name not in out:
            raise _fail(index_path, f"weight_map maps tensor to shard {shard!r}, which has "
                                    f"no such tensor", name)
    return SafetensorsModel(out, config=config, metadata=metadata, shard_metadata=shard_meta,
                            index_metadata=index_meta,
                            files=[os.path.abspath(p) for p in shards.values()])


# -------------------------------------------------------------- public --

def _read_config(directory: str) -> Optional[Dict[str, Any]]:
    cpath = os.path.join(directory, CONFIG_FILE)
    if not os.path.exists(cpath):
        return None
    return _read_json_file(cpath, "config")


def load_safetensors(path: Union[StrPath, bytes]) -> SafetensorsModel:
    """Load a safetensors checkpoint into a :class:`SafetensorsModel` (a dict).

    ``path`` is a ``.safetensors`` file; a ``*.json`` sharded index (e.g.
    ``model.safetensors.index.json``) whose ``weight_map`` names shard files
    in the same directory; or a directory holding ``model.safetensors`` or
    ``model.safetensors.index.json`` (not both: pass the one you mean). For a
    directory or an index, ``config.json`` beside it, if present, is parsed
    into ``.config``.

    Raises :class:`SafetensorsError` (a ``ValueError``) for any missing,
    unreadable, malformed or inconsistent file, naming the file, the tensor
    if any, and the problem.
    """
    try:
        path = os.fspath(path)
    except TypeError:
        raise TypeError(f"path must be str or os.PathLike, got {type(path).__name__}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if os.path.isdir(path):
        single = os.path.join(path, MODEL_FILE)
        index = os.path.join(path, INDEX_FILE)
        has_single, has_index = os.path.isfile(single), os.path.isfile(index)
        if has_single and has_index:
            raise _fail(path, f"directory holds both {MODEL_FILE} and {INDEX_FILE}; "
                              "pass the one to load")
        if not (has_single or has_index):
            raise _fail(path, f"directory holds neither {MODEL_FILE} nor {INDEX_FILE}")
        config = _read_config(path)
        if has_index:
            return _load_index(index, config)
        tensors, meta = _load_file(single)
        return SafetensorsModel(tensors, config=config, metadata=meta,
                                shard_metadata={MODEL_FILE: meta}, files=[os.path.abspath(single)])
    if not os.path.exists(path):
        raise _fail(path, "no such file or directory")
    if not os.path.isfile(path):
        raise _fail(path, "not a regular file")
    if path.endswith(".json"):
        return _load_index(path, _read_config(os.path.dirname(os.path.abspath(path))))
    tensors, meta = _load_file(path)
    return SafetensorsModel(tensors, metadata=meta, shard_metadata={os.path.basename(path): meta},
                            files=[os.path.abspath(path)])
