"""The fused int8 SwiGLU chain: integer steps against a NumPy reference,
sprinkle identities, selection rules, modes, bad input."""
import json

import numpy as np
import pytest

import orkpy
import orkpy._core as C
from orkpy.evaluation import ffn
from orkpy.cli import main, read_text_like_llama_cpp
from orkpy.kernels.reference import round_half_away

ST = "models/stories260K/stories260K-F32.gguf"


@pytest.fixture(scope="module")
def setup(shared):
    m = orkpy.load_model(shared / ST, weights="int8")
    text = read_text_like_llama_cpp(shared / "text" / "tinystories-val-B.txt")
    toks = m.tokenizer.encode(text)
    stats = ffn.prep(m, toks[: 256 * 30], n_ctx=256)
    return m, toks, stats


def _pw(m, i, name):
    g = orkpy.GGUFFile(m.path)
    w = g.tensor(f"blk.{i}.{name}.weight")
    return orkpy.pack(orkpy.quantize(w, "int8"))


def np_gate_up(h, pg, pu):
    """The chain's gate and up outputs (ffn_chain.h): per-token int8 input, int32 products, dequantized."""
    f32 = np.float32
    q = orkpy.quantize(h, "int8")
    hq, a = q.codes, q.scales
    G, U = pg.matmul_int(hq), pu.matmul_int(hq)
    return ((G.astype(f32) * a[:, None]).astype(f32) * pg.bscale[None, :],
            (U.astype(f32) * a[:, None]).astype(f32) * pu.bscale[None, :])


def np_chain(h, pg, pu, pd, p, lut, lut_scale):
    """NumPy reference of the fused chain (ffn_chain.h), float32 step by step."""
    f32 = np.float32
    g, u = np_gate_up(h, pg, pu)
    inv = f32(1) / f32(p["lut_step"])
    idx = np.clip(round_half_away((g * inv).astype(f32)) + f32(512), 0, 1023).astype(np.int64)
    s = lut[idx].astype(f32) * f32(lut_scale)
    ss, us, ps = f32(p["s_scale"]), f32(p["u_scale"]), f32(p["p_scale"])
    sq = np.clip(round_half_away((s / ss).astype(f32)), -127, 127).astype(np.int32)
    uq = np.clip(round_half_away((u / us).astype(f32)), -127, 127).astype(np.int32)
    m = f32(ss * us) / ps
    pq = np.clip(round_half_away(((sq * uq).astype(f32) * m).astype(f32)), -127, 127).astype(np.int8)
    Y = pd.matmul_int(pq)
    return (Y.astype(f32) * ps).astype(f32) * pd.bscale[None, :], pq


def test_fused_integer_steps_match_numpy_reference(setup):
    m, toks, stats = setup
    ffn.configure(m, stats, "fused")
    rng = np.random.default_rng(0)
    h = rng.standard_normal((37, 64)).astype(np.float32) * 1.5
    for layer in range(m.hparams["n_layer"]):
        p = ffn.layer_params(stats[layer], "fused")
        lut, lut_scale = C.ffn_lut(p["lut_step"])
        want, pq = np_chain(h, _pw(m, layer, "ffn_gate"), _pw(m, layer, "ffn_up"), _pw(m, layer, "ffn_down"), p, lut,
                            lut_scale)
        got = m._fwd.ffn_apply(layer, h)
        assert np.array_equal(got, want), layer
        assert np.abs(pq.astype(int)).max() > 20  # the requantized product actually uses the int8 range


