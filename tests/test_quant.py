"""The quantization core: tables, rounding, nibble order, error figures, SR,
imatrix scale search, cross-ISA / cross-thread identity, a second oracle and
bad input."""
import numpy as np
import pytest

import orkpy
import orkpy.kernels.reference as R

BNB_NF4 = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)


def rms(a):
    return float(np.sqrt(np.mean(np.asarray(a, dtype=np.float64) ** 2)))


def unpack(q):
    c = np.empty((q.codes.shape[0], q.codes.shape[1] * 2), np.uint8)
    c[:, 0::2] = q.codes & 15
    c[:, 1::2] = q.codes >> 4
    return c[:, : q.shape[1]]


# ------------------------------------------------------------------ tables --

def test_nf4_levels_are_bitsandbytes_exactly():
    assert orkpy.NF4_LEVELS.dtype == np.float32
    assert np.array_equal(orkpy.NF4_LEVELS, BNB_NF4)
    assert orkpy.NF4_LEVELS[0] == -1.0 and orkpy.NF4_LEVELS[7] == 0.0 and orkpy.NF4_LEVELS[15] == 1.0
    with pytest.raises(ValueError):
        orkpy.NF4_LEVELS[0] = 3.0  # read-only


def test_luts_are_rounded_levels():
    nf4 = orkpy.lut("nf4")
    assert nf4.dtype == np.int8
    assert np.array_equal(nf4, np.floor(BNB_NF4.astype(np.float64) * 127 + 0.5).astype(np.int8))
    assert np.array_equal(nf4, R.lut_of("nf4"))
    int4 = orkpy.lut("int4")
    assert np.array_equal(int4[:15], np.sign(np.arange(-7, 8)) * np.floor(np.abs(np.arange(-7, 8)) * 127 / 7 + 0.5))
    assert int4[15] == 0 and int4[7] == 0 and nf4[7] == 0
    assert orkpy.lut("int8") is None
    assert np.array_equal(orkpy.INT4_LEVELS, (np.arange(-7, 8) / 7).astype(np.float32))


@pytest.mark.parametrize("kind", ["nf4", "int4"])
def test_midpoint_ties_take_the_lower_code(kind):
    lev = orkpy.lut(kind).astype(np.float32)[: 16 if kind == "nf4" else 15]
    thr = (lev[1:] + lev[:-1]) / 2
    # a row whose absmax is 127 has scale 1 and inv 1: y == w exactly
    row = np.concatenate([[127.0], thr, np.nextafter(thr, np.float32(np.inf)), lev]).astype(np.float32)
    q = orkpy.quantize(row[None, :], kind)
    assert q.scales[0] == 1.0
    c = unpack(q)[0]
    n = len(thr)
    assert np.array_equal(c[1 : 1 + n], np.arange(n))             # on a midpoint: lower code
    assert np.array_equal(c[1 + n : 1 + 2 * n], np.arange(1, n + 1))  # just above: upper code
    assert np.array_equal(c[1 + 2 * n :], np.arange(len(lev)))     # exact levels round-trip
    deq = q.dequantize()[0]
    assert np.array_equal(deq[1 + 2 * n :], lev)


def test_nearest_is_nearest_of_the_lut_grid(rng):
    w = rng.standard_normal((64, 333)).astype(np.float32)
    for kind in ("nf4", "int4"):
        q = orkpy.quantize(w, kind)
        lev = orkpy.lut(kind).astype(np.float32)[: 16 if kind == "nf4" else 15]
        y = w / q.scales[:, None]
        best = np.abs(y[..., None] - lev).min(-1)
        got = np.abs(y - orkpy.lut(kind)[unpack(q)])
        assert np.all(got <= best + 1e-3)


