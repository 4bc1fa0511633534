"""Packed i4a8 / i8 weights: tile layout, exact int32 matmul, float matmul
error bound, ISA/thread identity, and the O4N1/O8N1 files."""
import os
import struct

import numpy as np
import pytest

import orkpy
from orkpy import _core

SHAPES = [(1, 32, 32), (3, 45, 37), (64, 100, 70), (1, 257, 129), (3, 64, 33), (64, 31, 1)]


def make(kind, N, K, seed=0, imatrix=False):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((N, K)).astype(np.float32)
    im = rng.random(K).astype(np.float32) if imatrix else None
    q = orkpy.quantize(w, kind, imatrix=im)
    return w, q, orkpy.pack(q)


@pytest.mark.parametrize("kind", orkpy.KINDS)
def test_tile_layout(kind):
    N, K = 70, 100
    _, q, pw = make(kind, N, K)
    t = pw.store
    eight = orkpy.kernels.quant.KIND_INFO[kind].bits == 8  # int8, int6, int5: int8 tiles in memory
    assert t.shape == (3, 4, 32, 32 if eight else 16)
    W = pw.int8_weight()
    inflated = t if eight else orkpy.lut(kind)[np.stack([t & 15, t >> 4], -1).reshape(3, 4, 32, 32)]
    for nb in range(3):
        for kb in range(4):
            blk = np.zeros((32, 32), np.int8)
            src = W[nb * 32:(nb + 1) * 32, kb * 32:(kb + 1) * 32]
            blk[: src.shape[0], : src.shape[1]] = src
            assert np.array_equal(inflated[nb, kb], blk)  # padding lanes are zero
    assert np.array_equal(pw.codes(), q.codes if kind == "int8" or K % 2 == 0 else q.codes)


@pytest.mark.parametrize("kind", orkpy.KINDS)
@pytest.mark.parametrize("M, K, N", SHAPES)
def test_exact_int32_accumulators(kind, M, K, N):
    _, q, pw = make(kind, N, K, seed=M + K + N)
    rng = np.random.default_rng(1)
    xq = rng.integers(-127, 128, size=(M, K)).astype(np.int8)
    want = xq.astype(np.int64) @ pw.int8_weight().astype(np.int64).T
    got = pw.matmul_int(xq)
    assert got.dtype == np.int32 and got.shape == (M, N)
    assert np.array_equal(got, want)


def test_extreme_values_do_not_overflow():
    K, N = 4096, 64
    q = orkpy.quantize(np.full((N, K), -1.0, np.float32), "nf4")  # every weight at -127
    pw = orkpy.pack(q)
    xq = np.full((2, K), 127, np.int8)
    xq[1] = -128
    got = pw.matmul_int(xq)
    assert np.all(got[0] == -127 * 127 * K) and np.all(got[1] == 127 * 128 * K)


@pytest.mark.parametrize("kind", orkpy.KINDS)
@pytest.mark.parametrize("act", ["per_token", "per_tensor"])
def test_float_matmul_within_activation_quantization_error(kind, act):
    M, K, N = 64, 300, 90
    _, q, pw = make(kind, N, K, seed=3)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((M, K)).astype(np.float32) * rng.uniform(0.1, 10, (M, 1)).astype(np.float32)
    W = q.dequantize().astype(np.float64)
    ref = x.astype(np.float64) @ W.T
    y = pw.matmul(x, act=act)
    a = np.abs(x).max(1) / 127 if act == "per_token" else np.full(M, np.abs(x).max() / 127)
    bound = 0.5 * a[:, None] * np.abs(W).sum(1)[None, :] * (1 + 1e-5) + 1e-5 * np.abs(ref) + 1e-6
    assert np.all(np.abs(y - ref) <= bound)
    assert np.abs(y - ref).max() < np.abs(ref).max() * 0.05


def test_float_matmul_formula_is_bit_exact():
    M, K, N = 5, 77, 40
    _, q, pw = make("nf4", N, K, seed=5)
    x = np.random.default_rng(6).standard_normal((M, K)).astype(np.float32)
    amax = np.abs(x).max(1)
    xq = orkpy.quantize(x, "int8").codes          # the same int8 quantizer, per row
    a = (amax / np.float32(127)).astype(np.float32)
    acc = pw.matmul_int(xq)
    want = (acc.astype(np.float32) * a[:, None]).astype(np.float32) * pw.bscale[None, :]
    assert np.array_equal(pw.matmul(x), want)


