"""NumPy reference of GPTQ rounding (csrc/ork/gptq.h), the algorithm of orkpy.quantization.gptq before it
moved to C: float64 with LAPACK's ``cholesky(inv(H))`` and BLAS's lazy block updates, so it
rounds differently from the C core (tests/test_gptq.py compares them with margins).

Differences from that earlier code, all towards the C contract: int8 rounds half away from zero
exactly (quant.h; the ``y + 0.5`` trick misrounds 0.49999997); the scales follow
:func:`orkpy.quantize` for group-wise weights too (float16 values, codes chosen with ``1 / s``)
also for a dynamic group's scale (a per-row quantize of the segment would give a float32 one);
and a dynamic group that reaches past the current block gets the block's pending updates first,
so its scale sees every earlier column's error whatever ``block`` is.
"""
import numpy as np

import orkpy


def round_int8(w, inv, qmax=127):
    """quant.h's int8 rounding: y = float32(w) * inv in float32, half away from zero, clamped to
    +-qmax (127 int8, 31 int6, 15 int5)."""
    y = w.astype(np.float32) * inv
    t = np.trunc(y)
    f = y - t
    q = t + (f >= 0.5) - (f <= -0.5)
    return np.clip(q, -qmax, qmax).astype(np.float32)


def segment_scale(seg, kind, im, grouped):
    """(scale, float32 inverse) quantize() picks for each row of seg (R, n) as a segment of a row
    with per-row (grouped False) or group-wise (True: float16 scale, inverse 1 / s) scales."""
    if grouped:  # the segment as the first group of a wider row of zeros: its scale as a group's
        n = seg.shape[1]
        pad = np.zeros((seg.shape[0], 2 * 32 * -(-n // 32)), np.float32)
        pad[:, :n] = seg
        imp = None
        if im is not None:
            imp = np.zeros(pad.shape[1], np.float32)
            imp[:n] = im
        # the padded group is wider than the segment: search it as C searches n values (screened from 512)
        s = orkpy.quantize(pad, kind, imatrix=imp, group_size=pad.shape[1] // 2,
                           search="screen" if n >= 512 else "full").scales[:, 0]
        inv = np.where(s > 0, np.float32(1) / np.where(s > 0, s, 1), 0).astype(np.float32)
        return s, inv
    s = orkpy.quantize(seg, kind, imatrix=im).scales
    # the float32 inverse Q / m of the chosen m = s * Q (exact: s = m / Q was rounded once; recover
    # m as quantize did, from absmax * r, by trying the clip grid)
    q = np.float32(orkpy.kernels.quant.KIND_INFO[kind].qmax)
    amax = np.abs(seg).max(axis=1).astype(np.float32)
    grid = np.concatenate([[np.float32(1)], orkpy.kernels.quant.DEFAULT_CLIP_GRID]).astype(np.float32)
    inv = np.zeros(len(s), np.float32)
    for n in range(len(s)):
        if s[n] > 0:
            m = next(m for m in (amax[n] * grid).astype(np.float32) if np.float32(m / q) == s[n])
            inv[n] = q / m
    return s, inv


def gptq_ref(w, gram, kind="int8", damp=0.01, block=128, rows=0, group_size=None, static_groups=False,
             disable_feedback=False):
    """(codes, scales) of GPTQ on float32 w (N, K) and float64 gram (K, K), laid out as
    orkpy.quantize's. ``disable_feedback``: no error moves (a broken implementation, for the
    tests that show the margins catch it)."""
    w32 = np.asarray(w, np.float32)
    N, K = w32.shape
    g = np.asarray(gram, np.float64)
    four = orkpy.kernels.quant.KIND_INFO[kind].bits == 4
    qmax = orkpy.kernels.quant.KIND_INFO[kind].qmax
    im = (np.diag(g) / rows).astype(np.float32) if (kind != "int8" and rows > 0) else None
    im = im if (im is not None and np.any(im > 0)) else None
    gs = group_size if (group_size and group_size < K) else K
    grouped = gs < K
    G = -(-K // gs)
    s = np.zeros((N, G), np.float32)
    inv = np.zeros((N, G), np.float32)
    for gi in range(G if static_groups else 1):
        c0 = gi * gs
        s[:, gi], inv[:, gi] = segment_scale(w32[:, c0:c0 + gs], kind, None if im is None else im[c0:c0 + gs],
                                             grouped)
    if four:
        lut = np.asarray(orkpy.lut(kind), np.float64)
        nlev = len(np.unique(lut))  # int4's 16th code repeats 0
        lv = lut[:nlev]
        mids = (lv[1:] + lv[:-1]) / 2
        zero = int(np.argmin(np.abs(lv)))
    h = g.copy()
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    h[np.diag_indices(K)] += damp * float(np.mean(np.diag(h)))
    u = np.linalg.cholesky(np.linalg.inv(h)).T  # upper: inv(h) = u^T u
    W = w32.astype(np.float64)
    C = np.empty((N, K), np.uint8 if four else np.int8)
    for i1 in range(0, K, block):
        i2 = min(i1 + block, K)
        err = np.zeros((N, i2 - i1))
        for k in range(i1, i2):
            gi = k // gs
            if k % gs == 0 and k > 0 and not static_groups:  # this group's scale, from the updated columns
                if k + gs > i2:  # it reaches past the block: the block's pending updates first
                    W[:, i2:] -= err[:, :k - i1] @ u[i1:k, i2:]
                    err[:, :k - i1] = 0
                s[:, gi], inv[:, gi] = segment_scale(W[:, k:k + gs].astype(np.float32), kind,
                                                     None if im is None else im[k:k + gs], grouped)
            sd = s[:, gi].astype(np.float64)
            if four:
                live = sd > 0
                idx = np.where(live, np.searchsorted(mids, W[:, k] * np.where(live, 1.0 / np.where(live, sd, 1), 0),
                                                     side="right"), zero)
                C[:, k] = idx
                q = lv[idx]
            else:
                q = round_int8(W[:, k], inv[:, gi], qmax)
                C[:, k] = q
            if dead[k] or disable_feedback:
                continue
            e = (W[:, k] - q.astype(np.float64) * sd) / u[k, k]
            W[:, k + 1:i2] -= np.outer(e, u[k, k + 1:i2])
            err[:, k - i1] = e
        if i2 < K:
            W[:, i2:] -= err @ u[i1:i2, i2:]
    scales = s if grouped else s[:, 0].copy()
    if four:
        if K % 2:
            C = np.concatenate([C, np.full((N, 1), zero, np.uint8)], axis=1)
        C = (C[:, 0::2] | (C[:, 1::2] << 4)).astype(np.uint8)
    return np.ascontiguousarray(C), np.ascontiguousarray(scales)
