"""The screened imatrix clip search (csrc/ork/quant.h, "screened clip search"): 4-bit kinds, segments
of at least 512 values. Bit for bit the NumPy reference of the contract on every ISA and thread count;
search="full" is the unscreened search; the screen picks what the full search picks on all but a few
rows and never exceeds plain absmax's error."""
import numpy as np
import pytest

import orkpy
from orkpy.kernels import reference as R

f32 = np.float32
FOUR = ("nf4", "int4")


def heavy(rng, N, K, df=4):
    """Heavy-tailed rows (Student t, ``df`` degrees of freedom) with an outlier column and a zero
    row, and a skewed importance (chi-square times log-normal, a few zeros)."""
    w = (rng.standard_t(df, (N, K)) * 0.02).astype(f32)
    w[:, 3] *= 20
    w[1] = 0
    im = (rng.chisquare(2, K) * rng.lognormal(0, 1, K)).astype(f32)
    im[::97] = 0
    return w, im


def werr(w, im, q):
    d = (w.astype(np.float64) - q.dequantize().astype(np.float64)) ** 2
    return (d * im.astype(np.float64)[None, :]).sum(axis=1)


@pytest.mark.parametrize("kind", FOUR)
@pytest.mark.parametrize("K, group", [(512, None), (777, None), (2048, None), (1536, 512), (2048, 1024)])
def test_screen_is_the_reference_on_every_isa_and_thread_count(rng, kind, K, group):
    w, im = heavy(rng, 48, K)
    c, s = R.quantize(w, kind, imatrix=im, group_size=group)
    for isa in orkpy.capabilities()["available"]:
        with orkpy.use_isa(isa):
            for t in (1, 3):
                for sr in (False, True):
                    q = orkpy.quantize(w, kind, imatrix=im, group_size=group, threads=t, sr=sr, seed=5)
                    assert np.array_equal(q.scales, s), (isa, t, sr)
                    if not sr:
                        assert np.array_equal(q.codes, c), (isa, t)


@pytest.mark.parametrize("kind", FOUR)
def test_full_search_is_the_unscreened_reference(rng, kind):
    w, im = heavy(rng, 40, 1024)
    q = orkpy.quantize(w, kind, imatrix=im, search="full")
    c, s = R.quantize(w, kind, imatrix=im, search="full")
    assert np.array_equal(q.codes, c) and np.array_equal(q.scales, s)


@pytest.mark.parametrize("kind", FOUR)
def test_screen_picks_the_full_searchs_scale_on_almost_every_row(kind):
    """On 3000 heavy-tailed rows of 512 (the shortest screened segment, where the histogram is
    coarsest; a seed where both kinds have rows the screen misses) the screened scale differs from
    the full search's on a few rows (so the screen really runs), at most 0.5%, and those rows are
    the reference's too; the total weighted error is within 1e-4 of the full search's; no row is
    worse than plain absmax (1.0 is always evaluated exactly)."""
    w, im = heavy(np.random.default_rng(2), 3000, 512, df=2)
    scr = orkpy.quantize(w, kind, imatrix=im)
    full = orkpy.quantize(w, kind, imatrix=im, search="full")
    plain = orkpy.quantize(w, kind)
    differ = np.count_nonzero(scr.scales != full.scales)
    assert 1 <= differ <= 15, differ
    c, s = R.quantize(w, kind, imatrix=im)
    assert np.array_equal(scr.codes, c) and np.array_equal(scr.scales, s)
    es, ef, ep = werr(w, im, scr), werr(w, im, full), werr(w, im, plain)
    assert es.sum() <= ef.sum() * (1 + 1e-4)
    assert np.all(ef <= es * (1 + 1e-9))  # the full search is the best of the grid
    assert np.all(es <= ep * (1 + 1e-9))


def test_short_segments_and_8_bit_kinds_search_in_full(rng):
    w, im = heavy(rng, 30, 511)
    for kind in ("nf4", "int8", "int6"):
        a = orkpy.quantize(w, kind, imatrix=im)
        b = orkpy.quantize(w, kind, imatrix=im, search="full")
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    w, im = heavy(rng, 30, 1024)
    for kind in ("int8", "int5"):
        a = orkpy.quantize(w, kind, imatrix=im)
        b = orkpy.quantize(w, kind, imatrix=im, search="full")
        assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)
    w, im = heavy(rng, 30, 2048)  # groups of 256 in a long row: each group is a short segment
    a = orkpy.quantize(w, "nf4", imatrix=im, group_size=256)
    b = orkpy.quantize(w, "nf4", imatrix=im, group_size=256, search="full")
    assert np.array_equal(a.codes, b.codes) and np.array_equal(a.scales, b.scales)