def test_zero_activation_row_and_vector_input():
    _, q, pw = make("int4", 33, 64)
    x = np.zeros((2, 64), np.float32)
    x[1, 3] = 1.0
    y = pw.matmul(x)
    assert np.all(y[0] == 0)
    assert np.array_equal(pw.matmul(x[1]), y[1])


@pytest.mark.parametrize("kind", orkpy.KINDS)
def test_all_isas_and_thread_counts_identical(kind, isa):
    _, q, pw = make(kind, 97, 200, seed=7)
    rng = np.random.default_rng(8)
    for M in (1, 3, 64):
        xq = rng.integers(-127, 128, (M, 200)).astype(np.int8)
        x = rng.standard_normal((M, 200)).astype(np.float32)
        with orkpy.use_isa("scalar"):
            ref_i, ref_f = pw.matmul_int(xq, threads=1), pw.matmul(x, threads=1)
        with orkpy.use_isa(isa):
            for t in (1, 2, 5):
                assert np.array_equal(pw.matmul_int(xq, threads=t), ref_i), (t, M)
                assert np.array_equal(pw.matmul(x, threads=t), ref_f), (t, M)


@pytest.mark.parametrize("kind", ["int8", "nf4", "int4"])
@pytest.mark.parametrize("group, K", [(None, 200), (64, 200), (32, 2080)])
def test_decode_sized_matmul_split_over_threads_is_identical(kind, group, K, isa):
    """M = 1 and 2 over a weight whose strips are split over the threads in runs of several strips
    (38 strips, the last one short; 1189 x 200 is ~266K multiply-adds, so up to 4 threads take part):
    every thread count gives the scalar one-thread result bit for bit. K = 2080 in groups of 32 has
    65 groups: its per-strip scales outgrow the stack scratch (scratch.h) and come from the heap."""
    rng = np.random.default_rng(11)
    N = 32 * 37 + 5
    w = rng.standard_normal((N, K)).astype(np.float32)
    pw = orkpy.pack(orkpy.quantize(w, kind, group_size=group))
    for M in (1, 2):
        xq = rng.integers(-127, 128, (M, K)).astype(np.int8)
        x = rng.standard_normal((M, K)).astype(np.float32)
        with orkpy.use_isa("scalar"):
            ref_f = pw.matmul(x, threads=1)
            ref_i = pw.matmul_int(xq, threads=1) if group is None else None
        with orkpy.use_isa(isa):
            for t in (1, 2, 3, 5):
                assert np.array_equal(pw.matmul(x, threads=t), ref_f), (t, M)
                if ref_i is not None:
                    assert np.array_equal(pw.matmul_int(xq, threads=t), ref_i), (t, M)


def test_bad_inputs():
    _, q, pw = make("nf4", 40, 64)
    with pytest.raises(ValueError, match=r"K = 64"):
        pw.matmul(np.ones((2, 63), np.float32))
    with pytest.raises(ValueError, match=r"NaN.*\[1, 5\]"):
        x = np.ones((2, 64), np.float32)
        x[1, 5] = np.nan
        pw.matmul(x)
    with pytest.raises(ValueError, match="act must be"):
        pw.matmul(np.ones((1, 64), np.float32), act="per_channel")
    with pytest.raises(TypeError, match="xq must be a 2-D int8"):
        pw.matmul_int(np.ones((1, 64), np.float32))
    with pytest.raises(TypeError, match="QuantizedTensor"):
        orkpy.pack(np.ones((4, 4)))
    with pytest.raises(ValueError, match="exceeds"):
        orkpy.pack(orkpy.quantize(np.ones((1, 140000), np.float32), "int8"))


# ------------------------------------------------------------------ O4N1 --

@pytest.mark.parametrize("kind", orkpy.KINDS)
def test_save_load_bit_identical_and_redump_byte_identical(kind, tmp_path):
    _, q, pw = make(kind, 70, 100, seed=9, imatrix=True)
    p1, p2 = tmp_path / "a.bin", tmp_path / "b.bin"
    orkpy.save_packed(pw, p1)
    assert p1.read_bytes()[:4] == (b"O8N1" if orkpy.kernels.quant.KIND_INFO[kind].bits == 8 else b"O4N1")
    x = np.random.default_rng(10).standard_normal((3, 100)).astype(np.float32)
    xq = np.random.default_rng(11).integers(-127, 128, (64, 100)).astype(np.int8)
    for mm in (True, False):
        lw = orkpy.load_packed(p1, mmap=mm)
        assert lw.kind == kind and lw.shape == (70, 100)
        assert np.array_equal(lw.matmul(x), pw.matmul(x))
        assert np.array_equal(lw.matmul(x[:1]), pw.matmul(x[:1]))
        assert np.array_equal(lw.matmul_int(xq), pw.matmul_int(xq))
        assert not lw.store.flags.writeable
        orkpy.save_packed(lw, p2)
        assert p2.read_bytes() == p1.read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["a.bin", "b.bin"]


