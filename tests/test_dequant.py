"""ggml block dequantizers (csrc/ork/dequant.c) against gguf-py's NumPy
dequantizers: every supported type bit-exact on random blocks, half-precision
corner cases, unsupported / invalid types, size checks and thread identity."""
import numpy as np
import pytest

import orkpy
import orkpy._core as C

from orkpy.evaluation.testing import DEQUANT_TYPES as SUPPORTED
from orkpy.evaluation.testing import random_blocks as random_raw

UNSUPPORTED = {16: "IQ2_XXS", 34: "TQ1_0", 39: "MXFP4", 9: "Q8_1", 15: "Q8_K", 19: "IQ1_S",
               24: "I8", 28: "F64", 40: "NVFP4"}
INVALID = [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, 2**32 - 1]


def oracle(gguf, raw, type_id):
    q = gguf.GGMLQuantizationType(type_id)
    out = gguf.quants.dequantize(raw, q)
    return np.asarray(out, dtype=np.float32).reshape(-1)


def assert_bits_equal(got, want):
    """Bit-identical float32 arrays (NaN payloads included)."""
    assert got.dtype == np.float32 and want.dtype == np.float32
    assert got.shape == want.shape
    g, w = got.view(np.uint32), want.view(np.uint32)
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (f"{bad.size} mismatches, first at {bad[0]}: "
                           f"got {got[bad[0]]!r} ({g[bad[0]]:#010x}) want {want[bad[0]]!r} "
                           f"({w[bad[0]]:#010x})")


# ------------------------------------------------------------ type table --

def test_type_table():
    assert C.ggml_type_count() == 43
    for tid, (name, bs, ts, _) in SUPPORTED.items():
        info = C.ggml_type_info(tid)
        assert info["name"] == name and info["block_size"] == bs and info["type_size"] == ts
        assert info["bits_per_weight"] == 8.0 * ts / bs
        assert info["quantized"] == (bs > 1)
    for tid in INVALID:
        assert C.ggml_type_info(tid) is None
    assert C.ggml_type_info(-1) is None


def test_type_table_matches_gguf():
    gguf = pytest.importorskip("gguf")
    for q in gguf.GGMLQuantizationType:
        info = C.ggml_type_info(int(q))
        if q.name == "Q8_1":  # gguf-py says 40 bytes; ggml's block_q8_1 is 36 (see ggml_types.h)
            continue
        assert info is not None, q.name
        bs, ts = gguf.GGML_QUANT_SIZES[q]
        assert (info["name"], info["block_size"], info["type_size"]) == (q.name, bs, ts)


# ------------------------------------------------------- against gguf-py --

