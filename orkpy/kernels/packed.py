"""Packed weights: the int4-stored / int8-computed path.

``pack(q)`` lays a :class:`~orkpy.QuantizedTensor` into the RK3588 NPU's
native int8 weight layout, tiles of 32 outputs x 32 inputs
(``(N/32, K/32, 32, 32)``; 4-bit kinds keep the same tile order with two codes
per byte). ``PackedWeight.matmul`` quantizes activations to int8, multiplies in
int8 with exact int32 accumulation and scales back; ``save_packed`` /
``load_packed`` persist the weight as 'O4N1' (4-bit) or 'O8N1' (int8; int6 / int5 as
6 / 5 bits per code, unpacked to int8 tiles on load), see
docs/o4n1.md (group-wise scales are float16 values, stored as such: version 3).
Layout and arithmetic contract: csrc/ork/pack.h.
"""
from __future__ import annotations

import hashlib
import os
from typing import Any, NoReturn, Optional, Sequence, Tuple, Union

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._core import FormatError
from .._io import atomic_write
from .._mapped import MappedFile, guarded, maps_of
from .._mapped import check as _check_maps
from .._typing import StrPath
from .actspec import ACT_MODES, ActSpec
from .quant import KIND_INFO, KINDS, QuantizedTensor, _check_threads, check_group, lut as _lut

ACTIVATION_MODES = ACT_MODES  # the activation mode registry (csrc/ork/actspec.h), as orkpy.ACT_MODES