def test_o4n1_is_about_half_of_the_tiled_int8_dump(tmp_path):
    _, q, pw = make("nf4", 1024, 1024, seed=12)
    # the tiled int8 dump of the same weight: the inflated tiles and the same scales
    codes8 = pw.int8_weight()
    int8_dump = orkpy.PackedWeight("int8", pw.shape, orkpy._core.pack(codes8, "int8", 1024, 1024), pw.bscale)
    assert np.array_equal(int8_dump.matmul_int(np.ones((1, 1024), np.int8)), pw.matmul_int(np.ones((1, 1024), np.int8)))
    orkpy.save_packed(pw, tmp_path / "w.o4n1")
    orkpy.save_packed(int8_dump, tmp_path / "w.o8n1")
    ratio = os.path.getsize(tmp_path / "w.o4n1") / os.path.getsize(tmp_path / "w.o8n1")
    print(f"\nO4N1 / tiled int8 dump size ratio: {ratio:.4f}")
    assert ratio < 0.55


def test_atomic_write_leaves_old_file_on_failure(tmp_path, monkeypatch):
    _, q, pw = make("nf4", 40, 64)
    p = tmp_path / "w.o4n1"
    orkpy.save_packed(pw, p)
    before = p.read_bytes()
    _, q2, pw2 = make("nf4", 40, 64, seed=99)

    def boom(*a, **k):
        raise OSError("simulated crash before rename")
    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="simulated"):
        orkpy.save_packed(pw2, p)
    assert p.read_bytes() == before and os.listdir(tmp_path) == ["w.o4n1"]


def _valid(kind="nf4", N=40, K=64):
    _, q, pw = make(kind, N, K)
    hdr = orkpy._core.packed_header(kind, N, K)
    off = int.from_bytes(hdr[48:56], "little")
    return bytearray(hdr + pw.bscale.tobytes() + bytes(off - 64 - 4 * N) + pw.store.tobytes())


def _patch(data, off, fmt, value):
    d = bytearray(data)
    struct.pack_into(fmt, d, off, value)
    return bytes(d)


CORRUPT = {
    "empty": (lambda: b"", r"truncated"),
    "short header": (lambda: bytes(_valid()[:40]), r"truncated"),
    "bad magic": (lambda: b"XXXX" + bytes(_valid()[4:]), r"bad magic"),
    "version 5": (lambda: _patch(_valid(), 4, "<I", 5), r"unsupported version 5"),
    "version 3 with a 64-byte header": (lambda: _patch(_valid(), 4, "<I", 3), r"header size field is 64, expected 72"),
    "version 2 with a 64-byte header": (lambda: _patch(_valid(), 4, "<I", 2), r"header size field is 64, expected 72"),
    "kind 7": (lambda: _patch(_valid(), 8, "<I", 7), r"unknown kind 7"),
    "int8 kind in O4N1": (lambda: _patch(_valid(), 8, "<I", 2), r"unknown kind 2 for a O4N1"),
    "4-bit kind in O8N1": (lambda: _patch(_valid("int8"), 8, "<I", 0), r"unknown kind 0 for a O8N1"),
    "header size": (lambda: _patch(_valid(), 12, "<I", 32), r"header size field"),
    "K zero": (lambda: _patch(_valid(), 16, "<Q", 0), r"bad shape"),
    "K huge": (lambda: _patch(_valid(), 16, "<Q", 2**40), r"bad shape"),
    "N changed": (lambda: _patch(_valid(), 24, "<Q", 70), r"store offset"),
    "K changed": (lambda: _patch(_valid(), 16, "<Q", 100), r"store size"),
    "lut mismatch": (lambda: _patch(_valid(), 33, "<b", 5), r"LUT"),
    "store offset": (lambda: _patch(_valid(), 48, "<Q", 4096), r"store offset"),
    "store bytes": (lambda: _patch(_valid(), 56, "<Q", 10), r"store size"),
    "truncated store": (lambda: bytes(_valid()[:-1]), r"truncated or trailing"),
    "truncated scales": (lambda: bytes(_valid()[:100]), r"truncated or trailing"),
    "trailing data": (lambda: bytes(_valid()) + b"\0", r"truncated or trailing"),
    "NaN scale": (lambda: _patch(_valid(), 64 + 4 * 3, "<f", float("nan")), r"scale\[3\]"),
    "Inf scale": (lambda: _patch(_valid(), 64, "<f", float("inf")), r"scale\[0\]"),
    "negative scale": (lambda: _patch(_valid(), 64 + 4 * 39, "<f", -1.0), r"scale\[39\]"),
    "minus zero scale": (lambda: _patch(_valid(), 64 + 4, "<f", -0.0), r"scale\[1\]"),
    "padding not zero": (lambda: _patch(_valid(), 64 + 4 * 40 + 2, "<B", 1), r"padding"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT), ids=lambda c: c.replace(" ", "-"))
