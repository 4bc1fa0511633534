"""The pruned full clip search of the 8-bit kinds (csrc/ork/quant.h, "pruned full search"): a lower
bound from the row's tail skips candidates that cannot win, so fewer are evaluated exactly, and the
chosen scale must be the full search's bit for bit. The NumPy reference evaluates every ratio, so
each test below compares against an unpruned search, on rows built to stress the bound: ties
between ratios, a tail longer than ORK_PRUNE_TAIL, zero importance where the tail is, float16
group scales that round to zero, long and duplicated custom grids."""
import numpy as np
import pytest

import orkpy
from orkpy.kernels import reference as R

f32 = np.float32
EIGHT = ("int8", "int6", "int5")


def check(w, kind, im, **kw):
    c, s = R.quantize(w, kind, imatrix=im, **kw)
    for isa in orkpy.capabilities()["available"]:
        with orkpy.use_isa(isa):
            for t in (1, 3):
                for search in ("screen", "full"):  # the pruned search serves both (it is exact)
                    q = orkpy.quantize(w, kind, imatrix=im, threads=t, search=search, **kw)
                    assert np.array_equal(q.scales, s), (isa, t, search)
                    assert np.array_equal(q.codes, c), (isa, t, search)


@pytest.mark.parametrize("kind", EIGHT)
@pytest.mark.parametrize("df", [2, 4, 50])
@pytest.mark.parametrize("K, group", [(128, None), (700, None), (2048, None), (1024, 256)])
def test_pruned_search_is_the_full_search(rng, kind, df, K, group):
    w = (rng.standard_t(df, (40, K)) * 0.02).astype(f32)
    w[:, 5] *= 30  # an outlier column: clipping pays on some rows
    w[2] = 0
    im = (rng.chisquare(2, K) * rng.lognormal(0, 1, K)).astype(f32)
    im[::53] = 0
    check(w, kind, im, group_size=group)


@pytest.mark.parametrize("kind", EIGHT)
def test_ties_between_ratios_keep_the_earliest(rng, kind):
    """The tie rule (1.0 first, then grid order), which pruning must not disturb: rows on a coarse
    lattice (where some ratios may tie), and rows where every ratio's error is exactly 0 (all tie,
    1.0 must win)."""
    K = 512
    w = rng.integers(-3, 4, (30, K)).astype(f32) * f32(0.25)
    w[:, 0] = 0.75  # absmax 0.75 on every row
    im = np.ones(K, f32)
    check(w, kind, im)
    im2 = (rng.random(K) < 0.5).astype(f32)
    check(w, kind, im2)
    # every ratio's error exactly 0 (the only nonzero values have zero importance): 1.0 must win
    w3 = np.zeros((4, K), f32)
    w3[:, :7] = rng.standard_normal((4, 7)).astype(f32)
    im3 = np.ones(K, f32)
    im3[:7] = 0
    check(w3, kind, im3)


@pytest.mark.parametrize("kind", EIGHT)
def test_long_tails_and_zero_importance_in_the_tail(rng, kind):
    """Every value in the tail (|x| near absmax on the whole row, far more than ORK_PRUNE_TAIL
    values: the bound uses only the first of them), and rows whose tail has zero importance (the
    bound is 0 and prunes nothing)."""
    K = 2048
    w = (np.sign(rng.standard_normal((20, K))) * (0.9 + 0.1 * rng.random((20, K)))).astype(f32)
    im = rng.random(K).astype(f32)
    check(w, kind, im)
    w2 = (rng.standard_normal((20, K)) * 0.02).astype(f32)
    im2 = np.where(np.abs(w2).max(axis=0) > 0.03, 0, 1).astype(f32)
    check(w2, kind, im2)


@pytest.mark.parametrize("kind", ("int8", "int5"))
def test_custom_grids(rng, kind):
    """A 1024-ratio grid (the most the contract allows), one with duplicates and ratios above 1."""
    w = (rng.standard_t(3, (12, 640)) * 0.02).astype(f32)
    im = (rng.chisquare(2, 640)).astype(f32)
    check(w, kind, im, clip_grid=np.linspace(1.0, 0.3, 1024, dtype=f32))
    check(w, kind, im, clip_grid=np.array([0.9, 1.0, 0.9, 1.2, 0.7, 0.7, 0.95], f32))


def test_float16_scales_that_round_to_zero(rng):
    """Group-wise scales are float16: tiny groups make candidates whose scale rounds to 0 (evaluated
    as all zeros, quant.h); the bound of such a candidate is the tail's sum im * x^2."""
    K = 1024
    w = (rng.standard_normal((16, K)) * 0.02).astype(f32)
    w[:, 256:512] *= f32(1e-4)  # absmax ~1e-5: m / 127 near float16's smallest subnormal
    w[:, 512:768] *= f32(3e-5)
    im = rng.random(K).astype(f32)
    check(w, "int8", im, group_size=256)


@pytest.mark.parametrize("kind", EIGHT)
def test_a_nan_error_at_ratio_one_keeps_ratio_one(rng, kind):
    """absmax = FLT_MAX: 127 * (a / 127) rounds up to inf, so at ratio 1.0 the absmax value's error is
    inf and, with zero importance there, 0 * inf = NaN. The full search takes 1.0's error first as it is
    and nothing compares below NaN, so 1.0 stays; the pruned search must keep it too (found in review:
    it took the first finite candidate)."""
    K = 256
    w = (rng.standard_normal((3, K)) * 1e37).astype(f32)
    w[:, 0] = np.finfo(f32).max
    im = np.ones(K, f32)
    im[0] = 0
    with np.errstate(over="ignore", invalid="ignore"):
        check(w, kind, im)
