"""Target-size sensitivities in a few streamed passes (orkpy/quantization/sensitivity.py, issue 39):
the online KL over vocabulary blocks equals the whole-vocabulary one, each type's KL equals the
whole model's with that type's linears rounded, the head's the whole model's with its head
rounded, a head applied in row blocks changes nothing, and the report splits each type's KL
over its linears."""
import numpy as np
import pytest

from orkpy.formats.source import open_source
from orkpy.formats.tiermap import OUTPUT
from orkpy.kernels.quant import quantize
from orkpy.quantization import alloc, sensitivity
from orkpy.quantization.imatrix import Imatrix
from orkpy.runtime.blocks import STEMS
from orkpy.runtime.linear import LinearSpec
from orkpy.runtime.model import calib_chunks, float_model, linear_names

F16 = "models/stories260K/stories260K-F16.gguf"
TEXT = "text/tinystories-val-B.txt"


def test_online_kl_over_column_blocks_is_the_mean_kl(rng):
    zp = [rng.standard_normal((7, 50)).astype(np.float32) * 3, rng.standard_normal((4, 50)).astype(np.float32)]
    zq = [z + rng.standard_normal(z.shape).astype(np.float32) for z in zp]
    want = alloc.mean_kl([alloc._log_softmax(z) for z in zp], zq)
    for cuts in ([0, 50], [0, 1, 20, 50], [0, 13, 26, 39, 50]):
        kl = sensitivity._OnlineKL([z.shape[0] for z in zp])
        for a, b in zip(cuts[:-1], cuts[1:]):
            kl.add([z[:, a:b] for z in zp], [z[:, a:b] for z in zq])
        assert kl.value() == pytest.approx(want, rel=1e-10)


@pytest.fixture(scope="module")
def stories(shared):
    src = open_source(str(shared / F16))
    calib = (shared / TEXT).read_text()[:12000]
    rng = np.random.default_rng(5)
    im = Imatrix(chunks=1)
    for n in linear_names(src.hp):
        im.add(n, rng.random(src.shapes()[src.tensor_name(n)][1]) + 0.1, 1)
    rep = alloc.sensitivities(src, calib, kind="nf4", imatrix=im, n_ctx=64, chunks=2, progress=False, method="passes")
    return src, calib, im, rep


def test_each_type_and_the_head_measure_the_whole_models_kl(stories):
    """KL_type from the streams = the whole float model's KL with every linear of the type at
    the ref option (its forward pass, swap_linear); the head's the same with only the head."""
    src, calib, im, rep = stories
    assert rep["method"] == "passes" and set(rep["kl_type"]) == set(STEMS)
    m = float_model(src)
    chunks, _ = calib_chunks(src, calib, 64, 2)
    ref_logp = [alloc._log_softmax(m.forward(c)) for c in chunks]

    def kl_with(names):
        old = {n: m.swap_linear(n, LinearSpec.f32(n, alloc._dequantized(src.linear(n), rep["ref"], "nf4",
                                                                          im.values(n)))) for n in names}
        try:
            return max(alloc.mean_kl(ref_logp, [m.forward(c) for c in chunks]), 0.0)
        finally:
            for n, s in old.items():
                m.swap_linear(n, s)

    n_layer = int(src.hp["n_layer"])
    for t in STEMS:
        want = kl_with([f"blk.{i}.{t}.weight" for i in range(n_layer)])
        assert rep["kl_type"][t] == pytest.approx(want, rel=1e-6, abs=1e-12), t
        assert want > 0
    assert rep["kl_ref"][OUTPUT] == pytest.approx(kl_with([OUTPUT]), rel=1e-6)