@pytest.mark.parametrize("type_id", sorted(SUPPORTED), ids=[SUPPORTED[t][0] for t in sorted(SUPPORTED)])
def test_matches_gguf_exactly(type_id):
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(1000 + type_id)
    name, bs, ts, _ = SUPPORTED[type_id]
    nblocks = 4096 if bs == 1 else max(64, 16384 // bs)
    raw = random_raw(rng, type_id, nblocks)
    got = C.dequantize_raw(raw, type_id, nblocks * bs)
    want = oracle(gguf, raw, type_id)
    assert got.shape == (nblocks * bs,)
    assert np.all(np.isfinite(got))
    assert np.array_equal(got, want)
    assert_bits_equal(got, want)


@pytest.mark.parametrize("type_id", [t for t in sorted(SUPPORTED) if SUPPORTED[t][3]],
                         ids=[SUPPORTED[t][0] for t in sorted(SUPPORTED) if SUPPORTED[t][3]])
def test_matches_gguf_with_any_half_scales(type_id):
    """Scale fields with every fp16 class (subnormal, large, Inf, NaN): the
    results are still bit-identical (same IEEE operations in the same order)."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(2000 + type_id)
    name, bs, ts, offs = SUPPORTED[type_id]
    specials = np.array([0x0001, 0x03ff, 0x8001, 0x0400, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00,
                         0x7c01, 0x0000, 0x8000, 0x3c00], dtype=np.uint16)
    nblocks = 4 * len(specials)
    raw = random_raw(rng, type_id, nblocks).reshape(nblocks, ts)
    for i, off in enumerate(offs):
        h = np.roll(np.tile(specials, 4), i)
        raw[:, off:off + 2] = h.view(np.uint8).reshape(nblocks, 2)
    raw = raw.reshape(-1)
    with np.errstate(all="ignore"):
        want = oracle(gguf, raw, type_id)
    got = C.dequantize_raw(raw, type_id, nblocks * bs)
    assert np.array_equal(got, want, equal_nan=True)
    assert_bits_equal(got, want)


def test_f16_all_bit_patterns(isa):
    """Every one of the 65536 half values (subnormals, Inf, quiet and
    signalling NaN) converts exactly, NaN payloads included: the scalar loop
    and the selected ISA's (F16C on x86), the tail of a row too."""
    gguf = pytest.importorskip("gguf")
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    raw = h.view(np.uint8)
    with orkpy.use_isa(isa):
        got = C.dequantize_raw(raw, 1, 65536)
        tail = C.dequantize_raw(raw[: 2 * 13], 1, 13)
    assert_bits_equal(tail, got[:13])
    want = oracle(gguf, raw, 1)
    assert np.array_equal(got, h.view(np.float16).astype(np.float32), equal_nan=True)
    assert_bits_equal(got, want)
    # spot values
    assert got[0x0001] == 2.0 ** -24 and got[0x03ff] == 1023 * 2.0 ** -24
    assert got[0x7c00] == np.inf and got[0xfc00] == -np.inf and got[0x7bff] == 65504.0
    assert np.signbit(got[0x8000]) and got[0x8000] == 0


def test_bf16_and_f32_bit_patterns():
    gguf = pytest.importorskip("gguf")
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    got = C.dequantize_raw(h.view(np.uint8), 30, 65536)
    assert_bits_equal(got, oracle(gguf, h.view(np.uint8), 30))
    assert_bits_equal(got, (h.astype(np.uint32) << 16).view(np.float32))
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, size=10000, dtype=np.uint64).astype(np.uint32)
    bits[:4] = [0x7f800001, 0xffc00001, 0x00000001, 0x80000000]  # sNaN, qNaN, subnormal, -0
    got = C.dequantize_raw(bits.view(np.uint8), 0, bits.size)
    assert_bits_equal(got, bits.view(np.float32))


# ---------------------------------------------------- hand-made anchors --

def _half(x):
    return np.array([x], dtype=np.float16).view(np.uint8)


def test_q8_0_and_q4_0_anchor_values():
    qs = np.arange(-16, 16, dtype=np.int8)
    raw = np.concatenate([_half(0.5), qs.view(np.uint8)])
    assert np.array_equal(C.dequantize_raw(raw, 8, 32), qs.astype(np.float32) * 0.5)
    # Q4_0: byte j low nibble -> element j, high nibble -> element j+16
    nib = np.arange(16, dtype=np.uint8)
    raw = np.concatenate([_half(2.0), nib | ((15 - nib) << 4)])
    want = np.concatenate([(nib.astype(np.float32) - 8) * 2, (15 - nib.astype(np.float32) - 8) * 2])
    assert np.array_equal(C.dequantize_raw(raw, 2, 32), want)


def test_iq4_nl_codebook():
    kv = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.float32)
    nib = np.arange(16, dtype=np.uint8)
    raw = np.concatenate([_half(1.0), nib | (nib[::-1] << 4)])
    assert np.array_equal(C.dequantize_raw(raw, 20, 32), np.concatenate([kv, kv[::-1]]))


# -------------------------------------------------- errors and threading --

@pytest.mark.parametrize("type_id", sorted(UNSUPPORTED))
def test_unsupported_types_raise_not_implemented(type_id):
    name = UNSUPPORTED[type_id]
    info = C.ggml_type_info(type_id)
    assert info is not None and info["name"] == name
    raw = np.zeros(info["type_size"] * 2, np.uint8)
    with pytest.raises(NotImplementedError, match=rf"\b{name}\b"):
        C.dequantize_raw(raw, type_id, 2 * info["block_size"])


@pytest.mark.parametrize("type_id", INVALID + [-1])
def test_invalid_type_ids_raise_value_error(type_id):
    with pytest.raises(ValueError):
        C.dequantize_raw(np.zeros(64, np.uint8), type_id, 32)


