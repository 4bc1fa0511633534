"""Group-wise scales (csrc/ork/quant.h, pack.h "Group-wise scales", docs/o4n1.md version 3):
quantization per group, the grouped int8 matmul bit for bit against a NumPy model of its
contract on every ISA and thread count, the O4N1/O8N1 grouped file, the forward pass, the
tier map's grouped tiers and quantize_model(group_size=). The float16 scales themselves and the
version-3 file in detail: tests/test_group_f16.py."""
import os

import numpy as np
import pytest

import orkpy
from orkpy import _core
from orkpy.kernels import reference as R
from orkpy.kernels.reference import round_half_away
from orkpy.formats.tiermap import packed_nbytes, split_tier

f32 = np.float32
KINDS = ("nf4", "int4", "int8")


@pytest.fixture
def rng():
    return np.random.default_rng(17)


def weight(rng, N=70, K=300):
    w = rng.standard_normal((N, K)).astype(f32)
    w[:, 40] *= 30  # an outlier column: its group's scale is large, the others are not
    w[3, 64:128] = 0  # a zero group
    return w


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("group", [32, 64, 128, 256])
def test_each_group_is_quantized_as_a_row_of_its_columns(rng, kind, group):
    w = weight(rng)
    im = rng.random(300).astype(f32)
    q = orkpy.quantize(w, kind, imatrix=im, group_size=group)
    G = -(-300 // group)
    assert q.group == group and q.scales.shape == (70, G)
    c_ref, s_ref = R.quantize(w, kind, imatrix=im, group_size=group)  # each group's columns as a row, float16 scale
    assert np.array_equal(q.codes, c_ref) and np.array_equal(q.scales, s_ref)
    plain = orkpy.quantize(w, kind, group_size=group)
    for i in range(G):  # without imatrix: the float16 of the scale of the group's columns quantized as rows
        lo, hi = i * group, min(300, (i + 1) * group)
        seg = orkpy.quantize(np.ascontiguousarray(w[:, lo:hi]), kind)
        assert np.array_equal(seg.scales.astype(np.float16).astype(f32), plain.scales[:, i])
    assert np.all(q.scales[3, 64 // group:128 // group] == 0) or group > 64
    # dequantize: scale of the column's group
    d = q.dequantize()
    assert d.shape == w.shape
    assert np.array_equal(orkpy.pack(q).dequantize(), d)
    assert plain.nbytes == q.nbytes


@pytest.mark.parametrize("kind", KINDS)
def test_a_group_of_k_or_more_is_the_per_row_result_byte_for_byte(rng, kind):
    w = weight(rng, K=256)
    base = orkpy.quantize(w, kind, sr=True, seed=5)
    for g in (256, 512):
        q = orkpy.quantize(w, kind, sr=True, seed=5, group_size=g)
        assert q.group == 0 and q.scales.shape == (70,)
        assert np.array_equal(q.codes, base.codes) and np.array_equal(q.scales, base.scales)


def test_stochastic_rounding_hashes_the_global_column(rng):
    w = weight(rng, K=128)
    q = orkpy.quantize(w, "int8", sr=True, seed=3, group_size=64)
    seg = orkpy.quantize(np.ascontiguousarray(w[:, 64:]), "int8", sr=True, seed=3)
    # same scale (as float16), but the second group's columns are 64..127 of the row, not 0..63
    assert np.array_equal(seg.scales.astype(np.float16).astype(f32), q.scales[:, 1])
    assert not np.array_equal(seg.codes, q.codes[:, 64:])


@pytest.mark.parametrize("bad", [16, 48, 5000, -32, 1.5, True])
def test_bad_group_sizes_are_refused(rng, bad):
    with pytest.raises((ValueError, TypeError), match="group_size"):
        orkpy.quantize(weight(rng), "nf4", group_size=bad)


def grouped_reference(pw, x):
    """The documented output (pack.h): per-token int8 activations, per-group int32 sums,
    t_i = (float(acc_i) * a) * s_i in float32, added left to right."""
    absmax = np.abs(x).max(axis=1).astype(f32)
    a = (absmax / f32(127)).astype(f32)
    inv = (f32(127) / absmax).astype(f32)
    xq = np.clip(round_half_away((x * inv[:, None]).astype(f32)), -127, 127).astype(np.int64)
    W = pw.int8_weight().astype(np.int64)
    g, K = pw.group, pw.K
    y = None
    for i in range(pw.bscale.shape[1]):
        acc = xq[:, i * g:(i + 1) * g] @ W[:, i * g:(i + 1) * g].T
        t = ((acc.astype(f32) * a[:, None]).astype(f32) * pw.bscale[:, i][None, :]).astype(f32)
        y = t if y is None else (y + t).astype(f32)
    return y, xq


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("group", [32, 128])
@pytest.mark.parametrize("M", [1, 7])
def test_grouped_matmul_is_its_contract_bit_for_bit_on_every_isa_and_thread_count(rng, kind, group, M):
    pw = orkpy.pack(orkpy.quantize(weight(rng), kind, group_size=group))
    x = rng.standard_normal((M, 300)).astype(f32)
    ref, xq = grouped_reference(pw, x)
    outs = []
    for isa in orkpy.capabilities()["available"]:
        with orkpy.use_isa(isa):
            for t in (1, 3):
                outs.append(pw.matmul(x, threads=t))
    assert len(outs) >= 2
    for y in outs:
        assert np.array_equal(y.view(np.int32), ref.view(np.int32))
    acc = pw.matmul_int(xq.astype(np.int8))
    G = pw.bscale.shape[1]
    assert acc.shape == (G, M, 70)
    W = pw.int8_weight().astype(np.int64)
    for i in range(G):
        assert np.array_equal(acc[i], xq[:, i * group:(i + 1) * group] @ W[:, i * group:(i + 1) * group].T)


def test_grouping_lowers_the_output_error(rng):
    w = weight(rng, N=128, K=512)
    x = rng.standard_normal((16, 512)).astype(f32)
    exact = x @ w.T
    err = {g: float(np.mean((orkpy.pack(orkpy.quantize(w, "nf4", group_size=g)).matmul(x) - exact) ** 2))
           for g in (None, 128, 32)}
    assert err[32] < err[128] < err[None]


@pytest.mark.parametrize("kind", ["nf4", "int8"])
@pytest.mark.parametrize("mmap", [True, False])
def test_grouped_file_round_trips_and_per_channel_stays_version_1(rng, tmp_path, kind, mmap):
    w = weight(rng)
    x = rng.standard_normal((3, 300)).astype(f32)
    pc = orkpy.pack(orkpy.quantize(w, kind))
    orkpy.save_packed(pc, tmp_path / "pc")
    raw = (tmp_path / "pc").read_bytes()
    assert int.from_bytes(raw[4:8], "little") == 1 and int.from_bytes(raw[12:16], "little") == 64
    pw = orkpy.pack(orkpy.quantize(w, kind, group_size=64))
    p = tmp_path / "g"
    orkpy.save_packed(pw, p)
    raw = p.read_bytes()
    assert raw[:4] == (b"O8N1" if kind == "int8" else b"O4N1")
    assert int.from_bytes(raw[4:8], "little") == 3 and int.from_bytes(raw[12:16], "little") == 72
    assert int.from_bytes(raw[64:68], "little") == 64 and int.from_bytes(raw[68:72], "little") == 5
    lay = _core.packed_layout(kind, 70, 300, 64)
    assert len(raw) == lay["file_bytes"] and lay["store_offset"] == -(-(72 + 2 * 70 * 5) // 64) * 64
    back = orkpy.load_packed(p, mmap=mmap)
    assert back.group == 64 and back.bscale.shape == (70, 5)
    assert np.array_equal(back.matmul(x), pw.matmul(x))
    orkpy.save_packed(back, tmp_path / "again")
    assert (tmp_path / "again").read_bytes() == raw
    assert back.nbytes == packed_nbytes(f"{'int8' if kind == 'int8' else 'int4'}-g64", 70, 300)


def _patched(raw, off, value, size=4):
    b = bytearray(raw)
    b[off:off + size] = int(value).to_bytes(size, "little")
    return bytes(b)


@pytest.mark.parametrize("patch, msg", [
    ((64, 48), "group size"), ((64, 0), "group size"), ((64, 512), "group size"),
    ((68, 4), "group count"), ((4, 5), "unsupported version"), ((12, 64), "header size"),
    ((4, 2), "store offset 832, expected 1472"),  # version 2 (float32 scales) needs 4 bytes per scale
])
def test_corrupt_grouped_headers_are_format_errors(rng, tmp_path, patch, msg):
    pw = orkpy.pack(orkpy.quantize(weight(rng), "nf4", group_size=64))
    orkpy.save_packed(pw, tmp_path / "g")
    bad = tmp_path / "bad"
    bad.write_bytes(_patched((tmp_path / "g").read_bytes(), *patch))
    with pytest.raises(orkpy.FormatError, match=msg):
        orkpy.load_packed(bad)


def test_bad_grouped_scales_are_refused(rng):
    pw = orkpy.pack(orkpy.quantize(weight(rng), "nf4", group_size=64))
    bs = pw.bscale.copy()
    bs[2, 3] = -1
    with pytest.raises(ValueError, match=r"scale\[2, 3\]"):
        orkpy.PackedWeight("nf4", pw.shape, pw.store, bs, group=64)
    with pytest.raises(ValueError, match="bscale has shape"):
        orkpy.PackedWeight("nf4", pw.shape, pw.store, pw.bscale[:, :4].copy(), group=64)
    with pytest.raises(ValueError, match="outlier"):
        pw.matmul(np.ones((1, 300), f32), act="per_token_outliers", outliers=[1, 2])


def test_tier_strings_with_a_group():
    assert split_tier("int4-g32") == ("int4", 32) and split_tier("int8") == ("int8", 0)
    for bad in ("int4-g48", "float-g32", "int4-g", "int4-g8192", "nf4"):
        with pytest.raises(ValueError, match="unknown tier"):
            split_tier(bad)
    assert packed_nbytes("int4-g32", 64, 576) == 64 * 576 // 2 + 2 * 64 * 18  # float16 group scales
    assert packed_nbytes("int4-g1024", 64, 576) == packed_nbytes("int4", 64, 576)


STORIES = "models/stories260K/stories260K-F32.gguf"


@pytest.mark.gate
def test_quantize_model_group_size_saves_runs_and_lowers_kl(shared, tmp_path):
    """stories260K on its Q4_0 allocation: group_size=32 packs every quantized linear with
    group-wise scales, the saved model reloads bit-identically, runs through the NPU emulator bit for
    bit (one K tile per group), the fused chain refuses it with a message, and the w4a8 KL beats
    per-channel scales on held-out text."""
    path, alloc = shared / STORIES, shared / "models/stories260K/stories260K-Q4_0.gguf"
    text = (shared / "text" / "tinystories-val-B.txt").read_text(encoding="utf-8")
    cut = text.index("\n", len(text) // 2) + 1
    calib, scored = text[:cut], text[cut:]
    quiet = dict(progress=False, log=lambda s: None)
    base = orkpy.load_model(path)
    im = orkpy.collect_imatrix(base, calib, n_ctx=256, chunks=4, progress=False)
    pc = orkpy.quantize_model(path, alloc, imatrix=im, **quiet)
    gq = orkpy.quantize_model(path, alloc, imatrix=im, group_size=32, **quiet)
    assert gq.settings["group_size"] == 32 and "group_size" not in pc.settings
    assert all(pw.group == 32 for pw in gq.tensors.values() if pw.K > 32)
    assert all(split_tier(t)[1] == 32 for n, t in gq.tiers.items() if n in gq.tensors and gq.tensors[n].K > 32)
    toks = base.tokens(scored)
    ref = tmp_path / "ref.npz"
    orkpy.perplexity(base, toks, n_ctx=256, chunks=4, save_logprobs=ref, progress=False)

    def kl(m):
        return orkpy.perplexity(m, toks, n_ctx=256, chunks=4, kld_base=ref, progress=False).kld["mean"]

    mg = orkpy.load_model(gq.save(tmp_path / "g32"))
    k_pc, k_g = kl(orkpy.load_model(pc.save(tmp_path / "pc"))), kl(mg)
    assert k_g == kl(gq.to_model())  # the saved model is the resident one
    print(f"stories260K w4a8 KL: per-channel {k_pc:.5f}, group 32 {k_g:.5f}")
    assert k_g < 0.9 * k_pc
    sizes = {p.suffix for p in (tmp_path / "g32").iterdir()}
    assert ".o4n1" in sizes
    with pytest.raises(ValueError, match="group-wise scales"):
        mg.set_ffn(0, {"mode": "fused"})
    toks_npu = toks[:64]
    cpu = mg.forward(toks_npu)
    assert orkpy.runtime.npu.use_npu(mg, "emu") > 0  # per-group int32 partials from the NPU, scaled on the host
    assert np.array_equal(mg.forward(toks_npu), cpu)


def test_npu_plan_prints_the_grouped_cost(capsys):
    """bench/npu_plan.py's grouped table: K split on group boundaries writes one int32 block per
    group, so the decode output traffic is sum(ceil(K / g) * N * 4) over the token's matmuls."""
    from conftest import load_bench
    plan = load_bench("npu_plan")
    sh = plan.shapes(plan.QWEN3_1_7B)
    out = plan.grouped_plan(sh, [128, 32], 33.8, prefill=64)
    text = capsys.readouterr().out
    assert "Group-wise scales on the NPU" in text and "prefill 64" in text
    for g in (128, 32):
        want = sum(-(-K // g) * N * 4 * cnt for _, K, N, cnt in sh)
        assert out[(g, 1)]["out_bytes"] == want
        assert out[(g, 1)]["w_bytes"] == out[(0, 1)]["w_bytes"]  # the same int8 weights stream
        assert out[(g, 64)]["out_bytes"] > out[(g, 1)]["out_bytes"] * 32
    assert out[(32, 1)]["ms_per_token"] > out[(128, 1)]["ms_per_token"] > out[(0, 1)]["ms_per_token"]


@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_gptq_with_groups(rng, kind):
    """GPTQ with group-wise scales: with nothing to compensate (diagonal Gram, no damping) it is
    plain grouped rounding, scales included; on a correlated Gram it lowers the output error of
    grouped rounding, with each group's scale chosen from the updated columns (or up front)."""
    from orkpy.quantization.gptq import gptq_quantize
    w = weight(rng, N=48, K=256)
    q = gptq_quantize(w, np.eye(256), kind, damp=0.0, group_size=64)
    r = orkpy.quantize(w, kind, group_size=64)
    assert q.group == 64 and np.array_equal(q.codes, r.codes) and np.array_equal(q.scales, r.scales)
    x = rng.standard_normal((600, 256)) @ rng.standard_normal((256, 256)) * 0.3 + rng.standard_normal((600, 256))
    g = x.T @ x

    def err(t):
        d = t.dequantize().astype(np.float64) - w
        return float(np.einsum("nk,nk->", d @ g, d))
    im = (np.diag(g) / 600).astype(f32) if kind != "int8" else None
    base = err(orkpy.quantize(w, kind, imatrix=im, group_size=32))
    dyn = gptq_quantize(w, g, kind, rows=600, group_size=32)
    sta = gptq_quantize(w, g, kind, rows=600, group_size=32, static_groups=True)
    assert err(dyn) < base and err(sta) < base
    assert not np.array_equal(dyn.scales[:, 1:], sta.scales[:, 1:])  # later groups' scales follow the updates
    assert np.array_equal(dyn.scales[:, 0], sta.scales[:, 0])
    orkpy.pack(dyn)  # a valid weight
