"""float16 group-wise scales (csrc/ork/quant.h "float16 group scales", csrc/ork/half.h) and the
O4N1/O8N1 version-3 file (docs/o4n1.md): the codec against NumPy's float16, grouped scales that are
float16 values chosen and used as stored, per-row scales untouched, tiny / huge segments, the
error cost, the file (written, read, version 2 still read, refusals), the byte counts."""
import pathlib

import numpy as np
import pytest

import orkpy
import orkpy.kernels.reference as R
from orkpy import _core
from orkpy.formats.tiermap import packed_nbytes

f32, f16 = np.float32, np.float16
KINDS = ("nf4", "int4", "int8")


@pytest.fixture
def rng():
    return np.random.default_rng(1703)


def bits(a):
    return np.ascontiguousarray(a, dtype=f32).view(np.uint32)


def is_f16(a):
    a = np.asarray(a, f32)
    return np.array_equal(bits(a.astype(f16).astype(f32)), bits(a))


def test_codec_is_ieee_nearest_even_as_numpy():
    """half.h: every float16 widens exactly; float32 -> float16 rounds like NumPy's cast
    (nearest, ties to even) on every float16, every midpoint between neighbours and one float32
    ulp either side (subnormals, the 65504 / 65520 overflow edge included), and random bits."""
    h = np.arange(1 << 16, dtype=np.uint16)
    assert np.array_equal(bits(_core.f16_to_f32(h)), bits(h.view(f16).astype(f32)))
    fin = h[np.isfinite(h.view(f16))]
    v = fin.view(f16).astype(np.float64)
    pos = np.sort(np.unique(np.abs(v)))
    mids = (pos[1:] + pos[:-1]) / 2                        # exact in float32 (12 significant bits)
    mids = np.concatenate([mids, [65520.0, 2.0 ** -25]]).astype(f32)
    near = np.concatenate([mids, np.nextafter(mids, f32(np.inf)), np.nextafter(mids, f32(0))])
    x = np.concatenate([v.astype(f32), near, -near, np.array([np.inf, -np.inf, 1e30, -1e-30, 0.0, -0.0], f32),
                        np.random.default_rng(0).integers(0, 2**32, 400_000, dtype=np.uint64)
                        .astype(np.uint32).view(f32)])
    nan = np.isnan(x)
    with np.errstate(over="ignore", invalid="ignore"):
        want = x.astype(f16).view(np.uint16)
    got = _core.f16_from_f32(x)
    assert np.array_equal(got[~nan], want[~nan])
    assert np.all(np.isnan(got[nan].view(f16)))
    assert _core.f16_from_f32(np.array([65519.996, 65520.0], f32)).tolist() == [0x7BFF, 0x7C00]
    with pytest.raises(TypeError, match="x must be a 1-D float32"):
        _core.f16_from_f32(np.zeros(3))


