"""Activation-scale modes of the packed linears (orkpy/runtime/actcal.py, csrc/ork/linear.h): per token,
per tensor, static (calibrated range, saturating) and per token with outlier channels in float;
their calibration (max, MSE-optimal), saving with a model directory, the NPU path, the errors."""
import json
import os

import numpy as np
import pytest

import orkpy
from orkpy.runtime import actcal, npu
from orkpy.runtime.actcal import ActCalibration
from orkpy.runtime.model import LinearSpec

ST = "models/stories260K"


def _pw(rng, kind="int8", N=48, K=100):
    return orkpy.pack(orkpy.quantize(rng.standard_normal((N, K)).astype(np.float32), kind))


def _q(x, r):
    """The int8 quantizer of pack.h for a range r (float32 throughout)."""
    y = x * (np.float32(127) / np.float32(r))
    t = np.trunc(y)
    f = y - t
    t = t + (f >= 0.5) - (f <= -0.5)
    return np.clip(t, -127, 127).astype(np.int32)


def _ref_static(pw, x, clip):
    acc = _q(x, clip) @ pw.int8_weight().astype(np.int32).T
    return (acc.astype(np.float32) * np.float32(np.float32(clip) / np.float32(127))) * pw.bscale


# ------------------------------------------------------------ one matmul --

@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_static_range_saturates_and_matches_the_contract(rng, kind, isa):
    pw = _pw(rng, kind)
    x = rng.standard_normal((9, 100)).astype(np.float32)
    x[2, 5], x[7, 60] = 40.0, -25.0                      # far beyond the range: saturate at +-127
    clip = 2.0
    with orkpy.use_isa(isa):
        y = pw.matmul(x, act="static", clip=clip)
        assert np.array_equal(y, _ref_static(pw, x, clip))
        # saturation is the whole effect beyond the range: clipping x first changes nothing
        assert np.array_equal(y, pw.matmul(np.clip(x, -clip, clip), act="static", clip=clip))
        # a row's result does not depend on the other rows (no measurement at run time)
        assert np.array_equal(pw.matmul(x[3:4], act="static", clip=clip), y[3:4])
    assert not np.array_equal(y, pw.matmul(x, act="per_tensor"))


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_per_tensor_equals_static_at_the_batch_absmax(rng, kind, isa):
    pw = _pw(rng, kind)
    x = (rng.standard_normal((6, 100)) * rng.uniform(0.1, 10, 100)).astype(np.float32)
    with orkpy.use_isa(isa):
        assert np.array_equal(pw.matmul(x, act="per_tensor"),
                              pw.matmul(x, act="static", clip=float(np.abs(x).max())))


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_outlier_channels_are_exact_in_float(rng, kind, isa):
    pw = _pw(rng, kind)
    out = np.array([4, 31, 77], np.int32)
    x = rng.standard_normal((5, 100)).astype(np.float32)
    x[:, 31] *= 300.0                                     # an outlier channel
    w8 = pw.int8_weight().astype(np.float32)
    with orkpy.use_isa(isa):
        xo = np.zeros_like(x)
        xo[:, out] = x[:, out]                            # only outlier channels: the float product alone
        yo = pw.matmul(xo, act="per_token_outliers", outliers=out)
        s = np.zeros((5, pw.N), np.float32)
        for j in out:                                     # linear.h: sum in channel order, then * bscale
            s = s + xo[:, j:j + 1] * w8[:, j]
        assert np.array_equal(yo, s * pw.bscale)
        y = pw.matmul(x, act="per_token_outliers", outliers=out)
        xm = x.copy()
        xm[:, out] = 0.0                                  # the rest: per token int8, its scale without them
        s = np.zeros((5, pw.N), np.float32)
        for j in out:
            s = s + x[:, j:j + 1] * w8[:, j]
        assert np.array_equal(y, pw.matmul(xm) + s * pw.bscale)
    exact = x @ pw.dequantize().T
    err = lambda z: float(np.abs(z - exact).max())
    assert err(y) < 0.05 * err(pw.matmul(x))             # the outlier no longer sets every token's scale


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_prefix_rows_are_quantized_per_token(rng, kind, isa):
    pw = _pw(rng, kind)
    x = rng.standard_normal((8, 100)).astype(np.float32)
    x[0] *= 200.0                                         # a massive first token
    with orkpy.use_isa(isa):
        y = pw.matmul(x, act="static", clip=3.0, prefix=2)
        assert np.array_equal(y[:2], pw.matmul(x[:2]))    # per token, whatever the range
        assert np.array_equal(y[2:], pw.matmul(x[2:], act="static", clip=3.0))
        y = pw.matmul(x, act="per_tensor", prefix=1)
        assert np.array_equal(y[:1], pw.matmul(x[:1]))
        assert np.array_equal(y[1:], pw.matmul(x[1:], act="per_tensor"))   # its absmax leaves row 0 out
    exact = x[1:] @ pw.dequantize().T
    assert np.abs(y[1:] - exact).max() < 0.1 * np.abs(pw.matmul(x, act="per_tensor")[1:] - exact).max()