@pytest.mark.parametrize("type_id", sorted(SUPPORTED), ids=[SUPPORTED[t][0] for t in sorted(SUPPORTED)])
def test_wrong_sizes_raise_value_error(type_id):
    name, bs, ts, _ = SUPPORTED[type_id]
    good = np.zeros(3 * ts, np.uint8)
    assert C.dequantize_raw(good, type_id, 3 * bs).shape == (3 * bs,)
    for raw in (np.zeros(3 * ts - 1, np.uint8), np.zeros(3 * ts + 1, np.uint8), np.zeros(2 * ts, np.uint8)):
        with pytest.raises(ValueError, match=name):
            C.dequantize_raw(raw, type_id, 3 * bs)
    if bs > 1:  # n not a multiple of the block size
        with pytest.raises(ValueError, match="block size"):
            C.dequantize_raw(good, type_id, 3 * bs - 1)
    with pytest.raises(ValueError):
        C.dequantize_raw(good, type_id, -bs)


def test_bad_arguments():
    with pytest.raises(TypeError):
        C.dequantize_raw(np.zeros(18, np.int8), 2, 32)  # not uint8
    with pytest.raises(TypeError):
        C.dequantize_raw(np.zeros((1, 18), np.uint8), 2, 32)  # not 1-D
    with pytest.raises(ValueError):
        C.dequantize_raw(np.zeros(18, np.uint8), 2, 32, threads=-1)
    assert C.dequantize_raw(np.zeros(0, np.uint8), 12, 0).shape == (0,)


def test_unaligned_and_strided_input():
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(5)
    raw = random_raw(rng, 12, 40)
    buf = np.zeros(raw.size + 1, np.uint8)
    buf[1:] = raw
    view = buf[1:]  # odd address: block fields are unaligned
    assert view.ctypes.data % 2 == 1
    want = oracle(gguf, raw, 12)
    assert_bits_equal(C.dequantize_raw(view, 12, 40 * 256), want)
    strided = np.zeros(raw.size * 2, np.uint8)
    strided[::2] = raw
    assert_bits_equal(C.dequantize_raw(strided[::2], 12, 40 * 256), want)
    mv = memoryview(raw.tobytes())
    assert_bits_equal(C.dequantize_raw(mv, 12, 40 * 256), want)


@pytest.mark.parametrize("type_id", sorted(SUPPORTED), ids=[SUPPORTED[t][0] for t in sorted(SUPPORTED)])
def test_thread_count_does_not_change_output(type_id):
    rng = np.random.default_rng(3000 + type_id)
    name, bs, ts, _ = SUPPORTED[type_id]
    nblocks = max(8, (3 * 65536 + 1000) // bs)  # several parallel chunks
    raw = random_raw(rng, type_id, nblocks)
    a = C.dequantize_raw(raw, type_id, nblocks * bs, threads=1)
    b = C.dequantize_raw(raw, type_id, nblocks * bs, threads=2)
    c = C.dequantize_raw(raw, type_id, nblocks * bs, threads=0)
    assert_bits_equal(a, b)
    assert_bits_equal(a, c)


def test_dequantize_into_out():
    """out=: written and returned (any shape of n elements); a wrong dtype, layout, size or an out
    overlapping raw is refused before any work."""
    raw = random_raw(np.random.default_rng(3), 8, 64)  # Q8_0: 64 blocks
    want = C.dequantize_raw(raw, 8, 64 * 32)
    out = np.full((32, 64), np.nan, np.float32)
    got = C.dequantize_raw(raw, 8, 64 * 32, out=out)
    assert got is out and np.array_equal(out.ravel(), want)
    with pytest.raises(TypeError, match="float32"):
        C.dequantize_raw(raw, 8, 64 * 32, out=np.empty(64 * 32, np.float64))
    with pytest.raises(TypeError, match="C-contiguous"):
        C.dequantize_raw(raw, 8, 64 * 32, out=np.empty((64, 64), np.float32)[:, ::2])
    with pytest.raises(TypeError, match="native float32"):
        C.dequantize_raw(raw, 8, 64 * 32, out=np.empty(64 * 32, ">f4"))
    with pytest.raises(TypeError, match="aligned"):
        C.dequantize_raw(raw, 8, 64 * 32, out=np.frombuffer(bytearray(64 * 32 * 4 + 1), np.float32, 64 * 32, 1))
    with pytest.raises(ValueError, match="out has 2047 elements, n = 2048"):
        C.dequantize_raw(raw, 8, 64 * 32, out=np.empty(2047, np.float32))
    buf = np.zeros(raw.size + 64 * 32 * 4, np.uint8)
    buf[:raw.size] = raw
    with pytest.raises(ValueError, match="overlaps raw"):
        C.dequantize_raw(buf[:raw.size], 8, 64 * 32, out=buf[16:16 + 64 * 32 * 4].view(np.float32))