def test_screen_keeps_a_custom_grid_and_its_order(rng):
    """A user grid: the screen only ever picks ratios of that grid; duplicates and 1.0 inside it
    change nothing; a one-ratio grid is 1.0 against that ratio, exactly as the full search."""
    w, im = heavy(rng, 64, 1024)
    grid = np.array([0.9, 1.0, 0.7, 0.9, 0.5], f32)
    q = orkpy.quantize(w, "nf4", imatrix=im, clip_grid=grid)
    c, s = R.quantize(w, "nf4", imatrix=im, clip_grid=grid)
    assert np.array_equal(q.codes, c) and np.array_equal(q.scales, s)
    a = np.abs(w).max(axis=1)
    ok = (s == 0) | np.isin(s, (a[:, None] * np.array([1.0, 0.9, 0.7, 0.5], f32)[None, :] / f32(127)).astype(f32))
    assert ok.all()
    one = np.array([0.8], f32)
    a1 = orkpy.quantize(w, "nf4", imatrix=im, clip_grid=one)
    b1 = orkpy.quantize(w, "nf4", imatrix=im, clip_grid=one, search="full")
    assert np.array_equal(a1.scales, b1.scales)


def test_search_argument_is_checked():
    with pytest.raises(ValueError, match="search must be one of 'screen', 'full'"):
        orkpy.quantize(np.ones((2, 4), f32), "nf4", search="fast")
    with pytest.raises(ValueError, match="clip_search must be one of"):
        orkpy.quantize_model("nonexistent.gguf", None, clip_search="fast")


def test_quantize_model_passes_the_search_and_records_it(shared, tmp_path, monkeypatch):
    """quantize_model(clip_search=) reaches every quantize() call and the manifest's settings
    (recorded whenever an imatrix chose scales); ``orkpy quantize --clip-search full`` gives the same
    directory; full with GPTQ is refused (GPTQ's own scales come from the screened search)."""
    import json
    import subprocess
    import sys
    import orkpy.quantization.rounding as cal  # round_linear, the one call of quantize per linear (pipeline, layerwise)
    src = shared / "models/stories260K/stories260K-F16.gguf"
    alloc = shared / "models/stories260K/stories260K-Q4_0.gguf"
    quiet = dict(progress=False, log=lambda s: None)
    im = orkpy.collect_imatrix(orkpy.load_model(src), np.arange(1, 300, dtype=np.int32), n_ctx=64, progress=False)
    seen = []
    real = cal.quantize

    def spy(*a, **kw):
        seen.append(kw.get("search"))
        return real(*a, **kw)
    monkeypatch.setattr(cal, "quantize", spy)
    orkpy.quantize_model(src, alloc, output=tmp_path / "plain", **quiet)
    orkpy.quantize_model(src, alloc, imatrix=im, output=tmp_path / "screen", **quiet)
    n = len(seen)
    orkpy.quantize_model(src, alloc, imatrix=im, clip_search="full", output=tmp_path / "full", **quiet)
    assert set(seen[:n]) == {"screen"} and set(seen[n:]) == {"full"} and len(seen) == 3 * n // 2
    settings = {d: json.loads((tmp_path / d / "manifest.json").read_text())["settings"]
                for d in ("plain", "screen", "full")}
    assert "clip_search" not in settings["plain"]
    assert settings["screen"]["clip_search"] == "screen" and settings["full"]["clip_search"] == "full"
    im.save(tmp_path / "im.dat")
    subprocess.run([sys.executable, "-m", "orkpy", "quantize", str(src), "--alloc", str(alloc), "--imatrix",
                    str(tmp_path / "im.dat"), "--clip-search", "full", "-o", str(tmp_path / "cli"), "--no-progress"],
                   check=True, capture_output=True)
    assert (json.loads((tmp_path / "cli" / "manifest.json").read_text())["settings"]
            == json.loads((tmp_path / "full" / "manifest.json").read_text())["settings"])
    with pytest.raises(ValueError, match="clip_search='full' applies to the plain rounding"):
        orkpy.quantize_model(src, alloc, method="gptq", calib="Once upon a time", clip_search="full", **quiet)