def test_nibble_order_low_first_and_odd_padding():
    lev = orkpy.lut("nf4").astype(np.float32)
    w = np.array([[lev[15], lev[3], lev[9], lev[0], lev[12]]], np.float32)  # absmax 127 -> codes exact
    q = orkpy.quantize(w, "nf4")
    assert q.codes.shape == (1, 3)
    assert q.codes[0, 0] == (15 | (3 << 4))
    assert q.codes[0, 1] == (9 | (0 << 4))
    assert q.codes[0, 2] == (12 | (7 << 4))  # padding nibble = code of level 0


def test_int8_round_half_away_and_range():
    w = np.array([[127.0, 0.5, -0.5, 1.5, -1.5, 2.5, 0.49999997, -126.5, -127.0]], np.float32)
    q = orkpy.quantize(w, "int8")
    assert q.scales[0] == 1.0 and q.lut is None and q.codes.dtype == np.int8
    assert q.codes[0].tolist() == [127, 1, -1, 2, -2, 3, 0, -127, -127]


# ------------------------------------------------------------ error figures --

def test_nf4_over_int4_error_ratio_on_gaussian():
    w = np.random.default_rng(0).standard_normal((1024, 4096)).astype(np.float32)
    e = {k: rms(orkpy.quantize(w, k).dequantize() - w) for k in orkpy.KINDS}
    ratio = e["nf4"] / e["int4"]
    print(f"\nrms error nf4 {e['nf4']:.4f} int4 {e['int4']:.4f} int8 {e['int8']:.5f} ratio {ratio:.4f}")
    assert 0.60 < ratio < 0.75
    assert 0.10 < e["nf4"] < 0.12
    assert e["int8"] < e["nf4"] / 10


def test_zero_rows_give_zero_scale_and_exact_zeros(rng):
    w = rng.standard_normal((6, 70)).astype(np.float32)
    w[2] = 0.0
    w[4] = -0.0
    w[5, :] = 1e-38  # below ORK_QUANT_TINY: documented as a zero row
    for kind in orkpy.KINDS:
        for im in (None, np.ones(70, np.float32)):
            q = orkpy.quantize(w, kind, imatrix=im, sr=True)
            d = q.dequantize()
            for r in (2, 4, 5):
                assert q.scales[r] == 0.0
                assert np.all(d[r] == 0.0)


def test_float16_input_equals_float32_of_it(rng):
    w = rng.standard_normal((33, 65)).astype(np.float16)
    for kind in orkpy.KINDS:
        a, b = orkpy.quantize(w, kind), orkpy.quantize(w.astype(np.float32), kind)
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)


def test_noncontiguous_input(rng):
    base = rng.standard_normal((80, 130)).astype(np.float32)
    view = base.T[::2, 1:]
    for kind in orkpy.KINDS:
        a, b = orkpy.quantize(view, kind), orkpy.quantize(np.ascontiguousarray(view), kind)
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)


# --------------------------------------------------------- stochastic rounding --

@pytest.mark.parametrize("kind", orkpy.KINDS)
def test_sr_is_unbiased(kind):
    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 512)).astype(np.float32)
    w[:, 0] = 4.0  # fixed absmax so every seed has the same scale
    n = 400
    acc = np.zeros_like(w, dtype=np.float64)
    for seed in range(n):
        acc += orkpy.quantize(w, kind, sr=True, seed=seed).dequantize()
        if seed + 1 == n // 16:
            early = rms(acc / (seed + 1) - w)
    mean = acc / n
    bias_rtn = rms(orkpy.quantize(w, kind).dequantize() - w)
    bias_sr = rms(mean - w)
    print(f"\n{kind}: rms(mean of {n} SR draws - w) = {bias_sr:.5f} (of {n // 16}: {early:.5f}), "
          f"rms(RTN - w) = {bias_rtn:.5f}")
    assert bias_sr < bias_rtn / 5
    assert abs(float(np.mean(mean - w))) < 1e-3  # no global bias
    # the error of the mean is noise, not bias: 16x the draws, about 4x smaller
    assert 2.5 < early / bias_sr < 6.0


