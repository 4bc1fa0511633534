"""The integer contract of the NPU's int4 x int4 -> int16 matmul (docs/w4a4.md, "Integer contract";
csrc/ork/i4.h) through orkpy.kernels.int4: chunks of 480 k summed in int16 never overflow, for any
codes; their int32 sum is the exact product (numpy int64), for this split and any split into
chunks of at most 511; every ISA's kernel equals the scalar _ref, at any thread count; the storage
codec's nibble order; bad input raises ValueError naming the argument. The kernels' shapes and
tails, and NEON under qemu: tests/c/test_i4.c."""
import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.kernels import int4
from orkpy.kernels.int4 import mm_i4, mm_i4_partials, pack_i4, unpack_i4

INT16 = (-32768, 32767)


def exact(a, w):
    return np.asarray(a, np.int64) @ np.asarray(w, np.int64).T


def chunk_sums(a, w, bounds):
    """The exact (int64) sum of each chunk [bounds[i], bounds[i+1]) and the largest |prefix| in it."""
    p = np.asarray(a, np.int64)[:, None, :] * np.asarray(w, np.int64)[None, :, :]
    sums, peaks = [], []
    for k0, k1 in zip(bounds[:-1], bounds[1:]):
        c = np.cumsum(p[:, :, k0:k1], axis=2)
        sums.append(c[:, :, -1])
        peaks.append(np.abs(c).max())
    return np.array(sums), max(peaks)


def codes(rng, shape, lo=-8, hi=7):
    return rng.integers(lo, hi + 1, shape).astype(np.int8)


def test_constants_are_the_c_cores():
    assert int4.KCHUNK == 480 and int4.KCHUNK * 8 * 8 <= INT16[1] < 512 * 8 * 8
    assert int4.layout(481) == {"Kp": 512, "row_bytes": 256, "kchunk": 480, "n_chunks": 2, "max_k": 1 << 24}
    assert int4.layout(480)["n_chunks"] == 1 and int4.layout(960)["n_chunks"] == 2 and int4.layout(961)["n_chunks"] == 3


@pytest.mark.parametrize("K", [480, 481, 960, 8192])
@pytest.mark.parametrize("wv", [-8, 7])
def test_extreme_codes_chunk_without_overflow(K, wv, isa):
    """All -8 activations against all -8 (every product +64) or all 7 (-56) weights: the largest
    |chunk sum| there is; every int16 partial is the exact chunk sum and the int32 result exact."""
    a = np.full((2, K), -8, np.int8)
    w = np.full((3, K), wv, np.int8)
    with orkpy.use_isa(isa):
        assert orkpy.capabilities()["i4_kernels"] == isa
        got = mm_i4(a, w, threads=2)
    assert got.dtype == np.int32 and got.shape == (2, 3)
    assert (got == K * (-8) * wv).all()
    part = mm_i4_partials(a, w)
    Kp = -(-K // 32) * 32
    bounds = list(range(0, Kp, 480)) + [Kp]
    assert part.dtype == np.int16 and part.shape == (len(bounds) - 1, 2, 3)
    want, peak = chunk_sums(np.pad(a, ((0, 0), (0, Kp - K))), np.pad(w, ((0, 0), (0, Kp - K))), bounds)
    assert peak <= 480 * 64 <= INT16[1]
    assert np.array_equal(part.astype(np.int64), want)  # no partial wrapped
    assert np.array_equal(part.astype(np.int32).sum(axis=0, dtype=np.int32), got)
    if K >= 480 and wv == -8:
        assert part[0, 0, 0] == 30720


@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (1, 4096, 70), (3, 100, 33), (5, 481, 8), (17, 2000, 9), (2, 12345, 5)])
def test_product_is_the_exact_int64_dot(M, K, N, rng):
    a, w = codes(rng, (M, K)), codes(rng, (N, K))
    got = mm_i4(a, w)
    assert np.array_equal(got.astype(np.int64), exact(a, w))
    part = mm_i4_partials(a, w)
    assert np.array_equal(part.astype(np.int64).sum(axis=0), exact(a, w))


def test_any_split_into_chunks_of_at_most_511_is_exact(rng):
    """The property the NPU's chunking rests on: whatever the split of k into chunks of <= 511,
    every running int16 sum stays in range, so each chunk sum is exact and their int32 sum is the
    product. Random splits, random and extreme codes (all -8, {-8, 7})."""
    K = 3000
    cases = [(np.full((1, K), -8), np.full((2, K), -8)),
             (np.full((1, K), -8), rng.choice([-8, 7], (2, K))),
             (codes(rng, (2, K)), codes(rng, (2, K)))]
    for a, w in cases:
        want = mm_i4(a, w)
        for _ in range(25):
            cuts = [0]
            while cuts[-1] < K:
                cuts.append(min(K, cuts[-1] + int(rng.integers(1, 512))))
            sums, peak = chunk_sums(a, w, cuts)
            assert peak <= 511 * 64 <= INT16[1]
            wrapped = sums.astype(np.int16).astype(np.int32).sum(axis=0, dtype=np.int32)  # int16 chunks, int32 sum
            assert np.array_equal(wrapped, want) and np.array_equal(want.astype(np.int64), exact(a, w))
    # the bound is tight: one chunk of 512 products of -8 x -8 leaves int16 (this check can fail)
    sums, peak = chunk_sums(np.full((1, 512), -8), np.full((1, 512), -8), [0, 512])
    assert peak == 32768 > INT16[1] and sums.astype(np.int16)[0, 0, 0] == -32768


@pytest.mark.parametrize("M,K,N", [(1, 1, 1), (1, 31, 7), (1, 4096, 33), (1, 4127, 65), (2, 33, 4), (2, 4160, 9),
                                   (3, 480, 8), (5, 992, 100), (17, 64, 31), (4, 8224, 3)])