def test_static_is_identical_on_every_isa(rng, simd_isa):
    pw = _pw(rng, "nf4", 70, 333)
    x = (rng.standard_normal((17, 333)) * 3).astype(np.float32)
    out = np.array([0, 5, 332], np.int32)
    with orkpy.use_isa("scalar"):
        a = pw.matmul(x, act="static", clip=1.5), pw.matmul(x, act="per_token_outliers", outliers=out)
    with orkpy.use_isa(simd_isa):
        b = pw.matmul(x, act="static", clip=1.5), pw.matmul(x, act="per_token_outliers", outliers=out)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


def test_bad_activation_settings_are_clear_errors(rng):
    pw = _pw(rng)
    x = rng.standard_normal((2, 100)).astype(np.float32)
    for clip in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="clip"):
            pw.matmul(x, act="static", clip=clip)
    with pytest.raises(ValueError, match="static activation range"):
        pw.matmul(x, act="static", clip=1e-40)           # underflows to 0 in float32 / below the tiny limit
    with pytest.raises(ValueError, match="needs clip"):
        pw.matmul(x, act="static")
    with pytest.raises(ValueError, match="needs outliers"):
        pw.matmul(x, act="per_token_outliers")
    with pytest.raises(ValueError, match=r"outlier channel 100 .*outside \[0, 100\)"):
        pw.matmul(x, outliers=[3, 100])
    with pytest.raises(ValueError, match="strictly increasing"):
        pw.matmul(x, outliers=[7, 3])
    with pytest.raises(ValueError, match="prefix must be an int >= 0"):   # ActSpec's one message
        pw.matmul(x, act="per_tensor", prefix=-1)
    x[1, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN.*\[1, 3\]"):
        pw.matmul(x, outliers=[3])                       # a non-finite outlier value is still refused


# ------------------------------------------------------------- calibration --

def test_mse_range_matches_the_exact_error(rng):
    """The histogram's estimate of the quantization error (range_mse) against the exact error of
    the values, and mse_clip against a brute-force search over the same grid."""
    x = np.abs(rng.standard_t(3, 100_000)).astype(np.float32)
    edges = actcal.hist_edges()
    b = np.searchsorted(edges, x, side="right") - 1       # the C binning (tested in test_actquant.c)
    B = len(edges) - 1
    st = {"absmax": x.max(), "count": np.bincount(b, minlength=B),
          "sum": np.bincount(b, x.astype(np.float64), minlength=B),
          "sum2": np.bincount(b, x.astype(np.float64) ** 2, minlength=B)}

    def exact(c):
        return float(((x.astype(np.float64) - _q(x, c) * (np.float32(c) / np.float32(127))) ** 2).sum())
    for c in (float(x.max()), 10.0, 3.0, 0.5):
        assert actcal.range_mse(st["count"], st["sum"], st["sum2"], [c])[0] == pytest.approx(exact(c), rel=2e-3)
    c = actcal.mse_clip(st)
    grid = np.float32(x.max()) * (2.0 ** (-np.arange(385) / 32)).astype(np.float32)
    best = min(exact(float(g)) for g in grid)
    assert exact(c) <= best * 1.001 and c < 0.8 * x.max()   # heavy tails: clipping pays
    assert actcal.clipped_share(st, c) == pytest.approx(float((x > c).mean()), abs=2e-4)


@pytest.fixture(scope="module")
def stories(shared):
    d = shared / ST
    text = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    return {"f32": str(d / "stories260K-F32.gguf"), "f16": str(d / "stories260K-F16.gguf"),
            "q4": str(d / "stories260K-Q4_0.gguf"), "score": text[:20_000], "calib": text[200_000:260_000]}


@pytest.fixture(scope="module")
def cal(stories):
    m = orkpy.load_model(stories["f32"], weights="fp32")
    return orkpy.calibrate_activations(m, stories["calib"], n_ctx=128, chunks=4, progress=False)


def test_calibration_covers_every_linear(stories, cal):
    m = orkpy.load_model(stories["f32"], weights="fp32")
    assert list(cal.ranges) == m.linear_names() and cal.prefix == actcal.DEFAULT_PREFIX == 1
    mx, mse = cal.clips("max"), cal.clips("mse")
    for n in m.linear_names():
        assert 0 < mse[n] <= mx[n], n
        ch = cal.channels[n]
        assert len(ch) == min(actcal.SAVED_OUTLIERS, m.linears[n].K) and len(set(ch.tolist())) == len(ch)
        assert cal.channel_absmax[n][0] >= np.float32(mx[n]) and np.all(np.diff(cal.channel_absmax[n]) <= 0), n
    assert any(mse[n] < mx[n] for n in mx)                # the MSE search clips somewhere
    assert orkpy.calibrate_act_scales(m, stories["calib"], n_ctx=128, chunks=4, method="max", progress=False) == mx
    k = cal.outliers(4)
    assert all(np.array_equal(k[n], np.sort(cal.channels[n][:4])) for n in k)


def test_activation_statistics_are_the_linears_inputs(stories):
    """The |x| histogram's totals against the imatrix pass (sum x^2 per channel), same chunks."""
    m = orkpy.load_model(stories["f32"], weights="int8")
    toks = m.tokens(stories["calib"])
    st = m.collect_act_stats(m.chunks(toks, 128, 3)[1])
    x2 = m.collect_activation_stats(m.chunks(toks, 128, 3)[1])
    for n, s in st.items():
        K = m.linears[n].K
        rows = 3 * 64 if n == "output.weight" else 3 * 128   # the head: each chunk's second half
        assert s["rows"] == rows and int(s["count"].sum()) == rows * K, n
        assert s["ch_absmax"].shape == (K,) and s["ch_absmax"].max() == np.float32(s["absmax"])
        assert s["n_clipped"] == 0                        # no static linear here
        if n != "output.weight":
            assert s["sum2"].sum() == pytest.approx(x2[n][0].sum(), rel=1e-9), n
    p2 = m.collect_act_stats(m.chunks(toks, 128, 3)[1], prefix=2)   # the first 2 positions left out
    for n, s in p2.items():
        assert s["rows"] == (3 * 64 if n == "output.weight" else 3 * 126), n   # never the head's rows
        assert s["absmax"] <= st[n]["absmax"]
        assert np.array_equal(s["ch_absmax"], st[n]["ch_absmax"]), n   # channel maxima: every row


def test_static_model_counts_saturation(stories, cal):
    tiny = ActCalibration({n: {"max": 1e-3, "mse": 1e-3} for n in cal.ranges}, cal.channels, cal.channel_absmax)
    m = orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=tiny)
    st = m.collect_act_stats(m.chunks(m.tokens(stories["score"]), 128, 1)[1])
    q = st["blk.0.attn_q.weight"]                          # the normed embeddings: far beyond 1e-3
    assert q["n_clipped"] > 0.5 * q["rows"] * m.linears["blk.0.attn_q.weight"].K
    clipped = {}
    for method in ("max", "mse"):  # on the calibration text itself (the float model calibrated, int8 runs)
        m = orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=cal, act_method=method)
        st = m.collect_act_stats(m.chunks(m.tokens(stories["calib"]), 128, 4)[1])
        clipped[method] = sum(s["n_clipped"] for s in st.values()) / sum(s["count"].sum() for s in st.values())
    assert clipped["max"] < 1e-4 and 2 * clipped["max"] < clipped["mse"] < 1e-2