def np_split_chain(h, pg, pu, pd, p, lut, lut_scale):
    """NumPy reference of split_product (ffn_chain.h): the fused chain's sq * uq handed to the down
    task as two int8 digit planes, combined in 64 bits."""
    f32 = np.float32
    g, u = np_gate_up(h, pg, pu)
    idx = np.clip(round_half_away((g * (f32(1) / f32(p["lut_step"]))).astype(f32)) + f32(512), 0, 1023).astype(int)
    s = lut[idx].astype(f32) * f32(lut_scale)
    ss, us = f32(p["s_scale"]), f32(p["u_scale"])
    sq = np.clip(round_half_away((s / ss).astype(f32)), -127, 127).astype(np.int32)
    uq = np.clip(round_half_away((u / us).astype(f32)), -127, 127).astype(np.int32)
    P = sq * uq
    hi = round_half_away((P.astype(f32) / f32(128)).astype(f32)).astype(np.int32)
    lo = P - 128 * hi
    assert np.abs(hi).max() <= 127 and np.abs(lo).max() <= 64 and np.array_equal(128 * hi + lo, P)
    Y = 128 * pd.matmul_int(hi.astype(np.int8)).astype(np.int64) + pd.matmul_int(lo.astype(np.int8)).astype(np.int64)
    return (Y.astype(f32) * f32(ss * us)).astype(f32) * pd.bscale[None, :], P


def test_split_product_matches_numpy_reference_and_keeps_the_product_exact(setup):
    m, toks, stats = setup
    rng = np.random.default_rng(1)
    h = rng.standard_normal((29, 64)).astype(np.float32) * 1.5
    for layer in range(m.hparams["n_layer"]):
        ffn.configure(m, stats, "split_product")
        p = ffn.layer_params(stats[layer], "split_product")
        lut, lut_scale = C.ffn_lut(p["lut_step"])
        pg, pu, pd = (_pw(m, layer, t) for t in ("ffn_gate", "ffn_up", "ffn_down"))
        want, P = np_split_chain(h, pg, pu, pd, p, lut, lut_scale)
        got = m._fwd.ffn_apply(layer, h)
        assert np.array_equal(got, want), layer
        assert np.abs(P).max() > 1000  # products well beyond one int8 digit are carried exactly
        # the fused chain's requantized product loses what split_product keeps: closer to the
        # same chain with its product in float (fp32 P, per-token int8 down input: fp32_silu_out)
        ffn.configure(m, stats, "fused")
        fused = m._fwd.ffn_apply(layer, h)
        ffn.configure(m, stats, "fp32_silu_out")
        fl = m._fwd.ffn_apply(layer, h)
        assert np.abs(got - fl).mean() < np.abs(fused - fl).mean(), layer


def test_lut_is_silu():
    lut, sc = C.ffn_lut(0.02)
    x = (np.arange(1024) - 512) * np.float32(0.02)
    silu = x / (1 + np.exp(-x))
    assert np.abs(lut * sc - silu).max() <= sc  # within one LUT quantum
    assert lut.dtype == np.int16 and lut[512] == 0


def test_sprinkle_identities(setup):
    m, toks, stats = setup
    n = m.hparams["n_layer"]
    chunk = toks[:256]
    ffn.configure(m, stats, "exact_silu")
    exact = m.forward(chunk)
    ffn.configure(m, stats, "fused")
    fused = m.forward(chunk)
    ffn.configure(m, stats, "baseline")
    base = m.forward(chunk)
    ffn.configure(m, stats, ffn.sprinkle(stats, n))
    assert np.array_equal(m.forward(chunk), exact)      # all layers exact == exact_silu
    ffn.configure(m, stats, ffn.sprinkle(stats, 0))
    assert np.array_equal(m.forward(chunk), fused)      # none exact == fused
    assert np.array_equal(exact, base)                  # the exact path is the per-op path
    assert not np.array_equal(fused, exact)