def test_sr_deterministic_per_seed_and_seed_sensitive(rng):
    w = rng.standard_normal((40, 300)).astype(np.float32)
    for kind in orkpy.KINDS:
        a = orkpy.quantize(w, kind, sr=True, seed=11)
        b = orkpy.quantize(w, kind, sr=True, seed=11)
        c = orkpy.quantize(w, kind, sr=True, seed=12)
        d = orkpy.quantize(w, kind, sr=True, seed=2**40 + 11)  # high seed bits matter
        assert np.array_equal(a.codes, b.codes)
        assert not np.array_equal(a.codes, c.codes)
        assert not np.array_equal(a.codes, d.codes)
        assert np.array_equal(a.scales, orkpy.quantize(w, kind).scales)  # SR never changes scales


def test_sr_keeps_exact_levels(rng):
    lev = orkpy.lut("nf4").astype(np.float32)
    w = np.tile(lev, (8, 3))
    for seed in range(5):
        q = orkpy.quantize(w, "nf4", sr=True, seed=seed)
        assert np.array_equal(q.dequantize(), w)


# ------------------------------------------------------------------ imatrix --

def weighted_err(w, q, im):
    d = (q.dequantize() - w).astype(np.float64)
    return (im.astype(np.float64) * d * d).sum(axis=1)


@pytest.mark.parametrize("magnitude", [1.0, 4.0])
def test_imatrix_never_worse_per_channel_and_much_better_in_total(magnitude):
    rng = np.random.default_rng(7)
    N, K = 512, 2048
    w = rng.standard_normal((N, K)).astype(np.float32)
    cols = rng.choice(K, 16, replace=False)
    w[:, cols] *= magnitude
    im = np.ones(K, np.float32)
    im[cols] = 1000.0
    factors = {}
    for kind in orkpy.KINDS:
        e0 = weighted_err(w, orkpy.quantize(w, kind), im)
        e1 = weighted_err(w, orkpy.quantize(w, kind, imatrix=im), im)
        assert np.all(e1 <= e0 * (1 + 1e-12)), kind
        factors[kind] = e0.sum() / e1.sum()
    print(f"\nimatrix weighted-error reduction (important columns x{magnitude}): "
          + ", ".join(f"{k} {v:.3f}x" for k, v in factors.items()))
    if magnitude == 1.0:
        assert factors["nf4"] > 1.5 and factors["int4"] > 2.0 and factors["int8"] > 1.2
    else:
        assert factors["nf4"] > 1.1 and factors["int4"] > 1.05


def test_imatrix_none_is_byte_identical_to_absmax(rng):
    w = rng.standard_normal((50, 257)).astype(np.float32)
    for kind in orkpy.KINDS:
        plain = orkpy.quantize(w, kind)
        # the independent NumPy oracle's plain absmax path
        c, s = R.quantize(w, kind)
        assert np.array_equal(plain.codes, c) and np.array_equal(plain.scales, s)
        a = np.abs(w).max(1)
        qmax = np.float32(orkpy.kernels.quant.KIND_INFO[kind].qmax)  # 127 (int8, the 4-bit LUT range), 31 int6, 15 int5
        assert np.array_equal(plain.scales, (a / qmax).astype(np.float32))
        # an imatrix with only ratio 1.0 in the grid, or all-zero importance, changes nothing
        for im, grid in ((np.ones(257, np.float32), [1.0]), (np.zeros(257, np.float32), None)):
            q = orkpy.quantize(w, kind, imatrix=im, clip_grid=grid)
            assert q.codes.tobytes() == plain.codes.tobytes()
            assert q.scales.tobytes() == plain.scales.tobytes()


def test_default_grid():
    g = orkpy.DEFAULT_CLIP_GRID
    assert g.dtype == np.float32 and len(g) == 41
    assert g[0] == 1.0 and abs(g[-1] - 0.6) < 1e-6 and np.all(np.diff(g) < 0)


