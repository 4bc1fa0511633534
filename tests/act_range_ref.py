"""The NumPy reference of the static-range error (csrc/ork/act_range.h's formula), the
implementation of orkpy.runtime.actcal.range_mse before the C kernel: tests/test_act_range.py
holds the kernel to it."""
import numpy as np

from orkpy.runtime.actcal import hist_edges


def _sawtooth_integral(u):
    """integral from 0 to u (>= 0) of (t - round(t))^2 dt, rounding half up."""
    k = np.floor(u + 0.5)
    r = u - k
    return np.where(k >= 1, 1.0 / 24.0 + (k - 1.0) / 12.0 + (r ** 3 + 0.125) / 3.0, u ** 3 / 3.0)


def range_mse_ref(count, sums, sums2, clips, qmax=127):
    edges = hist_edges()
    n = np.asarray(count, np.float64)
    s1 = np.asarray(sums, np.float64)
    s2 = np.asarray(sums2, np.float64)
    keep = n > 0
    lo, hi = edges[:-1][keep], edges[1:][keep]
    n, s1, s2 = n[keep], s1[keep], s2[keep]
    c = np.asarray(clips, np.float64).reshape(-1, 1)
    d = c / float(qmax)
    above = np.maximum(s2 - 2.0 * c * s1 + n * c * c, 0.0)
    span_hi = np.where(np.isfinite(hi), hi, lo * 2.0)
    top = np.clip(c, lo, span_hi)
    frac = (top - lo) / (span_hi - lo)
    safe = np.where(top > lo, top - lo, 1.0)
    rounding = np.where(top > lo, d * d * (_sawtooth_integral(top / d) - _sawtooth_integral(lo / d)) / (safe / d), 0.0)
    straddle = (span_hi - top) ** 2 / 3.0
    err = np.where(lo >= c, above, n * frac * rounding + n * (1.0 - frac) * straddle)
    return err.sum(axis=1)
