"""Affine int4 groups (csrc/ork/affine.h, docs/w4a4.md "Affine groups"): a float16 scale and offset per
group of a w4a4 / w4a8 weight. The search against a NumPy transcription of the contract, bit for bit;
the product's offset term against its definition (built from the core's own symmetric product and
activation sums), on every ISA; GPTQ with a diagonal Gram matrix equal to rounding; the refusals."""
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.kernels.actspec import ActSpec
from orkpy.kernels.packed import PackedWeight
from orkpy.quantization.gptq import gptq_quantize

F32 = np.float32
ROOT = pathlib.Path(__file__).resolve().parents[1]
STORIES = ROOT.parent / "shared" / "models" / "stories260K" / "stories260K-F32.gguf"
TEXT = ROOT.parent / "shared" / "text" / "tinystories-val-B.txt"


def f16(v):
    return np.asarray(v, F32).astype(np.float16).astype(F32)


def round_half_away(y):
    t = np.trunc(y)
    f = (y - t).astype(F32)
    return (t + (f >= 0.5) - (f <= -0.5)).astype(F32)


def ref_segment(x, im):
    """(s, o, codes) of affine.h's search for one segment (float32 x, importance im or None)."""
    x = np.asarray(x, F32)
    lo, hi = F32(x.min()), F32(x.max())
    best, out = np.inf, None
    for t in range(20):
        r = F32(1) - F32(t) / F32(40)
        a, b = F32(lo * r), F32(hi * r)
        s = f16(F32(F32(b - a) / F32(15)))[()]
        o = f16(F32(a + F32(F32(8) * s)))[()]
        inv = F32(1) / s if s > 0 else F32(0)
        c = np.clip(round_half_away((x - o).astype(F32) * inv), -8, 7).astype(F32)
        d = ((c * s).astype(F32) + o).astype(F32) - x
        e = np.sum((1.0 if im is None else im.astype(np.float64)) * d.astype(np.float64) ** 2)
        if e < best:
            best, out = e, (s, o, c.astype(np.int8))
        if lo == hi:
            break
    return out


