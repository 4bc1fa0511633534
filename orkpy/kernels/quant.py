"""Weight quantization: NF4, uniform int4 and per-channel int8.

Weights are ``(N, K)`` arrays: N output channels, K inputs. See
``docs/quantization.md`` for the exact contract (levels, LUTs, rounding,
nibble order, scale search, stochastic rounding).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core
from .._mapped import check as check_maps
from .._mapped import maps_of



def _readonly(a: ArrayLike) -> NDArray[Any]:
    a = np.array(a, copy=True)
    a.setflags(write=False)
    return a


@dataclass(frozen=True)
class KindInfo:
    """One row of the C kind registry (csrc/ork/quant.h): ``bits`` 4 (codes
    index ``lut``, two per byte) or 8 (the codes are the int8 values);
    ``levels`` the nominal float levels and ``zero_code`` the code of level
    0.0 (4-bit kinds; None / 0 for int8); ``id`` the O4N1/O8N1 header field;
    ``qmax`` the largest |code| of an 8-bit kind (127 int8, 31 int6, 15 int5; 127 for
    4-bit kinds: the LUT's range); ``store_bits`` the bits per code in a file (4, 8, 6, 5); ``act_bits``
    the activation width its linears multiply: 8, or 4 for ``w4a4`` (integer codes in [-7, 7] for the
    NPU's int4 x int4 mode, -8 too in affine groups, docs/w4a4.md)."""

    name: str
    id: int
    bits: int
    levels: Optional[np.ndarray]
    lut: Optional[np.ndarray]
    zero_code: int
    qmax: int = 127
    store_bits: int = 8
    act_bits: int = 8


def _kind_info(row: Dict[str, Any]) -> KindInfo:
    return KindInfo(row["name"], row["id"], row["bits"], None if row["levels"] is None else _readonly(row["levels"]),
                    None if row["lut"] is None else _readonly(row["lut"]), row["zero_code"], row["qmax"],
                    row["store_bits"], row["act_bits"])


#: The kind registry, in id order: every kind list in orkpy (and every CLI choice) derives from it.
KIND_INFO: Dict[str, KindInfo] = {r["name"]: _kind_info(r) for r in _core.kinds()}
#: Every quantization kind: "nf4", "int4", "int8", "int5", "int6".
KINDS: Tuple[str, ...] = tuple(KIND_INFO)
#: The 4-bit codebooks (the int4 tier's choices): "nf4", "int4".
FOUR_BIT_KINDS: Tuple[str, ...] = tuple(k for k, i in KIND_INFO.items() if i.bits == 4)


def _check_kind(kind: str) -> None:
    if kind not in KIND_INFO:
        raise ValueError(f"unknown kind {kind!r} (expected one of {', '.join(KINDS)})")


def levels(kind: str) -> NDArray[np.float32]:
    """The nominal float levels of a 4-bit kind (ascending; code c dequantizes to ``lut[c] * scale``)."""
    _check_kind(kind)
    lev = KIND_INFO[kind].levels
    if lev is None:
        raise ValueError(f"kind {kind!r} has no codebook levels (its codes are the int8 values)")
    return lev


#: The 16 bitsandbytes NF4 values (code 0 = -1.0, code 7 = 0.0, code 15 = 1.0), float32.
NF4_LEVELS = levels("nf4")
#: The 15 uniform symmetric int4 levels k/7, k = -7..7 (codes 0..14), float32.
INT4_LEVELS = levels("int4")
#: The default imatrix clip-ratio grid: 1.00, 0.99, ..., 0.60.
DEFAULT_CLIP_GRID = _readonly(_core.default_grid())


def lut(kind: str) -> Optional[NDArray[np.int8]]:
    """The kind's 16-entry int8 LUT (``round(level * 127)``), or None for int8."""
    _check_kind(kind)
    return KIND_INFO[kind].lut


def _check_threads(threads: Optional[int]) -> int:
    if threads is None:
        return 0
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)) or threads < 1:
        raise ValueError(f"threads must be a positive int or None (all cores), got {threads!r}")
    return int(threads)


