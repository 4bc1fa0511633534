"""The integer contract of the RK3588 NPU's int4 x int4 -> int16 matmul mode (docs/w4a4.md,
"Integer contract"; the C kernels: csrc/ork/i4.h).

Codes are int4 values in [-8, 7] (orkpy's weights are symmetric codes in [-7, 7]; searched 4-bit
activations use -8 too). They
are stored as the NPU reads them: rows of ``Kp = round_up(K, 32)`` codes, two per byte, code
``2j`` in the low nibble of byte ``j``, ``2j+1`` in the high nibble, padding codes 0
(:func:`pack_i4`). The product ``acc[m, n] = sum_k a[m, k] * w[n, k]`` sums chunks of at most
:data:`KCHUNK` = 480 consecutive k in int16 (no chunk can overflow, for any codes) and adds
the chunk sums in int32, so it is the exact integer product (:func:`mm_i4`);
:func:`mm_i4_partials` gives the int16 sum of each chunk, as an NPU job of one chunk returns
it. Every ISA gives the same result, for any thread count.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import numpy as np
from numpy.typing import ArrayLike, NDArray

from .. import _core

#: k per int16 partial sum (the NPU's chunk; 480 * 8 * 8 = 30720 fits int16)
KCHUNK: int = int(_core.i4_layout(1)["kchunk"])
#: the longest row mm_i4 takes (the int32 sum of any codes fits)
MAX_K: int = int(_core.i4_layout(1)["max_k"])
CODE_MIN, CODE_MAX = -8, 7


def _codes(x: Any, name: str, min_rows: int = 0) -> NDArray[np.int8]:
    """A 2-D integer array of codes in [-8, 7] (at least ``min_rows`` rows) as C-contiguous int8, else
    ValueError naming ``name``."""
    arr = np.asarray(x)
    if arr.dtype.kind not in "iu":
        raise ValueError(f"{name} must be an integer array of int4 codes (int8), got dtype {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, K), got shape {arr.shape}")
    if arr.shape[0] < min_rows:
        raise ValueError(f"{name} must have at least {min_rows} row(s), got shape {arr.shape}")
    if arr.shape[1] < 1 or arr.shape[1] > MAX_K:
        raise ValueError(f"{name} must have K in [1, {MAX_K}] columns, got shape {arr.shape}")
    bad = (arr < CODE_MIN) | (arr > CODE_MAX)
    if bad.any():
        r, c = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{name}: code {int(arr[r, c])} at [{r}, {c}] is outside [{CODE_MIN}, {CODE_MAX}]")
    return np.ascontiguousarray(arr, dtype=np.int8)


def layout(K: int) -> Dict[str, int]:
    """The storage and chunking of rows of ``K`` codes: ``Kp``, ``row_bytes`` (Kp / 2), ``kchunk``,
    ``n_chunks`` (ceil(Kp / kchunk)) and ``max_k`` (from the C core)."""
    if not isinstance(K, (int, np.integer)) or isinstance(K, bool):
        raise ValueError(f"K must be an int, got {type(K).__name__}")
    return _core.i4_layout(int(K))


def pack_i4(codes: ArrayLike) -> NDArray[np.uint8]:
    """Store int4 codes (rows, K) in [-8, 7] as the NPU reads them: uint8 (rows, Kp / 2)."""
    return _core.i4_pack(_codes(codes, "codes"))


def unpack_i4(packed: ArrayLike, K: int) -> NDArray[np.int8]:
    """The inverse of :func:`pack_i4`: uint8 (rows, Kp / 2) -> int8 codes (rows, K). A padding code
    that is not 0 raises ValueError."""
    arr = np.asarray(packed)
    lay = layout(K)
    if arr.dtype != np.uint8 or arr.ndim != 2 or arr.shape[1] != lay["row_bytes"]:
        raise ValueError(f"packed must be a uint8 array of shape (rows, {lay['row_bytes']}) for K = {K}, "
                         f"got {arr.dtype} {arr.shape}")
    return _core.i4_unpack(np.ascontiguousarray(arr), int(K))


def _operands(a_codes: ArrayLike, w_codes: ArrayLike) -> Tuple[NDArray[np.uint8], NDArray[np.uint8], int]:
    a = _codes(a_codes, "a_codes", 1)
    w = _codes(w_codes, "w_codes", 1)
    if a.shape[1] != w.shape[1]:
        raise ValueError(f"a_codes has K = {a.shape[1]} columns but w_codes has {w.shape[1]}")
    return _core.i4_pack(a), _core.i4_pack(w), a.shape[1]


def mm_i4(a_codes: ArrayLike, w_codes: ArrayLike, threads: Optional[int] = None) -> NDArray[np.int32]:
    """``acc[m, n] = sum_k a[m, k] * w[n, k]`` (int32, (M, N)) of activation codes a (M, K) and
    weight codes w (N, K) in [-8, 7], as the NPU's int4 mode computes it (int16 chunks of
    :data:`KCHUNK` k, added in int32): the exact integer product. ``threads``: None or 0 for all
    cores; the result never depends on it."""
    if threads is None:
        threads = 0
    if not isinstance(threads, (int, np.integer)) or isinstance(threads, bool) or threads < 0:
        raise ValueError(f"threads must be None or an int >= 0, got {threads!r}")
    a, w, K = _operands(a_codes, w_codes)
    return _core.mm_i4(a, w, K, threads=int(threads))


def mm_i4_partials(a_codes: ArrayLike, w_codes: ArrayLike) -> NDArray[np.int16]:
    """The int16 sum of each chunk of :func:`mm_i4` (the scalar reference): int16 (n_chunks, M, N),
    chunk c over k in [c * KCHUNK, min(Kp, (c + 1) * KCHUNK)); their int32 sum is mm_i4's result."""
    a, w, K = _operands(a_codes, w_codes)
    return _core.mm_i4_partials(a, w, K)