def test_every_isa_equals_the_scalar_ref(M, K, N, simd_isa, rng):
    a, w = codes(rng, (M, K)), codes(rng, (N, K))
    a[:, ::7] = -8
    w[::2, ::5] = 7  # the largest |u * a| of the AVX2 kernel's w + 8 operand
    with orkpy.use_isa("scalar"):
        assert orkpy.capabilities()["i4_kernels"] == "scalar"
        ref = mm_i4(a, w, threads=1)
    with orkpy.use_isa(simd_isa):
        assert orkpy.capabilities()["i4_kernels"] == simd_isa
        got = mm_i4(a, w, threads=1)
    assert np.array_equal(got, ref)
    assert np.array_equal(ref.astype(np.int64), exact(a, w))


def test_thread_counts_give_the_same_result(isa, rng):
    a, w = codes(rng, (3, 3000)), codes(rng, (200, 3000))
    with orkpy.use_isa(isa):
        outs = [mm_i4(a, w, threads=t) for t in (1, 2, 3, 7)]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    assert np.array_equal(outs[0].astype(np.int64), exact(a, w))


def test_edge_codes_minus_8_and_minus_7(isa):
    """-8 is accepted (the hardware's range); the quantizers' symmetric range stops at -7."""
    a = np.array([[-8, -7, -8, 7, -7], [-7, -7, -7, -7, -7]], np.int8)
    w = np.array([[-8, -8, 7, -8, 7], [-7, 7, -7, 7, -7], [7, 7, 7, 7, 7]], np.int8)
    with orkpy.use_isa(isa):
        got = mm_i4(a, w)
    assert np.array_equal(got.astype(np.int64), exact(a, w))
    assert got[0, 0] == 64 + 56 - 56 - 56 - 49 and got[1, 1] == 49


def test_pack_nibble_order_padding_and_round_trip(rng):
    p = pack_i4(np.array([[1, 2, -8], [7, -1, -8]], np.int8))
    assert p.dtype == np.uint8 and p.shape == (2, 16)
    assert list(p[0, :2]) == [0x21, 0x08] and list(p[1, :2]) == [0xF7, 0x08]  # 2j low nibble, 2j+1 high
    assert not p[:, 2:].any()  # padding codes are 0
    for K in (1, 2, 31, 32, 33, 64, 480, 481, 1001):
        c = codes(rng, (3, K))
        packed = pack_i4(c)
        assert packed.shape == (3, int4.layout(K)["row_bytes"])
        assert np.array_equal(unpack_i4(packed, K), c)
    q = p.copy()
    q[0, 1] |= 0x10  # code 3 of row 0 is padding for K = 3
    with pytest.raises(ValueError, match=r"packed: .*\[0, 3\]"):
        unpack_i4(q, 3)
    assert np.array_equal(pack_i4([[-8, 7]]), [[0x78] + [0] * 15])  # a list of ints is taken


def test_bad_input_raises_value_error_naming_the_argument():
    good = np.zeros((2, 40), np.int8)
    a8, w9 = np.zeros((2, 40), np.int64), np.zeros((2, 40), np.int16)
    a8[1, 3], w9[0, 39], w9[1, 0] = 8, -9, -10
    bad = {
        r"a_codes: code 8 at \[1, 3\]": lambda: mm_i4(a8, good),
        r"w_codes: code -9 at \[0, 39\]": lambda: mm_i4(good, w9),
        r"a_codes must be an integer array": lambda: mm_i4(good.astype(np.float32), good),
        r"w_codes must be 2-D": lambda: mm_i4(good, good[0]),
        r"a_codes must be 2-D": lambda: mm_i4(good[None], good),
        r"a_codes must have at least 1 row": lambda: mm_i4(good[:0], good),
        r"a_codes must have K in": lambda: mm_i4_partials(good[:, :0], good[:, :0]),
        r"a_codes has K = 40 columns but w_codes has 39": lambda: mm_i4_partials(good, good[:, :39]),
        r"threads must be": lambda: mm_i4(good, good, threads=-1),
        r"codes: code 100": lambda: pack_i4(np.full((1, 3), 100)),
        r"codes must be an integer array": lambda: pack_i4(["a"]),
        r"packed must be a uint8 array": lambda: unpack_i4(np.zeros((1, 16), np.int8), 3),
        r"K must be an int": lambda: unpack_i4(np.zeros((1, 16), np.uint8), 3.0),
    }
    for msg, call in bad.items():
        with pytest.raises(ValueError, match=msg):
            call()


def test_the_binding_refuses_bad_arrays_without_crashing():
    """_core's own checks (the Python layer's are first): exact dtypes (TypeError), row widths,
    K's range and codes outside [-8, 7] from the core (ValueError naming the argument)."""
    p = pack_i4(np.zeros((2, 40), np.int8))
    with pytest.raises(ValueError, match=r"w must have shape \(rows >= 1, 32\)"):
        _core.mm_i4(p, p[:, :16], 40)
    with pytest.raises(ValueError, match=r"K must be in \[1, "):
        _core.mm_i4(p, p, 0)
    with pytest.raises(TypeError, match="a must be a 2-D uint8"):
        _core.mm_i4(p.astype(np.int8), p, 40)
    with pytest.raises(ValueError, match=r"codes: int4 code 8 at \[0, 1\] is outside \[-8, 7\]"):
        _core.i4_pack(np.array([[0, 8]], np.int8))
    with pytest.raises(TypeError):
        _core.i4_pack(np.zeros((2, 3), np.int16))
    with pytest.raises(ValueError, match="threads"):
        _core.mm_i4(p, p, 40, threads=-2)