class PackedWeight:
    """A packed ``(N, K)`` weight: ``kind``, ``shape``, ``store`` (the tile
    array: uint8 ``(N/32, K/32, 32, 16)`` for 4-bit kinds, int8
    ``(N/32, K/32, 32, 32)`` for int8, padded with zeros), ``bscale``
    (float32 ``(N,)``; ``(N, G)`` with group-wise scales, ``group`` > 0) and ``lut``
    (int8[16] or None).

    Operators follow NumPy's meaning of the ``(N, K)`` matrix ``W`` it
    stores (a linear layer's weight, out x in): ``x @ pw.T`` is
    ``pw.matmul(x)``, the int8 kernel, i.e. ``x @ W.T`` for ``x`` of shape
    ``(..., K)``, giving ``(..., N)``. ``x @ pw`` (NumPy: ``x @ W``, a
    product over N) has no kernel and raises TypeError saying so.

    The constructor is a door: it refuses (ValueError / TypeError naming the
    entry) a store of the wrong dtype or shape, an int8 code of -128, and a
    scale that is not finite, is negative (or -0.0) or exceeds
    ``FLT_MAX / (127 * 127 * K)`` (docs/o4n1.md); what ``pack`` and
    ``load_packed`` produce always passes. Arrays viewing a file mapping are
    checked before and after each use (docs/security.md).
    """

    __array_ufunc__ = None  # ndarray @ PackedWeight defers to our operators instead of making an object array

    def __init__(self, kind: str, shape: Sequence[int], store: NDArray[Any], bscale: NDArray[np.float32],
                 source: Optional[str] = None, group: Optional[int] = None,
                 boffset: Optional[NDArray[np.float32]] = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}")
        N, K = int(shape[0]), int(shape[1])
        g = check_group(group, K)
        _core.packed_check(store, kind, N, K, bscale, g)
        if boffset is not None:
            boffset = check_offsets(boffset, kind, N, K, g)
        self._setup(kind, (N, K), store, bscale, source, g, boffset)

    def _setup(self, kind: str, shape: Tuple[int, int], store: NDArray[Any], bscale: NDArray[np.float32],
               source: Optional[str], group: int = 0, boffset: Optional[NDArray[np.float32]] = None) -> None:
        self.kind = kind
        self.group = group  # 0: per-channel bscale (N,); else group-wise (N, G) (csrc/ork/pack.h)
        self.shape = shape
        self.store = store
        self.bscale = bscale
        self.boffset = boffset  # affine groups (csrc/ork/affine.h): offsets (N, G) beside bscale; None: symmetric
        self.lut = _lut(kind)
        self.source = source  # a file path when loaded
        self._mapped_for: Tuple[Any, Any] = (None, None)
        self._maps: Tuple[MappedFile, ...] = ()

    @classmethod
    def _trusted(cls, kind: str, shape: Tuple[int, int], store: NDArray[Any], bscale: NDArray[np.float32],
                 source: Optional[str] = None, group: int = 0,
                 boffset: Optional[NDArray[np.float32]] = None) -> PackedWeight:
        """For pack() and load_packed(), whose C cores have validated codes and scales already."""
        pw = cls.__new__(cls)
        pw._setup(kind, shape, store, bscale, source, group, boffset)
        return pw

    def as_kind(self, kind: str) -> PackedWeight:
        """The same store and scales read as another kind with the same codes and store layout
        (w4a4 and w4a8 share int4 codes; they differ only in the activation width). No copy."""
        if kind == self.kind:
            return self
        a = dict(_core.packed_layout(self.kind, self.N, self.K, self.group), kind=None)
        b = dict(_core.packed_layout(kind, self.N, self.K, self.group), kind=None)
        ka, kb = KIND_INFO[self.kind], KIND_INFO[kind]
        if a != b or ka.qmax != kb.qmax or ka.store_bits != kb.store_bits:
            raise ValueError(f"a {self.kind} store cannot be read as {kind}: the codes or layouts differ")
        return PackedWeight._trusted(kind, self.shape, self.store, self.bscale, self.source, self.group, self.boffset)

    def _file_views(self) -> Tuple[Any, ...]:
        """The arrays of this weight that may view a file, read without unpacking anything."""
        return (self.store, self.bscale)

    def _mapped(self) -> Tuple[MappedFile, ...]:
        """The file mappings store and bscale view (recomputed if either attribute was replaced)."""
        if self._mapped_for[0] is not self.store or self._mapped_for[1] is not self.bscale:
            self._maps = maps_of(self.store, self.bscale)
            self._mapped_for = (self.store, self.bscale)
        return self._maps

    @property
    def N(self) -> int:
        return self.shape[0]

    @property
    def K(self) -> int:
        return self.shape[1]

    @property
    def nbytes(self) -> int:
        """Bytes as stored in a file: the tile store plus the scales, 4 per float32 per-channel
        scale and 2 per group-wise scale (float16 values, O4N1/O8N1 version 3;
        ``tiermap.packed_nbytes``). An int6 / int5 store counts 6 / 5 bits per code (its file
        store, docs/o4n1.md); in memory it is the int8 tile store (``store.nbytes``)."""
        store = _core.packed_layout(self.kind, self.N, self.K, self.group)["file_store_bytes"]
        offs = 0 if self.boffset is None else 2 * self.boffset.size  # float16 offsets (version 4)
        return int(store + (2 if self.group else 4) * self.bscale.size + offs)

    @property
    def T(self) -> PackedWeightT:
        """The ``(K, N)`` transpose, for ``x @ pw.T`` (== ``pw.matmul(x)``)."""
        return PackedWeightT(self)

    def __rmatmul__(self, x: object) -> NoReturn:
        raise TypeError(f"x @ pw multiplies by the {self.N} x {self.K} weight itself (a product over N, which "
                        f"has no kernel); a linear layer is x @ pw.T == pw.matmul(x) for x of width K = {self.K}")

    def matmul_int(self, xq: ArrayLike, threads: Optional[int] = None) -> NDArray[np.int32]:
        """Exact int32 accumulators ``(M, N)`` for int8 activations ``xq`` ``(M, K)``; with
        group-wise scales one per group, ``(G, M, N)`` (what an NPU job split on group
        boundaries returns)."""
        xq = np.asarray(xq)
        if xq.ndim == 1:
            xq = xq[None, :]
        maps = self._mapped()
        _check_maps(maps)
        acc = _core.matmul_int(self.store, self.kind, self.N, self.K, xq, _check_threads(threads), self.group)
        _check_maps(maps)
        return acc

    def matmul(self, x: ArrayLike, act: Union[str, ActSpec] = "per_token", threads: Optional[int] = None,
               clip: Optional[float] = None, outliers: Optional[ArrayLike] = None,
               prefix: Optional[int] = None) -> NDArray[np.float32]:
        """float32 ``x`` ``(M, K)`` (or ``(K,)``) -> float32 ``(M, N)``.

        Activations are quantized to int8 symmetric in an activation mode (:data:`orkpy.ACT_MODES`):
        one scale per row (``act="per_token"``), one for the whole input (``"per_tensor"``) or the
        fixed range ``clip`` (``"static"``: scale ``clip / 127``, values beyond ``+-clip``
        saturate), multiplied with int32 accumulation, and scaled by ``ascale * bscale[n]``.
        ``outliers`` (increasing input channels; required by ``"per_token_outliers"``,
        allowed with any mode): those channels are left out of the int8 product and added
        in float with the same weight values (:mod:`orkpy.runtime.actcal`, csrc/ork/linear.h).
        ``prefix``: the first rows quantized per row whatever the mode (and left out of the
        per-tensor absmax). ``act`` may be a resolved :class:`orkpy.ActSpec` instead (``clip``,
        ``outliers``, ``prefix`` then in it). Group-wise scales: the int32 sums per group, each
        scaled by its group's scale, added in group order (csrc/ork/pack.h); not with ``outliers``.
        """
        spec = ActSpec.for_matmul(act, clip, outliers, prefix)
        x = np.asarray(x)
        vec = x.ndim == 1
        if vec:
            x = x[None, :]
        maps = self._mapped()
        _check_maps(maps)
        y = _core.matmul(self.store, self.kind, self.N, self.K, self.bscale, x, spec.to_core(), _check_threads(threads),
                         self.group, self.boffset)
        _check_maps(maps)
        return y[0] if vec else y

    def codes(self) -> NDArray[Any]:
        """The row-major codes (as in QuantizedTensor.codes), unpacked from the tiles."""
        maps = self._mapped()
        _check_maps(maps)
        c = _core.unpack(self.store, self.kind, self.N, self.K)
        _check_maps(maps)
        return c

    def int8_weight(self) -> NDArray[np.int8]:
        """The int8 weight the kernels multiply: ``(N, K)`` (LUT applied for 4-bit kinds)."""
        c = self.codes()
        if KIND_INFO[self.kind].bits == 8:
            return c
        full = np.empty((self.N, c.shape[1] * 2), np.uint8)
        full[:, 0::2] = c & 15
        full[:, 1::2] = c >> 4
        assert self.lut is not None  # 4-bit kinds have a LUT
        return self.lut[full[:, : self.K]]

    def dequantize(self) -> NDArray[np.float32]:
        w = self.int8_weight().astype(np.float32)
        if not self.group:
            return w * self.bscale[:, None]
        w = w * np.repeat(self.bscale, self.group, axis=1)[:, : self.K]
        if self.boffset is not None:  # affine groups: code * scale, then + offset
            w += np.repeat(self.boffset, self.group, axis=1)[:, : self.K]
        return w

    def save(self, path: StrPath) -> None:
        save_packed(self, path)

    def __repr__(self) -> str:
        g = (f", group={self.group}" if self.group else "") + (", affine" if self.boffset is not None else "")
        return f"PackedWeight(kind={self.kind!r}, shape={self.shape}{g}, nbytes={self.nbytes})"