# ------------------------------------------------------------------ models --

def test_load_model_activation_modes(stories, cal):
    ids = np.arange(1, 80)
    outs = {}
    for act in actcal.ACT_MODES:
        m = orkpy.load_model(stories["f32"], weights="nf4", act=act, act_calib=cal)
        spec = m.linears["blk.2.ffn_down.weight"]
        assert spec.act == act and spec.act_mode == act and spec.act_spec.mode == act  # act_spec: the resolved ActSpec
        if act == "static":
            assert spec.act_clip == cal.ranges["blk.2.ffn_down.weight"]["mse"] and spec.act_prefix == cal.prefix
            assert m.linears["output.weight"].act_prefix == 0      # the head runs on other rows
        if act == "per_token_outliers":
            assert np.array_equal(spec.outliers, np.sort(cal.channels["blk.2.ffn_down.weight"][:8]))
        outs[act] = m.forward(ids)
    assert len({o.tobytes() for o in outs.values()}) == 4   # four different computations
    m = orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=cal, act_method="max")
    assert m.linears["output.weight"].act_clip == cal.ranges["output.weight"]["max"]
    m = orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=cal, act_prefix=0)
    assert m.linears["blk.0.attn_q.weight"].act_prefix == 0
    m = orkpy.load_model(stories["f32"], weights="int8", act="per_tensor", act_prefix=3)
    assert (m.linears["blk.0.attn_q.weight"].act_prefix, m.linears["output.weight"].act_prefix) == (3, 0)
    assert orkpy.load_model(stories["f32"], weights="int8", act="per_token_outliers", act_calib=cal,
                            act_outliers=3).linears["blk.0.attn_q.weight"].outliers.shape == (3,)
    # a float linear keeps no activation setting
    m = orkpy.load_model(stories["f32"], weights={"default": "int8", "output.weight": "fp32"}, act="static",
                         act_calib=cal)
    assert m.linears["output.weight"].act_mode == "float" and m.linears["output.weight"].act_clip is None
    assert m.linears["output.weight"].act == "float" and m.linears["output.weight"].act_spec is None


