"""A plain-NumPy implementation of orkpy's quantization contract.

It is independent of the C core (it shares only the contract in
``docs/quantization.md``) and reproduces it bit for bit: same float32
operations in the same order, the same four-lane double error sum, the same
counter-based stochastic rounding. The tests use it as a second oracle and
``bench/quant.py`` uses it as the baseline. It is slow and memory-hungry by
design: clarity over speed.
"""
import numpy as np

from .quant import DEFAULT_CLIP_GRID, KIND_INFO

_M32 = 0xFFFFFFFF
TINY = np.float32(1e-30)


def round_half_away(x):
    """Round half away from zero, elementwise (exact, any float dtype)."""
    x = np.asarray(x)
    t = np.trunc(x)
    f = x - t
    return np.where(f >= 0.5, t + 1, np.where(f <= -0.5, t - 1, t)).astype(x.dtype)


def _is8(kind):
    return KIND_INFO[kind].bits == 8


def _qmax(kind):
    """The largest |code| of an 8-bit kind (127, 31, 15); 127 (the LUT range) for 4-bit kinds."""
    return KIND_INFO[kind].qmax


def lut_of(kind):
    """The int8 LUT derived from the kind's nominal levels (the registry's one
    primary fact): round(level * 127), 0 for codes past the last level; None
    for an 8-bit kind."""
    if _is8(kind):
        return None
    lev = KIND_INFO[kind].levels
    lut = np.zeros(16)
    lut[: len(lev)] = round_half_away(lev.astype(np.float64) * 127)
    return lut.astype(np.int8)


def zero_code(kind):
    """The code of the 0.0 level: zero rows and padding nibbles."""
    return int(np.flatnonzero(KIND_INFO[kind].levels == 0)[0])


def _levels(kind):
    return lut_of(kind).astype(np.float32)[: len(KIND_INFO[kind].levels)]


def _mix32(x):
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x *= np.uint32(0x7FEB352D)
    x ^= x >> np.uint32(15)
    x *= np.uint32(0x846CA68B)
    x ^= x >> np.uint32(16)
    return x


def _mix32_int(x):
    return int(_mix32(np.array([x & _M32], dtype=np.uint32))[0])


def sr_row_key(seed, row):
    k = _mix32_int((seed & _M32) ^ 0x9E3779B9)
    k = _mix32_int(k ^ ((seed >> 32) & _M32))
    k = _mix32_int(k ^ (row & _M32))
    return _mix32_int(k ^ ((row >> 32) & _M32) ^ 0x85EBCA6B)


def sr_uniform(seed, rows, K):
    """u[n, k] in [0, 1): the stochastic-rounding uniforms of the contract."""
    keys = np.array([sr_row_key(seed, int(n)) for n in rows], dtype=np.uint32)
    cols = np.arange(K, dtype=np.uint32) * np.uint32(0x9E3779B1)
    h = _mix32(keys[:, None] + cols[None, :])
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


def _nearest(y, kind):
    if _is8(kind):
        q = _qmax(kind)
        return np.clip(round_half_away(y), -q, q)
    lev = _levels(kind)
    thr = (lev[1:] + lev[:-1]) / np.float32(2)
    return np.searchsorted(thr, y, side="left")  # count of thr < y; ties -> lower


def _deq(codes, kind):
    return codes.astype(np.float32) if _is8(kind) else _levels(kind)[codes]


def _scale_inv(a, r, f16=False, q=127):
    """(stored scale, inverse) of m = a * r: float32 m / Q and Q / m per row (Q the kind's
    qmax: 127, or 31 / 15 for int6 / int5); with float16 group scales f16(m / Q) (NumPy's
    float16 cast: nearest, ties to even) and 1 / s, 0 for a scale that rounds to 0
    (csrc/ork/quant.h, "float16 group scales")."""
    m = (a * np.float32(r)).astype(np.float32)
    s = (m / np.float32(q)).astype(np.float32)
    if not f16:
        return s, (np.float32(q) / m).astype(np.float32)
    s = s.astype(np.float16).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(s > 0, np.float32(1) / s, np.float32(0)).astype(np.float32)
    return s, inv


def _werr(w, im, a, r, kind, f16=False):
    s, inv = _scale_inv(a, r, f16, _qmax(kind))
    y = w * inv[:, None]
    q = _deq(_nearest(y, kind), kind) * s[:, None]
    d = (w - q).astype(np.float64)
    terms = im.astype(np.float64)[None, :] * (d * d)
    lanes = [terms[:, i::4].cumsum(axis=1)[:, -1] if terms[:, i::4].shape[1] else np.zeros(len(w))
             for i in range(4)]
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])


