"""The fused FFN chain on an architecture whose gate activation is GELU-tanh (Gemma's GeGLU):
the chain's LUT, its exact path and its prep statistics use the model's activation
(csrc/ork/ffn_chain.h), checked on a small synthetic gemma3 model (tests/archgen.py) against
the per-op forward pass and a NumPy reference of the integer steps."""
import numpy as np
import pytest

import orkpy
import orkpy._core as C
from orkpy.evaluation import ffn
from orkpy.formats.arch import GATE_FNS

import archgen
from test_ffn import np_chain

GELU = GATE_FNS["gelu_tanh"]


def gelu(x):
    x = np.asarray(x, np.float64)
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    p = tmp_path_factory.mktemp("g") / "gemma3.gguf"
    archgen.make("gemma3", p, n_layer=3, D=64, H=4, HKV=1, hd=32, F=128, n_swa=32, scale=3.0)
    m = orkpy.load_model(p, weights="int8")
    toks = archgen.tokens(64 * 6, seed=1)
    stats = ffn.prep(m, toks, n_ctx=64)
    return p, m, toks, stats


def test_lut_of_each_activation():
    x = (np.arange(1024) - 512) * np.float32(0.02)
    lut, sc = C.ffn_lut(0.02, GELU)
    assert np.abs(lut * sc - gelu(x)).max() <= sc and lut[512] == 0
    silu_lut, silu_sc = C.ffn_lut(0.02)                       # the default is SiLU, as before
    assert np.array_equal(C.ffn_lut(0.02, GATE_FNS["silu"])[0], silu_lut)
    assert np.abs(silu_lut * silu_sc - x / (1 + np.exp(-x))).max() <= silu_sc
    # GELU's negative lobe is shallower and shorter than SiLU's (ffn_chain.h)
    assert -0.171 < (lut * sc).min() < -0.169 and -0.279 < (silu_lut * silu_sc).min() < -0.277
    for bad in ((0.02, 2), (0.02, -1), (0.0, GELU), (float("inf"), GELU)):
        with pytest.raises(ValueError):
            C.ffn_lut(*bad)


def test_prep_statistics_are_of_gelu(gemma):
    p, m, toks, stats = gemma
    assert m.hparams["gate_fn"] == "gelu_tanh"
    for s in stats:
        assert -0.1701 < s["smin"] < 0          # GELU's minimum is -0.1700 (SiLU's -0.2785)
        assert 0 < s["smax"] <= s["gmax"]       # gelu(z) <= z for z > 0


def test_exact_path_is_the_per_op_gelu_ffn(gemma):
    p, m, toks, stats = gemma
    chunk = toks[:64]
    ffn.configure(m, stats, "baseline")
    base = m.forward(chunk)
    ffn.configure(m, stats, "exact_silu")   # the exact path: fp32 activation (here GELU) * up
    assert np.array_equal(m.forward(chunk), base)
    ffn.configure(m, stats, "fused")
    fused = m.forward(chunk)
    assert not np.array_equal(fused, base) and np.isfinite(fused).all()
    ffn.configure(m, stats, "baseline")


def test_fused_gelu_chain_matches_numpy_reference(gemma):
    p, m, toks, stats = gemma
    g = orkpy.GGUFFile(p)
    pw = lambda i, n: orkpy.pack(orkpy.quantize(g.tensor(f"blk.{i}.{n}.weight"), "int8"))
    ffn.configure(m, stats, "fused")
    h = np.random.default_rng(0).standard_normal((23, 64)).astype(np.float32) * 2.0
    for layer in range(m.hparams["n_layer"]):
        prm = ffn.layer_params(stats[layer], "fused")
        lut, lut_scale = C.ffn_lut(prm["lut_step"], GELU)
        want, pq = np_chain(h, pw(layer, "ffn_gate"), pw(layer, "ffn_up"), pw(layer, "ffn_down"), prm, lut, lut_scale)
        assert np.array_equal(m._fwd.ffn_apply(layer, h), want), layer
        # with SiLU's table the chain would give another result: the activation is really GELU's
        silu_lut, silu_sc = C.ffn_lut(prm["lut_step"])
        other, _ = np_chain(h, pw(layer, "ffn_gate"), pw(layer, "ffn_up"), pw(layer, "ffn_down"), prm, silu_lut,
                            silu_sc)
        assert not np.array_equal(other, want)
    ffn.configure(m, stats, "baseline")


def test_every_mode_runs_on_gelu(gemma):
    p, m, toks, stats = gemma
    chunk = toks[:64]
    outs = {}
    for mode in ("fused", "fp32_silu_out", "exact_lut_input", "clip_pct_99.5", "asym_zero_point", "per_channel_out",
                 "unfused"):
        ffn.configure(m, stats, mode)
        outs[mode] = m.forward(chunk)
        assert np.isfinite(outs[mode]).all(), mode
    assert len({o.tobytes() for o in outs.values()}) == len(outs)
    ffn.configure(m, stats, "baseline")