@dataclass(frozen=True)
class QuantizedTensor:
    """A quantized ``(N, K)`` weight.

    ``codes``: for 4-bit kinds a uint8 ``(N, ceil(K/2))`` array, two codes per
    byte, element ``2j`` in the low nibble and ``2j+1`` in the high nibble;
    for int8 the int8 ``(N, K)`` array itself. ``scales``: float32 ``(N,)``, or
    ``(N, G)`` with group-wise scales (``group`` > 0: ``G = ceil(K / group)``,
    inputs ``[i*group, (i+1)*group)`` share ``scales[n, i]``; float32 arrays
    holding float16 values, which is how they are stored).
    ``lut``: the kind's int8 LUT (None for int8), so that
    ``dequant[n, k] = lut[code[n, k]] * scales[n]`` (int8: ``codes * scales``;
    grouped: ``scales[n, k // group]``).
    """

    kind: str
    shape: Tuple[int, int]
    codes: np.ndarray
    scales: np.ndarray
    lut: Optional[np.ndarray]
    sr: bool = False
    seed: int = 0
    imatrix_used: bool = False
    group: int = 0
    #: affine groups (csrc/ork/affine.h; w4a4 / w4a8, group-wise only): float32 ``(N, G)`` holding
    #: float16 values, ``dequant = code * scale + offset``; None: symmetric scales
    offsets: Optional[np.ndarray] = None

    def dequantize(self, threads: Optional[int] = None) -> NDArray[np.float32]:
        return dequantize(self, threads=threads)

    @property
    def nbytes(self) -> int:
        """Bytes of codes plus scales (and offsets) as stored: 4 per per-row scale, 2 per (float16) group
        scale or offset."""
        offs = 0 if self.offsets is None else 2 * self.offsets.size
        return int(self.codes.nbytes + (2 if self.group else 4) * self.scales.size + offs)

    def __repr__(self) -> str:
        g = (f", group={self.group}" if self.group else "") + (", affine" if self.offsets is not None else "")
        return (f"QuantizedTensor(kind={self.kind!r}, shape={self.shape}{g}, "
                f"nbytes={self.nbytes}, sr={self.sr}, imatrix_used={self.imatrix_used})")


GROUP_SIZES = (32, 64, 128, 256)  # the group sizes the tables use; any multiple of 32 up to 4096 works


def check_group(group: Optional[int], K: Optional[int] = None) -> int:
    """The effective group size of ``group`` (None or 0: one scale per row) for ``K`` inputs:
    0 when ``group >= K`` (one group is a per-row scale); ValueError unless a multiple of 32 in
    [32, 4096]."""
    if group is None:
        return 0
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)):
        raise TypeError(f"group_size must be an int (a multiple of 32) or None, got {type(group).__name__}")
    g = int(group)
    if g != 0 and (g % 32 or not 32 <= g <= 4096):
        raise ValueError(f"group_size must be a multiple of 32 in [32, 4096] (the NPU's 32-wide K tiles), got {g}")
    return 0 if (K is not None and g >= K) else g


#: the imatrix clip search's modes (:func:`quantize`'s ``search``): the default first
CLIP_SEARCHES = ("screen", "full")