#: the screened clip search of 4-bit segments of at least SCREEN_MIN_N values (csrc/ork/quant.h):
#: SCREEN_BINS histogram bins for every segment
SCREEN_BINS = 2048
SCREEN_MIN_N = 512
SCREEN_TOP = 3
SCREEN_BLOCK = 8


def _block_prefix(S):
    """P (N, B + 1), P[:, i] = the sum of the bins S[:, :i] as the C screen forms it (quant.h): 0 for
    i = 0, else off[j] + run[i - 1] with j = (i - 1) // SCREEN_BLOCK, run the running sum inside each
    block of SCREEN_BLOCK bins and off the running sum of the blocks' totals before block j."""
    N, B = S.shape
    W = SCREEN_BLOCK
    run = np.cumsum(S.reshape(N, B // W, W), axis=2)
    off = np.zeros((N, B // W))
    off[:, 1:] = np.cumsum(run[:, :-1, -1], axis=1)
    P = np.zeros((N, B + 1))
    P[:, 1:] = (off[:, :, None] + run).reshape(N, B)
    return P


def _screen_picks(w, im, a, grid, kind, f16):
    """Indices into ``grid`` (N, <= SCREEN_TOP), in grid order, of the screened search's picks per row:
    the best histogram estimates of every ratio but 1.0 (quant.h, "screened clip search")."""
    N, n = w.shape
    B = SCREEN_BINS
    h = float(B // 2)
    ra = 1.0 / a.astype(np.float64)
    v = (w.astype(np.float64) * ra[:, None] + 1.0) * h
    b = np.clip(np.trunc(v), 0, B - 1).astype(np.int64) + (np.arange(N) * B)[:, None]
    imd = im.astype(np.float64)
    # bincount adds each bin's weights in element order, as the C loop does
    P0 = _block_prefix(np.bincount(b.ravel(), np.broadcast_to(imd, (N, n)).ravel(), N * B).reshape(N, B))
    P1 = _block_prefix(np.bincount(b.ravel(), (imd[None, :] * w.astype(np.float64)).ravel(), N * B).reshape(N, B))
    lev = _levels(kind)
    thr = (lev[1:] + lev[:-1]) / np.float32(2)
    rows = np.arange(N)
    cand = [i for i, g in enumerate(grid) if g != np.float32(1)]
    est = np.zeros((N, len(cand)))
    for ci, i in enumerate(cand):
        s, inv = _scale_inv(a, grid[i], f16, _qmax(kind))
        e = np.zeros(N)
        prev = np.zeros(N, np.int64)
        for c in range(len(lev)):
            if c + 1 < len(lev):
                with np.errstate(divide="ignore", invalid="ignore"):
                    vb = (np.float64(thr[c]) * (ra / inv.astype(np.float64)) + 1.0) * h + 0.5
                bnd = np.clip(np.trunc(np.nan_to_num(vb, nan=0.0, posinf=B, neginf=0.0)), 0, B).astype(np.int64)
                if np.any(bnd < prev):  # ascending thresholds and k > 0 give ascending boundaries
                    raise RuntimeError(f"{kind}: the screen's boundaries do not ascend (thresholds {thr})")
            else:
                bnd = np.full(N, B, np.int64)
            L = np.float64(lev[c]) * s.astype(np.float64)
            e = e + (L * L * (P0[rows, bnd] - P0[rows, prev]) - 2.0 * L * (P1[rows, bnd] - P1[rows, prev]))
            prev = bnd
        est[:, ci] = np.where(inv == 0, 0.0, e)
    order = np.argsort(est, axis=1, kind="stable")[:, :SCREEN_TOP]
    return np.sort(np.asarray(cand, np.int64)[order], axis=1) if cand else np.zeros((N, 0), np.int64)


def _segment(w, kind, imatrix, sr, seed, clip_grid, col0, f16, search="screen"):
    """Unpacked codes (N, n) and scales (N,) of the columns col0.. of every row, quantized as rows."""
    N, K = w.shape
    a = np.abs(w).max(axis=1)
    zero = ~(a >= TINY)
    a_safe = np.where(zero, np.float32(1), a).astype(np.float32)
    r = np.ones(N, dtype=np.float32)
    if imatrix is not None:
        im = np.asarray(imatrix, dtype=np.float32)
        grid = DEFAULT_CLIP_GRID if clip_grid is None else np.asarray(clip_grid, dtype=np.float32)
        best = _werr(w, im, a_safe, np.float32(1), kind, f16)
        if not _is8(kind) and K >= SCREEN_MIN_N and search == "screen":  # 1.0, then the screen's picks
            picks = _screen_picks(w, im, a_safe, grid, kind, f16)
            for t in range(picks.shape[1]):
                g = grid[picks[:, t]]
                e = _werr(w, im, a_safe, g, kind, f16)
                better = e < best
                best = np.where(better, e, best)
                r = np.where(better, g, r).astype(np.float32)
        else:
            for g in grid:
                e = _werr(w, im, a_safe, g, kind, f16)
                better = e < best
                best = np.where(better, e, best)
                r = np.where(better, g, r).astype(np.float32)
    s, inv = _scale_inv(a_safe, r, f16, _qmax(kind))
    zero |= s == 0
    y = w * inv[:, None]
    if not sr:
        codes = _nearest(y, kind)
    else:
        u = sr_uniform(seed, range(N), col0 + K)[:, col0:]
        if _is8(kind):
            yc = np.clip(y, np.float32(-_qmax(kind)), np.float32(_qmax(kind)))
            lo = np.floor(yc)
            codes = lo + (u < (yc - lo)).astype(np.float32)
        else:
            lev = _levels(kind)
            i = (y[..., None] >= lev[None, None, 1:]).sum(-1)
            top = len(lev) - 1
            lo = lev[i]
            hi = lev[np.minimum(i + 1, top)]
            with np.errstate(divide="ignore", invalid="ignore"):
                p = (y - lo) / (hi - lo)
            codes = i + ((u < p) & (i < top))
    s = np.where(zero, np.float32(0), s).astype(np.float32)
    if _is8(kind):
        return np.where(zero[:, None], 0, codes).astype(np.int8), s
    return np.where(zero[:, None], zero_code(kind), codes).astype(np.uint8), s


def quantize(w, kind, imatrix=None, sr=False, seed=0, clip_grid=None, group_size=None, search="screen"):
    """Return (codes, scales) exactly as orkpy.quantize stores them. ``group_size`` (below K):
    every ``group_size`` columns of a row quantized as a row (SR hashing the global column) with
    a float16 scale, scales (N, G)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    N, K = w.shape
    g = group_size if group_size and group_size < K else K
    im = None if imatrix is None else np.asarray(imatrix, dtype=np.float32)
    parts = [_segment(w[:, c:c + g], kind, None if im is None else im[c:c + g], sr, seed, clip_grid, c, g < K, search)
             for c in range(0, K, g)]
    codes = np.concatenate([c for c, _ in parts], axis=1)
    s = np.stack([s for _, s in parts], axis=1) if g < K else parts[0][1]
    if _is8(kind):
        return codes, s
    if K % 2:
        codes = np.concatenate([codes, np.full((N, 1), zero_code(kind), np.uint8)], axis=1)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << np.uint8(4))).astype(np.uint8)
    return packed, s


def dequantize(codes, scales, kind, K, group_size=None):
    """Float32 (N, K) from stored codes and scales ((N, G) with ``group_size``)."""
    s = np.repeat(scales, group_size, axis=1)[:, :K] if scales.ndim == 2 else scales[:, None]
    if _is8(kind):
        return codes.astype(np.float32) * s
    c = np.empty((codes.shape[0], codes.shape[1] * 2), dtype=np.uint8)
    c[:, 0::2] = codes & 15
    c[:, 1::2] = codes >> 4
    return lut_of(kind).astype(np.float32)[c[:, :K]] * s


# ------------------------------------------------- the float32 linear (F32 path) --
def fmaf32(a, b, c):
    """float32 a * b + c with one rounding (C's fmaf), elementwise, exact: the product of two
    float32 values is exact in float64, TwoSum gives the float64 sum's error, the sum is rounded
    to odd (53 >= 24 + 2 bits), then to float32 -- no double-rounding error."""
    a, b, c = (np.asarray(v, dtype=np.float32).astype(np.float64) for v in (a, b, c))
    p = a * b
    s = p + c
    bb = s - p
    e = (p - (s - bb)) + (c - bb)                      # p + c == s + e exactly
    even = (s.view(np.int64) & 1) == 0
    s = np.where((e != 0) & even, np.nextafter(s, np.where(e > 0, np.inf, -np.inf)), s)
    return s.astype(np.float32)


def linear_f32(x, w):
    """The F32 linear's contract (csrc/ork/gemm_f32.h): y (M, N) float32 = x (M, K) W^T with
    y[m][n] = c_K, c_0 = +0, c_{k+1} = fmaf(x[m][k], W[n][k], c_k) -- one fused multiply-add
    per term, in k order."""
    x, w = np.asarray(x, dtype=np.float32), np.asarray(w, dtype=np.float32)
    c = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
    for k in range(x.shape[1]):
        c = fmaf32(x[:, k, None], w[None, :, k], c)
    return c