def test_selection_rules_deterministic(setup):
    m, toks, stats = setup
    g = [s["gmax"] for s in stats]
    top2 = ffn.sprinkle(stats, 2)
    assert sorted(i for i, md in enumerate(top2) if md == "exact_silu") == sorted(np.argsort(g)[-2:].tolist())
    assert ffn.sprinkle(stats, "auto") == ffn.sprinkle(stats, "auto")
    thr = ffn.sprinkle(stats, float(np.median(g)))
    assert [md == "exact_silu" for md in thr] == [x > np.median(g) for x in g]
    fake = [{"gmax": v} for v in (1.0, 1.1, 0.9, 1.05, 9.0, 1.0)]
    # median 1.025, MAD 0.05: c = 1 -> threshold 1.075, c = 3 -> 1.175
    assert ffn.sprinkle(fake, "auto") == ["fused", "exact_silu", "fused", "fused", "exact_silu", "fused"]
    assert ffn.sprinkle(fake, "auto", c=3.0) == ["fused"] * 4 + ["exact_silu", "fused"]
    assert ffn.AUTO_C == 1.0
    # on stories260K the automatic choice is the two layers with the largest gmax
    auto = [i for i, md in enumerate(ffn.sprinkle(stats, "auto")) if md == "exact_silu"]
    assert auto == sorted(np.argsort(g)[-2:].tolist())


@pytest.mark.parametrize("mode", ["fp32_silu_out", "exact_lut_input", "clip_pct_99.5", "asym_zero_point",
                                  "per_channel_out", "unfused", "split_product"])
def test_every_mode_runs_and_differs_from_fused(setup, mode):
    m, toks, stats = setup
    chunk = toks[:128]
    ffn.configure(m, stats, "fused")
    fused = m.forward(chunk)
    ffn.configure(m, stats, mode)
    out = m.forward(chunk)
    assert np.all(np.isfinite(out)) and not np.array_equal(out, fused)


def test_bad_input(setup, shared):
    m, toks, stats = setup
    with pytest.raises(ValueError, match="unknown FFN mode"):
        ffn.configure(m, stats, "fused9")
    with pytest.raises(ValueError, match="percentile"):
        ffn.configure(m, stats, "clip_pct_100")
    f32 = orkpy.load_model(shared / ST)  # float weights: the chain needs packed ones
    with pytest.raises(ValueError, match="packed"):
        ffn.configure(f32, stats, "fused")
    with pytest.raises(ValueError, match="modes for"):
        ffn.configure(m, stats, ["fused"])


@pytest.mark.gate
def test_ffn_sweep_cli(shared, tmp_path, capsys):
    out = tmp_path / "sweep.jsonl"
    text, calib = str(shared / "text" / "tinystories-val-B.txt"), str(shared / "text" / "wikitext-2-raw-test.txt")
    assert main(["ffn-sweep", str(shared / ST), text, "--calib", calib, "--chunks", "20", "--calib-chunks", "40",
                 "--json-out", str(out), "--no-progress"]) == 0
    rows = [json.loads(l) for l in out.read_text().splitlines()]
    modes = [r["mode"] for r in rows]
    for want in ("baseline", "fused", "exact_silu", "fp32_silu_out", "exact_lut_input", "clip_pct_99.9",
                 "clip_pct_99.5", "clip_pct_99", "asym_zero_point", "per_channel_out", "unfused", "sprinkle_auto"):
        assert want in modes
    sprinkles = [r for r in rows if r["mode"] == "sprinkle"]
    assert [len(r["exact_layers"]) for r in sprinkles] == list(range(6))
    by = {r["mode"]: r for r in rows}
    assert by["exact_silu"]["ppl"] == by["baseline"]["ppl"] == sprinkles[-1]["ppl"]
    assert sprinkles[0]["ppl"] == by["fused"]["ppl"]
    assert set(rows[0]) == {"mode", "exact_layers", "ppl", "ppl_err", "kl", "wall_s"}
    # the sensitivity sprinkle at its default budget (25% of 5 layers: 1), next to gmax at the same count
    sens, gmax = by["sprinkle_sensitivity"], by["sprinkle_gmax"]
    assert len(sens["exact_layers"]) == len(gmax["exact_layers"]) == 1
    assert gmax == dict(sprinkles[1], mode="sprinkle_gmax")
    assert sens["method"] == "lazy" and sens["budget"] == 1 and sens["calib_chunks"] == 8 and sens["calib_s"] > 0
    assert len(sens["gain"]) == 5 and sens["exact_layers"] == [int(np.argmax(sens["gain"]))]
    assert sens["kl"] < gmax["kl"] and sens["ppl"] < gmax["ppl"]
    unf = by["sprinkle_sensitivity_unfused"]
    assert len(unf["exact_layers"]) == 1 and by["fused"]["ppl"] != unf["ppl"] != by["unfused"]["ppl"]