class PackedWeightT:
    """``pw.T``: a PackedWeight seen as its ``(K, N)`` transpose. ``x @ pw.T``
    runs ``pw.matmul(x)`` (per-token int8 activations, int32 accumulation)
    for ``x`` of shape ``(K,)``, ``(M, K)`` or ``(..., K)``; ``pw.T.T`` is ``pw``."""

    __array_ufunc__ = None

    def __init__(self, pw: PackedWeight) -> None:
        self.T = pw

    @property
    def shape(self) -> Tuple[int, int]:
        return (self.T.K, self.T.N)

    def __rmatmul__(self, x: ArrayLike) -> NDArray[np.float32]:
        pw = self.T
        x = np.asarray(x)
        if x.ndim == 0 or x.shape[-1] != pw.K:
            raise ValueError(f"x @ pw.T needs x of width K = {pw.K}, got shape {x.shape}")
        if x.ndim <= 2:
            return pw.matmul(x)
        return pw.matmul(x.reshape(-1, pw.K)).reshape(*x.shape[:-1], pw.N)

    def __repr__(self) -> str:
        return f"{self.T!r}.T"


def pack(q: QuantizedTensor) -> PackedWeight:
    """Pack a QuantizedTensor into the NPU tile layout."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"pack expects a QuantizedTensor, got {type(q).__name__}")
    N, K = q.shape
    store = _core.pack(q.codes, q.kind, N, K)
    bscale = np.ascontiguousarray(q.scales, dtype=np.float32) + np.float32(0)  # -0.0 -> +0.0
    if not np.all(np.isfinite(bscale)) or np.any(bscale < 0):
        raise ValueError("scales must be finite and non-negative")
    _core.packed_check(store, q.kind, N, K, bscale, q.group)  # the scale bound (the codes were checked by _core.pack)
    boffset = None if q.offsets is None else check_offsets(q.offsets, q.kind, N, K, q.group)
    return PackedWeight._trusted(q.kind, (N, K), store, bscale, group=q.group, boffset=boffset)


def check_offsets(offsets: ArrayLike, kind: str, N: int, K: int, group: int) -> NDArray[np.float32]:
    """Affine groups' offsets (csrc/ork/affine.h) as the C-contiguous float32 ``(N, G)`` the kernels
    read; ValueError unless the kind and group take them and every offset is a finite float16 value."""
    if KIND_INFO[kind].bits != 8 or KIND_INFO[kind].qmax != 7 or not group:
        raise ValueError(f"offsets (affine groups) are for group-wise w4a4 / w4a8 weights, not {kind} "
                         f"{'group ' + str(group) if group else 'per channel'}")
    o = np.ascontiguousarray(offsets, dtype=np.float32) + np.float32(0)  # -0.0 -> +0.0
    G = -(-K // group)
    if o.shape != (N, G):
        raise ValueError(f"offsets have shape {o.shape}, expected (N, G) = ({N}, {G})")
    flat = o.reshape(-1)
    bad = np.flatnonzero(~np.isfinite(flat) | (_core.f16_to_f32(_core.f16_from_f32(flat)).view(np.uint32)
                                               != flat.view(np.uint32)))
    if bad.size:
        n, i = divmod(int(bad[0]), G)
        raise ValueError(f"offset [{n}, {i}] = {flat[bad[0]]!r} is not a finite float16 value")
    return o


def _f16_scales(bscale: NDArray[np.float32], path: StrPath) -> bytes:
    """The float16 bytes of group-wise scales (version 3); ValueError naming the first scale that
    is not a float16 value (nothing is rounded at save time)."""
    s = np.ascontiguousarray(bscale, dtype=np.float32)
    flat = s.reshape(-1)
    h = _core.f16_from_f32(flat)
    bad = np.flatnonzero(_core.f16_to_f32(h).view(np.uint32) != flat.view(np.uint32))
    if bad.size:
        n, i = divmod(int(bad[0]), s.shape[1])
        raise ValueError(f"{os.fspath(path)}: scale[{n}, {i}] = {str(flat[bad[0]])} is not a float16 value "
                         f"({bad.size} of {flat.size} are not); group-wise scales are stored as float16 "
                         "(docs/o4n1.md version 3), quantize with orkpy.quantize(..., group_size=)")
    return h.astype("<u2").tobytes()


def save_packed(pw: PackedWeight, path: StrPath) -> None:
    """Write an O4N1 (4-bit kinds) or O8N1 (int8) file atomically: version 1 with
    per-channel float32 scales, version 3 with group-wise scales, which must be float16
    values (ValueError naming the first that is not), version 4 with affine groups' offsets
    after them (csrc/ork/affine.h), docs/o4n1.md. A store whose padding
    lanes do not hold the zero code (a hand-made one) is a ValueError naming the lane:
    load_packed would refuse the file."""
    _save_packed(pw, path)


def _save_packed(pw: PackedWeight, path: StrPath, durable: bool = True, direct: bool = False,
                 hasher: Any = None) -> None:
    """save_packed (``durable``, ``direct``, ``hasher``: orkpy._io.atomic_write)."""
    if not isinstance(pw, PackedWeight):
        raise TypeError(f"save_packed expects a PackedWeight, got {type(pw).__name__}")
    affine = pw.boffset is not None
    header = _core.packed_header(pw.kind, pw.N, pw.K, pw.group, affine)
    layout = _core.packed_layout(pw.kind, pw.N, pw.K, pw.group, affine)
    maps = pw._mapped()
    with guarded(maps):
        # padding lanes hold the zero code, as load_packed requires (a hand-made store may hold any code there)
        try:
            _core.store_padding_check(pw.store, pw.kind, pw.N, pw.K)
        except ValueError as e:
            raise ValueError(f"{os.fspath(path)}: {e}") from None
        if pw.group:
            scales = _f16_scales(pw.bscale, path)
            if pw.boffset is not None:  # version 4: the offsets follow the scales (float16 values: pack() checked)
                scales += _core.f16_from_f32(np.ascontiguousarray(pw.boffset, np.float32).reshape(-1)).astype("<u2").tobytes()
        else:
            scales = np.ascontiguousarray(pw.bscale, dtype="<f4").tobytes()
        store: Union[bytes, memoryview]
        if not maps and layout["file_store_bytes"] == layout["store_bytes"] and pw.store.flags.c_contiguous:
            store = pw.store.data.cast("B")  # in memory and stored as is: written from the array, no copy
        else:
            store = _core.store_to_file(pw.store, pw.kind, pw.N, pw.K)  # int6 / int5: 6 / 5 bits per code
    pad = layout["store_offset"] - len(header) - len(scales)
    atomic_write(path, [header, scales, bytes(pad), store], durable, direct,
                 head=layout["store_offset"], hasher=hasher)  # the header is read back at load


def save_packed_sha256(pw: PackedWeight, path: StrPath, durable: bool = True, direct: bool = False) -> str:
    """:func:`save_packed`, returning the hex SHA-256 of the bytes it wrote (hashed from memory, so a
    model directory's manifest needs no read-back of the file); ``direct``: past the page cache
    (orkpy._io.atomic_write)."""
    h = hashlib.sha256()
    _save_packed(pw, path, durable, direct, hasher=h)  # hashed as written: the bytes in the file
    return h.hexdigest()


class _UnpackedOnUse(PackedWeight):
    """An int6 / int5 weight as :func:`_map_saved` returns it: ``_raw``, its 6 / 5-bit file store,
    views the file just written, and the int8 tile store the kernels read is unpacked from it the
    first time :attr:`store` is read, then kept (what :func:`load_packed` holds). Until then none
    of it is in memory: a streamed quantization holds its int6 / int5 linears as mapped files, as
    it holds the others, not one int8 byte a weight each (Qwen3-1.7B at 5 bits a weight: about
    40 MB a layer)."""

    _raw: Optional[NDArray[np.uint8]] = None
    _unpacked: Optional[NDArray[Any]] = None

    @property
    def store(self) -> NDArray[Any]:
        if self._unpacked is None:
            raw = self._raw
            assert raw is not None
            with guarded(maps_of(raw)):  # the file changed under it: FormatError
                s = _core.store_from_file(raw, self.kind, self.N, self.K)
            s.flags.writeable = False  # read-only, as a mapped store is
            self._unpacked = s.reshape(_core.packed_layout(self.kind, self.N, self.K, self.group)["store_shape"])
            self._raw = None
        return self._unpacked

    @store.setter
    def store(self, value: Optional[NDArray[Any]]) -> None:
        self._unpacked = value

    def _file_views(self) -> Tuple[Any, ...]:
        return (self.bscale,) if self._raw is None else (self._raw, self.bscale)


def _release_pages(pw: PackedWeight) -> None:
    """Give the pages of the files ``pw`` views back to the kernel (their values stay), unpacking nothing."""
    for m in maps_of(*pw._file_views()):
        m.release()


def _map_saved(pw: PackedWeight, path: StrPath) -> PackedWeight:
    """``pw`` as a read-only mapping of the file :func:`save_packed` has just written from it: the store
    (and per-row scales) view the file, without :func:`load_packed`'s checks, which would read the whole
    int8 store back (after a direct write, from the disk); the bytes are ``pw``'s, which pack() checked.
    Group scales (float16 in the file) are ``pw``'s float32 values, as load_packed widens them. A store
    kept in another form in the file (int6 / int5) is unpacked from it when first used
    (:class:`_UnpackedOnUse`). A weight that is itself mapped is loaded."""
    layout = _core.packed_layout(pw.kind, pw.N, pw.K, pw.group, pw.boffset is not None)
    if pw._mapped():
        return load_packed(path)
    m = MappedFile(os.fspath(path))
    size = len(m)
    if size != layout["file_bytes"]:  # not what was just written
        m.close()
        raise FormatError(f"{os.fspath(path)}: {size} bytes, {layout['file_bytes']} were written")
    buf = memoryview(m)
    if pw.group:
        scales = np.array(pw.bscale, dtype=np.float32).reshape(pw.N, layout["G"])
    else:
        scales = np.frombuffer(buf, dtype="<f4", count=pw.N, offset=layout["scales_offset"])
    scales = scales.astype(np.float32, copy=False)
    if layout["file_store_bytes"] != layout["store_bytes"]:
        lazy = _UnpackedOnUse._trusted(pw.kind, (pw.N, pw.K), None, scales,  # type: ignore[arg-type]
                                       source=os.fspath(path), group=pw.group, boffset=pw.boffset)
        assert isinstance(lazy, _UnpackedOnUse)
        lazy._raw = np.frombuffer(buf, dtype=np.uint8, count=layout["file_store_bytes"], offset=layout["store_offset"])
        return lazy
    store = np.frombuffer(buf, dtype=layout["store_dtype"], count=layout["store_bytes"], offset=layout["store_offset"])
    return PackedWeight._trusted(pw.kind, (pw.N, pw.K), store.reshape(layout["store_shape"]), scales,
                                 source=os.fspath(path), group=pw.group, boffset=pw.boffset)


def load_packed(path: StrPath, mmap: bool = True, mapping: Optional[MappedFile] = None) -> PackedWeight:
    """Load an O4N1/O8N1 file; with ``mmap=True`` the store and scales are
    read-only views of a guarded memory map (streamed from disk on use; if the
    file changes while mapped, the weight's methods raise orkpy.FormatError,
    docs/security.md); ``mmap=False`` reads a private copy.
    ``mapping``: a :class:`orkpy._core.MappedFile` of the file, already open (``path`` then only
    names it): the weight views it (a loader that verified those bytes passes it).
    A malformed file raises orkpy.FormatError naming the problem."""
    path = os.fspath(path)
    buf: Union[bytes, memoryview]
    if mapping is not None:
        buf = memoryview(mapping)
    elif mmap:
        buf = memoryview(MappedFile(path))
    else:
        with open(path, "rb") as f:
            buf = f.read()
    maps = maps_of(buf)
    try:
        info = _core.packed_parse(buf)
    except FormatError as e:
        _check_maps(maps)  # a file that changed under the parse says so
        raise FormatError(f"{path}: {e}") from None
    _check_maps(maps)
    N, K, kind, group, G = info["N"], info["K"], info["kind"], info["group"], info["G"]
    if info["scale_bytes"] == 2:  # version 3: float16 scales, widened (exactly) to the float32 the kernels read
        with guarded(maps):
            h = np.frombuffer(buf, dtype="<u2", count=N * G, offset=info["scales_offset"])
            scales = _core.f16_to_f32(np.ascontiguousarray(h, dtype=np.uint16))
    else:
        scales = np.frombuffer(buf, dtype="<f4", count=N * G, offset=info["scales_offset"])
    if group:
        scales = scales.reshape(N, G)
    boffset = None
    if info["offsets_offset"]:  # version 4: affine groups' float16 offsets, widened exactly
        with guarded(maps):
            h = np.frombuffer(buf, dtype="<u2", count=N * G, offset=info["offsets_offset"])
            boffset = _core.f16_to_f32(np.ascontiguousarray(h, dtype=np.uint16)).reshape(N, G) + np.float32(0)
    layout = _core.packed_layout(kind, N, K, group)  # the store's shape and dtype (csrc/ork/pack.h)
    if layout["file_store_bytes"] != layout["store_bytes"]:  # int6 / int5: unpacked to the int8 tile store in memory
        with guarded(maps):
            raw = np.frombuffer(buf, dtype=np.uint8, count=info["store_bytes"], offset=info["store_offset"])
            try:
                store = _core.store_from_file(raw, kind, N, K)
            except FormatError as e:
                raise FormatError(f"{path}: {e}") from None
        store.flags.writeable = False  # read-only, as a mapped store is
    else:
        store = np.frombuffer(buf, dtype=layout["store_dtype"], count=info["store_bytes"], offset=info["store_offset"])
    return PackedWeight._trusted(kind, (N, K), store.reshape(layout["store_shape"]),
                                 scales.astype(np.float32, copy=False), source=path, group=group, boffset=boffset)