def test_load_model_calibrates_on_calib_text(stories, cal):
    m = orkpy.load_model(stories["f32"], weights="int8", act="static", calib=stories["calib"], calib_ctx=128,
                         calib_chunks=4)
    assert {n: s.act_clip for n, s in m.linears.items()} == cal.clips("mse")


def test_static_and_outliers_without_calibration_are_errors(stories, cal):
    for act in ("static", "per_token_outliers"):
        with pytest.raises(ValueError, match="needs calibrated activations.*calib="):
            orkpy.load_model(stories["f32"], weights="int8", act=act)
    with pytest.raises(ValueError, match="act must be one of"):
        orkpy.load_model(stories["f32"], weights="int8", act="static_max")
    with pytest.raises(ValueError, match="act_method"):
        orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=cal, act_method="p99")
    with pytest.raises(ValueError, match="act_outliers"):
        orkpy.load_model(stories["f32"], weights="int8", act="per_token_outliers", act_calib=cal, act_outliers=0)
    with pytest.raises(ValueError, match="act_prefix must be an int >= 0"):
        orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=cal, act_prefix=-1)
    with pytest.raises(ValueError, match="kept 64 channels"):
        orkpy.load_model(stories["f32"], weights="int8", act="per_token_outliers", act_calib=cal, act_outliers=65)
    part = ActCalibration({n: v for n, v in cal.ranges.items() if n != "blk.1.attn_v.weight"}, cal.channels,
                          cal.channel_absmax)
    with pytest.raises(ValueError, match="no entry for 'blk.1.attn_v.weight'"):
        orkpy.load_model(stories["f32"], weights="int8", act="static", act_calib=part)
    pw = orkpy.pack(orkpy.quantize(np.ones((32, 40), np.float32), "int8"))
    for kw, msg in (({"act_clip": -2.0}, "static activation range -2.0"), ({"act_clip": 1e-45}, "range 1e-45"),
                    ({"outliers": [3, 3]}, "strictly increasing"), ({"outliers": [40]}, r"in \[0, 40\)"),
                    ({"outliers": [[1]]}, "1-D integer")):
        with pytest.raises(ValueError, match=f"blk.0.attn_q.weight: .*{msg}"):
            LinearSpec.from_packed("blk.0.attn_q.weight", pw, **kw)