def test_report_splits_each_types_kl_by_the_relative_output_error(stories):
    src, _, im, rep = stories
    names = linear_names(src.hp)
    assert set(rep["kl_ref"]) == set(rep["loss"]) == set(rep["err"]) == set(rep["bytes"]) == set(names)
    ref = rep["ref"]
    for t in STEMS:
        ns = [n for n in names if f".{t}." in n]
        assert sum(rep["kl_ref"][n] for n in ns) == pytest.approx(rep["kl_type"][t], rel=1e-12)
        rho = {n: rep["err"][n][ref] / rep["energy"][n] for n in ns}
        for n in ns:
            w = src.linear(n).astype(np.float64)
            assert rep["energy"][n] == pytest.approx(float((w ** 2).sum(axis=0) @ im.values(n)), rel=1e-9)
            assert rep["kl_ref"][n] == pytest.approx(rep["kl_type"][t] * rho[n] / sum(rho.values()), rel=1e-12)
            assert rep["err"][n][ref] == pytest.approx(alloc.weighted_error(src.linear(n), ref, "nf4", im.values(n)),
                                                       rel=1e-12)
    for n in names:
        assert rep["loss"][n][ref] == pytest.approx(rep["kl_ref"][n], rel=1e-12)
        assert rep["loss"][n]["int8"] < rep["loss"][n][ref]


def test_head_in_row_blocks_changes_nothing(stories, monkeypatch):
    src, calib, im, rep = stories
    N, K = src.shapes()[src.tensor_name(OUTPUT)][:2]
    monkeypatch.setattr(sensitivity, "HEAD_BLOCK_BYTES", 4 * K * 100)  # 100 vocabulary rows at a time
    again = alloc.sensitivities(src, calib, kind="nf4", imatrix=im, n_ctx=64, chunks=2, progress=False,
                                method="passes")
    for t in STEMS:
        assert again["kl_type"][t] == pytest.approx(rep["kl_type"][t], rel=1e-9)
    assert again["kl_ref"][OUTPUT] == pytest.approx(rep["kl_ref"][OUTPUT], rel=1e-9)
    assert again["err"][OUTPUT] == pytest.approx(rep["err"][OUTPUT], rel=1e-12)


def test_auto_measures_small_models_per_linear(stories, monkeypatch):
    """"auto": per linear up to PER_LINEAR_MAX_BYTES of float32 weights (the report says which)."""
    src, calib, im, _ = stories
    assert sensitivity.auto_method(src) == "per_linear"
    monkeypatch.setattr(sensitivity, "PER_LINEAR_MAX_BYTES", 1000)
    assert sensitivity.auto_method(src) == "passes"
    rep = alloc.sensitivities(src, calib, kind="nf4", imatrix=im, n_ctx=64, chunks=1, progress=False)
    assert rep["method"] == "passes"


def test_bad_method_is_refused(stories):
    src, calib, _, _ = stories
    with pytest.raises(ValueError, match="method must be one of auto, passes, per_linear"):
        alloc.sensitivities(src, calib, method="each")


def test_options_on_sampled_rows_estimate_the_whole_weights_errors(rng):
    """Above 2 x OPTION_ROWS rows the options other than ref are quantized on OPTION_ROWS evenly
    rows drawn in proportion to ref's error per row: ref's error exact, the others within 3 % of the
    whole weight's (rows of unequal scales, outlier columns); at or below it every row, exactly."""
    from orkpy.quantization.alloc import DEFAULT_OPTIONS
    opts, ref = list(DEFAULT_OPTIONS), "int4"
    K = 256
    im = rng.uniform(0.1, 3.0, K).astype(np.float32)
    for N, tol in ((3000, 0.03), (2 * sensitivity.OPTION_ROWS, 1e-12)):
        w = (rng.standard_normal((N, K)) * np.exp(rng.normal(0, 0.5, (N, 1)))).astype(np.float32)
        w[:, :4] *= 8.0  # outlier input channels
        err, ref_w = sensitivity._options_of(w, opts, ref, "nf4", im, None)
        assert list(err) == opts
        np.testing.assert_array_equal(ref_w, quantize(w, "nf4", imatrix=im).dequantize())  # int4 tiers as the kind
        for t in opts:
            exact = alloc.weighted_error(w, t, "nf4", im)
            assert err[t] == pytest.approx(exact, rel=1e-12 if t == ref else tol), (N, t)