# ------------------------------------------------ review regressions --

def test_imatrix_refused_while_ffn_chain_is_on(shared):
    from orkpy.evaluation import ffn
    m = orkpy.load_model(shared / ST, weights="int8")
    toks = np.random.default_rng(0).integers(3, 512, 512)
    st = ffn.prep(m, toks, n_ctx=64, chunks=2)
    ffn.configure(m, st, "fused")
    with pytest.raises(ValueError, match="fused FFN chain"):
        orkpy.collect_imatrix(m, toks, n_ctx=64, chunks=2, progress=False)
    with pytest.raises(ValueError, match="finite"):
        m._fwd.set_ffn(0, dict(mode="fused", lut_step=1e39, s_scale=1.0, u_scale=1.0, p_scale=1.0))


def test_set_ffn_releases_replaced_arrays_and_names_missing_keys(shared):
    import sys
    from orkpy.evaluation import ffn
    m = orkpy.load_model(shared / ST, weights="int8")
    st = ffn.prep(m, np.random.default_rng(0).integers(3, 512, 512), n_ctx=64, chunks=2)
    p = ffn.layer_params(st[0], "per_channel_out")
    a = np.ascontiguousarray(p["s_scale_ch"])
    before = sys.getrefcount(a)
    m._fwd.set_ffn(0, dict(p, s_scale_ch=a))
    assert sys.getrefcount(a) == before + 1          # held while in use
    m._fwd.set_ffn(0, dict(p, s_scale_ch=a.copy()))
    assert sys.getrefcount(a) == before              # released when replaced
    with pytest.raises(ValueError, match="'mode'"):
        m._fwd.set_ffn(0, {"lut_step": 1.0})
    with pytest.raises(ValueError, match="missing 'u_scale'"):
        m._fwd.set_ffn(0, {"mode": "fused", "lut_step": 0.1, "s_scale": 0.1, "p_scale": 0.1})


# ------------------------------------------------ activation modes in the chain --
@pytest.mark.parametrize("act", ["per_tensor", "static"])
def test_chain_input_follows_the_activation_mode(setup, shared, act):
    """The chain quantizes h in the gate's activation mode: its exact path still equals the
    per-op path of a model loaded in that mode, and differs from the per-token one."""
    m0, toks, stats = setup
    calib = read_text_like_llama_cpp(shared / "text" / "wikitext-2-raw-test.txt")
    m = orkpy.load_model(shared / ST, weights="int8", act=act, calib=calib if act == "static" else None,
                         calib_ctx=256, calib_chunks=4)
    chunk = toks[256:512]
    ffn.configure(m, stats, "baseline")
    base = m.forward(chunk)
    ffn.configure(m, stats, "exact_silu")
    exact = m.forward(chunk)
    assert np.array_equal(exact, base)
    ffn.configure(m0, stats, "exact_silu")
    assert not np.array_equal(exact, m0.forward(chunk))
    ffn.configure(m, stats, "fused")
    fused = m.forward(chunk)
    assert np.all(np.isfinite(fused)) and not np.array_equal(fused, exact)


def test_chain_refuses_outlier_channels(setup, shared):
    m0, toks, stats = setup
    calib = read_text_like_llama_cpp(shared / "text" / "wikitext-2-raw-test.txt")
    m = orkpy.load_model(shared / ST, weights="int8", act="per_token_outliers", calib=calib, calib_ctx=256,
                         calib_chunks=4)
    with pytest.raises(ValueError, match="outlier"):
        ffn.configure(m, stats, "fused")
