"""The static-range error kernel (csrc/ork/act_range.h, orkpy.runtime.actcal.range_mse, issue 39:
the activation-range search was the largest stage of a calibrated quantization, 0.75 s per
linear in NumPy): equal to the NumPy reference (tests/act_range_ref.py) to rounding on random
and real histograms, the same MSE-optimal range chosen, independent of the thread count; bad
arguments raise named errors."""
import numpy as np
import pytest

from orkpy import _core
from orkpy.runtime import actcal

from act_range_ref import range_mse_ref

B = len(actcal.hist_edges()) - 1


def _hist(rng, values):
    """count / sum / sum2 of |values| over the core's bins, as the C statistics hook keeps them."""
    edges = actcal.hist_edges()
    a = np.abs(values.astype(np.float64))
    b = np.clip(np.searchsorted(edges, a, side="right") - 1, 0, B - 1)
    return (np.bincount(b, minlength=B).astype(np.float64), np.bincount(b, a, minlength=B),
            np.bincount(b, a * a, minlength=B))


def _clips(amax):
    r = 2.0 ** (-np.arange(actcal.GRID_OCTAVES * actcal.GRID_PER_OCTAVE + 1) / actcal.GRID_PER_OCTAVE)
    c = (np.float32(amax) * r.astype(np.float32))
    return c[c >= np.float32(1e-30)].astype(np.float64)


@pytest.mark.parametrize("dist", ["normal", "laplace-outliers", "sparse", "huge"])
@pytest.mark.parametrize("qmax", [127, 7])
def test_kernel_equals_the_numpy_reference(rng, dist, qmax):
    n = 20000
    v = {"normal": lambda: rng.standard_normal(n),
         "laplace-outliers": lambda: np.concatenate([rng.laplace(size=n), [300.0, -500.0]]),
         "sparse": lambda: np.where(rng.random(n) < 0.9, 0.0, rng.standard_normal(n)),
         "huge": lambda: rng.standard_normal(n) * 2.0 ** 21}[dist]()  # beyond the last edge: the open bin
    count, s1, s2 = _hist(rng, v)
    clips = _clips(np.abs(v).max())
    want = range_mse_ref(count, s1, s2, clips, qmax)
    got = actcal.range_mse(count, s1, s2, clips, qmax)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert int(np.argmin(got)) == int(np.argmin(want))
    for t in (1, 2, 3):
        np.testing.assert_array_equal(actcal.range_mse(count, s1, s2, clips, qmax, threads=t), got)


def test_mse_clip_choice_unchanged_on_a_model(shared):
    """Every linear of stories260K (and both grids): the range the C kernel picks is the reference's."""
    import orkpy
    m = orkpy.load_model(shared / "models/stories260K/stories260K-F32.gguf")
    text = (shared / "text/tinystories-val-B.txt").read_text()[:20000]
    n, it = m.chunks(m.tokens(text), 128, 4)
    stats = m.collect_act_stats(list(it), prefix=1)
    for name, s in stats.items():
        for qmax in (127, 7):
            clips = _clips(float(s["absmax"]))
            ref = range_mse_ref(s["count"], s["sum"], s["sum2"], clips, qmax)
            best = min(range(len(ref)), key=lambda i: (ref[i], i))  # mse_clip: the largest range wins ties
            assert actcal.mse_clip(s, qmax) == float(np.float32(clips[best])), (name, qmax)


def test_bad_arguments():
    z = np.zeros(B)
    with pytest.raises(ValueError, match="must have"):
        _core.range_mse(np.zeros(B - 1), z, z, np.ones(3), 127)
    with pytest.raises(ValueError, match="clip 1 is"):
        _core.range_mse(z, z, z, np.array([1.0, 0.0]), 127)
    with pytest.raises(ValueError, match="clip 0 is"):
        _core.range_mse(z, z, z, np.array([np.nan]), 127)
    with pytest.raises(ValueError, match="qmax"):
        _core.range_mse(z, z, z, np.ones(2), 0)
    with pytest.raises((TypeError, ValueError)):
        _core.range_mse(z, z, z, np.ones((2, 2)), 127)
    assert _core.range_mse(z, z, z, np.ones(0), 127).shape == (0,)
