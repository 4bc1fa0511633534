"""The activation spec and the activation mode registry (csrc/ork/actspec.h, orkpy/kernels/actspec.py):
modes live in one C table and everything else -- orkpy.ACT_MODES, ActSpec's checks, the
resolution from a calibration, PackedWeight.matmul, load_model, the forward pass, the NPU path,
the CLI's --act choices -- reads it. A dummy mode registered through the test-only hook runs
end to end with nothing else edited; the C validator refuses what the Python one would."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.kernels.actspec import ACT_MODE_INFO, ActSpec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- registry --
def test_mode_table_is_the_one_source():
    rows = _core.act_modes()
    assert [r["name"] for r in rows] == list(orkpy.ACT_MODES) == ["per_token", "per_tensor", "static",
                                                                 "per_token_outliers"]
    assert [r["id"] for r in rows] == [0, 1, 2, 3]
    assert [(r["static"], r["per_tensor"], r["outliers"]) for r in rows] == [
        (False, False, False), (False, True, False), (True, False, False), (False, False, True)]
    assert all(r["bits"] == (4, 8) for r in rows)  # int8, and the int4 of a w4a4 linear
    assert orkpy.runtime.actcal.ACT_MODES == orkpy.kernels.packed.ACTIVATION_MODES == orkpy.ACT_MODES
    assert [n for n, i in ACT_MODE_INFO.items() if i.calibrated] == ["static", "per_token_outliers"]
    with pytest.raises(ValueError, match="sealed"):
        _core._register_act_mode_for_tests("late_mode")


def test_product_never_registers_modes():
    pkg = os.path.join(ROOT, "orkpy")
    for fn in os.listdir(pkg):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), encoding="utf-8") as f:
                assert "_register_act_mode_for_tests" not in f.read(), fn


# ------------------------------------------------------------------ ActSpec --
def test_actspec_checks_once_with_clear_errors():
    assert ActSpec() == ActSpec("per_token", 8, "mse", None, 8) and hash(ActSpec()) == hash(ActSpec())
    for kw, msg in (({"mode": "dynamic"}, "act must be one of 'per_token'"), ({"bits": 5}, "act bits must be one of"),
                    ({"bits": True}, "act bits"), ({"method": "p99"}, "act_method must be one of"),
                    ({"prefix": -1}, "act_prefix must be an int >= 0"), ({"n_outliers": 0}, "act_outliers"),
                    ({"mode": "per_tensor", "clip": 2.0}, "clip= is a static range"),
                    ({"mode": "static", "clip": float("nan")}, "static activation range nan"),
                    ({"mode": "static", "clip": 1e-40}, "static activation range 1e-40"),
                    ({"channels": (3, 3)}, "strictly increasing"), ({"channels": ((1,),)}, "1-D integer")):
        with pytest.raises(ValueError, match=msg):
            ActSpec(**kw)
    s = ActSpec("static", clip=np.float64(0.1), prefix=np.int64(2), channels=np.array([1, 5]))
    assert s.clip == float(np.float32(0.1)) and type(s.prefix) is int and s.channels == (1, 5)
    assert s.resolved and not ActSpec("static").resolved and not ActSpec("per_token_outliers").resolved
    with pytest.raises(ValueError, match=r"in \[0, 5\)"):
        s.check_width(5)


def test_actspec_parse_and_serialize():
    assert ActSpec.parse("static", "max", 3, 2) == ActSpec("static", method="max", n_outliers=3, prefix=2)
    assert ActSpec.parse("per_tensor") == ActSpec("per_tensor")
    spec = ActSpec("per_token_outliers", n_outliers=4)
    assert ActSpec.parse(spec) is spec
    with pytest.raises(ValueError, match="act_method belong in the ActSpec"):
        ActSpec.parse(spec, act_method="max")
    with pytest.raises(TypeError, match="mode name, an ActSpec or a dict"):
        ActSpec.parse(3)  # type: ignore[arg-type]
    full = ActSpec("static", method="max", prefix=1, clip=2.5, channels=(4, 9))
    for s in (ActSpec(), spec, full):
        d = s.to_dict()
        assert json.loads(json.dumps(d)) == d and ActSpec.from_dict(d) == s and ActSpec.parse(d) == s
    assert ActSpec().to_dict() == {"mode": "per_token", "bits": 8, "method": "mse", "n_outliers": 8}
    with pytest.raises(ValueError, match="unknown ActSpec key 'clip_pct'"):
        ActSpec.from_dict({"mode": "static", "clip_pct": 99})
    with pytest.raises(ValueError, match="needs 'mode'"):
        ActSpec.from_dict({"bits": 8})
    core = full.to_core()
    assert core["mode"] == "static" and core["clip"] == 2.5 and core["prefix"] == 1 and core["bits"] == 8
    assert core["outliers"].dtype == np.int32 and core["outliers"].tolist() == [4, 9]


def test_matmul_takes_a_spec_or_the_keywords(rng):
    pw = orkpy.pack(orkpy.quantize(rng.standard_normal((40, 100)).astype(np.float32), "nf4"))
    x = rng.standard_normal((5, 100)).astype(np.float32)
    for act, kw in (("per_token", {}), ("per_tensor", {"prefix": 1}), ("static", {"clip": 1.5, "prefix": 2}),
                    ("per_token_outliers", {"outliers": [3, 50]})):
        spec = ActSpec(act, clip=kw.get("clip"), prefix=kw.get("prefix"),
                       channels=tuple(kw["outliers"]) if "outliers" in kw else None)
        assert np.array_equal(pw.matmul(x, act=act, **kw), pw.matmul(x, act=spec)), act
    with pytest.raises(ValueError, match="belong in the ActSpec"):
        pw.matmul(x, act=ActSpec("static", clip=1.0), clip=2.0)
    with pytest.raises(ValueError, match="needs clip"):
        pw.matmul(x, act=ActSpec("static"))


@pytest.mark.parametrize("act, msg", [
    ({"mode": "per_token", "bits": 5}, "bits must be 4 or 8, got 5"),
    ({"mode": "per_tensor", "bits": 16}, "bits must be 4 or 8, got 16"),
    ({"mode": "static", "clip": float("nan")}, "static activation range nan"),
    ({"mode": "static", "clip": 0.0}, "static activation range 0"),
    ({"mode": "static", "clip": 1e-60}, "underflows float32"),
    ({"mode": "per_tensor", "clip": 2.0}, "'per_tensor' takes no static range"),
    ({"mode": "per_token_outliers", "outliers": np.array([9, 2], np.int32)}, "strictly increasing"),
    ({"mode": "per_token", "outliers": np.array([3, 3], np.int32)}, "strictly increasing"),
    ({"mode": "per_token", "outliers": np.array([100], np.int32)}, r"outside \[0, 100\)"),
    ({"mode": "per_token", "prefix": -1}, "prefix must be >= 0"),
    ({"mode": "per_channel"}, "unknown activation mode 'per_channel'"),
    ({"mode": "per_token", "clip_pct": 99.0}, "unknown key 'clip_pct'"),
])
def test_the_c_validator_refuses_bad_specs(rng, act, msg):
    """The binding's one reader and ork_act_spec_check, reached without ActSpec's checks: a Python
    exception naming the problem, never a crash."""
    pw = orkpy.pack(orkpy.quantize(rng.standard_normal((40, 100)).astype(np.float32), "int8"))
    x = rng.standard_normal((2, 100)).astype(np.float32)
    with pytest.raises(ValueError, match=msg):
        _core.matmul(pw.store, pw.kind, pw.N, pw.K, pw.bscale, x, act)
    with pytest.raises(TypeError, match="must be a dict"):
        _core.matmul(pw.store, pw.kind, pw.N, pw.K, pw.bscale, x, ("per_token", 8))


# -------------------------------------------------------------- dummy mode --
# Two dummy modes registered before anything exported the table, whose kernel (the binding's
# test kernel) halves the range their flags give: "halfclip" (dynamic: half each row's absmax,
# so values above it saturate) and "halfstatic" (static: half the calibrated range). Nothing
# outside the registry knows about them, yet every path takes them.
_DUMMY = textwrap.dedent('''
    import importlib.machinery, importlib.util, json, sys
    import numpy as np
    path, model, calib_path = sys.argv[1], sys.argv[2], sys.argv[3]
    spec = importlib.util.spec_from_file_location(
        "orkpy._core", path, loader=importlib.machinery.ExtensionFileLoader("orkpy._core", path))
    core = importlib.util.module_from_spec(spec)
    sys.modules["orkpy._core"] = core
    spec.loader.exec_module(core)
    refused = {}
    for name, kw in (("Bad-name", {}), ("per_token", {}), ("both", {"static": True, "per_tensor": True})):
        try:
            core._register_act_mode_for_tests(name, **kw)
        except ValueError as e:
            refused[name] = str(e)
    ids = [core._register_act_mode_for_tests("halfclip"), core._register_act_mode_for_tests("halfstatic", static=True)]

    import orkpy, orkpy.runtime.npu
    from orkpy.cli import build_parser, main
    out = {"ids": ids, "refused": refused, "modes": list(orkpy.ACT_MODES)}
    rng = np.random.default_rng(0)
    pw = orkpy.pack(orkpy.quantize(rng.standard_normal((45, 77)).astype(np.float32), "nf4"))
    x = rng.standard_normal((6, 77)).astype(np.float32)
    y = pw.matmul(x, act="halfclip")
    rows = [pw.matmul(x[m:m + 1], act="static", clip=float(np.float32(0.5) * np.abs(x[m]).max()))[0] for m in range(6)]
    out["matmul_is_half_static"] = bool(np.array_equal(y, np.stack(rows)))
    out["matmul_spec"] = bool(np.array_equal(pw.matmul(x, act=orkpy.ActSpec("halfclip")), y))
    out["matmul_differs"] = not np.array_equal(y, pw.matmul(x))
    try:
        pw.matmul(x, act="halfstatic")
    except ValueError as e:
        out["halfstatic_no_clip"] = str(e)
    out["halfstatic_matmul"] = bool(np.array_equal(pw.matmul(x, act="halfstatic", clip=3.0),
                                                   pw.matmul(x, act="static", clip=1.5)))

    ids = list(range(1, 60))
    m = orkpy.load_model(model, weights="int8", act="halfclip")
    logits = m.forward(ids)
    s = m.session(64)
    dec = np.concatenate([s.eval(ids[:40], all_logits=True), s.eval(ids[40:41])[None]])
    out["model"] = [m.linears["blk.0.attn_q.weight"].act_mode, bool(np.all(np.isfinite(logits))),
                    not np.array_equal(logits, orkpy.load_model(model, weights="int8").forward(ids)),
                    bool(np.array_equal(dec, logits[:41]))]
    from orkpy import ffn                           # the FFN chain quantizes its input in the gate's spec
    base = orkpy.load_model(model, weights="int8")
    fs = ffn.prep(base, np.asarray(ids), n_ctx=32, chunks=1)
    chain = []
    for mm in (base, orkpy.load_model(model, weights="int8", act="halfclip")):
        ffn.configure(mm, fs, "fused")
        chain.append(mm.forward(ids))
    out["ffn_chain"] = [bool(np.all(np.isfinite(chain[1]))), not np.array_equal(chain[0], chain[1])]
    out["npu_routed"] = orkpy.runtime.npu.use_npu(m, "emu")
    out["npu_same"] = bool(np.array_equal(m.forward(ids), logits))
    cal = orkpy.ActCalibration.load(calib_path)
    try:
        orkpy.load_model(model, weights="int8", act="halfstatic")
    except ValueError as e:
        out["halfstatic_needs_calib"] = str(e)
    hs = orkpy.load_model(model, weights="int8", act="halfstatic", act_calib=cal)
    half = orkpy.ActCalibration({n: {k: v / 2 for k, v in r.items()} for n, r in cal.ranges.items()}, cal.channels,
                                cal.channel_absmax, cal.info)
    st = orkpy.load_model(model, weights="int8", act="static", act_calib=half)
    q = hs.linears["blk.1.ffn_down.weight"].act_spec
    out["halfstatic_spec"] = [q.mode, q.clip == cal.ranges["blk.1.ffn_down.weight"]["mse"], q.prefix == cal.prefix]
    out["halfstatic_is_half_static"] = bool(np.array_equal(hs.forward(ids), st.forward(ids)))
    sub = build_parser()._subparsers._group_actions[0].choices
    out["cli_act"] = {c: list(next(a for a in sub[c]._actions if a.dest == "act").choices) for c in ("ppl", "ffn-sweep")}
    out["cli_ppl"] = main(["ppl", model, sys.argv[4], "--weights", "int8", "--act", "halfclip", "-c", "64",
                           "--chunks", "2", "--no-progress", "--json"])
    out["cli_needs_calib"] = main(["ppl", model, sys.argv[4], "--weights", "int8", "--act", "halfstatic",
                                   "--no-progress"])
    try:
        core._register_act_mode_for_tests("late")
    except ValueError as e:
        out["late"] = str(e)
    print(json.dumps(out))
''')


def test_a_dummy_mode_needs_only_a_registry_row(shared, tmp_path):
    model = str(shared / "models" / "stories260K" / "stories260K-F32.gguf")
    text = str(shared / "text" / "tinystories-val-B.txt")
    m = orkpy.load_model(model, weights="fp32")
    cal = orkpy.calibrate_activations(m, open(text).read()[:20000], n_ctx=64, chunks=2, progress=False)
    cal.save(tmp_path / "act.json")
    r = subprocess.run([sys.executable, "-c", _DUMMY, _core.__file__, model, str(tmp_path / "act.json"), text],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ids"] == [4, 5] and out["modes"] == list(orkpy.ACT_MODES) + ["halfclip", "halfstatic"]
    assert "[a-z0-9_]" in out["refused"]["Bad-name"] and "already registered" in out["refused"]["per_token"]
    assert "static or dynamic" in out["refused"]["both"]
    assert out["matmul_is_half_static"] and out["matmul_spec"] and out["matmul_differs"]
    assert "act='halfstatic' needs clip=" in out["halfstatic_no_clip"] and out["halfstatic_matmul"]
    assert out["model"] == ["halfclip", True, True, True]
    assert out["npu_routed"] > 0 and out["npu_same"] and out["ffn_chain"] == [True, True]
    assert "act='halfstatic' needs calibrated activations" in out["halfstatic_needs_calib"]
    assert out["halfstatic_spec"] == ["halfstatic", True, True] and out["halfstatic_is_half_static"]
    assert all(c == out["modes"] for c in out["cli_act"].values())
    assert out["cli_ppl"] == 0 and out["cli_needs_calib"] == 2
    assert "sealed" in out["late"]


def test_ffn_chain_outlier_refusal_names_the_registry_modes(shared):
    """The fused FFN chain refuses a gate with outlier channels and names the modes that take none,
    read from the registry (not a list written in ffn_chain.c)."""
    m = orkpy.load_model(shared / "models" / "stories260K" / "stories260K-F32.gguf", weights="int8")
    names = list(m._linears)
    gate = next(i for i, n in enumerate(names) if "ffn_gate" in n)
    path, d = m._linears[names[gate]].to_core()
    d = dict(d, act={"mode": "per_token", "bits": 8, "clip": 0.0, "prefix": 0,
                     "outliers": np.array([0, 3], np.int32)})
    m._fwd.set_linear(gate, (path, d))
    plain = [r["name"] for r in _core.act_modes() if not r["outliers"]]
    want = ", ".join(f"'{n}'" for n in plain[:-1]) + f" or '{plain[-1]}'"
    assert want == "'per_token', 'per_tensor' or 'static'"
    with pytest.raises(ValueError, match=f"use act={want} with it"):
        m._fwd.set_ffn(0, dict(mode="fused", lut_step=0.01, s_scale=0.02, u_scale=0.02, p_scale=0.001))