def test_custom_grid_is_used(rng):
    w = rng.standard_normal((20, 128)).astype(np.float32)
    im = np.ones(128, np.float32)
    q = orkpy.quantize(w, "nf4", imatrix=im, clip_grid=[0.8])
    a = np.abs(w).max(1)
    s1, s08 = a / np.float32(127), (a * np.float32(0.8)) / np.float32(127)
    assert np.all((q.scales == s1) | (q.scales == s08.astype(np.float32)))
    assert np.any(q.scales != s1)


# -------------------------------------------------- identity across ISA/threads --

def _all_variants(w, im):
    for kind in orkpy.KINDS:
        for imx in (None, im):
            for sr in (False, True):
                yield kind, imx, sr


def test_scalar_vs_simd_bit_identical(rng, simd_isa):
    w = (rng.standard_normal((67, 1001)) * 0.05).astype(np.float32)
    w[3] = 0
    im = rng.random(1001).astype(np.float32)
    for kind, imx, sr in _all_variants(w, im):
        with orkpy.use_isa("scalar"):
            a = orkpy.quantize(w, kind, imatrix=imx, sr=sr, seed=5)
            da = a.dequantize()
        with orkpy.use_isa(simd_isa):
            b = orkpy.quantize(w, kind, imatrix=imx, sr=sr, seed=5)
            db = b.dequantize()
        assert np.array_equal(a.codes, b.codes), (kind, imx is not None, sr)
        assert np.array_equal(a.scales, b.scales), (kind, imx is not None, sr)
        assert np.array_equal(da, db), (kind, imx is not None, sr)


def test_threads_do_not_change_results(rng):
    w = rng.standard_normal((301, 515)).astype(np.float32)
    im = rng.random(515).astype(np.float32)
    for kind, imx, sr in _all_variants(w, im):
        a = orkpy.quantize(w, kind, imatrix=imx, sr=sr, seed=9, threads=1)
        for t in (2, 3, 8):
            b = orkpy.quantize(w, kind, imatrix=imx, sr=sr, seed=9, threads=t)
            assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
            assert np.array_equal(a.dequantize(threads=1), b.dequantize(threads=t))


@pytest.mark.parametrize("K", [1, 2, 31, 64, 301])
def test_matches_independent_numpy_oracle(rng, K):
    w = (rng.standard_normal((37, K)) * 0.02).astype(np.float32)
    w[5] = 0
    im = rng.random(K).astype(np.float32)
    im[::7] += 30
    for kind, imx, sr in _all_variants(w, im):
        q = orkpy.quantize(w, kind, imatrix=imx, sr=sr, seed=77)
        c, s = R.quantize(w, kind, imatrix=imx, sr=sr, seed=77)
        assert np.array_equal(q.codes, c), (kind, imx is not None, sr)
        assert np.array_equal(q.scales, s)
        assert np.array_equal(q.dequantize(), R.dequantize(c, s, kind, K))


# ----------------------------------------------------------------- bad input --