def quantize(w: ArrayLike, kind: str, imatrix: Optional[ArrayLike] = None, sr: bool = False, seed: int = 0,
             clip_grid: Optional[ArrayLike] = None, threads: Optional[int] = None,
             group_size: Optional[int] = None, search: str = "screen", symmetric: bool = True) -> QuantizedTensor:
    """Quantize a float32 (or float16) ``(N, K)`` weight.

    kind: ``"nf4"``, ``"int4"`` (4-bit codes into an int8 LUT, per-row scale
    ``absmax/127``), ``"int8"`` (per-row symmetric, codes in [-127, 127]) or
    ``"int6"`` / ``"int5"`` (uniform symmetric, codes in [-31, 31] / [-15, 15], scale
    ``absmax/31`` / ``absmax/15``; int8 codes in memory, 6 / 5 bits per code in a file:
    "i6a8" / "i5a8", computed by the int8 kernels).

    imatrix: optional float32 ``(K,)`` per-input-channel importance (e.g.
    mean squared activation). Each row's scale is then chosen from the clip
    ratios ``clip_grid`` (default :data:`DEFAULT_CLIP_GRID`; ratio 1.0, plain
    absmax, is always tried first) to minimise
    ``sum_k imatrix[k] * (w[n,k] - dequant[n,k])**2``. ``imatrix=None`` gives
    output byte-identical to plain absmax.

    search: how the 4-bit kinds' clip search runs on segments (rows, or groups) of at
    least 512 values. ``"screen"`` (the default): every ratio's error is first estimated
    from a histogram of the segment and only 1.0 and the three best estimates are evaluated
    exactly, 2-5x faster; it picks what the full search picks whenever the full search's
    best is among those three (measured: all but 9 of 155,520 rows of SmolLM2-135M, the
    model's weighted error +2e-7; docs/quantization.md). ``"full"``: every ratio evaluated
    exactly, byte for byte what the default gave before the screen existed. 8-bit kinds
    and shorter segments always search in full.

    sr: stochastic rounding between the two bracketing levels, unbiased,
    from a counter-based generator keyed by (seed, row, column): identical for
    any thread count and instruction set.

    threads: worker threads (None = all cores). Results never depend on it.

    group_size: None (one scale per row) or a multiple of 32: every ``group_size``
    inputs of a row get their own scale, chosen as a row's is (absmax, or the imatrix
    clip search over the group's columns) but as a float16 value (the nearest to
    ``m / 127``, ties to even; the clip search and the codes use that stored scale);
    ``scales`` is then ``(N, G)``. A group of ``K`` or more is the per-row result, byte
    for byte. A group whose scale exceeds float16's 65504 (absmax >= ~8.3e6) is a
    ValueError naming it; one whose scale rounds to 0 (absmax below ~3.8e-6) is a zero
    group (csrc/ork/quant.h).

    symmetric=False: affine groups for the NPU's int4 kinds (``w4a4``, ``w4a8``, with a
    ``group_size`` below K): each group gets a float16 scale and a float16 offset
    (``dequant = code * scale + offset``, codes in [-8, 7]) from a 20-ratio search of its
    [min, max] (csrc/ork/affine.h), weighted by ``imatrix`` when given; ``offsets`` holds
    them. The NPU multiplies the same int4 codes; the host adds each group's offset times the
    sum of that group's activation codes (docs/w4a4.md "Affine groups"). Not with ``sr``.
    """
    _check_kind(kind)
    if not isinstance(sr, (bool, np.bool_)):
        raise TypeError(f"sr must be a bool, got {type(sr).__name__}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or not 0 <= seed < 2**64:
        raise ValueError(f"seed must be an int in [0, 2**64), got {seed!r}")
    nthreads = _check_threads(threads)
    if search not in CLIP_SEARCHES:
        raise ValueError(f"search must be one of {', '.join(map(repr, CLIP_SEARCHES))}, got {search!r}")
    w = np.asarray(w)
    if w.ndim != 2:
        raise ValueError(f"w must be a 2-D (N, K) array, got shape {w.shape}")
    maps = maps_of(w)  # a view of a mapped file (GGUFFile.raw, load_safetensors) is checked around the read
    check_maps(maps)
    group = check_group(group_size, int(w.shape[1]))
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be a bool, got {type(symmetric).__name__}")
    offsets = None
    if symmetric:
        codes, scales = _core.quantize(w, kind, imatrix, bool(sr), int(seed), clip_grid, nthreads, group,
                                       search == "full")
    else:
        if sr:
            raise ValueError("symmetric=False (affine groups) rounds to nearest: sr must be False")
        codes, scales, offsets = _core.quantize_affine(w, kind, imatrix, nthreads, group)
    check_maps(maps)
    return QuantizedTensor(kind=kind, shape=(int(w.shape[0]), int(w.shape[1])), codes=codes,
                           scales=scales, lut=KIND_INFO[kind].lut, sr=bool(sr), seed=int(seed),
                           imatrix_used=imatrix is not None, group=group, offsets=offsets)


def dequantize(q: QuantizedTensor, threads: Optional[int] = None) -> NDArray[np.float32]:
    """Dequantize a :class:`QuantizedTensor` to float32 ``(N, K)``."""
    if not isinstance(q, QuantizedTensor):
        raise TypeError(f"dequantize expects a QuantizedTensor, got {type(q).__name__}")
    _check_kind(q.kind)
    out = _core.dequantize(q.codes, q.scales, q.kind, q.shape[1], _check_threads(threads), q.group)
    if q.offsets is not None:  # affine groups: code * scale, then + offset (float32, csrc/ork/affine.h)
        out += np.repeat(np.asarray(q.offsets, np.float32), q.group, axis=1)[:, :q.shape[1]]
    return out