def test_corrupt_packed_files(tmp_path, case):
    make_bytes, pattern = CORRUPT[case]
    p = tmp_path / "bad.o4n1"
    p.write_bytes(make_bytes())
    for mm in (True, False):
        with pytest.raises(orkpy.FormatError, match=pattern) as e:
            orkpy.load_packed(p, mmap=mm)
        assert str(p) in str(e.value)


def test_valid_fixture_loads(tmp_path):
    p = tmp_path / "ok.o4n1"
    p.write_bytes(bytes(_valid()))
    assert orkpy.load_packed(p).shape == (40, 64)


def _lane(kind, N, K, n, k):
    """(byte offset in the file store, bit shift, bits, the padding code u) of lane [n, k]: the store's
    codes in memory order as a little-endian stream of b bits each (docs/o4n1.md; 4-bit: nibbles,
    int8: bytes, int6 / int5 / w4a4: b-bit streams with u = code + 2^(b-1))."""
    lay = _core.packed_layout(kind, N, K)
    info = orkpy.kernels.quant.KIND_INFO[kind]
    b = 4 if info.bits == 4 else lay["store_bits"]
    KB = -(-K // 32)
    idx = (((n // 32) * KB + k // 32) * 32 + n % 32) * 32 + k % 32
    zero = _core.kinds()[[r["name"] for r in _core.kinds()].index(kind)]["zero_code"] if info.bits == 4 else \
        (0 if b == 8 else 1 << (b - 1))
    return lay["store_offset"] + b * idx // 8, b * idx % 8, b, zero


@pytest.mark.parametrize("kind", orkpy.KINDS)
@pytest.mark.parametrize("lane", [(45, 3), (7, 77), (63, 95)], ids=["row-past-N", "column-past-K", "corner"])
def test_non_zero_padding_lane_refused(tmp_path, kind, lane):
    """A store's padding lanes (n >= N or k >= K) must hold the zero code (docs/o4n1.md): a file
    with another code in one is a FormatError naming the file, the lane and its file offset, for
    every kind and store encoding (the results would stay exact: padding lanes meet zero
    activations or produce discarded rows, but the file is not one orkpy writes)."""
    N, K = 40, 70
    _, q, pw = make(kind, N, K, seed=5)
    p = tmp_path / "w.o4n1"
    orkpy.save_packed(pw, p)
    data = bytearray(p.read_bytes())
    off, shift, b, zero = _lane(kind, N, K, *lane)
    word = int.from_bytes(data[off:off + 2].ljust(2, b"\0"), "little")
    assert (word >> shift) & ((1 << b) - 1) == zero         # what save_packed wrote: the zero code
    word ^= 1 << shift                                      # another code, inside the kind's range
    data[off:off + 2] = word.to_bytes(2, "little")[:len(data[off:off + 2])]
    p.write_bytes(bytes(data))
    for mm in (True, False):
        with pytest.raises(orkpy.FormatError, match=r"padding") as e:
            orkpy.load_packed(p, mmap=mm)
        msg = str(e.value)
        assert str(p) in msg and f"[{lane[0]}, {lane[1]}]" in msg and f"offset {off}" in msg, msg
    # a lane inside the weight may hold any code: set to the zero code, the file loads
    orkpy.save_packed(pw, p)
    data = bytearray(p.read_bytes())
    off, shift, b, zero = _lane(kind, N, K, 5, 5)
    word = int.from_bytes(data[off:off + 2], "little")
    word = word & ~(((1 << b) - 1) << shift) | zero << shift
    data[off:off + 2] = word.to_bytes(2, "little")
    p.write_bytes(bytes(data))
    assert orkpy.load_packed(p).int8_weight()[5, 5] == 0


def test_save_refuses_a_store_with_non_zero_padding(tmp_path):
    """What save_packed writes loads: a hand-made PackedWeight whose padding lane is not zero (the
    constructor takes any code in range) is refused before anything is written."""
    N, K = 40, 70
    _, q, pw = make("int8", N, K)
    store = pw.store.copy()
    store[1, 0, 20, 3] = 5                                  # row 52 >= N
    bad = orkpy.PackedWeight("int8", (N, K), store, pw.bscale)
    p = tmp_path / "w.o8n1"
    with pytest.raises(ValueError, match=r"padding lane \[52, 3\]"):
        orkpy.save_packed(bad, p)
    assert not p.exists() and os.listdir(tmp_path) == []


# ------------------------------------------------ review regressions --

def test_int8_minus_128_refused():
    codes = np.ones((32, 32), np.int8)
    codes[0, 0] = -128
    with pytest.raises(ValueError, match="-128"):
        orkpy._core.pack(codes, "int8", 32, 32)


def test_minus_zero_scale_normalised(tmp_path):
    q = orkpy.quantize(np.ones((2, 32), np.float32), "nf4")
    import dataclasses
    q = dataclasses.replace(q, scales=np.array([-0.0, 1.0], np.float32))
    pw = orkpy.pack(q)
    orkpy.save_packed(pw, tmp_path / "w.o4n1")
    assert orkpy.load_packed(tmp_path / "w.o4n1").bscale[0] == 0.0


# ------------------------------------------------- int6 / int5 narrow file stores --
@pytest.mark.parametrize("kind, bits", [("int6", 6), ("int5", 5)])
def test_narrow_file_store_bytes_round_trip_and_refusals(kind, bits, tmp_path):
    _, q, pw = make(kind, 70, 100, seed=3, imatrix=True)
    lay = _core.packed_layout(kind, 70, 100)
    raw = _core.store_to_file(pw.store, kind, 70, 100)
    assert len(raw) == lay["file_store_bytes"] == pw.store.nbytes * bits // 8
    # the contract: code i is u = code + qmax + 1 at bits [b*i, b*i + b) of a little-endian stream
    u = pw.store.reshape(-1).astype(np.int64) + (1 << (bits - 1))
    stream = np.unpackbits(np.frombuffer(raw, np.uint8), bitorder="little").reshape(-1, bits)
    assert np.array_equal((stream.astype(np.int64) << np.arange(bits)).sum(1), u)
    assert np.array_equal(_core.store_from_file(raw, kind, 70, 100), pw.store)
    p = tmp_path / "w.o8n1"
    orkpy.save_packed(pw, p)
    data = bytearray(p.read_bytes())
    assert len(data) == lay["file_bytes"] and pw.nbytes == len(raw) + 4 * 70
    assert np.array_equal(orkpy.load_packed(p).dequantize(), orkpy.dequantize(q))
    data[lay["store_offset"]] &= ~((1 << bits) - 1) & 0xFF  # code 0's u = 0: outside [-qmax, qmax]
    p.write_bytes(bytes(data))
    with pytest.raises(orkpy.FormatError, match=f"{kind} store code 0 is -{1 << (bits - 1)}"):
        orkpy.load_packed(p)
    bad = pw.store.copy()
    bad[0, 0, 0, 0] = (1 << (bits - 1))  # one past qmax
    with pytest.raises(ValueError, match=r"outside \[-"):
        _core.store_to_file(bad, kind, 70, 100)
    with pytest.raises(ValueError, match=rf"{kind} weight code {1 << (bits - 1)} at \[0, 0\]"):
        orkpy.PackedWeight(kind, (70, 100), bad, pw.bscale)
    pad = pw.store.copy()
    pad[2, 0, 6, 0] = -(1 << (bits - 1))  # row 70: padding past N
    with pytest.raises(ValueError, match=rf"{kind} store holds -{1 << (bits - 1)} in its padding"):
        orkpy.PackedWeight(kind, (70, 100), pad, pw.bscale)
