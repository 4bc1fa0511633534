"""The F32 linear's contract (csrc/ork/gemm_f32.h: one fused multiply-add per term, in k
order) through the forward pass, bit for bit against the NumPy oracle orkpy.kernels.reference.linear_f32
on every ISA and thread count; the oracle's fmaf against the C library's. The kernels themselves
(tile edges, K blocks, column ranges, NEON under qemu) are tests/c/test_gemm_f32.c."""
import ctypes
import ctypes.util

import numpy as np
import pytest

import orkpy
from ggufgen import FLOAT32, STRING, UINT32, build, kv
from orkpy.kernels import reference


def test_reference_fmaf_is_the_c_librarys(rng):
    libm = ctypes.CDLL(ctypes.util.find_library("m"))
    libm.fmaf.restype = ctypes.c_float
    libm.fmaf.argtypes = [ctypes.c_float] * 3
    a = (rng.standard_normal(4000) * 2.0 ** rng.integers(-20, 20, 4000)).astype(np.float32)
    b = (rng.standard_normal(4000) * 2.0 ** rng.integers(-20, 20, 4000)).astype(np.float32)
    c = (-(a.astype(np.float64) * b) * (1 + rng.standard_normal(4000) * 1e-6)).astype(np.float32)  # cancellation
    c[::3] = rng.standard_normal(len(c[::3])).astype(np.float32)
    e11, e12 = np.float32(2.0 ** -11), np.float32(2.0 ** -12)
    a[:2], b[:2], c[:2] = [1 + e12, 1 + e12], [1 + e12, 1 + e12], [-(1 + e11), np.float32(0)]  # 2^-24 vs 0
    want = np.array([libm.fmaf(float(x), float(y), float(z)) for x, y, z in zip(a, b, c)], dtype=np.float32)
    got = reference.fmaf32(a, b, c)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert got[0] == np.float32(2.0 ** -24) and (a[0] * b[0]).astype(np.float32) + c[0] == 0  # fused != unfused


def _head_model(tmp_path, D=64, V=96, seed=0):
    """A 1-layer llama whose attention and FFN outputs are exactly zero (zero output
    projections) and whose embeddings are +-1 with norm epsilon 1e-30: the final norm's scale
    is exactly 1, so each position's normed state is output_norm * its embedding, exactly,
    and its logits are the output linear alone."""
    rng = np.random.default_rng(seed)
    H, F = 4, 32
    T = {"token_embd.weight": np.where(rng.random((V, D)) < 0.5, -1.0, 1.0),
         "output_norm.weight": rng.standard_normal(D) * 2.0 ** rng.integers(-6, 6, D),
         "output.weight": rng.standard_normal((V, D)) * 2.0 ** rng.integers(-8, 8, (V, D)),
         "blk.0.attn_norm.weight": np.ones(D), "blk.0.ffn_norm.weight": np.ones(D),
         "blk.0.attn_q.weight": rng.standard_normal((D, D)) * 0.1,
         "blk.0.attn_k.weight": rng.standard_normal((D, D)) * 0.1,
         "blk.0.attn_v.weight": rng.standard_normal((D, D)) * 0.1,
         "blk.0.attn_output.weight": np.zeros((D, D)),
         "blk.0.ffn_gate.weight": rng.standard_normal((F, D)) * 0.1,
         "blk.0.ffn_up.weight": rng.standard_normal((F, D)) * 0.1,
         "blk.0.ffn_down.weight": np.zeros((D, F))}
    T = {k: v.astype(np.float32) for k, v in T.items()}
    a = "llama"
    kvs = [kv("general.architecture", STRING, a), kv(f"{a}.block_count", UINT32, 1),
           kv(f"{a}.embedding_length", UINT32, D), kv(f"{a}.feed_forward_length", UINT32, F),
           kv(f"{a}.attention.head_count", UINT32, H), kv(f"{a}.attention.head_count_kv", UINT32, H),
           kv(f"{a}.attention.layer_norm_rms_epsilon", FLOAT32, 1e-30), kv(f"{a}.context_length", UINT32, 64),
           kv(f"{a}.rope.freq_base", FLOAT32, 10000.0), kv(f"{a}.rope.dimension_count", UINT32, D // H)]
    data, _ = build(kvs, [(n, tuple(reversed(v.shape)), 0, v.tobytes()) for n, v in T.items()])
    p = tmp_path / "head.gguf"
    p.write_bytes(data)
    return p, T


def test_forward_logits_are_the_fused_chain_on_every_isa_and_thread_count(tmp_path, isa):
    path, T = _head_model(tmp_path)
    m = orkpy.load_model(path)
    tokens = np.random.default_rng(1).integers(0, 96, 40).astype(np.int32)
    h = T["token_embd.weight"][tokens[5:]] * T["output_norm.weight"]  # exact (+-1 times a float)
    want = reference.linear_f32(h, T["output.weight"])
    unfused = np.zeros_like(want)  # the same chain with the product rounded first
    for k in range(h.shape[1]):
        unfused = unfused + h[:, k, None] * T["output.weight"][None, :, k]
    assert not np.array_equal(want, unfused)  # the model tells a fused chain from an unfused one
    with orkpy.use_isa(isa):
        caps = orkpy.capabilities()  # under AVX2, its AVX-512 tile where the CPU has AVX-512 (gemm_f32_ref.c)
        assert caps["gemm_f32_kernels"] == ("avx512" if isa == "avx2" and caps["cpu_features"]["avx512"] else isa)
        for threads in (1, 2, 3):
            got = m.forward(tokens, first=5, threads=threads)
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (isa, threads)


@pytest.mark.slow
def test_stories_f32_forward_identical_across_isas_and_threads(shared, simd_isa):
    m = orkpy.load_model(shared / "models" / "stories260K" / "stories260K-F32.gguf")
    tokens = np.random.default_rng(2).integers(3, 512, 256).astype(np.int32)
    with orkpy.use_isa("scalar"):
        ref = m.forward(tokens, first=128, threads=1)
    with orkpy.use_isa(simd_isa):
        for threads in (1, 2, 3):
            assert np.array_equal(m.forward(tokens, first=128, threads=threads), ref), threads


def test_avx512_tile_equals_the_avx2_tile(shared, monkeypatch):
    """The AVX-512 GEMM (16 outputs per zmm, 8-row tiles) against the AVX2 one (ORKPY_NO_AVX512=1,
    read on every call): the same bits through a whole F32 forward pass, M = 1 and batched."""
    caps = orkpy.capabilities()
    if "avx2" not in caps["available"] or not caps["cpu_features"]["avx512"]:
        pytest.skip("this CPU has no AVX-512F/VL/BW/DQ: the avx512 GEMM table is not used here")
    m = orkpy.load_model(shared / "models" / "stories260K" / "stories260K-F32.gguf")
    tokens = np.random.default_rng(3).integers(3, 512, 203).astype(np.int32)
    with orkpy.use_isa("avx2"):
        assert orkpy.capabilities()["gemm_f32_kernels"] == "avx512"
        got = [m.forward(tokens, threads=t) for t in (1, 2)] + [m.forward(tokens[:1], threads=1)]
        monkeypatch.setenv("ORKPY_NO_AVX512", "1")
        assert orkpy.capabilities()["gemm_f32_kernels"] == "avx2"
        want = m.forward(tokens, threads=1)
        assert np.array_equal(got[0], want) and np.array_equal(got[1], want)
        assert np.array_equal(got[2], m.forward(tokens[:1], threads=1))