def test_the_c_door_checks_activation_settings(stories):
    """A spec built around LinearSpec's checks still meets the forward model's (naming the linear)."""
    from orkpy.formats.source import open_source
    src = open_source(stories["f32"])
    m = orkpy.load_model(stories["f32"], weights="int8")
    good = m.linears["output.weight"]

    def unchecked(mode, **fields):                        # an ActSpec with its Python checks bypassed
        spec = orkpy.ActSpec(mode)
        for k, v in fields.items():
            object.__setattr__(spec, k, v)
        return LinearSpec("output.weight", "packed", good.N, good.K, kind="int8", store=good.store,
                          bscale=good.bscale, act_spec=spec)
    for bad, msg in ((unchecked("static", clip=float("nan")), "static activation range nan"),
                     (unchecked("per_token_outliers", channels=(9, 2)), "strictly increasing"),
                     (unchecked("per_token", bits=5), "bits must be 4 or 8, got 5"),
                     (unchecked("per_tensor", clip=2.0), "takes no static range")):
        with pytest.raises(ValueError, match=f"output: .*{msg}"):
            orkpy.runtime.model.Model(m.path, m.hparams, {**m.linears, "output.weight": bad}, src.tensor, src.meta, src.tied,
                              m.paths)


def test_fused_ffn_chain_refuses_outlier_channels(stories, cal):
    from orkpy.evaluation import ffn
    m = orkpy.load_model(stories["f32"], weights="int8", act="per_token_outliers", act_calib=cal)
    stats = ffn.prep(m, m.tokens(stories["calib"]), n_ctx=128, chunks=2)
    with pytest.raises(ValueError, match="outlier channels in float"):
        ffn.configure(m, stats, "fused")
    m = orkpy.load_model(stories["f32"], weights="int8")
    ffn.configure(m, stats, "fused")                      # the chain bypasses the linears' inputs
    with pytest.raises(ValueError, match="runs the fused FFN chain"):
        m.collect_act_stats([m.tokens(stories["calib"])[:64]])


@pytest.mark.parametrize("act", ["per_tensor", "static", "per_token_outliers"])
def test_npu_path_is_bit_identical(stories, cal, act):
    m = orkpy.load_model(stories["f32"], weights="nf4", act=act, act_calib=cal)
    ids = m.tokenizer.encode(stories["score"][:600])[:90]
    cpu = m.forward(ids)
    assert m.route_linears(npu.Device("emu")) == len(m.linear_names())
    assert np.array_equal(m.forward(ids), cpu)


