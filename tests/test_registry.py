"""The registries: quantization kinds, NPU backends, FFN chain modes and the
forward model's linear names live in one C table each and every Python list
and CLI choice is derived from them; layout facts come from the binding."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import orkpy
from orkpy import _core, ffn, npu, reference
from orkpy.cli import build_parser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _choices(argv, dest):
    sub = build_parser()._subparsers._group_actions[0].choices[argv]  # type: ignore[union-attr]
    return tuple(next(a for a in sub._actions if a.dest == dest).choices)


# ------------------------------------------------------------------ kinds --
def test_kind_table_is_the_one_source():
    rows = _core.kinds()
    assert [r["name"] for r in rows] == list(orkpy.KINDS) == ["nf4", "int4", "int8", "int5", "int6", "w4a4", "w4a8"]
    assert [r["id"] for r in rows] == [0, 1, 2, 3, 4, 5, 6]  # the O4N1/O8N1 header ids
    assert [(r["qmax"], r["store_bits"]) for r in rows] == [(127, 4), (127, 4), (127, 8), (15, 5), (31, 6), (7, 4),
                                                            (7, 4)]
    assert [r["act_bits"] for r in rows] == [8, 8, 8, 8, 8, 4, 8]  # w4a4 / w4a8: the NPU's int4 x int4 mode
    four = tuple(r["name"] for r in rows if r["bits"] == 4)
    assert orkpy.kernels.quant.FOUR_BIT_KINDS == four
    for r in rows:
        k = r["name"]
        if r["bits"] == 8:
            assert r["lut"] is None and r["levels"] is None and orkpy.lut(k) is None
            continue
        # derived in C from the levels, re-derived independently by the reference
        assert np.array_equal(orkpy.lut(k), reference.lut_of(k)) and np.array_equal(r["lut"], reference.lut_of(k))
        assert r["zero_code"] == reference.zero_code(k) and r["lut"][r["zero_code"]] == 0
        assert len(r["levels"]) == r["nlev"] and np.array_equal(orkpy.kernels.quant.levels(k), r["levels"])
    assert np.array_equal(orkpy.NF4_LEVELS, rows[0]["levels"]) and np.array_equal(orkpy.INT4_LEVELS, rows[1]["levels"])
    assert orkpy.runtime.model.PATHS == ("fp32", "gguf") + orkpy.KINDS
    for cmd, dest in (("ppl", "int4_kind"), ("quantize", "kind"), ("gate", "kind")):
        assert _choices(cmd, dest) == four



def test_tiers_derive_from_the_kind_registry():
    """One vocabulary: every integer tier, its bits, its kind and its grouped forms come from the kind rows
    (orkpy/formats/tiermap.py); the model directory, load_model's paths and the allocator's options follow."""
    from orkpy import alloc, modeldir, tiermap
    rows = _core.kinds()
    def tier_of(r):  # int<store_bits>; a kind the NPU runs in its int4 mode (integer codes in 4 bits) its own
        return r["name"] if r["levels"] is None and r["store_bits"] == 4 else f"int{r['store_bits']}"
    want = {tier_of(r): (None if r["levels"] is not None else r["name"]) for r in rows}
    assert tiermap.TIER_KINDS == want == {"int8": "int8", "int6": "int6", "int5": "int5", "int4": None, "w4a4": "w4a4",
                                          "w4a8": "w4a8"}
    assert tiermap.TIERS == ("int8", "int6", "int5", "int4", "w4a8", "w4a4", "float")
    assert tiermap.TIER_BITS == {"int8": 8, "int6": 6, "int5": 5, "int4": 4, "w4a8": 4, "w4a4": 4}
    assert tiermap.NPU_BITS == {"int8": 8, "int6": 8, "int5": 8, "int4": 8, "w4a8": 4, "w4a4": 4, "float": 0}
    for r in rows:
        assert tiermap.kind_tier(r["name"]) == tier_of(r)
    for t in tiermap.INT_TIERS:
        kind = tiermap.tier_kind(t, "int4")
        assert orkpy.runtime.model.tier_path(t, "int4") == kind and kind in orkpy.runtime.model.PATHS
        assert modeldir._tier_ok(t)
        assert tiermap.split_tier(f"{t}-g64") == (t, 64) and modeldir._tier_ok(f"{t}-g64")
        # w4a4 / w4a8: groups up to the int4 mode's K tile (each group one int4 task's int16 block)
        assert modeldir._tier_ok(f"{t}-g512") == (t not in tiermap.NPU_INT4_TIERS)
    assert orkpy.runtime.model.tier_path("int4-g32", "nf4") == "nf4" and orkpy.runtime.model.tier_path("float") == "gguf"
    assert not modeldir._tier_ok("int3") and not modeldir._tier_ok("float-g32")
    assert {tiermap.split_tier(t)[0] for t in alloc.DEFAULT_OPTIONS} == set(tiermap.INT_TIERS) - {"w4a4", "w4a8"}

def test_registry_is_sealed_once_exported():
    _core.kinds()
    with pytest.raises(ValueError, match="sealed"):
        _core._register_kind_for_tests("late4", [-1.0, 0.0, 1.0])


def test_product_never_registers_kinds():
    pkg = os.path.join(ROOT, "orkpy")
    for fn in os.listdir(pkg):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), encoding="utf-8") as f:
                assert "_register_kind_for_tests" not in f.read(), fn


def test_unknown_kind_lists_the_registry():
    with pytest.raises(ValueError, match=r"expected one of nf4, int4, int8"):
        _core.pack(np.zeros((1, 1), np.uint8), "fp4", 1, 1)


# The dummy kind: a 9-level 4-bit codebook whose 0.0 level is code 4 (not 7),
# registered before anything exported the table. Nothing outside the registry
# knows about it, yet every path takes it.
_DUMMY = textwrap.dedent('''
    import importlib.machinery, importlib.util, json, sys
    import numpy as np
    path = sys.argv[1]
    spec = importlib.util.spec_from_file_location(
        "orkpy._core", path, loader=importlib.machinery.ExtensionFileLoader("orkpy._core", path))
    core = importlib.util.module_from_spec(spec)
    sys.modules["orkpy._core"] = core
    spec.loader.exec_module(core)
    levels = np.array([-1.0, -0.6, -0.35, -0.15, 0.0, 0.2, 0.45, 0.7, 1.0], np.float32)
    refused = {}
    for name, lev in (("nozero4", [-1.0, -0.5, 0.5, 1.0]), ("flat4", [-1.0, 0.0, 0.001, 1.0]),
                      ("Bad-name", levels), ("nf4", levels), ("wide4", [-2.0, 0.0, 1.0])):
        try:
            core._register_kind_for_tests(name, np.array(lev, np.float32))
        except ValueError as e:
            refused[name] = str(e)
    kid = core._register_kind_for_tests("test4", levels)

    import orkpy, orkpy.runtime.npu, orkpy.kernels.reference as ref
    from orkpy.cli import build_parser
    out = {"id": kid, "refused": refused, "kinds": list(orkpy.KINDS), "four": list(orkpy.kernels.quant.FOUR_BIT_KINDS),
           "zero_code": orkpy.kernels.quant.KIND_INFO["test4"].zero_code, "lut": orkpy.lut("test4").tolist(),
           "ref_lut": ref.lut_of("test4").tolist()}
    rng = np.random.default_rng(0)
    N, K = 45, 77  # neither a multiple of 32, K odd: padding nibbles and tiles take the zero code
    w = rng.standard_normal((N, K)).astype(np.float32)
    w[3] = 0  # a zero row
    im = rng.random(K).astype(np.float32)
    q = orkpy.quantize(w, "test4", imatrix=im)
    rc, rs = ref.quantize(w, "test4", imatrix=im)
    qsr = orkpy.quantize(w, "test4", sr=True, seed=5)
    with orkpy.use_isa("scalar"):
        qs = orkpy.quantize(w, "test4", sr=True, seed=5)
    out["quant_vs_reference"] = bool(np.array_equal(q.codes, rc) and np.array_equal(q.scales, rs))
    out["sr_same_on_scalar"] = bool(np.array_equal(qsr.codes, qs.codes))
    out["dequant_vs_reference"] = bool(np.array_equal(q.dequantize(), ref.dequantize(rc, rs, "test4", K)))
    out["zero_row"] = q.codes[3].tolist()
    pw = orkpy.pack(q)
    x = rng.standard_normal((5, K)).astype(np.float32)
    xq = rng.integers(-127, 128, (5, K), dtype=np.int8)
    acc = pw.matmul_int(xq)
    out["matmul_int_exact"] = bool(np.array_equal(
        acc, xq.astype(np.int32) @ pw.int8_weight().T.astype(np.int32)))
    out["codes_roundtrip"] = bool(np.array_equal(pw.codes(), q.codes))
    y = pw.matmul(x)
    pth = sys.argv[2] + "/w.o4n1"
    orkpy.save_packed(pw, pth)
    back = orkpy.load_packed(pth)
    out["file"] = [back.kind, open(pth, "rb").read(4).decode(), int.from_bytes(open(pth, "rb").read()[8:12], "little")]
    out["load_matmul_same"] = bool(np.array_equal(back.matmul(x), y))
    with orkpy.runtime.npu.Device("emu") as dev:
        out["npu_same"] = bool(np.array_equal(dev.matmul(xq, pw), acc))
    m = orkpy.load_model(sys.argv[3], weights="test4")
    ids = list(range(1, 40))
    logits = m.forward(ids)
    routed = orkpy.runtime.npu.use_npu(m, "emu", kinds=("test4",))
    out["model"] = [bool(np.all(np.isfinite(logits))), routed, bool(np.array_equal(m.forward(ids), logits))]
    sub = build_parser()._subparsers._group_actions[0].choices["quantize"]
    out["cli_kind"] = list(next(a for a in sub._actions if a.dest == "kind").choices)
    # the tiers: a codebook runs the 4-bit tier (a tier map, the CLI, the manifest, load_model(weights=))
    from orkpy.formats import tiermap
    from orkpy.cli import main
    out["tiers"] = [list(tiermap.TIERS), tiermap.kind_tier("test4"), tiermap.tier_kind("int4-g32", "test4")]
    tm = orkpy.tier_map(sys.argv[3])
    ents = {n: tiermap.TierEntry("int4-g32" if i % 2 else "int4", e.ggml_type, e.shape) if e.tier == "int8" else e
            for i, (n, e) in enumerate(tm.entries.items())}
    tiermap.TierMap(ents, tm.threshold, tm.source, tm.tied).save(sys.argv[2] + "/alloc.map")
    rc = main(["quantize", sys.argv[3], "--alloc", sys.argv[2] + "/alloc.map", "--kind", "test4",
               "-o", sys.argv[2] + "/model", "--no-progress"])
    with open(sys.argv[2] + "/model/manifest.json") as f:
        man = json.load(f)
    ents = man["tensors"].values()
    md = orkpy.load_model(sys.argv[2] + "/model")
    mm = orkpy.load_model(sys.argv[3], weights=orkpy.TierMap.load(sys.argv[2] + "/alloc.map"), int4_kind="test4")
    out["model_dir"] = [rc, sorted({(e["tier"], e["kind"]) for e in ents if e["kind"] != "float"}),
                        bool(np.all(np.isfinite(md.forward(ids)))), bool(np.all(np.isfinite(mm.forward(ids))))]
    try:
        core._register_kind_for_tests("late4", levels)
    except ValueError as e:
        out["late"] = str(e)
    print(json.dumps(out))
''')


def test_a_dummy_kind_needs_only_a_registry_row(shared, tmp_path):
    model = str(shared / "models" / "stories260K" / "stories260K-F32.gguf")
    r = subprocess.run([sys.executable, "-c", _DUMMY, _core.__file__, str(tmp_path), model], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    import json
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["id"] == 7 and out["kinds"] == ["nf4", "int4", "int8", "int5", "int6", "w4a4", "w4a8", "test4"]
    assert out["four"] == ["nf4", "int4", "test4"] and out["cli_kind"] == out["four"]
    assert out["zero_code"] == 4 and out["lut"] == out["ref_lut"] and out["lut"][4] == 0 and out["lut"][9:] == [0] * 7
    assert out["zero_row"] == [4 | 4 << 4] * 39  # zero rows hold the row's zero code, not 7
    refused = out["refused"]
    assert "no 0.0 level" in refused["nozero4"] and "not ascending" in refused["flat4"]
    assert "[a-z0-9_]" in refused["Bad-name"] and "already registered" in refused["nf4"]
    assert "[-1, 1]" in refused["wide4"]
    for key in ("quant_vs_reference", "sr_same_on_scalar", "dequant_vs_reference", "matmul_int_exact",
                "codes_roundtrip", "load_matmul_same", "npu_same"):
        assert out[key] is True, key
    assert out["file"] == ["test4", "O4N1", 7]
    assert out["model"] == [True, 5 * 7 + 1, True]  # every linear on the emulated NPU, same logits
    assert out["tiers"] == [["int8", "int6", "int5", "int4", "w4a8", "w4a4", "float"], "int4", "test4"]  # no tier of its own
    assert out["model_dir"] == [0, [["int4", "test4"], ["int4-g32", "test4"]], True, True]
    assert "sealed" in out["late"]


# ------------------------------------------------------------ layout facts --
@pytest.mark.parametrize("kind", orkpy.KINDS)
@pytest.mark.parametrize("N,K", [(1, 1), (33, 65), (64, 96)])
def test_packed_layout_is_the_binding_s(kind, N, K, tmp_path):
    lay = _core.packed_layout(kind, N, K)
    rng = np.random.default_rng(N * K)
    pw = orkpy.pack(orkpy.quantize(rng.standard_normal((N, K)).astype(np.float32), kind))
    assert pw.store.shape == lay["store_shape"] and pw.store.dtype == np.dtype(lay["store_dtype"])
    assert pw.store.nbytes == lay["store_bytes"]
    assert lay["file_store_bytes"] == lay["store_bytes"] * orkpy.kernels.quant.KIND_INFO[kind].store_bits // (
        8 if lay["store_dtype"] == "int8" else 4)
    orkpy.save_packed(pw, tmp_path / "w")
    data = (tmp_path / "w").read_bytes()
    assert len(data) == lay["file_bytes"] and data[:4].decode() == lay["magic"]
    assert int.from_bytes(data[48:56], "little") == lay["store_offset"]
    assert _core.packed_header(kind, N, K)[:4].decode() == lay["magic"] == ("O8N1" if lay["store_dtype"] == "int8" else "O4N1")


def test_packed_layout_refuses_bad_arguments():
    with pytest.raises(ValueError, match="unknown kind"):
        _core.packed_layout("int2", 4, 4)
    with pytest.raises(ValueError, match="positive"):
        _core.packed_layout("nf4", 0, 4)


# ---------------------------------------------------------- NPU backends --
def test_npu_backends_from_c():
    assert npu.BACKENDS == _core.npu_backends() == ("emu", "rknpu", "rocket")
    assert _choices("ppl", "npu") == npu.BACKENDS
    assert npu.pc_amount(104) == _core.npu_pc_amount(104) == 53
    for bad in (lambda: _core.npu_probe("tpu"), lambda: _core.NPUDevice("tpu")):
        with pytest.raises(ValueError, match=r"unknown NPU backend 'tpu' \(expected one of emu, rknpu, rocket\)"):
            bad()
    with pytest.raises(ValueError, match="no kernel driver to fake"):
        _core.NPUDevice("emu", "emu")
    with pytest.raises(ValueError, match="body_qwords"):
        _core.npu_pc_amount(-1)


def test_npu_binding_releases_on_error_paths():
    """Every failing call drops the references it took (one cleanup label)."""
    a = np.ones((4, 64), np.int8)
    before = sys.getrefcount(a)
    with pytest.raises(ValueError):
        _core.npu_layout("pack_input", 5, 64, 32, a)  # wrong shape after the array was taken
    with pytest.raises(ValueError):
        _core.npu_layout("unpack_everything", 4, 64, 32, a)
    dev = _core.NPUDevice("emu")
    w = dev.upload(np.ones((32, 64), np.int8))
    with pytest.raises(ValueError):
        dev.matmul(w, np.ones((4, 65), np.int8))
    bad_store = np.zeros(7, np.uint8)
    lut = np.zeros(16, np.int8)
    before_store = sys.getrefcount(bad_store)
    with pytest.raises(ValueError):
        dev.upload_packed("nf4", bad_store, lut, 32, 64)
    with pytest.raises(TypeError):
        dev.upload_packed("nf4", bad_store, lut.astype(np.int16), 32, 64)
    assert sys.getrefcount(a) == before
    assert sys.getrefcount(bad_store) == before_store
    dev.close()


# ------------------------------------------------------------- FFN modes --
def test_ffn_modes_from_c():
    assert ffn.MODES == ("baseline",) + _core.ffn_modes()
    assert _core.ffn_modes() == ("fused", "exact_silu", "fp32_silu_out", "exact_lut_input", "asym_zero_point",
                                 "per_channel_out", "unfused", "split_product")


def _tiny_model(path="int8"):
    from orkpy.evaluation.testing import synthetic_forward_model
    return synthetic_forward_model(n_layer=2, n_embd=64, n_ff=96, n_head=4, n_head_kv=2, head_dim=16, n_vocab=50,
                                   path=path, threads=1)


def test_ffn_settings_checked_in_c():
    m = _tiny_model()
    ok = {"mode": "asym_zero_point", "lut_step": 0.01, "s_scale": 0.01, "u_scale": 0.01, "p_scale": 0.01}
    m.set_ffn(0, ok)
    for bad, msg in (({"zp": 128}, "zero point 128 outside int8"), ({"zp": 10**30}, "outside int8"),
                     ({"u_scale": 0.0}, "positive and finite"), ({"p_scale": float("inf")}, "finite"),
                     ({"mode": "per_channel_out"}, "per-channel scales"), ({"mode": "fused9"}, "unknown FFN chain mode")):
        with pytest.raises(ValueError, match=msg):
            m.set_ffn(1, dict(ok, **bad))
    f32 = _tiny_model("fp32")
    with pytest.raises(ValueError, match="layer 0: the fused FFN chain needs packed"):
        f32.set_ffn(0, ok)


# ---------------------------------------------------------- linear names --
def test_linear_names_owned_by_the_forward_model():
    assert _core.layer_linears() == orkpy.runtime.model.LINEARS == (
        "attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
    names = _core.linear_names({"n_layer": 2})
    assert names == [f"blk.{i}.{t}.weight" for i in range(2) for t in _core.layer_linears()] + ["output.weight"]
    m = _tiny_model()
    m.imatrix_enable()
    m.forward(np.arange(8))
    sums = m.imatrix_take()
    assert len(sums) == len(names)
    assert [len(s) for s, _ in sums] == [64, 64, 64, 64, 64, 64, 96] * 2 + [64]  # K of each, in that order
    with pytest.raises(KeyError, match="n_layer"):
        _core.linear_names({})
    with pytest.raises(IndexError, match=r"outside \[0, 15\)"):
        m.set_npu(15, None)