def ref_quantize(w, group, im=None):
    N, K = w.shape
    G = -(-K // group)
    codes, s, o = np.zeros((N, K), np.int8), np.zeros((N, G), F32), np.zeros((N, G), F32)
    for n in range(N):
        for g in range(G):
            sl = slice(g * group, min(K, (g + 1) * group))
            s[n, g], o[n, g], codes[n, sl] = ref_segment(w[n, sl], None if im is None else im[sl])
    return codes, s, o


def _weight(N=24, K=160, seed=0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((N, K)) * 0.05 + rng.standard_normal((N, 1)) * 0.02).astype(F32)
    w[0, :32] = 0.0            # a zero group
    w[1, 32:64] = 0.25         # a constant group
    w[2, :] = np.abs(w[2])     # every group on one side of zero
    w[3, 7] = 3.0              # an outlier
    return w


@pytest.mark.parametrize("kind", ["w4a4", "w4a8"])
@pytest.mark.parametrize("imatrix", [False, True])
def test_search_is_the_contract(kind, imatrix):
    w = _weight()
    im = np.random.default_rng(1).uniform(0, 2, w.shape[1]).astype(F32) if imatrix else None
    q = orkpy.quantize(w, kind, imatrix=im, group_size=32, symmetric=False)
    codes, s, o = ref_quantize(w, 32, im)
    np.testing.assert_array_equal(q.scales, s)
    np.testing.assert_array_equal(q.offsets, o)
    np.testing.assert_array_equal(q.codes, codes)
    assert q.codes.min() == -8 and q.codes.max() == 7     # all 16 of the int4 mode's codes
    assert q.scales[0, 0] == 0 and q.offsets[0, 0] == 0    # the zero group
    assert q.scales[1, 1] == 0 and q.offsets[1, 1] == F32(0.25)  # the constant group: its value, exactly
    deq = q.dequantize()
    want = (codes.astype(F32) * np.repeat(s, 32, axis=1)[:, :160]).astype(F32) + np.repeat(o, 32, axis=1)[:, :160]
    np.testing.assert_array_equal(deq, want)
    # threads never change the bytes
    q1 = orkpy.quantize(w, kind, imatrix=im, group_size=32, symmetric=False, threads=1)
    np.testing.assert_array_equal(q1.codes, q.codes)


def test_affine_beats_symmetric_on_shifted_groups():
    w = _weight(N=64, K=256, seed=3)
    sym = orkpy.quantize(w, "w4a8", group_size=32)
    aff = orkpy.quantize(w, "w4a8", group_size=32, symmetric=False)
    e_sym = np.mean((sym.dequantize() - w) ** 2)
    e_aff = np.mean((aff.dequantize() - w) ** 2)
    assert e_aff < 0.8 * e_sym, (e_aff, e_sym)


def _offset_term_ref(pw, x, spec):
    """y of pw.matmul(x, act=spec) by affine.h's definition: the core's symmetric product, then
    sum_i u_i * o_i with u_i = a_i * S_i taken from a product with a 0/1 weight per group (exact)."""
    sym = PackedWeight(pw.kind, pw.shape, pw.store, pw.bscale, group=pw.group)
    y = sym.matmul(x, act=spec)
    K, g = pw.K, pw.group
    G = -(-K // g)
    ones = np.zeros((G, K), np.int8)
    for i in range(G):
        ones[i, i * g:(i + 1) * g] = 1
    from orkpy.kernels.quant import QuantizedTensor
    one = orkpy.pack(QuantizedTensor(pw.kind, (G, K), ones, np.ones((G, G), F32), None, group=g))
    u = one.matmul(x, act=spec)                     # (M, G): a_i[m] * S_i[m], each exact
    o = pw.boffset
    acc = (u[:, None, 0] * o[None, :, 0]).astype(F32)
    for i in range(1, G):
        acc = (acc + (u[:, None, i] * o[None, :, i]).astype(F32)).astype(F32)
    return (y + acc).astype(F32)


def _acts(M=17, K=160, seed=5):
    x = np.random.default_rng(seed).standard_normal((M, K)).astype(F32)
    x[:, 3] *= 20.0
    return x


@pytest.mark.parametrize("kind,spec", [
    ("w4a8", ActSpec()),                                           # int8 activations, a scale per token
    ("w4a8", ActSpec(bits=8, digits=True, group=32)),              # W4A8 digits, a scale per token and group
    ("w4a4", ActSpec(bits=4, search=True, prefix=1, group=32)),    # the NPU's W4A4 recipe
    ("w4a4", ActSpec(bits=4, search=True, prefix=1)),
])
def test_product_is_the_contract_on_every_isa(kind, spec):
    w, x = _weight(), _acts()
    pw = orkpy.pack(orkpy.quantize(w, kind, group_size=32, symmetric=False))
    with orkpy.use_isa("scalar"):
        want = _offset_term_ref(pw, x, spec)
        np.testing.assert_array_equal(pw.matmul(x, act=spec), want)
    for isa in ("avx2", "neon", "auto"):
        try:
            with orkpy.use_isa(isa):
                np.testing.assert_array_equal(pw.matmul(x, act=spec), want, err_msg=isa)
                np.testing.assert_array_equal(pw.matmul(x, act=spec, threads=1), want, err_msg=isa)
        except orkpy.UnavailableError:
            continue
    # the offsets change the product (a test that could not fail otherwise)
    sym = PackedWeight(pw.kind, pw.shape, pw.store, pw.bscale, group=pw.group)
    assert not np.array_equal(sym.matmul(x, act=spec), want)


def test_the_forward_model_runs_the_offsets():
    """A linear with offsets in the C forward model (LinearSpec.to_core) gives what PackedWeight.matmul gives."""
    from orkpy.runtime.linear import LinearSpec
    from orkpy.runtime.actcal import resolve
    w, x = _weight(N=32, K=64), _acts(M=5, K=64)
    pw = orkpy.pack(orkpy.quantize(w, "w4a4", group_size=32, symmetric=False))
    spec = resolve(ActSpec(groups=True), "blk.0.attn_q.weight", None, 64, "test", "w4a4", 32)
    ls = LinearSpec.from_packed("blk.0.attn_q.weight", pw, act_spec=spec)
    assert ls.to_core()[1]["boffset"] is pw.boffset
    np.testing.assert_array_equal(ls.packed_weight().matmul(x, act=spec), pw.matmul(x, act=spec))


def test_gptq_with_a_diagonal_gram_is_rounding():
    w = _weight()
    d = np.random.default_rng(2).uniform(0.5, 2, w.shape[1])
    for prec in ("float64", "float32"):
        g = gptq_quantize(w, np.diag(d), "w4a8", damp=0.0, rows=4, group_size=32, symmetric=False, precision=prec)
        q = orkpy.quantize(w, "w4a8", imatrix=(d / 4).astype(F32), group_size=32, symmetric=False)
        np.testing.assert_array_equal(g.codes, q.codes)
        np.testing.assert_array_equal(g.scales, q.scales)
        np.testing.assert_array_equal(g.offsets, q.offsets)


def test_gptq_affine_lowers_the_output_error():
    rng = np.random.default_rng(4)
    w = _weight(N=48, K=256, seed=6)
    x = (rng.standard_normal((2000, 256)) @ rng.standard_normal((256, 256)) * 0.1).astype(F32)
    h = x.T.astype(np.float64) @ x
    err = {}
    for sym in (True, False):
        q = gptq_quantize(w, h, "w4a8", rows=2000, group_size=32, symmetric=sym)
        q1 = gptq_quantize(w, h, "w4a8", rows=2000, group_size=32, symmetric=sym, threads=1, block=7)
        np.testing.assert_array_equal(q.codes, q1.codes)   # threads and block never change the bytes
        err[sym] = float(np.mean((x @ (q.dequantize() - w).T) ** 2))
    rtn = orkpy.quantize(w, "w4a8", group_size=32, symmetric=False)
    e_rtn = float(np.mean((x @ (rtn.dequantize() - w).T) ** 2))
    assert err[False] < err[True] and err[False] < e_rtn, (err, e_rtn)


def test_refusals_name_the_problem():
    w = _weight()
    with pytest.raises(ValueError, match="w4a4, w4a8"):
        orkpy.quantize(w, "int8", group_size=32, symmetric=False)
    with pytest.raises(ValueError, match="group size below K"):
        orkpy.quantize(w, "w4a4", symmetric=False)
    with pytest.raises(ValueError, match="group size below K"):
        orkpy.quantize(w, "w4a4", group_size=256, symmetric=False)
    with pytest.raises(ValueError, match="sr must be False"):
        orkpy.quantize(w, "w4a4", group_size=32, symmetric=False, sr=True)
    bad = w.copy()
    bad[5, 77] = np.nan
    with pytest.raises(ValueError, match=r"non-finite value \(NaN\) at \[5, 77\]"):
        orkpy.quantize(bad, "w4a4", group_size=32, symmetric=False)
    big = w.copy()
    big[4, 40] = 3e6
    big[4, 41] = -3e6
    with pytest.raises(ValueError, match="row 4, group 1"):
        orkpy.quantize(big, "w4a4", group_size=32, symmetric=False)
    with pytest.raises(ValueError, match="w4a4, w4a8"):
        gptq_quantize(w, np.eye(w.shape[1]), "int8", group_size=32, symmetric=False)
    q = orkpy.quantize(w, "w4a4", group_size=32, symmetric=False)
    pw = orkpy.pack(q)
    with pytest.raises(ValueError, match=r"offset \[2, 3\]"):
        PackedWeight(pw.kind, pw.shape, pw.store, pw.bscale, group=32,
                     boffset=np.where(np.arange(pw.boffset.size).reshape(pw.boffset.shape) == 2 * 5 + 3,
                                      F32(0.1), pw.boffset))
    with pytest.raises(ValueError, match="for group-wise w4a4 / w4a8"):
        PackedWeight("int8", pw.shape, _core.pack(np.zeros(pw.shape, np.int8), "int8", *pw.shape),
                     np.ones(pw.N, F32), boffset=np.zeros((pw.N, 1), F32))
    with pytest.raises(ValueError, match="boffset has shape"):
        _core.matmul(pw.store, pw.kind, pw.N, pw.K, pw.bscale, _acts(M=2), None, 0, 32, pw.boffset[:, :2].copy())


def test_files_keep_the_offsets(tmp_path):
    """Version 4 (docs/o4n1.md): the offsets after the scales, read back exactly (mapped or not); a
    version-4 header on a kind without affine groups, a non-finite offset: FormatError naming it."""
    from orkpy.kernels.packed import load_packed, save_packed
    q = orkpy.quantize(_weight(N=70, K=300), "w4a4", group_size=64, symmetric=False)
    pw = orkpy.pack(q)
    p = tmp_path / "a.o4n1"
    save_packed(pw, p)
    info = _core.packed_parse(p.read_bytes())
    assert info["version"] == 4 and info["offsets_offset"] == 72 + 2 * 70 * 5
    assert p.stat().st_size == _core.packed_layout("w4a4", 70, 300, 64, True)["file_bytes"]
    for mm in (True, False):
        lp = load_packed(p, mmap=mm)
        np.testing.assert_array_equal(lp.boffset, pw.boffset)
        np.testing.assert_array_equal(lp.dequantize(), q.dequantize())
    raw = bytearray(p.read_bytes())
    o = info["offsets_offset"] + 2 * 7
    raw[o:o + 2] = np.array([np.inf], np.float16).view(np.uint16).astype("<u2").tobytes()
    (tmp_path / "b.o4n1").write_bytes(bytes(raw))
    with pytest.raises(orkpy.FormatError, match=r"offset\[7\] is not finite"):
        load_packed(tmp_path / "b.o4n1")
    sym = orkpy.pack(orkpy.quantize(_weight(N=70, K=300), "int8", group_size=64))
    save_packed(sym, tmp_path / "c.o8n1")
    raw = bytearray((tmp_path / "c.o8n1").read_bytes())
    raw[4:8] = (4).to_bytes(4, "little")
    (tmp_path / "c.o8n1").write_bytes(bytes(raw))
    with pytest.raises(orkpy.FormatError, match="version 4: affine groups"):
        load_packed(tmp_path / "c.o8n1")


@pytest.mark.skipif(not STORIES.is_file(), reason="../shared/models/stories260K is absent")
def test_cli_symmetric_keeps_version_3(tmp_path):
    """--npu-bits makes affine groups by default (tests/test_w4a4.py runs them on the CPU and the NPU
    emulator); --symmetric beside it keeps the grouped int4 linears symmetric: no offsets, version-3 files."""
    out = tmp_path / "s"
    r = subprocess.run([sys.executable, "-m", "orkpy", "quantize", str(STORIES), "--npu-bits", "4", "--npu-tiers",
                        "w4a4-g32", "int8", "--symmetric", "--calib", str(TEXT), "--calib-chunks", "1",
                        "--calib-ctx", "128", "--no-progress", "-o", str(out)],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    man = json.loads((out / "manifest.json").read_text())
    assert man["recipe"]["rounding"]["symmetric"] is True
    m = orkpy.load_model(out)
    assert any(s.group for s in m.linears.values()) and all(s.boffset is None for s in m.linears.values())
    versions = {_core.packed_parse(p.read_bytes())["version"] for p in out.iterdir() if p.suffix in (".o4n1", ".o8n1")}
    assert versions and 4 not in versions


def test_recipe_refuses_affine_with_target_bpw():
    from orkpy.quantization.recipe import Recipe, RecipeError
    assert Recipe.from_kwargs(symmetric=False).rounding.symmetric is False
    with pytest.raises(RecipeError, match="rounding.symmetric"):
        Recipe.from_kwargs(symmetric=False, target_bpw=4.5)
    with pytest.raises(RecipeError, match="rounding.symmetric"):
        Recipe.from_kwargs(symmetric=False, sr=True)