def test_quantize_model_saves_the_calibration(stories, tmp_path):
    qm = orkpy.quantize_model(stories["f16"], stories["q4"], calib=stories["calib"], calib_ctx=128, calib_chunks=4,
                              progress=False, log=lambda s: None)
    assert qm.act_calib is not None and len(qm.act_calib) == len(qm.tiers)
    d = qm.save(tmp_path / "m")
    man = json.loads(open(os.path.join(d, "manifest.json")).read())
    assert man["act_scales"]["file"] == "act_scales.json"
    back = ActCalibration.load(os.path.join(d, "act_scales.json"))
    assert back.ranges == qm.act_calib.ranges and back.info == qm.act_calib.info
    assert all(np.array_equal(back.channels[n], qm.act_calib.channels[n]) for n in back.ranges)
    ids = np.arange(1, 70)
    for act, kw in (("static", {}), ("static", {"act_method": "max"}), ("per_token_outliers", {"act_outliers": 5})):
        m = orkpy.load_model(d, act=act, **kw)
        assert np.array_equal(m.forward(ids), qm.to_model(act=act, **kw).forward(ids)), (act, kw)
        assert m.linears["blk.0.ffn_up.weight"].act_mode == act
    # the file is covered by the manifest's checksum
    with open(os.path.join(d, "act_scales.json"), "r+b") as f:
        f.seek(40)
        f.write(b" ")
    with pytest.raises(orkpy.FormatError, match="checksum mismatch for act_scales.json"):
        orkpy.load_model(d, act="static")
    os.remove(os.path.join(d, "act_scales.json"))
    with pytest.raises(orkpy.FormatError, match="act_scales.json is missing"):
        orkpy.load_model(d)                               # a listed file, whatever the mode
    mpath = os.path.join(d, "manifest.json")
    man["act_scales"] = ["act_scales.json"]
    with open(mpath, "w") as f:
        json.dump(man, f)
    with pytest.raises(orkpy.FormatError, match="'act_scales' must be null or"):
        orkpy.load_model(d)


def test_model_dir_without_calibration(stories, cal, tmp_path):
    qm = orkpy.quantize_model(stories["f16"], stories["q4"], progress=False, log=lambda s: None)
    assert qm.act_calib is None
    d = qm.save(tmp_path / "m")
    assert "act_scales" not in json.loads(open(os.path.join(d, "manifest.json")).read())
    with pytest.raises(ValueError, match="needs calibrated activations"):
        orkpy.load_model(d, act="static")
    with pytest.raises(ValueError, match="needs calibrated activations"):
        qm.to_model(act="static")
    p = tmp_path / "act.json"
    cal.save(p)                                           # a calibration of the same model, passed in
    m = orkpy.load_model(d, act="static", act_calib=p)
    assert m.linears["blk.3.attn_k.weight"].act_clip == cal.ranges["blk.3.attn_k.weight"]["mse"]
    assert orkpy.load_model(d).linears["blk.3.attn_k.weight"].act_mode == "per_token"


def test_saved_calibration_is_checked(cal, tmp_path):
    doc = cal.to_json()
    assert ActCalibration.from_bytes(json.dumps(doc).encode()).ranges == cal.ranges
    bad = [b"{", json.dumps({**doc, "format": "x"}).encode(), json.dumps({**doc, "version": True}).encode()]
    n = next(iter(doc["linears"]))
    bad.append(json.dumps({**doc, "info": {**doc["info"], "prefix": -1}}).encode())
    for field, value in (("mse", -1.0), ("max", "1"), ("outliers", [1, 1]), ("outlier_absmax", [])):
        e = json.loads(json.dumps(doc))
        e["linears"][n][field] = value
        bad.append(json.dumps(e).encode())
    bad.append(json.dumps(doc).replace('"max": ', '"max": NaN, "x": ', 1).encode())
    for raw in bad:
        with pytest.raises(orkpy.FormatError):
            ActCalibration.from_bytes(raw, "act.json")
    with pytest.raises(orkpy.FormatError, match="cannot read"):
        ActCalibration.load(tmp_path / "missing.json")