W = np.ones((4, 8), np.float32)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: orkpy.quantize(np.where(np.eye(4, 8) > 0, np.nan, 1).astype(np.float32), "nf4"), ValueError, r"NaN.*\[0, 0\]"),
    (lambda: orkpy.quantize(np.pad(np.full((1, 1), np.inf, np.float32), ((2, 1), (3, 4)), constant_values=1), "int8"), ValueError, r"Inf.*\[2, 3\]"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.array([1, 1, 1, np.nan, 1, 1, 1, 1], np.float32)), ValueError, r"imatrix.*NaN.*\[3\]"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.array([1, 1, 1, 1, 1, -2, 1, 1], np.float32)), ValueError, r"negative.*\[5\]"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones(7, np.float32)), ValueError, r"imatrix has 7 entries.*K = 8"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones((8, 1), np.float32)), ValueError, r"imatrix must be 1-D"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones(8, np.int32)), TypeError, r"imatrix must be a floating"),
    (lambda: orkpy.quantize(np.ones(8, np.float32), "nf4"), ValueError, r"2-D"),
    (lambda: orkpy.quantize(np.ones((2, 2, 2), np.float32), "nf4"), ValueError, r"2-D"),
    (lambda: orkpy.quantize(np.ones((4, 8), np.int64), "nf4"), TypeError, r"floating-point.*int64"),
    (lambda: orkpy.quantize(np.ones((4, 8), np.complex64), "nf4"), TypeError, r"floating-point"),
    (lambda: orkpy.quantize(np.array([["a", "b"]], dtype=object), "nf4"), TypeError, r"floating-point"),
    (lambda: orkpy.quantize(np.ones((0, 8), np.float32), "nf4"), ValueError, r"non-empty"),
    (lambda: orkpy.quantize(np.ones((4, 0), np.float32), "int8"), ValueError, r"non-empty"),
    (lambda: orkpy.quantize(W, "fp4"), ValueError, r"unknown kind"),
    (lambda: orkpy.quantize(W, "nf4", seed=-1), ValueError, r"seed"),
    (lambda: orkpy.quantize(W, "nf4", seed=2**64), ValueError, r"seed"),
    (lambda: orkpy.quantize(W, "nf4", sr=1), TypeError, r"sr must be a bool"),
    (lambda: orkpy.quantize(W, "nf4", threads=0), ValueError, r"threads"),
    (lambda: orkpy.quantize(W, "nf4", threads=-3), ValueError, r"threads"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones(8, np.float32), clip_grid=[0.0]), ValueError, r"ratio \[0\]"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones(8, np.float32), clip_grid=[0.9, np.nan]), ValueError, r"ratio \[1\]"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones(8, np.float32), clip_grid=[-1.0]), ValueError, r"ratio"),
    (lambda: orkpy.quantize(W, "nf4", imatrix=np.ones(8, np.float32), clip_grid=[]), ValueError, r"clip_grid"),
    (lambda: orkpy.dequantize("not a tensor"), TypeError, r"QuantizedTensor"),
    (lambda: orkpy.set_isa("sse9"), ValueError, r"unknown ISA"),
])
def test_bad_input_raises_named_errors(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_tampered_quantized_tensor_is_refused(rng):
    import dataclasses
    q = orkpy.quantize(rng.standard_normal((4, 9)).astype(np.float32), "nf4")
    bad_shape = dataclasses.replace(q, codes=q.codes[:, :-1])
    with pytest.raises(ValueError, match="do not fit"):
        bad_shape.dequantize()
    bad_dtype = dataclasses.replace(q, codes=q.codes.astype(np.int16))
    with pytest.raises(TypeError, match="uint8"):
        bad_dtype.dequantize()
    bad_scale = dataclasses.replace(q, scales=np.array([1, np.nan, 1, 1], np.float32))
    with pytest.raises(ValueError, match=r"scale\[1\]"):
        bad_scale.dequantize()
    neg_scale = dataclasses.replace(q, scales=np.array([1, 1, -1, 1], np.float32))
    with pytest.raises(ValueError, match=r"scale\[2\]"):
        neg_scale.dequantize()


def test_unavailable_isa_raises_unavailable_error():
    caps = orkpy.capabilities()
    missing = [i for i in ("scalar", "avx2", "neon") if i not in caps["available"]]
    assert missing, "a build never has every ISA"
    with pytest.raises(orkpy.UnavailableError, match=missing[0]):
        orkpy.set_isa(missing[0])
    assert orkpy.capabilities()["isa"] == caps["isa"]


def test_concurrent_python_threads_are_safe_and_identical(rng):
    """Several Python threads in the C core at once (the GIL is released)."""
    import concurrent.futures as cf
    ws = [rng.standard_normal((128, 700)).astype(np.float32) for _ in range(6)]
    im = rng.random(700).astype(np.float32)
    serial = [orkpy.quantize(w, "nf4", imatrix=im, sr=True, seed=i) for i, w in enumerate(ws)]
    with cf.ThreadPoolExecutor(4) as ex:
        par = list(ex.map(lambda a: orkpy.quantize(a[1], "nf4", imatrix=im, sr=True, seed=a[0]),
                          enumerate(ws)))
    for a, b in zip(serial, par):
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