def weight(rng, N=40, K=320, std=0.02):
    w = (rng.standard_normal((N, K)) * std).astype(f32)
    w[:, 7] *= 30          # an outlier column
    w[3, 64:128] = 0       # a zero group
    return w


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("group", [32, 64, 96, 256])
def test_grouped_scales_are_float16_values_chosen_as_stored(rng, kind, group):
    """Group scales are float16 values, bit for bit the NumPy reference of the contract (search,
    stored scale, codes for 1 / s) on every ISA and thread count, with and without imatrix / SR;
    without imatrix a group's scale is f16 of the float32 scale of its columns as a row."""
    w = weight(rng)
    im = rng.random(320).astype(f32)
    for imx, sr in ((None, False), (im, False), (im, True)):
        outs = []
        for isa in orkpy.capabilities()["available"]:
            with orkpy.use_isa(isa):
                outs += [orkpy.quantize(w, kind, imatrix=imx, sr=sr, seed=4, group_size=group, threads=t)
                         for t in (1, 3)]
        c, s = R.quantize(w, kind, imatrix=imx, sr=sr, seed=4, group_size=group)
        assert s.shape == (40, -(-320 // group)) and is_f16(s)
        for q in outs:
            assert np.array_equal(q.codes, c) and np.array_equal(bits(q.scales), bits(s))
    plain = orkpy.quantize(w, kind, group_size=group)
    for i, lo in enumerate(range(0, 320, group)):
        seg = orkpy.quantize(np.ascontiguousarray(w[:, lo:lo + group]), kind)
        assert np.array_equal(bits(plain.scales[:, i]), bits(seg.scales.astype(f16).astype(f32)))


def test_search_and_codes_use_the_stored_scale(rng):
    """The imatrix search scores each clip ratio with its float16 scale (so it is not the float32
    search rounded afterwards), and the codes are the nearest levels of w / s for the stored s:
    inv = 1 / s, not 127 / m (int8: every weight's error is the least the stored scale allows)."""
    w = weight(rng, N=64, K=512)
    im = (rng.random(512) ** 4).astype(f32)
    q = orkpy.quantize(w, "int8", imatrix=im, group_size=32)
    searched = np.stack([orkpy.quantize(np.ascontiguousarray(w[:, c:c + 32]), "int8", imatrix=im[c:c + 32]).scales
                         for c in range(0, 512, 32)], axis=1)
    assert not np.array_equal(bits(q.scales), bits(searched.astype(f16).astype(f32)))
    q = orkpy.quantize(w, "int8", group_size=32)
    s = np.repeat(q.scales, 32, axis=1)
    a = np.repeat(np.abs(w.reshape(64, 16, 32)).max(-1), 32, axis=1).astype(f32)
    with np.errstate(divide="ignore"):
        inv_s = np.where(s > 0, f32(1) / s, f32(0)).astype(f32)
    codes = np.clip(R.round_half_away((w * inv_s).astype(f32)), -127, 127)
    assert np.array_equal(q.codes, codes.astype(np.int8))
    with np.errstate(divide="ignore", invalid="ignore"):
        other = np.clip(R.round_half_away((w * (f32(127) / a)).astype(f32)), -127, 127)
    live = s > 0
    assert np.any(other[live] != codes[live])  # the two choices differ: the test tells them apart
    err, err_other = (w - codes * s) ** 2, (w - other * s) ** 2
    assert np.all(err[live] <= err_other[live] * (1 + 1e-6) + 1e-30)


@pytest.mark.parametrize("kind", KINDS)
def test_per_row_scales_stay_float32(rng, kind):
    """group None / 0 / >= K: the float32 per-row contract (the reference without float16), and
    some scales are not float16 values, so nothing was rounded."""
    w = weight(rng, K=256)
    im = rng.random(256).astype(f32)
    c, s = R.quantize(w, kind, imatrix=im)
    for g in (None, 0, 256, 4096):
        q = orkpy.quantize(w, kind, imatrix=im, group_size=g)
        assert q.group == 0 and np.array_equal(q.codes, c) and np.array_equal(bits(q.scales), bits(s))
    assert not is_f16(s)


@pytest.mark.parametrize("kind", KINDS)
def test_tiny_segments_subnormal_and_zero_scales(rng, kind):
    """Subnormal float16 scales are kept (the weight error grows by at most 127 * 2^-25); a
    segment whose scale rounds to 0 (absmax / 127 <= 2^-25) or whose absmax is below 1e-30 is a
    zero segment: scale 0, zero codes, exact zeros."""
    w = weight(rng, N=4, K=128)
    w[0, :32] = rng.uniform(-1e-3, 1e-3, 32)      # scale ~ 7.9e-6: subnormal
    w[1, 32:64] = 0
    w[1, 40] = 3.7e-6                              # 3.7e-6 / 127 < 2^-25: rounds to 0
    w[1, 64:96] = 0
    w[1, 70] = 4e-6                                # > 2^-25: the smallest subnormal, 2^-24
    w[2, 96:] = 1e-31                              # below ORK_QUANT_TINY
    q = orkpy.quantize(w, kind, group_size=32)
    assert is_f16(q.scales)
    s0 = q.scales[0, 0]
    assert 0 < s0 < 2.0 ** -14 and s0 == f32(np.abs(w[0, :32]).max() / f32(127)).astype(f16)
    assert q.scales[1, 1] == 0 and q.scales[2, 3] == 0 and q.scales[1, 2] == f32(2.0 ** -24)
    d = q.dequantize()
    assert np.all(d[1, 32:64] == 0) and np.all(d[2, 96:] == 0)
    step = {"int8": 1.0, "int4": 127 / 14, "nf4": 127 * 0.16}[kind]   # half the widest level gap
    assert np.all(np.abs(d[0, :32] - w[0, :32]) <= step * s0 + 127 * 2.0 ** -25)
    c, s = R.quantize(w, kind, group_size=32)
    assert np.array_equal(q.codes, c) and np.array_equal(bits(q.scales), bits(s))
    zero = orkpy.quantize(np.zeros((1, 32), f32), kind).codes  # the zero codes of 32 columns
    seg = q.codes[1, 16:32] if kind != "int8" else q.codes[1, 32:64]
    assert np.array_equal(seg, zero[0])


@pytest.mark.parametrize("kind", KINDS)
def test_huge_segments(rng, kind):
    """absmax 1e6 gives a finite float16 scale (7872); absmax >= 65520 * 127 cannot be stored:
    ValueError naming the row, group, columns and absmax (never a silent clip). Per-row scales
    (float32) still take it."""
    w = weight(rng, N=6, K=128)
    w[2, 70] = 1e6
    q = orkpy.quantize(w, kind, group_size=32)
    assert q.scales[2, 2] == f32(f32(1e6) / f32(127)).astype(f16) and np.isfinite(q.scales).all()
    assert abs(q.dequantize()[2, 70] - 1e6) <= 1e6 * 2.0 ** -11
    w[4, 100] = -9e6
    with pytest.raises(ValueError, match=r"row 4, group 3 \(columns 96\.\.127\) has absmax 9e\+06.*largest float16"):
        orkpy.quantize(w, kind, group_size=32)
    assert orkpy.quantize(w, kind).scales[4] == f32(f32(9e6) / f32(127))


def test_float16_costs_little_error(rng):
    """Dequantization error of float16 group scales vs float32 ones (each group quantized as a
    row, the former contract), N(0, 0.02) weights 256 x 1024, importance-weighted with and without
    imatrix. Measured ratios: 4-bit 0.99999..1.00001, int8 0.9999..1.0001 (g32..g128)."""
    w = (rng.standard_normal((256, 1024)) * 0.02).astype(f32)
    im = (rng.random(1024) ** 2 + 0.01).astype(f32)
    for kind in KINDS:
        for g in (32, 128):
            for imx in (None, im):
                d16 = orkpy.quantize(w, kind, imatrix=imx, group_size=g).dequantize()
                d32 = np.concatenate([orkpy.quantize(np.ascontiguousarray(w[:, c:c + g]), kind,
                                                     imatrix=None if imx is None else imx[c:c + g]).dequantize()
                                      for c in range(0, 1024, g)], axis=1)
                wt = 1.0 if imx is None else imx.astype(np.float64)
                e16 = float((((w - d16).astype(np.float64)) ** 2 * wt).sum())
                e32 = float((((w - d32).astype(np.float64)) ** 2 * wt).sum())
                assert 0.998 < e16 / e32 < 1.002, (kind, g, imx is None, e16 / e32)


# ------------------------------------------------------------------ the version-3 file --
def _hdr(raw, off, size=4):
    return int.from_bytes(raw[off:off + size], "little")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("mmap", [True, False])
def test_version_3_round_trip(rng, tmp_path, kind, mmap):
    w = weight(rng, N=70, K=300)
    pw = orkpy.pack(orkpy.quantize(w, kind, group_size=64))
    p = tmp_path / "g"
    orkpy.save_packed(pw, p)
    raw = p.read_bytes()
    assert _hdr(raw, 4) == 3 and _hdr(raw, 12) == 72 and _hdr(raw, 64) == 64 and _hdr(raw, 68) == 5
    soff = -(-(72 + 2 * 70 * 5) // 64) * 64
    assert _hdr(raw, 48, 8) == soff and raw[72 + 700:soff] == bytes(soff - 772)
    assert raw[72:72 + 700] == pw.bscale.astype("<f2").tobytes()
    lay = _core.packed_layout(kind, 70, 300, 64)
    assert (lay["version"], lay["scale_bytes"], lay["store_offset"], lay["file_bytes"]) == (3, 2, soff, len(raw))
    info = _core.packed_parse(raw)
    assert (info["version"], info["scale_bytes"], info["G"]) == (3, 2, 5)
    back = orkpy.load_packed(p, mmap=mmap)
    assert back.bscale.dtype == f32 and np.array_equal(bits(back.bscale), bits(pw.bscale))
    x = rng.standard_normal((3, 300)).astype(f32)
    assert np.array_equal(back.matmul(x).view(np.int32), pw.matmul(x).view(np.int32))
    orkpy.save_packed(back, tmp_path / "again")
    assert (tmp_path / "again").read_bytes() == raw
    tier = ("int8" if kind == "int8" else "int4") + "-g64"
    assert pw.nbytes == back.nbytes == packed_nbytes(tier, 70, 300) == pw.store.nbytes + 2 * 350
    pc = orkpy.pack(orkpy.quantize(w, kind))
    orkpy.save_packed(pc, tmp_path / "pc")
    assert _hdr((tmp_path / "pc").read_bytes(), 4) == 1 and pc.nbytes == packed_nbytes(tier[:4], 70, 300)


def v2_file(pw, scales):
    """A version-2 file (float32 group scales) written by hand, as orkpy wrote them before."""
    N, K = pw.shape
    G = scales.shape[1]
    hdr = bytearray(_core.packed_header(pw.kind, N, K, pw.group))
    soff = -(-(72 + 4 * N * G) // 64) * 64
    hdr[4:8] = (2).to_bytes(4, "little")
    hdr[48:56] = soff.to_bytes(8, "little")
    body = scales.astype("<f4").tobytes()
    return bytes(hdr) + body + bytes(soff - 72 - len(body)) + pw.store.tobytes()


@pytest.mark.parametrize("kind", ["nf4", "int8"])
@pytest.mark.parametrize("mmap", [True, False])
def test_version_2_files_still_load(rng, tmp_path, kind, mmap):
    """A version-2 file (float32 scales, any float32 value) loads as it did; the weight re-saves as
    version 3 only if its scales are float16 values, else the writer refuses naming the scale."""
    w = weight(rng, N=70, K=300)
    pw = orkpy.pack(orkpy.quantize(w, kind, group_size=64))
    odd = pw.bscale * f32(1.0001)  # not float16 values
    assert not is_f16(odd)
    p = tmp_path / "v2"
    p.write_bytes(v2_file(pw, odd))
    info = _core.packed_parse(p.read_bytes())
    assert (info["version"], info["scale_bytes"]) == (2, 4)
    back = orkpy.load_packed(p, mmap=mmap)
    assert back.group == 64 and np.array_equal(bits(back.bscale), bits(odd))
    x = rng.standard_normal((2, 300)).astype(f32)
    ref = orkpy.PackedWeight(kind, pw.shape, pw.store, odd, group=64)
    assert np.array_equal(back.matmul(x).view(np.int32), ref.matmul(x).view(np.int32))
    with pytest.raises(ValueError, match=r"again: scale\[0, 0\] = .* is not a float16 value"):
        orkpy.save_packed(back, tmp_path / "again")
    assert not (tmp_path / "again").exists()
    p.write_bytes(v2_file(pw, pw.bscale))
    orkpy.save_packed(orkpy.load_packed(p, mmap=mmap), tmp_path / "v3")
    orkpy.save_packed(pw, tmp_path / "direct")
    assert (tmp_path / "v3").read_bytes() == (tmp_path / "direct").read_bytes()


def test_writer_refuses_scales_that_are_not_float16(rng, tmp_path):
    pw = orkpy.pack(orkpy.quantize(weight(rng), "nf4", group_size=64))
    bs = pw.bscale.copy()
    bs[1, 2] = 0.1
    bad = orkpy.PackedWeight("nf4", pw.shape, pw.store, bs, group=64)  # a valid weight in memory
    with pytest.raises(ValueError, match=r"scale\[1, 2\] = 0\.1 is not a float16 value \(1 of 200"):
        orkpy.save_packed(bad, tmp_path / "x")
    assert not list(tmp_path.iterdir())
    bs[1, 2] = 1e5  # above 65504: no float16 at all
    with pytest.raises(ValueError, match=r"scale\[1, 2\] = 100000\.0 is not a float16 value"):
        orkpy.save_packed(orkpy.PackedWeight("nf4", pw.shape, pw.store, bs, group=64), tmp_path / "x")


@pytest.mark.parametrize("h, msg", [
    (0x7E00, r"scale\[9\] = nan is not a finite non-negative"), (0x7C00, r"scale\[9\] = inf"),
    (0xBC00, r"scale\[9\] = -1 is not"), (0x8000, r"scale\[9\] = -0 is not"),
])
def test_version_3_bad_scales_are_format_errors(rng, tmp_path, h, msg):
    pw = orkpy.pack(orkpy.quantize(weight(rng), "int4", group_size=64))
    orkpy.save_packed(pw, tmp_path / "g")
    raw = bytearray((tmp_path / "g").read_bytes())
    raw[72 + 18:72 + 20] = h.to_bytes(2, "little")
    (tmp_path / "bad").write_bytes(bytes(raw))
    with pytest.raises(orkpy.FormatError, match=msg):
        orkpy.load_packed(tmp_path / "bad")
    raw = bytearray((tmp_path / "g").read_bytes())
    raw[72 + 2 * 200] = 1  # the first padding byte after the 200 float16 scales
    (tmp_path / "bad").write_bytes(bytes(raw))
    with pytest.raises(orkpy.FormatError, match="non-zero padding byte at offset 472"):
        orkpy.load_packed(tmp_path / "bad")


def test_packed_nbytes_counts_two_bytes_per_group_scale():
    assert packed_nbytes("int4-g32", 64, 576) == 64 * 576 // 2 + 2 * 64 * 18
    assert packed_nbytes("int8-g64", 33, 100) == 64 * 128 + 2 * 33 * 2
    assert packed_nbytes("int4-g128", 576, 1536) == 576 * 1536 // 2 + 2 * 576 * 12
    assert packed_nbytes("int4", 576, 1536) == 576 * 1536 // 2 + 4 * 576
    assert packed_nbytes("int4-g1024", 64, 576) == packed_nbytes("int4", 64, 576)  # one group: per row
    # 4-bit with a float16 scale per 32 inputs is llama.cpp Q4_0's 4.5 bits per weight
    assert 8 * packed_nbytes("int4-g32", 576, 1536) / (576 * 1536) == 4.5


STORIES = "models/stories260K/stories260K-F32.gguf"


def test_stories260k_grouped_model_saves_version_3_and_runs(shared, tmp_path):
    """quantize_model(group_size=32) on stories260K: every grouped linear is written as version 3
    and reloads with the same scales; the reloaded model's forward is the resident one's, bit for
    bit, and its bytes count 2 per group scale."""
    path, alloc = shared / STORIES, shared / "models/stories260K/stories260K-Q4_0.gguf"
    gq = orkpy.quantize_model(path, alloc, group_size=32, progress=False, log=lambda s: None)
    d = pathlib.Path(gq.save(tmp_path / "g32"))
    grouped = [n for n, pw in gq.tensors.items() if pw.group]
    assert grouped
    m = orkpy.load_model(d)
    for f in d.iterdir():
        if f.suffix in (".o4n1", ".o8n1"):
            raw = f.read_bytes()
            assert _hdr(raw, 4) in (1, 3) and (_hdr(raw, 4) == 3) == (_hdr(raw, 12) == 72)
    for n in grouped:
        pw = gq.tensors[n]
        assert is_f16(pw.bscale) and pw.nbytes == packed_nbytes("int8-g32" if pw.kind == "int8" else "int4-g32", *pw.shape)
    toks = m.tokens("Once upon a time there was a little girl who liked to play.")
    y = m.forward(toks)
    assert np.all(np.isfinite(y))
    assert np.array_equal(y.view(np.int32), gq.to_model().forward(toks).view(np.int32))