def split_digits(x8: ArrayLike) -> Tuple[NDArray[np.int8], NDArray[np.int8]]:
    """Two int4 digits of int8 activation codes in [-119, 119] (``ActSpec.digits``): ``x = 16 h + l`` with
    ``h = floor((x + 8) / 16)`` and ``l = x - 16 h``, both in [-8, 7] -- how a w4a8 linear runs its int8
    activations on the NPU's int4 mode (two rows per token; docs/w4a4.md "W4A8 by digits"). Two digits
    reach [-136, 119], so the codes stop at +-119."""
    x = np.asarray(x8)
    if x.ndim != 2 or not np.issubdtype(x.dtype, np.integer) or x.dtype == np.bool_:
        raise ValueError("x8 must be a 2-D integer array of int8 activation codes")
    if x.size and (int(x.min()) < -136 or int(x.max()) > 119):
        raise ValueError("x8 must hold codes in [-136, 119] (two int4 digits; orkpy's are in [-119, 119])")
    xi = x.astype(np.int16)
    h = np.floor_divide(xi + 8, 16)
    return h.astype(np.int8), (xi - 16 * h).astype(np.int8)


def mm_i4_digits(x8: ArrayLike, w_codes: ArrayLike, threads: Optional[int] = None) -> NDArray[np.int32]:
    """int8 activation codes (M, K) times int4 weight codes (N, K) through the int4 mode: the two digit
    rows of :func:`split_digits` in one :func:`mm_i4` of 2M rows, combined ``16 acc_h + acc_l`` in
    int32 -- exactly ``x8 @ w.T`` (|acc| <= K * 128 * 8 fits int32 for K < 2^21)."""
    h, lo = split_digits(x8)
    M = h.shape[0]
    acc = mm_i4(np.concatenate([h, lo]), w_codes, threads)
    out: NDArray[np.int32] = (acc[:M].astype(np.int64) * 16 + acc[M:]).astype(np.int32)
    return out
